#!/usr/bin/env bash
# Runs every test of the project and ends with one line `N passed, N failed, N skipped`.
#
# Each test is a plain program or script that prints what it compared and ends with its own count
# line; this runner adds them up. What runs:
#   - every program of `make list-programs` must exist (the build itself is a test)
#   - test/test_*.py (with $PYTHON), test/test_*.sh (with bash), build/test/test_* (unit programs)
#   - every dev/cuda lab program with --check (validates every version; skips without a GPU)
# A test that exits non-zero without counting a failure, or prints no count line, counts one failure.
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export PYTHON
total_passed=0 total_failed=0 total_skipped=0
failed_names=()
log=$(mktemp)
trap 'rm -f "$log"' EXIT

count_line_re='^([A-Za-z]+: )?([0-9]+) passed, ([0-9]+) failed(, ([0-9]+) skipped)?$'

run_test() {
    local name=$1
    shift
    echo "=== $name"
    local started=$SECONDS
    "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    echo "--- $name: $((SECONDS - started)) s"
    local line
    line=$(grep -E "$count_line_re" "$log" | tail -n 1)
    if [[ -z "$line" ]]; then
        echo "!!! $name: no count line (exit code $rc)"
        total_failed=$((total_failed + 1)); failed_names+=("$name")
        return
    fi
    [[ "$line" =~ $count_line_re ]]
    local p=${BASH_REMATCH[2]} f=${BASH_REMATCH[3]} s=${BASH_REMATCH[5]:-0}
    if [[ $rc -ne 0 && $f -eq 0 ]]; then
        echo "!!! $name: exit code $rc with no failure counted"
        f=1
    fi
    total_passed=$((total_passed + p)); total_failed=$((total_failed + f)); total_skipped=$((total_skipped + s))
    [[ $f -gt 0 ]] && failed_names+=("$name")
}

check_built() {
    local p=0 f=0
    for prog in $(MAKEFLAGS= make -s list-programs); do
        if [[ -x "$prog" ]]; then echo "  compiled: $prog"; p=$((p + 1))
        else echo "  NOT BUILT: $prog"; f=$((f + 1)); fi
    done
    echo "$p passed, $f failed, 0 skipped"
    [[ $f -eq 0 ]]
}

run_test "every CUDA program compiles" check_built
for t in test/test_*.py; do [[ -e "$t" ]] && run_test "$t" "$PYTHON" "$t"; done
for t in test/test_*.sh; do [[ -e "$t" ]] && run_test "$t" bash "$t"; done
for t in build/test/test_*; do [[ -x "$t" ]] && run_test "$t" "$t"; done
for t in $(MAKEFLAGS= make -s list-programs); do
    [[ "$t" == dev/cuda/* ]] && run_test "$t --check" "./$t" --check
done

echo
if [[ ${#failed_names[@]} -gt 0 ]]; then echo "failed: ${failed_names[*]}"; fi
echo "$total_passed passed, $total_failed failed, $total_skipped skipped"
[[ $total_failed -eq 0 ]]
