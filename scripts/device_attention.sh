#!/usr/bin/env bash
# Runs the attention laboratory on a GPU machine, from the repo root: builds the labs and the C API
# library, validates every version (--check), with SANITIZE=1 runs the flash kernels under memcheck at a
# small shape, benchmarks forward and backward at B=64 NH=12 T=1024 HS=64 bf16 (plus HS 80 and 128
# for the flash versions), and runs the PyTorch SDPA (flash backend) side-by-side.
# Logs go to $OUT/attention/*.log (OUT defaults to ./out).
#   usage: bash scripts/device_attention.sh [-h]
source "$(dirname "$0")/device_lab.sh" attention "$@"
run build make -j16 dev/cuda/attention_forward dev/cuda/attention_backward build/libattention_capi.so
run check ./dev/cuda/attention_forward --check
run check ./dev/cuda/attention_backward --check
# SANITIZE=1: memcheck of the flash paths at a small shape
[[ -n "${SANITIZE:-}" ]] && run sanitizer timeout 100 compute-sanitizer --tool memcheck --error-exitcode 1 ./dev/cuda/attention_forward 4 5 9 --no-validate -b 1 -n 2 -t 100
[[ -n "${SANITIZE:-}" ]] && run sanitizer timeout 100 compute-sanitizer --tool memcheck --error-exitcode 1 ./dev/cuda/attention_backward 4 7 8 9 10 11 --no-validate -b 1 -n 2 -t 100
run bench ./dev/cuda/attention_forward --no-validate
run bench ./dev/cuda/attention_backward --no-validate
for hs in 80 128; do
    run bench ./dev/cuda/attention_forward 4 5 6 7 8 9 --no-validate -s $hs -n $((768 / hs))
    run bench ./dev/cuda/attention_backward 4 5 6 7 8 9 10 11 --no-validate -s $hs -n $((768 / hs))
done
PYTHONUNBUFFERED=1 run vs_torch "$PY" dev/cuda/attention_vs_torch.py
exit $status
