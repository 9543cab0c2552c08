#!/usr/bin/env bash
# The closing device call: the README's test command on a GPU (every test, GPU ones included), then
# the training-throughput benchmark. Logs under $OUT/check/. Bounded so it fits one 10-minute call:
# TEST_LIMIT / BENCH_LIMIT seconds (defaults 420 / 100); TORCH=1 adds PyTorch's side of the benchmark.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT/check"
export GPT_MIRROR=${GPT_MIRROR:-.carry/mirror}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/check/device.log"
make -j16 all > "$OUT/check/build.log" 2>&1 || { tail -n 30 "$OUT/check/build.log"; exit 1; }
# make test as the README says (everything is built already, so no -j is needed).
timeout "${TEST_LIMIT:-420}" make test > "$OUT/check/make_test.log" 2>&1
echo "make test exit code $?"
grep -E "^===|passed, [0-9]+ failed|FAIL|!!!|^failed:" "$OUT/check/make_test.log" | tail -n 60
${PYTHON:-python3} data/prepare_tinyshakespeare.py > "$OUT/check/data.log" 2>&1 || tail -n 5 "$OUT/check/data.log"
OUT="$OUT/check" BATCHES=${BATCHES:-16 32 64} STEPS=${STEPS:-20} TORCH=${TORCH:-0} TORCH_BATCHES=${TORCH_BATCHES:-32} PROFILE_BATCHES=${PROFILE_BATCHES:-16} \
    timeout "${BENCH_LIMIT:-100}" bash scripts/bench_train.sh 2>&1 | tail -n 80
