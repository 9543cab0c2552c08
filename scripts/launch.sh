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
# would wait out its deadline) and exits with the first non-zero exit code.
set -u
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
for ((r = 0; r < n; r++)); do
    RANK=$r LOCAL_RANK=$r "$@" &
    pids+=($!)
done
signalled=0
forward() { signalled=1; kill -"$1" "${pids[@]}" 2>/dev/null; }
trap 'forward TERM' TERM
trap 'forward INT' INT
status=0
remaining=$n
while ((remaining > 0)); do
    finished=""
    wait -n -p finished
    rc=$?
    [[ -z ${finished:-} ]] && continue  # a signal (passed on above) interrupted the wait
    remaining=$((remaining - 1))
    # A rank that failed ends the others: one still waiting to meet it would wait out the rendezvous.
    # (Not after a stop this script passed on, nor for a rank stopped by a signal (exit code 75):
    # the others are finishing their checkpoint, and a second signal would end them at once.)
    if [[ $rc -ne 0 && $status -eq 0 ]]; then
        status=$rc
        [[ $signalled -eq 0 && $rc -ne 75 ]] && forward TERM
    fi
done
exit $status
