#!/usr/bin/env bash
# test/run_tests.sh itself, on a made-up project in a temporary folder: the sum of the tests' count
# lines, the skip reasons with their counts before the final line (a count without reason lines is
# named, not hidden), and a test that leaves files in its TMPDIR counted as a failure that names them.
# CPU only, a second. Ends with `N passed, N failed, N skipped`.
set -u
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0
report() {  # name ok detail
    if [[ $2 == 1 ]]; then passed=$((passed + 1)); printf '  %-66s ok  %s\n' "$1" "${3:-}"
    else failed=$((failed + 1)); printf '  %-66s FAIL  %s\n' "$1" "${3:-}"; fi
}

tree=$tmp/tree
mkdir -p "$tree/test"
cp test/run_tests.sh "$tree/test/"
printf 'list-programs:\n\t@echo prog\n' >"$tree/Makefile"
printf '#!/bin/sh\n' >"$tree/prog" && chmod +x "$tree/prog"
cat >"$tree/test/test_a.sh" <<'T'
echo "  one      skipped (no CUDA device)"
echo "  two: skipped (no CUDA device)"
echo "  three    skipped (transformers not installed)"
echo "  four     ok"
echo "1 passed, 0 failed, 3 skipped"
T
cat >"$tree/test/test_b.sh" <<'T'
echo "five: skipped (no CUDA device)"
echo "0 passed, 0 failed, 2 skipped"
T
cat >"$tree/test/test_leaves.sh" <<'T'
mktemp -d >/dev/null
echo "1 passed, 0 failed, 0 skipped"
T
cat >"$tree/test/test_tidy.sh" <<'T'
d=$(mktemp -d) && rm -rf "$d"
echo "1 passed, 0 failed, 0 skipped"
T
out=$(MAKEFLAGS= bash "$tree/test/run_tests.sh" 2>&1)
rc=$?
echo "$out" | sed 's/^/    | /' | tail -n 12
last=$(tail -n 1 <<<"$out")
report "the final line sums the count lines (the build's, a leak's failure)" \
    "$([[ $last == "4 passed, 1 failed, 5 skipped" && $rc -eq 1 ]] && echo 1 || echo 0)" "$last (exit code $rc)"
reasons=$(sed -n '/^skipped, by reason:$/,$p' <<<"$out" | sed '1d;$d')
want=$(printf '%8d  %s\n' 3 "no CUDA device" 1 "no reason given (test/test_b.sh)" 1 "transformers not installed")
report "before it, each skip reason with its count, largest first" \
    "$([[ $reasons == "$want" ]] && echo 1 || echo 0)" "$(tr '\n' '|' <<<"$reasons")"
report "a test that leaves a folder in its TMPDIR: a failure naming it" \
    "$(grep -qE '^!!! test/test_leaves.sh: left in its temporary folder \(TMPDIR\): tmp\.' <<<"$out" && echo 1 || echo 0)" \
    "$(grep -m1 '^!!!' <<<"$out")"
report "the tidy test is not blamed" "$(grep -q 'test_tidy.sh: left' <<<"$out" && echo 0 || echo 1)"
echo "$passed passed, $failed failed, 0 skipped"
[[ $failed -eq 0 ]]
