#!/usr/bin/env bash
# What torch.compile's LayerNorm forward is, against ours: saves the Triton kernels TorchInductor
# generates for F.layer_norm at N = 65536 and the benchmark C values (fp32 and bf16) with the
# configurations its autotuner kept, then profiles compile's kernel and ours at fp32 C = 1024, 2048
# and 4096 under Nsight Compute (launch shape, occupancy, DRAM throughput; clocks left alone).
# Logs go to $OUT/inductor/ (OUT defaults to ./out), the kernels to $OUT/inductor/kernels.tgz (the
# device returns few files).
#   usage: bash scripts/device_layernorm_inductor.sh [-h]
source "$(dirname "$0")/device_lab.sh" inductor "$@"
run build make -j16 build/liblayernorm_capi.so
cache=$(mktemp -d)
TORCHINDUCTOR_CACHE_DIR=$cache run dump timeout 300 "$PY" dev/cuda/layernorm_inductor_probe.py --save-dir "$logs/kernels"
sections=(--section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis)
for C in ${NCU_SHAPES:-1024 2048 4096}; do
    TORCHINDUCTOR_CACHE_DIR=$cache run ncu timeout 200 ncu --clock-control none --profile-from-start off "${sections[@]}" \
        "$PY" dev/cuda/layernorm_inductor_probe.py --ncu-shape "$C" --dtype fp32
done
tar -czf "$logs/kernels.tgz" -C "$logs" kernels && rm -rf "$logs/kernels" "$cache"
exit $status
