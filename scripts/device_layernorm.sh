#!/usr/bin/env bash
# Runs the LayerNorm laboratory on a GPU machine, from the repo root: builds the lab programs and the
# C API library, validates every version (--check), benchmarks both dtypes at the performance-bar
# shapes (N = 65536, C in 768 1024 1600 2048 4096), and runs the PyTorch side-by-side.
# Logs go to $OUT/layernorm/*.log (OUT defaults to ./out). FWD_VERSIONS / BWD_VERSIONS limit the
# benchmarked versions (default: all); SANITIZE=1 adds a compute-sanitizer memcheck of the header's
# backward (version 8) over the validation shapes; TORCH=0 skips the PyTorch side-by-side.
#   usage: bash scripts/device_layernorm.sh [-h]
source "$(dirname "$0")/device_lab.sh" layernorm "$@"
run build make -j16 dev/cuda/layernorm_forward dev/cuda/layernorm_backward build/liblayernorm_capi.so
run check ./dev/cuda/layernorm_forward --check
run check ./dev/cuda/layernorm_backward --check
[[ -n "${SANITIZE:-}" ]] && run sanitizer timeout 200 compute-sanitizer --tool memcheck --error-exitcode 1 ./dev/cuda/layernorm_backward 8 --check
for dt in fp32 bf16; do
    run forward ./dev/cuda/layernorm_forward ${FWD_VERSIONS:-} --dtype $dt
    run forward ./dev/cuda/layernorm_forward --residual --dtype $dt
    run backward ./dev/cuda/layernorm_backward ${BWD_VERSIONS:-} --dtype $dt
done
[[ ${TORCH:-1} == 1 ]] && PYTHONUNBUFFERED=1 run vs_torch "$PY" dev/cuda/layernorm_vs_torch.py
exit $status
