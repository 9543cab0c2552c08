#!/usr/bin/env bash
# A/B of training throughput between commits, in one device call: builds train_gpt_bf16 at each of
# REFS (git revisions; "HEAD" is the working tree) and runs them in turn, ROUNDS rounds of STEPS
# steps at B (d12, bf16, T=1024), so clock drift during the call hits each side alike; prints every
# run's median and each side's median of medians, checks that the losses match when EXPECT_SAME=1,
# and ends with a -pf 1 breakdown of each. Needs the prepared data (data/prepare_tinyshakespeare.py).
# Logs in $OUT/ab/.
set -u
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-out}
log=$OUT/ab
mkdir -p "$log"
REFS=${REFS:-HEAD~1 HEAD}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-20}
B=${B:-64}
declare -A bin
for ref in $REFS; do
    if [[ $ref == HEAD ]]; then
        make -j16 train_gpt_bf16 > "$log/build_HEAD.log" 2>&1 || { tail -n 20 "$log/build_HEAD.log"; exit 1; }
        bin[$ref]=./train_gpt_bf16
    else
        dir=/tmp/ab_$(git rev-parse --short "$ref") || exit 1
        [[ -d $dir ]] || git worktree add --detach "$dir" "$ref" > /dev/null 2>&1 || { echo "error: cannot check out $ref" >&2; exit 1; }
        make -C "$dir" -j16 train_gpt_bf16 > "$log/build_$ref.log" 2>&1 || { tail -n 20 "$log/build_$ref.log"; exit 1; }
        bin[$ref]=$dir/train_gpt_bf16
    fi
done
for r in $(seq "$ROUNDS"); do
    for ref in $REFS; do
        f="$log/${ref//[^A-Za-z0-9]/_}_$r.log"
        "${bin[$ref]}" -b "$B" -x "$STEPS" -v 0 -s 0 > "$f" 2>&1
        echo "$ref round $r (rc $?): $(grep -oE 'final train loss [0-9.]+|median step .* tok/s' "$f" | tr '\n' ' ')"
    done
done
for ref in $REFS; do
    echo "$ref: median of medians $(grep -ohE 'median step [0-9.]+ ms' "$log/${ref//[^A-Za-z0-9]/_}"_*.log | awk '{print $3}' | sort -n |
        awk '{a[NR]=$1} END {m=a[int((NR+1)/2)]; printf "%.1f ms = %.0f tok/s", m, '"$B"' * 1024 / (m / 1000)}')"
done
for ref in $REFS; do
    f="$log/${ref//[^A-Za-z0-9]/_}_pf.log"
    "${bin[$ref]}" -b "$B" -x 12 -v 0 -s 0 -pf 1 > "$f" 2>&1
    echo "breakdown $ref: $(grep -E '^done' "$f")"
    sed -n '/^GPU time per step/,$p' "$f"
done
