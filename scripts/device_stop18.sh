#!/usr/bin/env bash
# Stop 18's device calls (CUDA graph of the step, -cg; matmul tuning around cuBLASLt's heuristic, -tw),
# each fitting one 10-minute call. Logs under $OUT/stop18/ (and the scripts' own folders beside it).
#   PART=1  build everything; B=64 training A/B of -cg 0 / -cg 1 (two rounds) and one run of -cg 1 -tw 1
#           (scripts/device_flag_ab.sh: the losses must be the same bits); test/test_gpt.sh (both
#           precisions, every configuration; the CUDA graph and the weight stream must give the
#           gradients' bits).
#   PART=2  every lab's --check, the unit tests, test/test_resume.sh, test/test_train_cli.sh, the
#           matmul lab with --wide.
#   PART=3  the closing figures: training throughput at B=16/32/64 beside PyTorch (scripts/bench_train.sh,
#           the breakdown at 64), 200 steps of bf16 and fp32 from one seed, attention beside SDPA.
set -u
PART=${PART:-1}
[[ $PART == [123] ]] || { echo "error: PART must be 1, 2 or 3, got '$PART'" >&2; exit 1; }
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-out}
log=$OUT/stop18
mkdir -p "$log"
# The device returns few files and folders two deep: everything in one archive too, also when a time limit cuts the run short.
trap 'tar -czf "$OUT/stop18_part$PART.tgz" -C "$OUT" stop18' EXIT
export GPT_MIRROR=${GPT_MIRROR:-.carry/mirror}
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
started=$SECONDS
make -j16 all > "$log/build.log" 2>&1 || { tail -n 30 "$log/build.log"; exit 1; }
echo "build: $((SECONDS - started)) s"
"$PY" data/prepare_tinyshakespeare.py > "$log/data.log" 2>&1 || tail -n 5 "$log/data.log"
step() {  # step NAME LIMIT COMMAND...: run with a time limit, log to $log/NAME.log, print the counts
    local name=$1 limit=$2 t=$SECONDS
    shift 2
    timeout "$limit" "$@" > "$log/$name.log" 2>&1
    local rc=$?
    echo "--- $name: exit $rc, $((SECONDS - t)) s"
    grep -E "passed, [0-9]+ failed|FAIL|!!!|error" "$log/$name.log" | grep -v " ok " | tail -n 8
}
if [[ $PART == 1 ]]; then
    OUT="$log" FLAGSETS="-cg 0;-cg 1" ROUNDS=2 STEPS=20 BATCHES=64 PF=0 timeout 150 bash scripts/device_flag_ab.sh 2>&1 |
        grep -E "^B="
    OUT="$log/wide" FLAGSETS="-cg 1 -tw 1" ROUNDS=1 STEPS=20 BATCHES=64 PF=0 timeout 120 bash scripts/device_flag_ab.sh 2>&1 |
        grep -E "^B=.*round"
    grep -hE "^matmul tuned" "$log"/wide/flag_ab/B64__cg1_tw1_1.log | cut -c1-400
    echo "A/B done at $((SECONDS - started)) s"
    step test_gpt $((580 - (SECONDS - started))) bash test/test_gpt.sh
    grep -E "weight stream|determinism|CUDA graph" "$log/test_gpt.log" | sort | uniq -c
elif [[ $PART == 2 ]]; then
    step lab_check 300 bash -c 'rc=0; for p in $(MAKEFLAGS= make -s list-programs | tr " " "\n" | grep dev/cuda/); do echo "=== $p"; ./$p --check | tail -n 3; [[ ${PIPESTATUS[0]} == 0 ]] || rc=1; done; exit $rc'
    grep -E "^=== |passed, " "$log/lab_check.log"
    step unit_tests 60 bash -c 'rc=0; for t in build/test/test_*; do echo "=== $t"; $t | tail -n 3; [[ ${PIPESTATUS[0]} == 0 ]] || rc=1; done; exit $rc'
    step test_resume 120 bash test/test_resume.sh
    step test_train_cli 90 bash test/test_train_cli.sh
    OUT="$log" WIDE=1 TORCH=0 timeout $((580 - (SECONDS - started))) bash scripts/device_matmul.sh 2>&1 | cut -c1-300 | head -n 60
else
    OUT="$log" BATCHES="16 32 64" STEPS=30 PROFILE_BATCHES=64 GELU_BATCH=none TORCH_BATCHES="32 64" timeout 420 \
        bash scripts/bench_train.sh 2>&1 | tail -n 60
    for p in bf16 fp32; do  # same seed: bf16 should track fp32's validation loss
        timeout 100 ./train_gpt_$p -x 200 -v 50 -s 0 > "$log/curve_$p.log" 2>&1
        echo "$p 200 steps (rc $?): $(grep -E "^step +[0-9]+ \| val loss" "$log/curve_$p.log" | awk '{printf "%s:%s ", $2, $NF}') $(grep -oE "median step .* tok/s" "$log/curve_$p.log")"
    done
    timeout 60 "$PY" dev/cuda/attention_vs_torch.py > "$log/attention_vs_torch.log" 2>&1
    echo "--- attention beside SDPA: exit $?"; tail -n 12 "$log/attention_vs_torch.log"
fi
echo "done at $((SECONDS - started)) s"
