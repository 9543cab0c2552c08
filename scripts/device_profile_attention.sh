#!/usr/bin/env bash
# Hardware-counter profile (Nsight Compute) of the attention backward, ours against PyTorch's SDPA flash
# backend, at B=8 NH=12 T=1024 HS=64 bf16 (the per-sequence work of the training shape; B is small so
# each kernel replays quickly). Says where our backward loses to SDPA's: tensor-core use, stalls,
# occupancy, shared-memory traffic. Clocks are left alone (--clock-control none, see METHOD.md).
# Logs go to $OUT/profile/*.log (OUT defaults to ./out).
#   usage: bash scripts/device_profile_attention.sh [-h]
source "$(dirname "$0")/device_lab.sh" profile "$@"
run build make -j16 dev/cuda/attention_backward build/libattention_capi.so
sections=(--section SpeedOfLight --section LaunchStats --section Occupancy --section ComputeWorkloadAnalysis
          --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section InstructionStats)
# Ours: the header's backward (lab version 10): the D = rowsum(dO * O) kernel, dk/dv, dq.
run ours timeout 200 ncu --clock-control none "${sections[@]}" -k "regex:backward_(dot|dkdv|dq)_kernel" -c 3 \
    ./dev/cuda/attention_backward 11 --no-validate -b 8
# PyTorch's flash backward kernels (names contain flash_bwd), from the side-by-side script.
run sdpa timeout 300 ncu --clock-control none "${sections[@]}" -k "regex:flash_bwd" -c 3 \
    "$PY" dev/cuda/attention_vs_torch.py -b 8
exit $status
