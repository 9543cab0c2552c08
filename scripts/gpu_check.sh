#!/usr/bin/env bash
# usage: [OUT=out/gpu_check] bash scripts/gpu_check.sh
#
# What a GPU machine should check after a change, in one go: build every program, `make test`
# (every test, the GPU ones included: every lab's --check, test_gpt against PyTorch, resume and
# determinism), then a short throughput figure (d12, B=64, T=1024, bf16, 30 steps, through
# scripts/bench_train.sh without PyTorch or llm.c). Every stage has a time limit, so it never hangs;
# logs go under OUT, and it ends with a summary table and exit code 0 only if every stage passed.
# Environment: OUT (default out/gpu_check), BUILD_LIMIT / TEST_LIMIT / BENCH_LIMIT (seconds, default
# 1200 / 1800 / 600), BENCH=0 (no throughput), GPT_MIRROR / PYTHON (as for make test).
set -uo pipefail
# Paths given in the environment or as arguments are relative to where the script was started.
here=$PWD
abs_path() { if [[ $1 == /* ]]; then echo "$1"; else echo "$here/$1"; fi; }
cd "$(dirname "$0")/.." || exit 1
export PATH=/usr/local/cuda/bin:$PATH
if [[ ${1:-} == -h || ${1:-} == --help ]]; then sed -n '2,/^set -uo/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0; fi
[[ $# -eq 0 ]] || { echo "error: unexpected argument '$1' (settings go in the environment; -h)" >&2; exit 1; }
OUT=${OUT:+$(abs_path "$OUT")}
OUT=${OUT:-out/gpu_check}
mkdir -p "$OUT"
summary=()
failed=0
stage() {  # stage NAME LIMIT COMMAND...: run within LIMIT seconds, log to $OUT/NAME.log, keep a summary row
    local name=$1 limit=$2 t=$SECONDS rc
    shift 2
    echo "=== $name"
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    local result="ok"
    ((rc == 124)) && result="TIMED OUT after $limit s"
    ((rc != 0 && rc != 124)) && result="FAILED (exit $rc)"
    ((rc != 0)) && failed=1
    summary+=("| $name | $result | $((SECONDS - t)) s | $OUT/$name.log |")
    return "$rc"
}

if command -v nvidia-smi > /dev/null && nvidia-smi > /dev/null 2>&1; then
    nvidia-smi --query-gpu=name,memory.total,power.limit,driver_version --format=csv,noheader | tee "$OUT/device.log"
else
    echo "no GPU found: the GPU tests will skip, no throughput" | tee "$OUT/device.log"
    BENCH=0
fi
echo "code: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo ' with uncommitted changes')"

stage build "${BUILD_LIMIT:-1200}" make -j all || tail -n 30 "$OUT/build.log"
stage make_test "${TEST_LIMIT:-1800}" make test
grep -E "^(!!!|failed:)|FAIL" "$OUT/make_test.log" | head -n 30
tests=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$OUT/make_test.log" | tail -n 1)
echo "${tests:-make test printed no count line}"
if [[ ${BENCH:-1} == 1 ]]; then
    stage throughput "${BENCH_LIMIT:-600}" env OUT="$OUT/bench" TORCH=0 LLMC='' ROUNDS=1 STEPS=30 PROFILE=0 RECOMPUTE=0 \
        bash scripts/bench_train.sh d12:64
    grep -E '^\| (model|d12)' "$OUT/throughput.log"
fi

echo
echo "| stage | result | time | log |"
echo "|---|---|---|---|"
printf '%s\n' "${summary[@]}"
[[ -n $tests ]] && echo "make test: $tests"
[[ ${BENCH:-1} == 1 ]] && grep -E '^\| d12 ' "$OUT/throughput.log" | awk -F' *[|] *' '{print "throughput: d12 B=64 " $4 " tok/s, peak memory " $8}'
exit "$failed"
