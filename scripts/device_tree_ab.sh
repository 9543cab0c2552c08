#!/usr/bin/env bash
# A/B of source trees x train_gpt_bf16 flag sets in one device call: each tree in AB_DIRS ("." is the
# working tree; others exported by `git archive` into a carried folder) is built, then AB_ROUNDS rounds
# of AB_STEPS steps at B=AB_B (d12, T=1024), every tree x flag set (AB_FLAGS, ';'-separated) in turn
# within a round. Prints each run's final loss and median step; the losses of the same flags should be
# the same bits across trees when a change only reschedules work. Run from the repository root with the
# data prepared. Logs in $OUT/tree_ab/.
set -u
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-out}
log=$OUT/tree_ab
mkdir -p "$log"
IFS=';' read -r -a ab_flags <<<"${AB_FLAGS:--tw 0}"
for d in ${AB_DIRS:?AB_DIRS: source trees}; do
    make -C "$d" -j16 train_gpt_bf16 > "$log/build_$(basename "$(cd "$d" && pwd)").log" 2>&1 ||
        { tail -n 20 "$log/build_$(basename "$(cd "$d" && pwd)").log"; exit 1; }
    [[ $d == . ]] || { mkdir -p "$d/data" && ln -sfn "$PWD/data/tinyshakespeare" "$d/data/tinyshakespeare"; }
done
for r in $(seq "${AB_ROUNDS:-2}"); do
    for d in $AB_DIRS; do
        for flags in "${ab_flags[@]}"; do
            name="$(basename "$(cd "$d" && pwd)")$(echo "$flags" | tr -d ' ')_$r"
            # shellcheck disable=SC2086  # the flag set is split into words on purpose
            (cd "$d" && timeout 150 ./train_gpt_bf16 -b "${AB_B:-64}" -x "${AB_STEPS:-20}" -v 0 -s 0 $flags) > "$log/$name.log" 2>&1
            echo "$d [$flags] round $r (rc $?): $(grep -oE 'final train loss [0-9.]+|median step .* tok/s' "$log/$name.log" | tr '\n' ' ')"
        done
    done
done
