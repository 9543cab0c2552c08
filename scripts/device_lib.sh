#!/usr/bin/env bash
# device_lib.sh: what the device scripts share; each sources it after setting NAME (its log folder under
# $OUT) and PARTS (the digits its PART may be). It checks PART (default 1), goes to the repository
# root, sets PATH, $log, GPT_MIRROR (the carried mirror), PY
# and $started, archives $log into $OUT/${NAME}_part$PART.tgz at exit (the device returns few files and
# folders two deep; also when a time limit cuts the run short), prints the GPU, builds everything
# (make all) and prepares the data. Helpers:
#   step NAME [LIMIT] COMMAND...  run (within LIMIT seconds if given), log to $log/NAME.log, print the
#                                 exit code, the time and the count / failure lines
#   lab_check                     every lab's --check (in lab_check.log), then each lab's count line
#   unit_tests                    every build/test program
#   secs_left S                   the seconds left until S seconds after $started (at least 1), for timeouts
PART=${PART:-1}
[[ $PART == ["${PARTS:?PARTS: the digits PART may be}"] ]] ||
    { echo "error: PART must be one of ${PARTS}, got '$PART'" >&2; exit 1; }
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-out}
log=$OUT/${NAME:?NAME: the log folder}
mkdir -p "$log"
# shellcheck disable=SC2064  # expand now: $OUT and $NAME are this script's
trap "tar -czf '$OUT/${NAME}_part${PART:-0}.tgz' -C '$OUT' '$NAME'" EXIT
export GPT_MIRROR=$(realpath -m "${GPT_MIRROR:-.carry/mirror}")  # absolute: device_ab_dirs.sh prepares data in other folders
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv,noheader
started=$SECONDS
make -j16 all > "$log/build.log" 2>&1 || { tail -n 30 "$log/build.log"; exit 1; }
echo "build: $((SECONDS - started)) s"
"$PY" data/prepare_tinyshakespeare.py > "$log/data.log" 2>&1 || tail -n 5 "$log/data.log"
step() {
    local name=$1 t=$SECONDS limit=0
    shift
    if [[ $1 =~ ^[0-9]+$ ]]; then limit=$1; shift; fi
    if ((limit > 0)); then timeout "$limit" "$@"; else "$@"; fi > "$log/$name.log" 2>&1
    local rc=$?
    echo "--- $name: exit $rc, $((SECONDS - t)) s"
    grep -E "passed, [0-9]+ failed|FAIL|!!!|error" "$log/$name.log" | grep -v " ok " | tail -n 8
}
lab_check() {
    step lab_check 300 bash -c 'rc=0; for p in $(MAKEFLAGS= make -s list-programs | tr " " "\n" | grep dev/cuda/); do echo "=== $p"; ./$p --check | tail -n 3; [[ ${PIPESTATUS[0]} == 0 ]] || rc=1; done; exit $rc' |
        grep -E "^--- "  # the counts follow with each lab's name
    grep -E "^=== |passed, |FAIL" "$log/lab_check.log"
}
unit_tests() {
    step unit_tests 60 bash -c 'rc=0; for t in build/test/test_*; do echo "=== $t"; $t | tail -n 3; [[ ${PIPESTATUS[0]} == 0 ]] || rc=1; done; exit $rc'
}
secs_left() {
    local t=$(($1 - (SECONDS - started)))
    echo $((t > 1 ? t : 1))
}
