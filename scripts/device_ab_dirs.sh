#!/usr/bin/env bash
# A/B of training throughput between source trees exported into folders (git archive REV | tar -x -C
# DIR; "." is the working tree), in one device call, when the device's copy of the repository may not
# hold the commits: builds train_gpt_bf16 in each of DIRS and runs them in turn, ROUNDS rounds of
# STEPS steps at B (d12, bf16, T=1024), every tree x flag set (FLAGS, ';'-separated; default: none)
# within a round, then a -pf 1 breakdown of each (PF=0: not). The "median of medians" is the lower
# middle value: with two rounds, the faster one. The losses of one flag set should be the same bits
# across trees when a change only reschedules work. Data: prepared once in the first folder
# (GPT_MIRROR), linked into the others. Logs in $OUT/abd/.
set -u
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-out}
log=$OUT/abd
mkdir -p "$log"
DIRS=${DIRS:?DIRS: folders with the source trees to compare}
ROUNDS=${ROUNDS:-2}
STEPS=${STEPS:-20}
B=${B:-64}
IFS=';' read -r -a flag_sets <<<"${FLAGS:-}"
[[ ${#flag_sets[@]} == 0 ]] && flag_sets=("")
name_of() { echo "$(basename "$(cd "$1" && pwd)")$(echo "$2" | tr -d ' ')"; }
first=
for d in $DIRS; do
    n=$(basename "$(cd "$d" && pwd)")
    make -C "$d" -j16 train_gpt_bf16 > "$log/build_$n.log" 2>&1 || { tail -n 20 "$log/build_$n.log"; exit 1; }
    if [[ -z $first ]]; then
        first=$d
        [[ -f $d/data/tinyshakespeare/tiny_shakespeare_train.bin ]] ||
            (cd "$d" && python3 data/prepare_tinyshakespeare.py > "$log/data.log" 2>&1) || { tail -n 5 "$log/data.log"; exit 1; }
    else
        mkdir -p "$d/data" && ln -sfn "$(cd "$first" && pwd)/data/tinyshakespeare" "$d/data/tinyshakespeare"
        ln -sfn "$(cd "$first" && pwd)/data/gpt2_tokenizer.bin" "$d/data/gpt2_tokenizer.bin"
    fi
done
for r in $(seq "$ROUNDS"); do
    for d in $DIRS; do
        for flags in "${flag_sets[@]}"; do
            n=$(name_of "$d" "$flags")
            # shellcheck disable=SC2086  # the flag set is split into words on purpose
            (cd "$d" && ./train_gpt_bf16 -b "$B" -x "$STEPS" -v 0 -s 0 $flags) > "$log/${n}_$r.log" 2>&1
            echo "$n round $r (rc $?): $(grep -oE 'final train loss [0-9.]+|median step .* tok/s' "$log/${n}_$r.log" | tr '\n' ' ')"
        done
    done
done
for d in $DIRS; do
    for flags in "${flag_sets[@]}"; do
        n=$(name_of "$d" "$flags")
        echo "$n: median of medians $(grep -ohE 'median step [0-9.]+ ms' "$log/${n}"_[0-9]*.log | awk '{print $3}' | sort -n |
            awk '{a[NR]=$1} END {m=a[int((NR+1)/2)]; printf "%.1f ms = %.0f tok/s", m, '"$B"' * 1024 / (m / 1000)}')"
    done
done
[[ ${PF:-1} == 1 ]] && for d in $DIRS; do
    n=$(basename "$(cd "$d" && pwd)")
    (cd "$d" && ./train_gpt_bf16 -b "$B" -x 12 -v 0 -s 0 -pf 1) > "$log/${n}_pf.log" 2>&1
    echo "breakdown $n: $(grep -E '^done' "$log/${n}_pf.log")"
    sed -n '/^GPU time per step/,$p' "$log/${n}_pf.log" | grep -vE ' 0\.0[0-9]+ ms'
done
exit 0
