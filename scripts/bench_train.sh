#!/usr/bin/env bash
# Training throughput, d12 (GPT-2 124M), bf16, T=1024, B in {16, 32, 64} (or $BATCHES), on Tiny
# Shakespeare; then the same with the per-phase breakdown (-pf 1), then PyTorch (torch.compile,
# SDPA flash, bf16 autocast) at the same settings, all in one device call. Logs in $OUT/bench/.
# PROFILE_BATCHES picks the batch sizes of the breakdown runs; TORCH=0 skips PyTorch; TORCH_BATCHES picks its batch sizes (torch.compile takes ~1 min per size).
# GELU paths: a breakdown with the separate GELU kernels (-ge 0) at GELU_BATCH (default 16) beside the
# default's (fused, -ge 2), and the memory of -r 0 (default) against -r 1 (GELU recomputed) at
# RECOMPUTE_BATCH (default 64; the -r 0 numbers come from the throughput run when it had that B).
# GELU_BATCH=none / RECOMPUTE_BATCH=none skip those runs.
# Needs the prepared data (make train prepares it; or data/prepare_tinyshakespeare.py).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT/bench"
BATCHES=${BATCHES:-16 32 64}
STEPS=${STEPS:-30}
make -j16 train_gpt_bf16 >/dev/null || exit 1
for B in $BATCHES; do
    ./train_gpt_bf16 -e d12 -b "$B" -t 1024 -x "$STEPS" -v 0 -s 0 > "$OUT/bench/ours_B$B.log" 2>&1
    grep -E "^(memory|done)" "$OUT/bench/ours_B$B.log" | sed "s/^/ours B=$B: /"
    tail -n 2 "$OUT/bench/ours_B$B.log" | grep -i error
done
for B in ${PROFILE_BATCHES:-$BATCHES}; do
    ./train_gpt_bf16 -e d12 -b "$B" -t 1024 -x 12 -v 0 -s 0 -pf 1 > "$OUT/bench/profile_B$B.log" 2>&1
    echo "phase breakdown B=$B:"
    grep -E "^(done|GELU fusion)" "$OUT/bench/profile_B$B.log"
    sed -n '/^GPU time per step/,$p' "$OUT/bench/profile_B$B.log"
done
GB=${GELU_BATCH:-16}
[[ $GB != none ]] && {
    ./train_gpt_bf16 -e d12 -b "$GB" -t 1024 -x 12 -v 0 -s 0 -pf 1 -ge 0 > "$OUT/bench/profile_B${GB}_ge0.log" 2>&1
    echo "phase breakdown B=$GB, -ge 0 (separate GELU kernels, against the fused default above):"
    grep -E "^done" "$OUT/bench/profile_B${GB}_ge0.log"
    sed -n '/^GPU time per step/,$p' "$OUT/bench/profile_B${GB}_ge0.log"
}
RB=${RECOMPUTE_BATCH:-64}
[[ $RB != none ]] && for R in 0 1; do
    log="$OUT/bench/ours_B$RB.log"
    if [[ $R == 1 || " $BATCHES " != *" $RB "* ]]; then
        log="$OUT/bench/memory_B${RB}_r$R.log"
        ./train_gpt_bf16 -e d12 -b "$RB" -t 1024 -x 8 -v 0 -s 0 -r "$R" > "$log" 2>&1
    fi
    grep -E "^(memory|done)" "$log" | sed "s/^/-r $R B=$RB: /"
    tail -n 2 "$log" | grep -i error
done
[[ ${TORCH:-1} == 1 ]] && ${PYTHON:-python3} scripts/bench_torch_gpt.py --batch ${TORCH_BATCHES:-$BATCHES} --steps "$STEPS" 2>&1 |
    grep -vE "^\s*$|Warning|warn" | tee "$OUT/bench/pytorch.log"
