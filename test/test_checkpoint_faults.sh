#!/usr/bin/env bash
# The checkpoint commit protocol under faults, on the host (no GPU): train_gpt's own checkpoint code
# (build/test/checkpoint_tool) saves step 30 into a folder holding the checkpoints of steps 10 and 20,
# and an LD_PRELOAD library (build/test/libfault_inject.so) interrupts that save at each of its file
# operations (every file's create, writes, fsync, close, rename, the folder's fsync, the pruning's
# unlinks):
#   kill -9 before operation k   -y 1 then takes step 30 if its state file was renamed into place, else
#                                step 20; every checkpoint left loads and holds exactly what was saved;
#                                saving step 30 again gives the same checkpoint as a save never
#                                interrupted, and no temp file or lone model file is left
#   ENOSPC / EIO at operation k  (each create, write, fsync, close, rename, folder fsync) the save fails with
#                                exit code 1 and one `error:` line naming the step and the cause; steps 10
#                                and 20 are intact, step 30 does not exist, nothing of it is left
# Also: a first save killed at each operation leaves a folder where -y 1 starts over (nothing to lose).
# Ends with `N passed, N failed, N skipped`.
set -u
cd "$(dirname "$0")/.."
tool=build/test/checkpoint_tool
shim=$PWD/build/test/libfault_inject.so
passed=0 failed=0
report() {  # name ok detail
    if [[ $2 -eq 1 ]]; then passed=$((passed + 1)); printf '  %-72s ok    %s\n' "$1" "$3"
    else failed=$((failed + 1)); printf '  %-72s FAIL  %s\n' "$1" "$3"; fi
}
for f in "$tool" "$shim"; do
    if [[ ! -e $f ]]; then
        echo "FAIL: $f is not built (make $f)"
        echo "0 passed, 1 failed, 0 skipped"
        exit 1
    fi
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The reference: steps 10 and 20 saved, then 30 (keep 2: 20 and 30 remain).
mkdir "$tmp/base" "$tmp/ref"
$tool save "$tmp/base" 10 >/dev/null && $tool save "$tmp/base" 20 >/dev/null || { echo "FAIL: cannot save"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
cp "$tmp/base"/* "$tmp/ref"/ && $tool save "$tmp/ref" 30 >/dev/null
# How many operations one save makes (counted, not acted on).
cp -r "$tmp/base" "$tmp/count"
FAULT_ONLY="$tmp/count" FAULT_TRACE="$tmp/trace" LD_PRELOAD=$shim $tool save "$tmp/count" 30 >/dev/null
ops=$(grep -c '' "$tmp/trace")
report "a save of step 30 over steps 10 and 20 makes $ops file operations" "$([[ $ops -ge 20 ]] && echo 1 || echo 0)" \
    "$(awk '{print $2}' "$tmp/trace" | sort | uniq -c | awk '{printf "%s %s, ", $1, $2}')"

leftovers() { find "$1" -name '*.tmp.*' | wc -l; }
# everything_intact DIR: every checkpoint the folder holds loads and holds what was saved
everything_intact() {
    local d=$1 s
    for s in $(ls "$d" | sed -n 's/^state_0*\([0-9]\+\)\.bin$/\1/p'); do
        $tool verify "$d" "$s" >/dev/null 2>&1 || return 1
    done
}

echo "=== kill -9 before each operation of the save (and after the last)"
for ((k = 1; k <= ops + 1; k++)); do
    d=$tmp/kill_$k
    cp -r "$tmp/base" "$d"
    op=$(sed -n "${k}p" "$tmp/trace" | awk '{print $2, $3}' | sed "s#$tmp/count/##")
    (FAULT_ONLY="$d" FAULT_AT=$k FAULT_ACTION=kill LD_PRELOAD=$shim $tool save "$d" 30 >/dev/null 2>&1; exit $?) 2>/dev/null
    rc=$?
    took=$($tool resume "$d" 2>/dev/null)
    committed=0
    [[ -e $d/state_00000030.bin ]] && committed=1
    want=$([[ $committed == 1 ]] && echo "resume 30" || echo "resume 20")
    why=""
    if ((k <= ops)) && [[ $rc -ne 137 ]]; then why="exit $rc, expected to be killed (137)"
    elif [[ $took != "$want" ]]; then why="-y 1 takes '$took', expected '$want'"
    elif ! everything_intact "$d"; then why="a checkpoint in the folder does not hold what was saved"
    else
        $tool save "$d" 30 >/dev/null 2>&1  # the run goes on: the save is made again
        if ! $tool verify "$d" 30 >/dev/null 2>&1 || ! cmp -s "$d/state_00000030.bin" "$tmp/ref/state_00000030.bin" ||
           ! cmp -s "$d/model_00000030.bin" "$tmp/ref/model_00000030.bin"; then why="the save made again differs from the uninterrupted one"
        elif [[ $(leftovers "$d") -ne 0 ]]; then why="$(leftovers "$d") temp files left after the next save"
        elif [[ $(ls "$d" | tr '\n' ' ') != "model_00000020.bin model_00000030.bin state_00000020.bin state_00000030.bin " ]]; then
            why="the folder holds: $(ls "$d" | tr '\n' ' ')"
        fi
    fi
    report "killed before op $k ($([[ $k -le $ops ]] && echo "$op" || echo "after the save"))" "$([[ -z $why ]] && echo 1 || echo 0)" \
        "${why:-$took}"
done

echo "=== ENOSPC and EIO at each operation that can fail so"
for action in enospc eio; do
    cause=$([[ $action == enospc ]] && echo "No space left on device" || echo "Input/output error")
    for ((k = 1; k <= ops; k++)); do
        op=$(sed -n "${k}p" "$tmp/trace" | awk '{print $2}')
        [[ $op == create || $op == write || $op == fsync || $op == close || $op == rename || $op == dirsync ]] || continue
        d=$tmp/${action}_$k
        cp -r "$tmp/base" "$d"
        FAULT_ONLY="$d" FAULT_AT=$k FAULT_ACTION=$action LD_PRELOAD=$shim $tool save "$d" 30 >"$tmp/out" 2>"$tmp/err"
        rc=$?
        why=""
        if [[ $rc -ne 1 ]]; then why="exit $rc, expected 1"
        elif [[ $(grep -c '' "$tmp/err") -ne 1 || $(head -n 1 "$tmp/err") != "error: writing checkpoint for step 30: "*"$cause"* ]]; then
            why="stderr: $(head -n 2 "$tmp/err" | tr '\n' '|')"
        elif [[ $($tool resume "$d" 2>/dev/null) != "resume 20" ]]; then why="-y 1 takes '$($tool resume "$d" 2>/dev/null)', expected step 20"
        elif ! everything_intact "$d"; then why="step 10 or 20 does not hold what was saved"
        elif [[ $(ls "$d" | tr '\n' ' ') != "model_00000010.bin model_00000020.bin state_00000010.bin state_00000020.bin " ]]; then
            why="the folder holds: $(ls "$d" | tr '\n' ' ')"
        fi
        report "$action at op $k ($op)" "$([[ -z $why ]] && echo 1 || echo 0)" "${why:-$(head -n 1 "$tmp/err" | cut -c1-60)...}"
    done
done

echo "=== the newest checkpoint damaged: the run resumed from an older one keeps its own saves"
d=$tmp/damaged
mkdir "$d"
$tool save "$d" 50 1 >/dev/null && $tool save "$d" 100 1 >/dev/null
# keep 1 left step 100 alone; flip one byte inside its state file (past the header)
printf '\x01' | dd of="$d/state_00000100.bin" bs=1 seek=5000 conv=notrunc status=none
$tool save "$d" 50 1 >/dev/null  # (50 again: what keep 1 removed)
took=$($tool resume "$d" 2>/dev/null)
$tool save "$d" 60 1 >/dev/null
took2=$($tool resume "$d" 2>/dev/null)
report "state 100 damaged: resume takes 50, then a save of 60 with keep 1 is kept" \
    "$([[ $took == "resume 50" && $took2 == "resume 60" && -e $d/state_00000060.bin ]] && echo 1 || echo 0)" \
    "resume '$took', then '$took2'; the folder holds: $(ls "$d" | tr '\n' ' ')"

echo "=== a run's first save killed before each operation: -y 1 starts over"
mkdir "$tmp/first_count"
FAULT_ONLY="$tmp/first_count" FAULT_TRACE="$tmp/trace1" LD_PRELOAD=$shim $tool save "$tmp/first_count" 10 >/dev/null
ops1=$(grep -c '' "$tmp/trace1")
bad=""
for ((k = 1; k <= ops1; k++)); do
    d=$tmp/first_$k
    mkdir "$d"
    (FAULT_ONLY="$d" FAULT_AT=$k FAULT_ACTION=kill LD_PRELOAD=$shim $tool save "$d" 10 >/dev/null 2>&1; exit $?) 2>/dev/null
    rc=$?
    took=$($tool resume "$d" 2>/dev/null)
    want=$([[ -e $d/state_00000010.bin ]] && echo "resume 10" || echo "fresh")
    if [[ $rc -ne 137 ]]; then bad+=" op $k: exit $rc, expected to be killed (137);"
    elif [[ $took != "$want" ]]; then bad+=" op $k: '$took' (expected '$want');"
    fi
done
[[ $ops1 -ge 10 ]] || bad+=" a first save counted only $ops1 file operations (a save makes more);"
report "first save killed at each of its $ops1 operations: -y 1 resumes or starts over" "$([[ -z $bad ]] && echo 1 || echo 0)" "${bad:-all $ops1 as expected}"

echo "$passed passed, $failed failed, 0 skipped"
[[ $failed -eq 0 ]]
