#!/usr/bin/env bash
# Stop 20's device calls, each fitting one 10-minute call. Logs under $OUT/stop20/, all of them in
# $OUT/stop20_partN.tgz (scripts/device_lib.sh). The ablation timing that chose this stop's work is
# scripts/device_ablate.sh (its own call).
#   PART=1  the bias gradients from the weight gradients' GEMMs (a column of ones after each LayerNorm
#           output): the matmul and LayerNorm forward labs' --check, test/test_gpt.sh, then a B=64
#           training A/B of source trees (AB_DIRS, default .carry/ab/base = the code before and the
#           working tree; scripts/device_ab_dirs.sh), -ov 1 and -ov 0 (AB_FLAGS). SKIP_CHECKS=1: the A/B only.
#   PART=2  the matmul lab's benchmark (the 1-GEMM dweight + dbias rows beside dweight and the gemv).
set -u
PARTS=12
NAME=stop20
source "$(dirname "$0")/device_lib.sh"
if [[ $PART == 1 ]]; then
    [[ ${SKIP_CHECKS:-0} == 1 ]] || {
    step matmul_check 120 ./dev/cuda/matmul --check
    grep -E "1 GEMM|inp ld|ld " "$log/matmul_check.log" | grep -c " ok " | sed 's/^/ones-column checks ok: /'
    step layernorm_forward_check 120 ./dev/cuda/layernorm_forward --check
    step test_gpt 300 bash test/test_gpt.sh
    grep -E "weight stream|determinism" "$log/test_gpt.log" | sort | uniq -c
    }
    OUT="$log" DIRS="${AB_DIRS:-.carry/ab/base .}" FLAGS="${AB_FLAGS:--ov 1;-ov 0}" PF=0 timeout $((590 - (SECONDS - started))) \
        bash scripts/device_ab_dirs.sh
elif [[ $PART == 2 ]]; then
    step matmul_bench 400 ./dev/cuda/matmul
    grep -E "^(qkv|attproj|fc|fcproj|lmhead) |per step|reference" "$log/matmul_bench.log" | grep -vE " 3 " | head -n 60
fi
echo "done at $((SECONDS - started)) s"
