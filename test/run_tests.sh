#!/usr/bin/env bash
# Runs every test of the project and ends with one line `N passed, N failed, N skipped`.
#
# Each test is a plain program or script that prints what it compared and ends with its own count
# line; this runner adds them up. What runs:
#   - every program of `make list-programs` must exist (the build itself is a test)
#   - test/test_*.py (with $PYTHON), test/test_*.sh (with bash), build/test/test_* (unit programs)
#   - every dev/cuda lab program with --check (validates every version; skips without a GPU)
# Tests run TEST_JOBS at a time (default: the number of cores, at most 4); each one's output is
# printed whole when it ends. None of them measures time, and each uses its own temporary folder, so
# running them side by side (on one GPU too) changes no result. TEST_JOBS=1 runs them one by one.
# A test that exits non-zero without counting a failure, or prints no count line, counts one failure.
# Each test gets a temporary folder of its own as TMPDIR; one that leaves anything there counts one
# failure (naming what it left). PyTorch's compiler caches (TorchInductor, Triton), which PyTorch
# keeps for the user under the temporary folder, go to one folder of the runner's instead. Skipped checks say why (`... skipped (REASON)`); the run ends with
# the reasons and their counts, then the count line.
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export PYTHON
cores=$(nproc 2>/dev/null || echo 1)
jobs_max=${TEST_JOBS:-$((cores < 4 ? cores : 4))}
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
export TORCHINDUCTOR_CACHE_DIR=$logs/torch_cache/inductor TRITON_CACHE_DIR=$logs/torch_cache/triton

count_line_re='^([A-Za-z]+: )?([0-9]+) passed, ([0-9]+) failed(, ([0-9]+) skipped)?$'

# The programs `make` builds, a path a line. make's own messages on stdout (such as NCCL's absence)
# are not paths and are left out; a failing make, or an empty list, ends the run here.
if ! listed=$(MAKEFLAGS= make -s list-programs); then
    echo "error: make list-programs failed" >&2
    exit 1
fi
programs=$(grep -E '^[^[:space:]]+$' <<<"$listed")
[[ -n $programs ]] || { echo "error: make list-programs listed no program" >&2; exit 1; }

check_built() {
    local p=0 f=0
    for prog in $programs; do
        if [[ -x "$prog" ]]; then echo "  compiled: $prog"; p=$((p + 1))
        else echo "  NOT BUILT: $prog"; f=$((f + 1)); fi
    done
    echo "$p passed, $f failed, 0 skipped"
    [[ $f -eq 0 ]]
}

# The tests, longest first where known (they start first when several run at once).
names=() cmds=()
add() { names+=("$1"); shift; cmds+=("$(printf '%q ' "$@")"); }
add "every CUDA program compiles" check_built
for t in test/test_gpt.sh test/test_resume.sh test/test_reference_training.sh test/test_fp8.sh test/test_train_cli.sh; do
    [[ -e $t ]] && add "$t" bash "$t"
done
for t in test/test_*.sh; do
    [[ -e $t && " ${names[*]} " != *" $t "* ]] && add "$t" bash "$t"
done
for t in test/test_*.py; do [[ -e "$t" ]] && add "$t" "$PYTHON" "$t"; done
for t in build/test/test_*; do [[ -x "$t" ]] && add "$t" "$t"; done
for t in $programs; do
    [[ "$t" == dev/cuda/* ]] && add "$t --check" "./$t" --check
done

total_passed=0 total_failed=0 total_skipped=0
failed_names=()
declare -A skip_reasons=()  # reason -> count, over all tests
skip_line_re='skipped \((.*)\)[[:space:]]*$'
finish_one() {  # index: print the test's output and add up its count line
    local i=$1 name=${names[$1]} log=$logs/$1.log
    local rc secs
    read -r rc secs <"$logs/$i.status"
    echo "=== $name"
    cat "$log"
    echo "--- $name: $secs s"
    local left
    left=$(cd "$logs/tmp.$i" && ls -A | head -n 5 | tr '\n' ' ')
    rm -rf "$logs/tmp.$i"
    local line
    line=$(grep -E "$count_line_re" "$log" | tail -n 1)
    if [[ -z "$line" ]]; then
        echo "!!! $name: no count line (exit code $rc)"
        total_failed=$((total_failed + 1)); failed_names+=("$name")
        [[ -n $left ]] && echo "!!! $name: left in its temporary folder (TMPDIR): $left"
        return
    fi
    [[ "$line" =~ $count_line_re ]]
    local p=${BASH_REMATCH[2]} f=${BASH_REMATCH[3]} s=${BASH_REMATCH[5]:-0}
    if [[ $rc -ne 0 && $f -eq 0 ]]; then
        echo "!!! $name: exit code $rc with no failure counted"
        f=1
    fi
    if [[ -n $left ]]; then
        echo "!!! $name: left in its temporary folder (TMPDIR): $left"
        f=$((f + 1))
    fi
    total_passed=$((total_passed + p)); total_failed=$((total_failed + f)); total_skipped=$((total_skipped + s))
    [[ $f -gt 0 ]] && failed_names+=("$name")
    # The skip reasons: one line `... skipped (REASON)` per skipped check. Where the lines and the
    # count disagree, the difference is named rather than guessed.
    local reasons=() reason
    while IFS= read -r reason; do
        [[ $reason =~ $skip_line_re ]] && reasons+=("${BASH_REMATCH[1]}")
    done < <(grep -E "$skip_line_re" "$log")
    if ((s > 0 && ${#reasons[@]} > s)); then
        skip_reasons["more skip lines than skips counted ($name)"]=$s
    elif ((s > 0)); then
        for reason in "${reasons[@]}"; do skip_reasons[$reason]=$((${skip_reasons[$reason]:-0} + 1)); done
        if ((s > ${#reasons[@]})); then
            skip_reasons["no reason given ($name)"]=$((s - ${#reasons[@]}))
        fi
    fi
}

declare -A running=()  # pid -> index
started_all=$SECONDS
for i in "${!names[@]}"; do
    while ((${#running[@]} >= jobs_max)); do
        done_pid=""
        wait -n -p done_pid
        [[ -n $done_pid && -n ${running[$done_pid]:-} ]] && { finish_one "${running[$done_pid]}"; unset "running[$done_pid]"; }
    done
    mkdir "$logs/tmp.$i"
    (
        t=$SECONDS
        export TMPDIR=$logs/tmp.$i
        eval "${cmds[i]}" >"$logs/$i.log" 2>&1 </dev/null
        echo "$? $((SECONDS - t))" >"$logs/$i.status"
    ) &
    running[$!]=$i
done
while ((${#running[@]} > 0)); do
    done_pid=""
    wait -n -p done_pid
    [[ -n $done_pid && -n ${running[$done_pid]:-} ]] && { finish_one "${running[$done_pid]}"; unset "running[$done_pid]"; }
done

echo
echo "all tests: $((SECONDS - started_all)) s, $jobs_max at a time"
if [[ ${#failed_names[@]} -gt 0 ]]; then echo "failed: ${failed_names[*]}"; fi
if ((${#skip_reasons[@]} > 0)); then
    echo "skipped, by reason:"
    for reason in "${!skip_reasons[@]}"; do printf '%8d  %s\n' "${skip_reasons[$reason]}" "$reason"; done | sort -k1,1nr -k2
fi
echo "$total_passed passed, $total_failed failed, $total_skipped skipped"
[[ $total_failed -eq 0 ]]
