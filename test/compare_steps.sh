# Sourced by test/test_multi_gpu.sh, test/test_resume.sh and test/test_fp8.sh (not a test itself:
# run_tests.sh runs test_*.sh): two train_gpt runs' step and validation lines compared within a
# relative bound or byte for byte, and a run with a time limit. The sourcing script defines
# `report NAME OK DETAIL`, and `bin`, the program `train` runs.

# Step lines as "step loss norm", validation lines as "step loss"; a line whose loss or norm is not a
# number (nan, inf) is left out, so the count catches it.
numeric_steps() { sed -nE 's/^step +([0-9]+)\/[0-9]+ \| loss ([-0-9.]+) \| norm ([-0-9.]+) .*/\1 \2 \3/p' "$1"; }
numeric_vals() { sed -nE 's/^step +([0-9]+) \| val loss ([-0-9.]+)$/\1 \2/p' "$1"; }

# close NAME A B TOL STEPS WHAT [vals]: every step line of log B against log A's line of the same
# step: B must have exactly STEPS steps, all in A, each within TOL relative. Rounding to the printed
# digits counts as no difference: each printed value is within half a unit of its last place (losses
# print 6 decimals, norms 4), so one unit of difference can be rounding alone.
# WHAT=all: loss and gradient norm at every step. WHAT=loss: the loss at every step, the norm at
# the first step only. (In bf16 the gradients of two runs that sum their micro-batches in another
# order differ by bf16 roundings; after a few updates the norm, a sum of squares dominated by a few
# spiky elements, amplifies that to several percent while the loss stays within ~2e-3: 2 GPUs
# against 1 differ less than 1 GPU with B=4 against B=8.)
# With `vals` the validation lines instead (WHAT=loss: their losses).
# On a failure both logs' lines are printed, "-" where a log lacks the step.
close() {
    local ok w c lines=numeric_${7:-steps} what=$6
    read -r ok w c < <(awk -v tol="$4" -v steps="$5" -v what="$what" '
        NR == FNR { a[$1] = $2 " " $3; next }
        { n++; if (!($1 in a)) next; split(a[$1], x, " "); c++
          for (i = 1; i <= (what == "all" || c == 1 ? 2 : 1); i++) {
              d = x[i] - $(i + 1); d = d < 0 ? -d : d; d -= i == 1 ? 1e-6 : 1e-4; d = d < 0 ? 0 : d
              ref = $(i + 1) < 0 ? -$(i + 1) : $(i + 1); r = d / (ref == 0 ? 1 : ref); if (r > w) w = r } }
        END { printf "%d %.2e %d\n", (c == n && c == steps && w <= tol) ? 1 : 0, w, c }' <($lines "$2") <($lines "$3"))
    local bound="bound $4"
    if [[ $lines == numeric_vals ]]; then bound+=", validation losses"
    elif [[ $what == loss ]]; then bound+=", losses; norm at the first"; fi
    report "$1" "$ok" "worst relative difference $w over $c $([[ $lines == numeric_vals ]] && echo validations || echo steps) ($bound)"
    [[ $ok -eq 1 ]] || join -a1 -a2 -e - -o 0,1.2,1.3,2.2,2.3 <($lines "$2" | sort -k1,1) <($lines "$3" | sort -k1,1) |
        sort -n | awk '{ printf "      step %3d  loss %s  %s  norm %s  %s\n", $1, $2, $4, $3, $5 }'
}

# train LOG ARGS...: runs ./$bin with a time limit; stdout in LOG.out, stderr in LOG.err; sets rc
train() {
    local log=$1
    shift
    timeout 300 "./$bin" "$@" >"$log.out" 2>"$log.err" </dev/null
    rc=$?
}
# same NAME A B N: files A and B are identical and hold N lines
same() {
    local n
    n=$(grep -c '' "$2")
    if cmp -s "$2" "$3" && [[ $n -eq $4 ]]; then
        report "$1" 1 "$n lines identical"
    else
        report "$1" 0 "$(grep -c '' "$2") vs $(grep -c '' "$3") lines (expected $4), first difference:"
        awk 'NR == FNR { a[FNR] = $0; n = FNR; next } { m = FNR } a[FNR] != $0 { print "line " FNR ": " a[FNR] "  vs  " $0; d = 1; exit }
             END { if (!d) print "same lines, " n + 0 " vs " m + 0 }' "$2" "$3" | sed 's/^/      | /'
    fi
}
