#!/usr/bin/env bash
# One device call for the training loop: builds, runs test_gpt at every configuration in both
# precisions, prepares the data, and trains. Logs go to $OUT/train/ (the device tool returns $OUT).
#   usage: scripts/device_train.sh [test] [train] [bench]   (default: all three)
#   test   test/test_gpt.sh (PyTorch reference on the GPU vs test_gpt_fp32 / test_gpt_bf16)
#   train  `make train` exactly as the README says (bf16), then a short fp32 run
#   bench  tokens/s of d12 at B=16 T=1024 (bf16) and peak memory
# The device is offline: GPT_MIRROR defaults to .carry/mirror (a copy of the mirror sent with carry).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT/train"
export GPT_MIRROR=${GPT_MIRROR:-.carry/mirror}
export PYTHON=${PYTHON:-python3}
phases=${*:-test train bench}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$OUT/train/device.log"
make -j16 train_gpt_bf16 train_gpt_fp32 test_gpt_bf16 test_gpt_fp32 2>&1 | tail -n 20 | tee "$OUT/train/build.log"
for phase in $phases; do
    case $phase in
        test)
            bash test/test_gpt.sh 2>&1 | tee "$OUT/train/test_gpt.log" ;;
        train)
            make train 2>&1 | tee "$OUT/train/make_train.log"
            ./train_gpt_fp32 -b 4 -x 20 -v 10 -s 0 2>&1 | tee "$OUT/train/train_fp32.log" ;;
        bench)
            ./train_gpt_bf16 -b 16 -t 1024 -x 30 -v 0 -s 0 2>&1 | tee "$OUT/train/bench_bf16_B16.log" ;;
        *) echo "unknown phase $phase"; exit 1 ;;
    esac
done
