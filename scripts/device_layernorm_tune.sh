#!/usr/bin/env bash
# LayerNorm forward tuning experiment on a GPU machine: the header's kernel (lab version 5) at the
# benchmark shapes under each variant in $VARIANTS (lab flags, one variant per ';'): warps per row
# (--wpr), streaming instead of plain loads (--stream-loads), the smallest block (--min-block 32|256),
# and where `out` lies (--out-offset: does the distance between the input and output addresses change
# the bandwidth?). Each run validates what it benchmarks first. Logs go to
# $OUT/layernorm_tune/*.log (OUT defaults to ./out); a summary line per (dtype, variant) is printed.
# Default variants: out at offset 0 and 1025 KiB with every --wpr (the stop-10 experiment).
#   usage: [VARIANTS='--wpr 2;--stream-loads'] [DTYPES='fp32 bf16'] bash scripts/device_layernorm_tune.sh [-h]
source "$(dirname "$0")/device_lab.sh" layernorm_tune "$@"
run build make -j16 dev/cuda/layernorm_forward
if [[ -z "${VARIANTS:-}" ]]; then
    VARIANTS=""
    for off in 0 1025; do
        for w in 0 1 2 4 8 16; do
            v="--out-offset $off"
            [[ $w == 0 ]] || v+=" --wpr $w"
            VARIANTS+="$v;"
        done
    done
fi
IFS=';' read -ra variants <<< "$VARIANTS"
for dt in ${DTYPES:-fp32 bf16}; do
    for v in "${variants[@]}"; do
        [[ -n "${v// /}" ]] || v=" "
        # shellcheck disable=SC2086  # a variant is several flags
        ./dev/cuda/layernorm_forward 5 --dtype $dt $v > "$logs/run.log" 2>&1 || { status=1; cat "$logs/run.log"; }
        cat "$logs/run.log" >> "$logs/all.log"
        # one line per (dtype, variant): % of copy at each C, or the note when --wpr is too small
        echo "$dt [$v]: $(grep -E "^  5 " "$logs/run.log" | awk '{printf "C%s %s%s ", $3, $6, ($7 ? "*" : "")}')"
    done
done
rm -f "$logs/run.log"
echo "(* = the variant did not apply there, e.g. --wpr below what the row needs: the header's choice ran)"
exit $status
