#!/usr/bin/env bash
# The Makefile's own behaviour, on a made-up project in a temporary folder with a stand-in nvcc
# (it records its MAKEFLAGS, the target, and how many compiles run at once, then sleeps): `make test`
# and `make train` build in parallel by themselves (-j the number of cores), a -j given on the command
# line wins (-j1 stays serial, -j8 is used as given), and every target is built exactly once.
# CPU only, a few seconds. Ends with `N passed, N failed, N skipped`.
set -u
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0 skipped=0
report() {  # name ok detail
    if [[ $2 == 1 ]]; then passed=$((passed + 1)); printf '  %-66s ok  %s\n' "$1" "${3:-}"
    else failed=$((failed + 1)); printf '  %-66s FAIL  %s\n' "$1" "${3:-}"; fi
}
cores=$(nproc 2>/dev/null || echo 1)

tree=$tmp/tree
mkdir -p "$tree"/{dev/cuda,test,scripts,data}
cp Makefile "$tree/"
touch "$tree"/{train_gpt.cu,test_gpt.cu,generate_gpt.cu,common.cuh} "$tree"/dev/lab.cuh \
      "$tree"/dev/cuda/{lab_a.cu,lab_b.cu,lab_c.cu} "$tree"/test/{unit_a.cu,unit_b.cu,fault_inject.c} \
      "$tree"/dev/cuda/layernorm_capi.cu "$tree"/dev/cuda/attention_capi.cu
printf '#!/bin/sh\necho /bin/true\n' >"$tree/scripts/setup_python.sh"
printf '#!/bin/sh\necho "1 passed, 0 failed, 0 skipped"\n' >"$tree/test/run_tests.sh"
log=$tmp/log
mkdir -p "$log"
# The stand-in compiler: writes -o's file (a script, so `make train` can run it) after 0.4 s.
cat >"$tmp/compile" <<T
#!/usr/bin/env bash
out=""
while [[ \$# -gt 0 ]]; do [[ \$1 == -o ]] && out=\$2; shift; done
touch "$log/running.\$\$"
ls "$log"/running.* | wc -l >>"$log/at_once"
echo "\$out" >>"$log/built"
echo "\${MAKEFLAGS:-}" >>"$log/makeflags"
sleep 0.4
mkdir -p "\$(dirname "\$out")"
printf '#!/bin/sh\nexit 0\n' >"\$out" && chmod +x "\$out"
rm -f "$log/running.\$\$"
T
chmod +x "$tmp/compile"

# As a user types it: no make above (under `make test` this script inherits its MAKEFLAGS and MAKELEVEL,
# and the runner's PYTHON, which the Makefile would take for the tree's Python).
unset MAKEFLAGS MFLAGS MAKELEVEL MAKEOVERRIDES PYTHON
build() {  # make arguments...: a clean build in the tree; the log folder holds what the compiler saw
    rm -rf "$log"/* && (cd "$tree" && make -s clean NVCC="$tmp/compile" >/dev/null 2>&1 && rm -rf out)
    (cd "$tree" && make NVCC="$tmp/compile" CC="$tmp/compile" GPU_ARCH=90 NCCL=0 "$@" >"$log/make.out" 2>&1)
}
most_at_once() { sort -n "$log/at_once" | tail -n 1; }
twice() { sort "$log/built" | uniq -d | head -n 3 | tr '\n' ' '; }
targets=14  # 2+2+2 programs, 3 labs, 2 unit programs, fault_inject, 2 C API libraries

build test
rc=$?
report "make test: builds every target once, then runs the tests" \
    "$([[ $rc -eq 0 && $(sort -u "$log/built" | wc -l) -eq $targets && -z $(twice) ]] && grep -q '1 passed' "$log/make.out" && echo 1 || echo 0)" \
    "exit code $rc, $(wc -l <"$log/built") compiles, twice: $(twice)"
report "make test: the compiles see -j$cores (the number of cores)" \
    "$(grep -q -- "-j$cores\b" "$log/makeflags" && echo 1 || echo 0)" "$(head -n 1 "$log/makeflags")"
if [[ $cores -gt 1 ]]; then
    report "make test: compiles run side by side" "$([[ $(most_at_once) -gt 1 ]] && echo 1 || echo 0)" \
        "at most $(most_at_once) at once"
else
    skipped=$((skipped + 1)); printf '  %-66s skipped (one core)\n' "make test: compiles run side by side"
fi
build -j8 test
rc=$?
report "make -j8 test: every target once, at most 8 at once, the -j8 given" \
    "$([[ $rc -eq 0 && $(sort -u "$log/built" | wc -l) -eq $targets && -z $(twice) && $(most_at_once) -le 8 ]] \
        && grep -q -- '-j8\b' "$log/makeflags" && echo 1 || echo 0)" \
    "exit code $rc, $(wc -l <"$log/built") compiles, at most $(most_at_once) at once"
build -j1 test
rc=$?
report "make -j1 test: one compile at a time (the command line wins)" \
    "$([[ $rc -eq 0 && $(most_at_once) -eq 1 && $(wc -l <"$log/built") -eq $targets ]] && echo 1 || echo 0)" \
    "exit code $rc, at most $(most_at_once) at once"
build train
rc=$?
report "make train: builds its program with -j$cores" \
    "$([[ $rc -eq 0 && $(cat "$log/built") == train_gpt_bf16 ]] && grep -q -- "-j$cores\b" "$log/makeflags" && echo 1 || echo 0)" \
    "exit code $rc, built: $(tr '\n' ' ' <"$log/built"), MAKEFLAGS: $(head -n 1 "$log/makeflags")"
build
rc=$?
report "plain make: as before (no -j added)" \
    "$([[ $rc -eq 0 && $(most_at_once) -eq 1 ]] && ! grep -q -- '-j' "$log/makeflags" && echo 1 || echo 0)" \
    "exit code $rc, at most $(most_at_once) at once"
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
