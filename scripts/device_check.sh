#!/usr/bin/env bash
# The closing device calls, in two stages that each fit one 10-minute call (STAGE=test|bench|all):
#   test:  build everything, then the README's test command on a GPU (every test, GPU ones included),
#          bounded by TEST_LIMIT seconds (default 540);
#   bench: prepare the data, `make train` as the README says, then the training-throughput benchmark
#          bounded by BENCH_LIMIT seconds (default 240; TORCH=1 adds PyTorch's side).
# Logs under $OUT/check/.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
STAGE=${STAGE:-all}
mkdir -p "$OUT/check"
export GPT_MIRROR=${GPT_MIRROR:-.carry/mirror}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/check/device.log"
started=$SECONDS
make -j16 all > "$OUT/check/build.log" 2>&1 || { tail -n 30 "$OUT/check/build.log"; exit 1; }
echo "build: $((SECONDS - started)) s"
if [[ $STAGE == test || $STAGE == all ]]; then
    # make test as the README says (everything is built already, so no -j is needed).
    timeout "${TEST_LIMIT:-540}" make test > "$OUT/check/make_test.log" 2>&1
    echo "make test exit code $?"
    grep -E "^(===|---)|passed, [0-9]+ failed|FAIL|!!!|^failed:" "$OUT/check/make_test.log" | tail -n 80
fi
if [[ $STAGE == bench || $STAGE == all ]]; then
    timeout 150 make train > "$OUT/check/make_train.log" 2>&1
    echo "make train exit code $?"
    grep -vE "^step +[0-9]*[1-9] " "$OUT/check/make_train.log" | tail -n 40
    OUT="$OUT/check" BATCHES=${BATCHES:-16 32 64} STEPS=${STEPS:-20} TORCH=${TORCH:-0} TORCH_BATCHES=${TORCH_BATCHES:-32} PROFILE_BATCHES=${PROFILE_BATCHES:-16} \
        timeout "${BENCH_LIMIT:-240}" bash scripts/bench_train.sh 2>&1 | tail -n 80
fi
