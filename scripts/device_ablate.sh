#!/usr/bin/env bash
# Ablation timing (stop 20): what each kernel family costs a B=64 step under the power cap, measured by
# leaving it out. Needs the GPT_ABLATE hook of commit 660b21c (train_gpt.cu, reverted on main): from
# step 4 on the named kernels are skipped, so the losses and gradients are wrong; only the step time
# means anything. Each variant runs ROUNDS times (interleaved), STEPS steps, median step after warm-up.
#   usage: ROUNDS=2 STEPS=16 VARIANTS="dbqkv,dbfc afwd ..." bash scripts/device_ablate.sh
set -u
cd "$(dirname "$0")/.." || exit 1
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-out}
log=$OUT/ablate
mkdir -p "$log"
trap "tar -czf '$OUT/ablate.tgz' -C '$OUT' ablate" EXIT
export GPT_MIRROR=${GPT_MIRROR:-.carry/mirror}
ROUNDS=${ROUNDS:-2}
STEPS=${STEPS:-16}
VARIANTS=${VARIANTS:-"none dbqkv,dbfc dbqkv dbfc afwd abwd cls lnb lnf aux dgelu res head opt"}
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
make -j16 train_gpt_bf16 > "$log/build.log" 2>&1 || { tail -n 20 "$log/build.log"; exit 1; }
python3 data/prepare_tinyshakespeare.py > "$log/data.log" 2>&1 || tail -n 5 "$log/data.log"
for r in $(seq "$ROUNDS"); do
    for v in $VARIANTS; do
        GPT_ABLATE=$v ./train_gpt_bf16 -b 64 -x "$STEPS" -v 0 -s 0 > "$log/${v//,/+}_$r.log" 2>&1
        echo "round $r [$v] rc $?: $(grep -oE 'median step [0-9.]+ ms = [0-9]+ tok/s' "$log/${v//,/+}_$r.log")"
    done
done
for v in $VARIANTS; do
    echo "[$v] $(grep -ohE 'median step [0-9.]+ ms' "$log/${v//,/+}"_*.log | awk '{print $3}' | sort -n | tr '\n' ' ')"
done
