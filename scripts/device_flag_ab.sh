#!/usr/bin/env bash
# A/B of train_gpt_bf16's runtime flags in one device call: FLAGSETS (separated by ';') run in turn,
# ROUNDS rounds of STEPS steps at each B in BATCHES (d12, bf16, T=1024). Per flag set and B: every
# run's median step, the "median of medians" (the lower middle value), and whether its per-step
# losses are the same bits as the first flag set's (flags that change only the schedule must keep
# them). Then a -pf 1 breakdown of each flag set at the last B. Run from the repository root, with
# the data prepared (data/prepare_tinyshakespeare.py). Logs in $OUT/flag_ab/. PF=0 skips the breakdowns.
set -u
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-out}
log=$OUT/flag_ab
mkdir -p "$log"
FLAGSETS=${FLAGSETS:?FLAGSETS: flag sets separated by ';', e.g. "-ov 0;-ov 1"}
ROUNDS=${ROUNDS:-2}
STEPS=${STEPS:-20}
BATCHES=${BATCHES:-64}
make -j16 train_gpt_bf16 > "$log/build.log" 2>&1 || { tail -n 20 "$log/build.log"; exit 1; }
IFS=';' read -r -a sets <<<"$FLAGSETS"
name_of() { echo "${1// /}" | tr -c 'a-zA-Z0-9\n' '_'; }
losses_of() { grep -oE '^step +[0-9]+/[0-9]+ \| loss [0-9.]+' "$1" | awk '{print $NF}'; }
for B in $BATCHES; do
    for r in $(seq "$ROUNDS"); do
        for flags in "${sets[@]}"; do
            f="$log/B${B}_$(name_of "$flags")_$r.log"
            # shellcheck disable=SC2086 # the flag set is split into words on purpose
            ./train_gpt_bf16 -b "$B" -x "$STEPS" -v 0 -s 0 $flags > "$f" 2>&1
            echo "B=$B [$flags] round $r (rc $?): $(grep -oE 'final train loss [0-9.]+|median step .* tok/s' "$f" | tr '\n' ' ')"
        done
    done
    first_losses=$(losses_of "$log/B${B}_$(name_of "${sets[0]}")_1.log")
    for flags in "${sets[@]}"; do
        n=$(name_of "$flags")
        same=yes
        [[ -n $first_losses ]] || same="NO (no losses to compare)"
        for f in "$log/B${B}_${n}"_[0-9]*.log; do [[ $(losses_of "$f") == "$first_losses" ]] || same=NO; done
        echo "B=$B [$flags]: median of medians $(grep -ohE 'median step [0-9.]+ ms' "$log/B${B}_${n}"_[0-9]*.log |
            awk '{print $3}' | sort -n | awk '{a[NR]=$1} END {m=a[int((NR+1)/2)]; printf "%.1f ms = %.0f tok/s", m, '"$B"' * 1024 / (m / 1000)}'); losses bit-identical to [${sets[0]}] round 1: $same"
    done
done
[[ ${PF:-1} == 1 ]] && for flags in "${sets[@]}"; do
    f="$log/pf_B${B}_$(name_of "$flags").log"
    # shellcheck disable=SC2086
    ./train_gpt_bf16 -b "$B" -x 12 -v 0 -s 0 -pf 1 $flags > "$f" 2>&1
    echo "breakdown B=$B [$flags]: $(grep -E '^done' "$f")"
    sed -n '/^GPU time per step/,$p' "$f" | grep -vE ' 0\.0[0-9]+ ms'
done
