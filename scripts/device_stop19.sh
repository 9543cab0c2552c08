#!/usr/bin/env bash
# Stop 19's device calls, each fitting one 10-minute call. Logs under $OUT/stop19/, all of them in
# $OUT/stop19_partN.tgz (scripts/device_lib.sh). PART 1-3 ran the code of commit 81b466b (train_gpt
# -th, lab version 14) and PART 4 that of 8a23d89 (the LM head's weight gradient on the weight
# stream) and PART 5 that of f9ded23 (lab version 14: dq's loads two tiles ahead) and of f9b1ee7
# (LAB=attention_forward VERSIONS="11 13 14": split row max and sum), none kept: check the commit out
# to run them again.
#   PART=1  B=64 training A/B (scripts/device_flag_ab.sh, interleaved rounds; the losses must be the
#           same bits): -tw 0, -th 1, -tw 1, -tw 1 -th 1 (FLAGSETS to change), then what each plan's
#           hot timing kept.
#   PART=2  the fused attention backward (version 14): the lab's versions 13 and 14 validated (and 14
#           against 13 bit for bit at small rings) and benchmarked, 14 at several --lag/--slots, a
#           memcheck of 14; then a training A/B of source trees (AB_DIRS, default .carry/ab/base and the
#           working tree; scripts/device_ab_dirs.sh) at B=64, -tw 0 (AB_FLAGS).
#   PART=3  version 14 at larger rings (RINGS: "lag slots;..."), beside version 13.
#   PART=4  training A/B of source trees x flags (AB_DIRS, default .carry/ab/base and the working tree;
#           AB_FLAGS, default -ov 1 / -ov 0; scripts/device_ab_dirs.sh), then test/test_gpt.sh.
#   PART=5  an attention lab's versions (LAB, default attention_backward; VERSIONS, default 13 14)
#           validated and benchmarked, three rounds.
#   PART=6  Nsight Compute on the header's attention forward (lab version 11, B=8): which pipes are busy
#           (tensor cores against the exponentials' XU pipe), stalls; then the attention beside SDPA.
#   PART=7  closing figures: 200 steps of bf16 and of fp32 from the same seed (validation every 50: bf16
#           should track fp32), training throughput at B=32/64 beside PyTorch (scripts/bench_train.sh,
#           the breakdown at 64), B=64 with -tw 1.
set -u
PARTS=1234567
NAME=stop19
source "$(dirname "$0")/device_lib.sh"
ring_sweep() {  # ring_sweep "LAG SLOTS;LAG SLOTS;...": version 14's time at each, version 13's first
    echo "v13: $(timeout 60 ./dev/cuda/attention_backward 13 --no-validate | grep -E "^  13 ")"
    local rings ring lag slots
    IFS=';' read -r -a rings <<<"$1"
    for ring in "${rings[@]}"; do
        read -r lag slots <<<"$ring"
        echo "v14 --lag $lag --slots $slots: $(timeout 60 ./dev/cuda/attention_backward 14 --no-validate --lag "$lag" --slots "$slots" | grep -E "^  14 ")"
    done
}
if [[ $PART == 1 ]]; then
    OUT="$log" FLAGSETS="${FLAGSETS:--tw 0;-th 1;-tw 1;-tw 1 -th 1}" ROUNDS=${ROUNDS:-2} STEPS=20 BATCHES=64 PF=0 \
        timeout $((570 - (SECONDS - started))) bash scripts/device_flag_ab.sh 2>&1 | grep -E "^B="
    for f in "$log"/flag_ab/B64_*th1*_1.log; do
        echo "== $f"
        grep -E "^matmul tuned.*hot" "$f" | sed -E 's/^matmul tuned //; s/: [0-9]+ candidates.*\| hot/ | hot/' | cut -c1-200
    done
elif [[ $PART == 2 ]]; then
    step attn_v13_v14 240 ./dev/cuda/attention_backward 13 14
    grep -E "v14 = v13|FAIL|^  1[34] " "$log/attn_v13_v14.log" | grep -vE "bitwise identical$" | head -n 40
    ring_sweep "${RINGS:-0 4;2 8;4 8;8 16;16 24;24 32}"
    step memcheck 120 compute-sanitizer --tool memcheck --error-exitcode 1 ./dev/cuda/attention_backward 14 --no-validate -b 2 -n 12 -t 300 --slots 3 --lag 2
    grep -E "ERROR SUMMARY" "$log/memcheck.log"
    OUT="$log" DIRS="${AB_DIRS:-.carry/ab/base .}" FLAGS="${AB_FLAGS:--tw 0}" PF=0 timeout $((590 - (SECONDS - started))) \
        bash scripts/device_ab_dirs.sh
elif [[ $PART == 3 ]]; then
    ring_sweep "${RINGS:-32 48;32 64;40 80;48 96;64 128;96 192;128 384}"
elif [[ $PART == 4 ]]; then
    OUT="$log" DIRS="${AB_DIRS:-.carry/ab/base .}" FLAGS="${AB_FLAGS:--ov 1;-ov 0}" PF=0 timeout 300 bash scripts/device_ab_dirs.sh
    step test_gpt $((590 - (SECONDS - started))) bash test/test_gpt.sh
    grep -E "weight stream|determinism" "$log/test_gpt.log" | sort | uniq -c
elif [[ $PART == 5 ]]; then
    # shellcheck disable=SC2086  # the version list is split into words on purpose
    lab=./dev/cuda/${LAB:-attention_backward}
    step attn_versions 200 "$lab" ${VERSIONS:-13 14}
    grep -E "^  [0-9]+ +bf16" "$log/attn_versions.log"
    for r in 2 3; do
        # shellcheck disable=SC2086
        timeout 60 "$lab" ${VERSIONS:-13 14} --no-validate | grep -E "^  [0-9]+ +bf16"
    done
elif [[ $PART == 6 ]]; then
    ncu --query-metrics --chip gh100 2>/dev/null | grep -iE "^sm__(inst_executed_pipe_(xu|fma|alu|fp16|uniform)|pipe_(tensor|xu|fma|alu|shared)[a-z_]*cycles_active)" |
        awk '{print $1}' > "$log/metric_names.txt"
    metrics=$(grep -E "pipe_xu|pipe_fma|pipe_alu|tensor" "$log/metric_names.txt" | sed 's/$/.avg.pct_of_peak_sustained_active/' | paste -sd,)
    echo "metrics: $metrics"
    step ncu_forward 240 ncu --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
        --section InstructionStats --section Occupancy --print-details all ${metrics:+--metrics "$metrics"} -k "regex:forward_wgmma" -c 2 \
        ./dev/cuda/attention_forward 11 --no-validate -b 8
    grep -vE "^==PROF==|^\s*$" "$log/ncu_forward.log" | grep -E "pipe|Pipe|Throughput|Duration|Stall|stall|Issue|Occupancy|Registers|Eligible|Active Warps|pct" | head -n 80
    timeout 120 "$PY" dev/cuda/attention_vs_torch.py > "$log/attention_vs_torch.log" 2>&1
    echo "--- attention beside SDPA: exit $?"; grep -E "^(ours|torch) |ours / torch|agreement" "$log/attention_vs_torch.log"
elif [[ $PART == 7 ]]; then
    for p in bf16 fp32; do  # same seed: bf16 should track fp32's validation loss
        timeout 150 ./train_gpt_$p -x 200 -v 50 -s 0 > "$log/curve_$p.log" 2>&1
        echo "$p 200 steps (rc $?): $(grep -E "^step +[0-9]+ \| val loss" "$log/curve_$p.log" | awk '{printf "%s:%s ", $2, $NF}') $(grep -oE "median step .* tok/s" "$log/curve_$p.log")"
    done
    OUT="$log" BATCHES="32 64" STEPS=30 PROFILE_BATCHES=64 GELU_BATCH=none RECOMPUTE_BATCH=none TORCH_BATCHES="32 64" \
        timeout $((500 - (SECONDS - started))) bash scripts/bench_train.sh 2>&1 | tail -n 40
    timeout $((590 - (SECONDS - started))) ./train_gpt_bf16 -b 64 -x 30 -v 0 -s 0 -tw 1 > "$log/ours_B64_tw1.log" 2>&1
    echo "-tw 1 B=64 (rc $?): $(grep -E "^done" "$log/ours_B64_tw1.log")"
fi
echo "done at $((SECONDS - started)) s"
