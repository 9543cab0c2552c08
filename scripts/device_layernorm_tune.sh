#!/usr/bin/env bash
# LayerNorm forward tuning experiment on a GPU machine: the header's kernel (lab version 5) at the
# benchmark shapes with every warps-per-row choice (--wpr, 0 = the header's), with `out` placed right
# at the start of its allocation and 1025 KiB into it (--out-offset: does the distance between the
# input and output addresses change the bandwidth?). Each run validates what it benchmarks first.
# Logs go to $OUT/layernorm_tune/*.log (OUT defaults to ./out); a summary table is printed.
#   usage: bash scripts/device_layernorm_tune.sh [-h]
source "$(dirname "$0")/device_lab.sh" layernorm_tune "$@"
run build make -j16 dev/cuda/layernorm_forward
for dt in fp32 bf16; do
    for off in 0 1025; do
        for w in 0 1 2 4 8 16; do
            flags=(--dtype $dt --out-offset $off)
            [[ $w == 0 ]] || flags+=(--wpr $w)
            ./dev/cuda/layernorm_forward 5 "${flags[@]}" > "$logs/run.log" 2>&1 || { status=1; cat "$logs/run.log"; }
            cat "$logs/run.log" >> "$logs/all.log"
            # one line per (dtype, offset, wpr): % of copy at each C, or the note when --wpr is too small
            echo "$dt off=$off wpr=$w: $(grep -E "^  5 " "$logs/run.log" | awk '{printf "C%s %s%s ", $3, $6, ($7 ? "*" : "")}')"
        done
    done
done
rm -f "$logs/run.log"
echo "(* = --wpr below what the row needs: the header's choice ran)"
exit $status
