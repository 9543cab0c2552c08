#!/usr/bin/env bash
# The matmul lab on a GPU machine: build it, validate every version, benchmark the d12 step's GEMMs
# (every algorithm cuBLASLt offers), and PyTorch's same GEMMs in the same call. Logs: $OUT/matmul/.
#   ROWS=65536 ALGOS=16 bash scripts/device_matmul.sh
# WIDE=1: the benchmark's header tunes also over the configurations around cuBLASLt's heuristic
# (--wide; one line per plan says what it kept). TORCH=0 skips PyTorch's side.
set -u
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-out}
log=$OUT/matmul
mkdir -p "$log"
ROWS=${ROWS:-65536}
ALGOS=${ALGOS:-16}
WIDE=${WIDE:-0}
PY=${PYTHON:-python3}
make -j16 dev/cuda/matmul > "$log/build.log" 2>&1 || { tail -n 30 "$log/build.log"; exit 1; }
./dev/cuda/matmul --check > "$log/check.log" 2>&1
echo "--- check: exit $?"; grep -E "FAIL|passed, " "$log/check.log" | tail -n 12
wide=()
[[ $WIDE == 1 ]] && wide=(--wide)
./dev/cuda/matmul --force --rows "$ROWS" --algos "$ALGOS" "${wide[@]}" > "$log/bench.log" 2>&1
echo "--- bench: exit $?"; grep -E "reference|header|best|per step|no cuBLASLt|refused|tuned m|passed, |matmul tuning" "$log/bench.log"
if [[ ${TORCH:-1} == 1 ]]; then
    "$PY" dev/cuda/matmul_vs_torch.py --rows "$ROWS" > "$log/torch.log" 2>&1
    echo "--- torch: exit $?"; cat "$log/torch.log"
fi
