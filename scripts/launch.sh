#!/usr/bin/env bash
# usage: scripts/launch.sh NUM_GPUS PROGRAM [FLAGS...]
#   e.g. scripts/launch.sh 8 ./train_gpt_bf16 -e d12 -b 64 -d 524288 -o out/run
#
# Starts NUM_GPUS processes of PROGRAM on this machine, one per GPU, the way torchrun would: each gets
# RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and MASTER_ADDR/MASTER_PORT (127.0.0.1 and 29500, or
# those already set), and GPT_RUN_SECRET: a new random secret for this run (or the one already set),
# which every rank proves at the rendezvous, so that no other process can join it. No MPI needed.
# Only rank 0 prints a run's progress. SIGTERM / SIGINT are passed on to every rank (each finishes
# its step and, with -o, rank 0 writes a checkpoint). If a rank fails, this script sends the others
# SIGTERM (train_gpt's watchdog would end a joined rank anyway; one still waiting at the rendezvous
# would wait out its deadline) and exits with the first non-zero exit code. Needs bash 5.1 or newer.
set -u +o posix
if ((BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] < 501)); then
    echo "error: scripts/launch.sh needs bash 5.1 or newer (wait -n -p); this is bash $BASH_VERSION" >&2
    exit 1
fi
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
    sed -n '2,/^set -u/{/^#/s/^# \{0,1\}//p}' "$0"
    exit 0
fi
if [[ $# -lt 2 ]]; then
    echo "error: expected NUM_GPUS and PROGRAM (-h for the usage)" >&2
    exit 1
fi
n=$1
shift
# (more ranks than GPUs is allowed, so that the program itself can refuse it; a typo's 10^20 is not)
[[ $n =~ ^[1-9][0-9]{0,3}$ && $n -le 1024 ]] || { echo "error: NUM_GPUS must be an integer from 1 to 1024, got '$n'" >&2; exit 1; }
export MASTER_ADDR=${MASTER_ADDR:-127.0.0.1} MASTER_PORT=${MASTER_PORT:-29500} WORLD_SIZE=$n LOCAL_WORLD_SIZE=$n
# In the environment, never on a command line: other users can read a process's arguments, not its environment.
if [[ -z ${GPT_RUN_SECRET:-} ]]; then
    GPT_RUN_SECRET=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')
    [[ ${#GPT_RUN_SECRET} -eq 48 ]] || { echo "error: cannot read 24 random bytes from /dev/urandom for the run secret" >&2; exit 1; }
fi
export GPT_RUN_SECRET
pids=()
declare -A ended=()  # pid -> exit code, for the ranks that have ended
signalled=0
# The last rank first, rank 0 last: a signal that ends a process by default ends it before it runs
# again, so a rank still waiting for rank 0's answer at the rendezvous ends by its signal instead of
# seeing rank 0's connection close and printing an error of its own. Ranks that ended are skipped.
forward() {
    signalled=1
    local i
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
        [[ -z ${ended[${pids[i]}]:-} ]] && kill -"$1" "${pids[i]}" 2>/dev/null
    done
}
trap 'forward TERM' TERM
trap 'forward INT' INT
# (a signal while the ranks start reaches those started; no more start)
for ((r = 0; r < n && !signalled; r++)); do
    RANK=$r LOCAL_RANK=$r "$@" &
    pids+=($!)
done
status=0
rank_ended() {  # PID EXIT_CODE
    ended[$1]=$2
    # A rank that failed ends the others: one still waiting to meet it would wait out the rendezvous.
    # (Not after a stop this script passed on, nor for a rank stopped by a signal (exit code 75):
    # the others are finishing their checkpoint, and a second signal would end them at once.)
    if [[ $2 -ne 0 && $status -eq 0 ]]; then
        status=$2
        [[ $signalled -eq 0 && $2 -ne 75 ]] && forward TERM
    fi
}
# PID of a rank that has ended: its exit code. A signal passed on above can interrupt wait, which
# then returns 128 + the signal; asked again, wait gives the rank's own code (bash keeps a pid's code
# outside POSIX mode, which set +o posix above ensures).
collect() {
    local rc
    wait "$1"
    rc=$?
    if ((rc > 128)); then wait "$1"; rc=$?; fi
    rank_ended "$1" $rc
}
while ((${#ended[@]} < ${#pids[@]})); do
    finished=""
    wait -n -p finished  # returns early when a signal (passed on above) interrupts it
    rc=$?
    [[ -n ${finished:-} ]] && rank_ended "$finished" $rc
    # wait -n may reap ranks that end together and name only one of them; wait PID still gives each
    # one's exit code. So ask every rank that is gone (every rank left once wait -n says no child is
    # left, 127), again until a pass finds none: a loop on wait -n alone could spin.
    none_left=0
    [[ $rc -eq 127 && -z ${finished:-} ]] && none_left=1
    found=1
    while ((found)); do
        found=0
        for pid in "${pids[@]}"; do
            if [[ -z ${ended[$pid]:-} ]] && { ((none_left)) || ! kill -0 "$pid" 2>/dev/null; }; then
                collect "$pid"
                found=1
            fi
        done
    done
done
exit $status
