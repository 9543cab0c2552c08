#!/usr/bin/env bash
# Training throughput, d12 (GPT-2 124M), bf16, T=1024, B in {16, 32, 64} (or $BATCHES), on Tiny
# Shakespeare; then the same with the per-phase breakdown (-pf 1), then PyTorch (torch.compile,
# SDPA flash, bf16 autocast) at the same settings, all in one device call. Logs in $OUT/bench/.
# PROFILE_BATCHES picks the batch sizes of the breakdown runs; TORCH=0 skips PyTorch; TORCH_BATCHES picks its batch sizes (torch.compile takes ~1 min per size).
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
    sed -n '/^GPU time per step/,$p' "$OUT/bench/profile_B$B.log"
done
[[ ${TORCH:-1} == 1 ]] && ${PYTHON:-python3} scripts/bench_torch_gpt.py --batch ${TORCH_BATCHES:-$BATCHES} --steps "$STEPS" 2>&1 |
    grep -vE "^\s*$|Warning|warn" | tee "$OUT/bench/pytorch.log"
