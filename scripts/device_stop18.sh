#!/usr/bin/env bash
# Stop 18's device calls (matmul tuning around cuBLASLt's heuristic, train_gpt -tw; every matmul,
# dweight too, through cuBLASLt), each fitting one 10-minute call. Logs under $OUT/stop18/, and all
# of them in $OUT/stop18_partN.tgz.
#   PART=1  build everything; B=64 training A/B of -tw 0 / -tw 1 (scripts/device_flag_ab.sh: the
#           losses must be the same bits); test/test_gpt.sh (both precisions, every configuration).
#   PART=2  test/test_gpt.sh (SKIP_TEST_GPT=1: not), the unit tests, test/test_resume.sh,
#           test/test_train_cli.sh, then the matmul lab with --wide in the time left (WIDE_LAB=0: not).
#   PART=3  the closing figures: training throughput at B=16/32/64 beside PyTorch (scripts/bench_train.sh,
#           the breakdown at 64, memory with -r 1), and B=32/64 with -tw 1.
#   PART=4  A/B of source trees (AB_DIRS, exported by git archive into a carried folder; "." is the
#           working tree) x flag sets (AB_FLAGS, ';'-separated), AB_ROUNDS rounds of 20 steps at B=64,
#           interleaved.
#   PART=5  every lab's --check, and the attention beside PyTorch's SDPA.
set -u
PART=${PART:-1}
[[ $PART == [12345] ]] || { echo "error: PART must be 1 to 5, got '$PART'" >&2; exit 1; }
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
lab_check() {
    step lab_check 300 bash -c 'rc=0; for p in $(MAKEFLAGS= make -s list-programs | tr " " "\n" | grep dev/cuda/); do echo "=== $p"; ./$p --check | tail -n 3; [[ ${PIPESTATUS[0]} == 0 ]] || rc=1; done; exit $rc'
    grep -E "^=== |passed, " "$log/lab_check.log"
}
if [[ $PART == 1 ]]; then
    OUT="$log" FLAGSETS="-tw 0;-tw 1" ROUNDS=2 STEPS=20 BATCHES=64 PF=0 timeout 300 bash scripts/device_flag_ab.sh 2>&1 |
        grep -E "^B="
    step test_gpt $((580 - (SECONDS - started))) bash test/test_gpt.sh
    grep -E "weight stream|determinism" "$log/test_gpt.log" | sort | uniq -c
elif [[ $PART == 2 ]]; then
    [[ ${SKIP_TEST_GPT:-0} == 1 ]] || step test_gpt 240 bash test/test_gpt.sh
    step unit_tests 60 bash -c 'rc=0; for t in build/test/test_*; do echo "=== $t"; $t | tail -n 3; [[ ${PIPESTATUS[0]} == 0 ]] || rc=1; done; exit $rc'
    step test_resume 300 bash test/test_resume.sh
    step test_train_cli 240 bash test/test_train_cli.sh
    [[ ${WIDE_LAB:-1} == 1 ]] && OUT="$log" WIDE=1 TORCH=0 timeout $((580 - (SECONDS - started))) bash scripts/device_matmul.sh 2>&1 | cut -c1-300 | head -n 60
elif [[ $PART == 5 ]]; then
    lab_check
    timeout 90 "$PY" dev/cuda/attention_vs_torch.py > "$log/attention_vs_torch.log" 2>&1
    echo "--- attention beside SDPA: exit $?"; tail -n 12 "$log/attention_vs_torch.log"
elif [[ $PART == 4 ]]; then
    IFS=';' read -r -a ab_flags <<<"${AB_FLAGS:--tw 0;-tw 1}"
    for d in ${AB_DIRS:?AB_DIRS: source trees}; do
        [[ $d == . ]] && continue
        make -C "$d" -j16 train_gpt_bf16 > "$log/build_$(basename "$d").log" 2>&1 || { tail -n 20 "$log/build_$(basename "$d").log"; exit 1; }
        mkdir -p "$d/data" && ln -sfn "$PWD/data/tinyshakespeare" "$d/data/tinyshakespeare"
    done
    for r in $(seq "${AB_ROUNDS:-2}"); do
        for d in $AB_DIRS; do
            for flags in "${ab_flags[@]}"; do
                name="$(basename "$(cd "$d" && pwd)")$(echo "$flags" | tr -d ' ')_$r"
                # shellcheck disable=SC2086  # the flag set is split into words on purpose
                (cd "$d" && timeout 150 ./train_gpt_bf16 -b 64 -x 20 -v 0 -s 0 $flags) > "$log/ab_$name.log" 2>&1
                echo "$d [$flags] round $r (rc $?): $(grep -oE 'final train loss [0-9.]+|median step .* tok/s' "$log/ab_$name.log" | tr '\n' ' ')"
            done
        done
    done
else
    OUT="$log" BATCHES="16 32 64" STEPS=30 PROFILE_BATCHES=64 GELU_BATCH=none TORCH_BATCHES="32 64" timeout 420 \
        bash scripts/bench_train.sh 2>&1 | tail -n 60
    for B in 32 64; do
        timeout 80 ./train_gpt_bf16 -b $B -x 30 -v 0 -s 0 -tw 1 > "$log/ours_B${B}_tw1.log" 2>&1
        echo "-tw 1 B=$B (rc $?): $(grep -E "^done" "$log/ours_B${B}_tw1.log")"
    done
fi
echo "done at $((SECONDS - started)) s"
