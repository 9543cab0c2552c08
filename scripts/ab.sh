#!/usr/bin/env bash
# usage: [B=64] [ROUNDS=2] [STEPS=30] [FLAGS="-tw 0;-tw 1"] bash scripts/ab.sh TREE [TREE ...]
#
# Training throughput A/B of source trees and/or flag sets, in one run on one GPU. A TREE is a git
# revision (exported with git archive into a temporary folder: HEAD~1, a hash, a branch), a folder
# holding a source tree, or "." (this working tree, uncommitted changes included). Each tree's
# train_gpt_bf16 is built, then every tree x flag set runs in turn, ROUNDS rounds of STEPS steps
# (d12 unless MODEL=..., B, T=1024, on Tiny Shakespeare's training file or DATA), so clock drift
# hits every side alike. Prints each run's median step, then per side the median of its runs'
# medians as tok/s, its ratio to the first side, and whether its per-step losses are the same bits
# as the first side's first run (a change that only reschedules work must keep them; runs of one
# side must always agree: determinism).
#   bash scripts/ab.sh HEAD~1 .                        the last commit against the working tree
#   FLAGS="-ov 0;-ov 1" bash scripts/ab.sh .            two flag sets of one tree
#   FLAGS="-tw 0;-tw 1" bash scripts/ab.sh 80ff566 .    2 trees x 2 flag sets
# Environment: MODEL B T STEPS ROUNDS WARMUP (defaults d12 64 1024 30 2 5), FLAGS (flag sets
# separated by ';', default one empty set), PF=1 (then a -pf 1 breakdown of each side), DATA,
# OUT (log folder, default out/ab), KEEP=1 (keep the exported trees), RUN_LIMIT (seconds a run may
# take, default 600).
set -uo pipefail
# Paths given in the environment or as arguments are relative to where the script was started.
here=$PWD
abs_path() { if [[ $1 == /* ]]; then echo "$1"; else echo "$here/$1"; fi; }
cd "$(dirname "$0")/.." || exit 1
export PATH=/usr/local/cuda/bin:$PATH
if [[ $# -eq 0 || $1 == -h || $1 == --help ]]; then sed -n '2,/^set -uo/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0; fi
OUT=${OUT:+$(abs_path "$OUT")}
OUT=${OUT:-out/ab}
MODEL=${MODEL:-d12} B=${B:-64} T=${T:-1024} STEPS=${STEPS:-30} ROUNDS=${ROUNDS:-2} WARMUP=${WARMUP:-5}
RUN_LIMIT=${RUN_LIMIT:-600}
PY=${PYTHON:-$(cat build/python 2>/dev/null || echo python3)}
DATA=${DATA:+$(abs_path "$DATA")}
DATA=${DATA:-data/tinyshakespeare/tiny_shakespeare_train.bin}
IFS=';' read -r -a flag_sets <<< "${FLAGS:-}"
[[ ${#flag_sets[@]} -gt 0 ]] || flag_sets=("")
for var in ROUNDS STEPS T B; do
    [[ ${!var} =~ ^[1-9][0-9]{0,6}$ ]] || { echo "error: $var must be a positive integer, got '${!var}'" >&2; exit 1; }
done
[[ $WARMUP =~ ^[0-9]{1,7}$ ]] || { echo "error: WARMUP must be an integer >= 0, got '$WARMUP'" >&2; exit 1; }
((STEPS > WARMUP)) || { echo "error: STEPS ($STEPS) must exceed WARMUP ($WARMUP)" >&2; exit 1; }
(($# * ${#flag_sets[@]} >= 2)) || { echo "error: one tree and one flag set: nothing to compare (give two trees or FLAGS=\"A;B\")" >&2; exit 1; }
mkdir -p "$OUT"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ab.XXXXXX") || exit 1
[[ ${KEEP:-0} == 1 ]] || trap 'rm -rf "$tmp"' EXIT

median() { sort -g | awk '{a[NR] = $1} END {if (NR) printf "%.2f\n", NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
median_step_ms() {  # a run's median step time after WARMUP steps
    grep -E '^step +[0-9]+/[0-9]+ \|' "$1" | grep -oE '\| [0-9.]+ ms \|' | awk -v w="$WARMUP" 'NR > w {print $2}' | median
}
tok_s() { awk -v b="$B" -v t="$T" -v ms="$1" 'BEGIN {if (ms > 0) printf "%.0f", b * t / (ms / 1000); else print "-"}'; }
losses_of() { grep -oE '^step +[0-9]+/[0-9]+ \| loss [0-9.]+' "$1" | awk '{print $NF}'; }

# Trees: name and folder of each; revisions exported, then each tree built.
names=() dirs=()
for tree in "$@"; do
    if [[ $tree == . ]]; then
        name=worktree dir=.
    elif [[ -d $(abs_path "$tree") ]]; then
        dir=$(abs_path "$tree")
        name=$(basename "$(cd "$dir" && pwd)")
    else
        rev=$(git rev-parse --short "$tree^{commit}" 2> /dev/null) || { echo "error: '$tree' is neither a folder nor a git revision" >&2; exit 1; }
        name=$rev dir=$tmp/$rev
        mkdir -p "$dir"
        git archive "$rev" | tar -x -C "$dir" || { echo "error: cannot export $rev" >&2; exit 1; }
    fi
    echo "building $name ($dir)"
    make -C "$dir" -j train_gpt_bf16 > "$OUT/build_$name.log" 2>&1 || { tail -n 20 "$OUT/build_$name.log"; exit 1; }
    names+=("$name") dirs+=("$(cd "$dir" && pwd)")
done
if [[ ! -f $DATA ]]; then
    "$PY" data/prepare_tinyshakespeare.py > "$OUT/data.log" 2>&1 || { tail -n 5 "$OUT/data.log"; exit 1; }
fi
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,power.limit --format=csv,noheader
sides=()  # "tree index|flags"
for i in "${!names[@]}"; do
    for flags in "${flag_sets[@]}"; do sides+=("$i|$flags"); done
done
label() { local i=${1%%|*} f=${1#*|}; echo "${names[$i]}${f:+ [$f]}"; }
file() { local i=${1%%|*} f=${1#*|}; echo "$OUT/${names[$i]}$(echo "$f" | tr -c 'a-zA-Z0-9\n' '_')_$2.log"; }

# All runs read the token file from here (-i), so every tree trains on the same data.
status=0  # 1 when a run failed or printed no step times
for r in $(seq "$ROUNDS"); do
    for s in "${sides[@]}"; do
        i=${s%%|*} flags=${s#*|} log=$(file "$s" "$r")
        # shellcheck disable=SC2086  # a flag set is several flags
        timeout "$RUN_LIMIT" "${dirs[$i]}/train_gpt_bf16" -e "$MODEL" -b "$B" -t "$T" -x "$STEPS" -v 0 -s 0 -i "$DATA" $flags > "$log" 2>&1
        rc=$? ms=$(median_step_ms "$log")
        echo "round $r $(label "$s"): rc $rc, median step ${ms:--} ms, final loss $(losses_of "$log" | tail -n 1)"
        [[ $rc == 0 && -n $ms ]] || { status=1; tail -n 3 "$log"; }
    done
done

echo
echo "| side | runs (tok/s) | median tok/s | vs first | losses: same bits as the first side |"
echo "|---|---|---|---|---|"
first_losses=$(losses_of "$(file "${sides[0]}" 1)")
base=
for s in "${sides[@]}"; do
    runs='' same=yes
    for r in $(seq "$ROUNDS"); do
        log=$(file "$s" "$r")
        runs+="$(tok_s "$(median_step_ms "$log")") "
        [[ -n $first_losses && $(losses_of "$log") == "$first_losses" ]] || same=NO
    done
    [[ -n $first_losses ]] || same="NO (no losses)"
    ms=$(for r in $(seq "$ROUNDS"); do median_step_ms "$(file "$s" "$r")"; done | median)
    tok=$(tok_s "$ms")
    base=${base:-$tok}
    echo "| $(label "$s") | ${runs% } | $tok | $(awk -v a="$tok" -v b="$base" 'BEGIN {if (b > 0) printf "%+.2f%%", 100 * (a / b - 1)}') | $same |"
done
echo "($MODEL B=$B T=$T bf16; median over $ROUNDS runs of each run's median step after $WARMUP warm-up steps of $STEPS)"

[[ ${PF:-0} == 1 ]] && for s in "${sides[@]}"; do
    i=${s%%|*} flags=${s#*|} log=$(file "$s" pf)
    # shellcheck disable=SC2086
    timeout "$RUN_LIMIT" "${dirs[$i]}/train_gpt_bf16" -e "$MODEL" -b "$B" -t "$T" -x 12 -v 0 -s 0 -i "$DATA" -pf 1 $flags > "$log" 2>&1
    echo
    echo "$(label "$s"), -pf 1: $(grep -E '^done' "$log")"
    sed -n '/^GPU time per step/,$p' "$log"
done
exit "$status"
