#!/usr/bin/env bash
# Stop 18's device calls (matmul tuning around cuBLASLt's heuristic, train_gpt -tw; every matmul,
# dweight too, through cuBLASLt), each fitting one 10-minute call. Logs under $OUT/stop18/, and all
# of them in $OUT/stop18_partN.tgz (scripts/device_lib.sh).
#   PART=1  build everything; B=64 training A/B of -tw 0 / -tw 1 (scripts/device_flag_ab.sh: the
#           losses must be the same bits); test/test_gpt.sh (both precisions, every configuration).
#   PART=2  test/test_gpt.sh (SKIP_TEST_GPT=1: not), the unit tests, test/test_resume.sh,
#           test/test_train_cli.sh, then the matmul lab with --wide in the time left (WIDE_LAB=0: not).
#   PART=3  the closing figures: training throughput at B=16/32/64 beside PyTorch (scripts/bench_train.sh,
#           the breakdown at 64, memory with -r 1), and B=32/64 with -tw 1.
#   PART=4  A/B of source trees (AB_DIRS) x flag sets (AB_FLAGS, default -tw 0 / -tw 1), AB_ROUNDS
#           rounds of 20 steps at B=64, interleaved (scripts/device_ab_dirs.sh).
#   PART=5  every lab's --check, and the attention beside PyTorch's SDPA.
set -u
PARTS=12345
NAME=stop18
source "$(dirname "$0")/device_lib.sh"
if [[ $PART == 1 ]]; then
    OUT="$log" FLAGSETS="-tw 0;-tw 1" ROUNDS=2 STEPS=20 BATCHES=64 PF=0 timeout 300 bash scripts/device_flag_ab.sh 2>&1 |
        grep -E "^B="
    step test_gpt $((580 - (SECONDS - started))) bash test/test_gpt.sh
    grep -E "weight stream|determinism" "$log/test_gpt.log" | sort | uniq -c
elif [[ $PART == 2 ]]; then
    [[ ${SKIP_TEST_GPT:-0} == 1 ]] || step test_gpt 240 bash test/test_gpt.sh
    unit_tests
    step test_resume 300 bash test/test_resume.sh
    step test_train_cli 240 bash test/test_train_cli.sh
    [[ ${WIDE_LAB:-1} == 1 ]] && OUT="$log" WIDE=1 TORCH=0 timeout $((580 - (SECONDS - started))) bash scripts/device_matmul.sh 2>&1 | cut -c1-300 | head -n 60
elif [[ $PART == 5 ]]; then
    lab_check
    timeout 90 "$PY" dev/cuda/attention_vs_torch.py > "$log/attention_vs_torch.log" 2>&1
    echo "--- attention beside SDPA: exit $?"; tail -n 12 "$log/attention_vs_torch.log"
elif [[ $PART == 4 ]]; then
    OUT="$log" DIRS="${AB_DIRS:?AB_DIRS: source trees}" FLAGS="${AB_FLAGS:--tw 0;-tw 1}" ROUNDS=${AB_ROUNDS:-2} PF=0 \
        bash scripts/device_ab_dirs.sh
else
    OUT="$log" BATCHES="16 32 64" STEPS=30 PROFILE_BATCHES=64 GELU_BATCH=none TORCH_BATCHES="32 64" timeout 420 \
        bash scripts/bench_train.sh 2>&1 | tail -n 60
    for B in 32 64; do
        timeout 80 ./train_gpt_bf16 -b $B -x 30 -v 0 -s 0 -tw 1 > "$log/ours_B${B}_tw1.log" 2>&1
        echo "-tw 1 B=$B (rc $?): $(grep -E "^done" "$log/ours_B${B}_tw1.log")"
    done
fi
echo "done at $((SECONDS - started)) s"
