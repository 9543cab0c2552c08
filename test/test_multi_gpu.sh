#!/usr/bin/env bash
# Data-parallel training on the N GPUs of this machine (N >= 2; GPT_TEST_GPUS=K takes the first K) through
# scripts/launch.sh and NCCL, d12, B=4 T=256, -d 8 T N (2 micro-batches a GPU):
#   equivalence   N GPUs against 1 GPU accumulating 2N micro-batches, 20 steps: every
#                 step's loss and gradient norm within 1e-5 relative in fp32; in bf16 every step's
#                 loss and the first step's norm within 1e-2 (see close in test/compare_steps.sh); the
#                 same over sockets alone (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1: how nodes without
#                 InfiniBand talk)
#   split         fp32, the same -d split otherwise: N GPUs at -b 8 (one micro-batch each) and at -b 2
#                 (four) against 1 GPU at -b 4: every step's loss (and the first norm) and every
#                 validation loss within 1e-5 relative (the same sequences: dataloader.h)
#   mpirun        where Open MPI is installed: mpirun -np N -x GPT_RUN_SECRET prints the fp32 run's step
#                 lines exactly
#   the secret    through each launcher: scripts/launch.sh makes one (none set) and its ranks train; a
#                 rank given another secret is refused with one line on each rank; srun's variables
#                 (one node, as srun sets them) with the secret in the environment train as launch.sh's
#                 run does; srun's variables without a secret: one line on each rank; mpirun without
#                 one: that line from each rank that gets there before mpirun ends the others, no other
#   determinism   the N-GPU run twice: the same step lines and final state file, byte for byte
#   resume        saved on N at step 10, resumed on N: the same bits as the run never stopped;
#                 resumed on 1: within the bf16 equivalence bounds
#   FP8           (a GPU of compute capability 8.9 or newer) -f8 1 on N GPUs against 1 GPU accumulating, at a
#                 gentle -l 5e-5 (at 6e-4 the loss jumps, and two FP8 runs a rounding apart jump apart):
#                 within the bf16 bounds; saved on N at step 10 and resumed on N: the same bits as the
#                 run never stopped (the delayed scales' amax history, max-reduced over the ranks each
#                 step, is every rank's, and rank 0's checkpoint restores it on all)
#   failures      kill -9 of rank 1: rank 0 ends with one line within 60 s; ranks started with
#                 different flags are refused; more ranks than GPUs is an error
# Needs 2 GPUs or more; elsewhere every check but the comparator's own says `skipped (needs 2 GPUs)`. Ends with `N passed, N failed, N skipped`.
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
checks=("equivalence fp32" "equivalence bf16" "split -b 8: steps" "split -b 8: validation" "split -b 2: steps"
        "split -b 2: validation" "mpirun" "mpirun without a secret" "launch.sh makes a secret"
        "another secret on rank 1" "srun's variables" "srun's variables without a secret" "equivalence over sockets" "determinism"
        "resume on all" "resume on 1" "FP8 equivalence" "FP8 resume on all" "kill one rank" "different flags" "more ranks than GPUs")
passed=0 failed=0 skipped=0
report() {
    if [[ $2 -eq 1 ]]; then passed=$((passed + 1)); printf '  %-66s ok    %s\n' "$1" "$3"
    else failed=$((failed + 1)); printf '  %-66s FAIL  %s\n' "$1" "$3"; fi
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source test/compare_steps.sh  # numeric_steps, numeric_vals, close

# The comparator needs no GPU, so it is checked everywhere, on made-up logs: it must pass a match, a
# log resumed at step 11, a norm one printed unit off at 1e-5, (WHAT=loss) a norm off after the
# first step, and validation losses one printed unit off at 1e-5; it must fail a loss 1.3% off at
# one step, a norm three units off at 1e-5, a step missing from B or from A, a log that started over
# instead of resuming, a nan loss, (WHAT=loss) a norm off at the first step, and a validation loss
# 1e-4 relative off.
for i in $(seq 1 20); do echo "step $i/20 | loss $((20 + i)).5 | norm 1.$i | lr 1"; done >"$tmp/made_up"
tail -n 10 "$tmp/made_up" >"$tmp/made_up_resumed"
sed 's/loss 30.5 /loss 30.9 /' "$tmp/made_up" >"$tmp/made_up_drift"
sed '/^step 7\//d' "$tmp/made_up" >"$tmp/made_up_gap"
sed 's/loss 27.5 /loss nan /' "$tmp/made_up" >"$tmp/made_up_nan"
sed 's/norm 1.5 /norm 1.9 /' "$tmp/made_up" >"$tmp/made_up_norm_late"
sed 's/norm 1.5 /norm 1.5001 /' "$tmp/made_up" >"$tmp/made_up_unit"
sed 's/norm 1.5 /norm 1.5003 /' "$tmp/made_up" >"$tmp/made_up_units"
sed 's/norm 1.1 /norm 1.9 /' "$tmp/made_up" >"$tmp/made_up_norm_first"
printf 'step %5d | val loss %s\n' 10 4.250000 20 4.125000 >"$tmp/made_up_vals"
sed 's/4.125000/4.125001/' "$tmp/made_up_vals" >"$tmp/made_up_vals_unit"
sed 's/4.125000/4.125400/' "$tmp/made_up_vals" >"$tmp/made_up_vals_drift"
verdicts=$(passed=0 failed=0
    close match "$tmp/made_up" "$tmp/made_up" 1e-2 20 all
    close resumed "$tmp/made_up" "$tmp/made_up_resumed" 1e-2 10 loss
    close late "$tmp/made_up" "$tmp/made_up_norm_late" 1e-2 20 loss
    close unit "$tmp/made_up" "$tmp/made_up_unit" 1e-5 20 all
    close drift "$tmp/made_up" "$tmp/made_up_drift" 1e-2 20 loss
    close units "$tmp/made_up" "$tmp/made_up_units" 1e-5 20 all
    close gap "$tmp/made_up" "$tmp/made_up_gap" 1e-2 20 all
    close extra "$tmp/made_up_gap" "$tmp/made_up" 1e-2 19 all
    close restarted "$tmp/made_up" "$tmp/made_up" 1e-2 10 loss
    close nan "$tmp/made_up" "$tmp/made_up_nan" 1e-2 20 all
    close first "$tmp/made_up" "$tmp/made_up_norm_first" 1e-2 20 loss
    close vals "$tmp/made_up_vals" "$tmp/made_up_vals_unit" 1e-5 2 loss vals
    close valdrift "$tmp/made_up_vals" "$tmp/made_up_vals_drift" 1e-5 2 loss vals)
# (a refused log is written "refused" here: a reader looking for this test's failures greps for FAIL)
verdicts=$(grep -oE '^  [a-z]+ +(ok|FAIL)' <<<"$verdicts" | sed 's/FAIL$/refused/' |
    awk '{ printf "%s%s:%s", (NR > 1 ? " " : ""), $1, $2 }')
expected="match:ok resumed:ok late:ok unit:ok drift:refused units:refused gap:refused extra:refused restarted:refused nan:refused"
expected+=" first:refused vals:ok valdrift:refused"
report "the step comparator on made-up logs: 5 to pass, 8 to fail" "$([[ $verdicts == "$expected" ]] && echo 1 || echo 0)" \
    "$verdicts"

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
n=${GPT_TEST_GPUS:-$gpus}  # the ranks of every multi-GPU run
[[ $n =~ ^[0-9]+$ ]] && ((n <= gpus)) || { echo "error: GPT_TEST_GPUS=$n: this machine has $gpus GPUs" >&2; exit 1; }
if [[ $n -lt 2 ]]; then
    for c in "${checks[@]}"; do echo "multi-GPU $c: skipped (needs 2 GPUs, found $gpus${GPT_TEST_GPUS:+, GPT_TEST_GPUS=$GPT_TEST_GPUS})"; skipped=$((skipped + 1)); done
    echo "$passed passed, $failed failed, $skipped skipped"
    [[ $failed -eq 0 ]]
    exit
fi
common=(-e d12 -i "$tmp/train.bin" -j "$tmp/val.bin" -t 256 -d $((8 * 256 * n)) -x 20 -u 5 -l 6e-4 -q 1 -v 10 -m 2 -s 0 -sd 3)
run=("${common[@]}" -b 4)
export NCCL_NVLS_ENABLE=0  # NVLink multicast buys nothing at these sizes
export MASTER_PORT=$((20000 + RANDOM % 20000))
"$PYTHON" test/train_inputs.py tokens "$tmp/train.bin" 300000 --vocab 50257 --seed 1
"$PYTHON" test/train_inputs.py tokens "$tmp/val.bin" 20000 --vocab 50257 --seed 2
for prec in fp32 bf16; do
    tol=$([[ $prec == fp32 ]] && echo "1e-5 20 all" || echo "1e-2 20 loss")
    ./train_gpt_$prec "${run[@]}" >"$tmp/one_$prec.log" 2>&1
    timeout 300 scripts/launch.sh $n ./train_gpt_$prec "${run[@]}" >"$tmp/two_$prec.log" 2>&1
    close "equivalence $prec: $n GPUs against 1 GPU with accumulation" "$tmp/two_$prec.log" "$tmp/one_$prec.log" $tol
done
# The same -d split otherwise trains on the same sequences and validates on the same ones.
for b in 8 2; do
    timeout 300 scripts/launch.sh $n ./train_gpt_fp32 "${common[@]}" -b $b >"$tmp/split_$b.log" 2>&1
    close "split fp32: $n GPUs at -b $b against 1 GPU at -b 4, every step" "$tmp/split_$b.log" "$tmp/one_fp32.log" 1e-5 20 loss
    close "split fp32: $n GPUs at -b $b against 1 GPU at -b 4, validation (0, 10, 20)" "$tmp/split_$b.log" "$tmp/one_fp32.log" \
        1e-5 3 loss vals
done
# Open MPI's mpirun starts the same run (the ranks from OMPI_COMM_WORLD_*; they still meet over TCP);
# it passes on the variables -x names, the run secret among them.
secret=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')
short=(-e d12 -i "$tmp/train.bin" -j "$tmp/val.bin" -b 4 -t 256 -x 2 -v 0 -s 0)
if mpirun --version 2>&1 | grep -q 'Open MPI'; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    GPT_RUN_SECRET=$secret timeout 300 mpirun -np $n -x GPT_RUN_SECRET ./train_gpt_fp32 "${run[@]}" >"$tmp/mpi.log" 2>&1
    report "mpirun -np $n -x GPT_RUN_SECRET: the same printed steps as scripts/launch.sh" \
        "$(numeric_steps "$tmp/mpi.log" | grep -q . && cmp -s <(numeric_steps "$tmp/mpi.log") <(numeric_steps "$tmp/two_fp32.log") && echo 1 || echo 0)" \
        "$(grep -m1 -E '^error|^data parallel' "$tmp/mpi.log")"
    # (mpirun ends every rank once one exits with an error, so a rank may end before its own line)
    env -u GPT_RUN_SECRET timeout 120 mpirun -np $n ./train_gpt_bf16 "${short[@]}" >"$tmp/mpi_none.log" 2>&1
    rc=$?
    said=$(grep -c "^error: $n ranks and no run secret" "$tmp/mpi_none.log")
    report "mpirun -np $n without a secret: that one line from 1 to $n ranks, no other, no step" \
        "$([[ $rc -ne 0 && $said -ge 1 && $said -le $n && $(grep -c '^error' "$tmp/mpi_none.log") -eq $said ]] &&
            ! grep -q '^step' "$tmp/mpi_none.log" && echo 1 || echo 0)" \
        "exit code $rc, $said lines: $(grep -m1 '^error' "$tmp/mpi_none.log")"
else
    for c in "mpirun -np $n -x GPT_RUN_SECRET" "mpirun -np $n without a secret"; do
        skipped=$((skipped + 1)); printf '  %-66s skipped (no Open MPI mpirun on PATH)\n' "$c"
    done
fi
# The run secret through scripts/launch.sh: one of its own when none is set; a rank given another
# is dropped at its proof (it says so) and rank 0 counts it when its time is up.
env -u GPT_RUN_SECRET timeout 300 scripts/launch.sh $n ./train_gpt_bf16 "${short[@]}" >"$tmp/secret_own.log" 2>&1
rc=$?
report "scripts/launch.sh, no secret set: it makes one, and the $n ranks train" \
    "$([[ $rc -eq 0 && $(grep -c '^step ' "$tmp/secret_own.log") -eq 2 ]] && echo 1 || echo 0)" "exit code $rc"
GPT_RENDEZVOUS_TIMEOUT=20 timeout 120 scripts/launch.sh $n bash -c \
    '[[ $RANK == 1 ]] && export GPT_RUN_SECRET=another-secret-0123456789; exec ./train_gpt_bf16 "$@"' launch "${short[@]}" \
    >"$tmp/secret_other.log" 2>&1
rc=$?
# rank 1's one line; launch.sh then ends the ranks waiting at the rendezvous (rank 0 last, so that
# none of them reports rank 0 gone) at once, and no step runs
report "scripts/launch.sh, rank 1 given another secret: refused in one line, rank 0 ended with it" \
    "$([[ $rc -ne 0 && $(grep -c '^error' "$tmp/secret_other.log") -eq 1 && $(grep -c '^step ' "$tmp/secret_other.log") -eq 0 ]] &&
        grep -q "^error: rendezvous: rank 0 at .* dropped this rank at its proof" "$tmp/secret_other.log" && echo 1 || echo 0)" \
    "$(grep -m1 '^error' "$tmp/secret_other.log")"
# srun's variables as srun sets them on one node (no Slurm needed): the secret from the environment.
srun_style() {  # LOG ENV_ARGS...: n ranks of the fp32 run (env's own arguments first); rank 0's output in LOG, rank r's in LOG.r
    local log=$1 r pids=()
    shift
    for ((r = 0; r < n; r++)); do
        env "$@" SLURM_STEP_NUM_TASKS=$n SLURM_PROCID=$r SLURM_LOCALID=$r SLURM_STEP_NUM_NODES=1 \
            timeout 300 ./train_gpt_fp32 "${run[@]}" >"$log$([[ $r -gt 0 ]] && echo .$r)" 2>&1 &
        pids+=($!)
    done
    wait "${pids[@]}"
}
srun_style "$tmp/srun.log" GPT_RUN_SECRET="$secret"
report "srun's variables, GPT_RUN_SECRET in the environment: the same printed steps as scripts/launch.sh" \
    "$(numeric_steps "$tmp/srun.log" | grep -q . && cmp -s <(numeric_steps "$tmp/srun.log") <(numeric_steps "$tmp/two_fp32.log") && echo 1 || echo 0)" \
    "$(cat "$tmp/srun.log"* | grep -m1 -E '^error|^data parallel')"
srun_style "$tmp/srun_none.log" -u GPT_RUN_SECRET
report "srun's variables without a secret: one line on each rank, no step" \
    "$([[ $(cat "$tmp/srun_none.log"* | grep -c "^error: $n ranks and no run secret") -eq $n ]] &&
        ! grep -q '^step' "$tmp/srun_none.log" && echo 1 || echo 0)" "$(grep -m1 '^error' "$tmp/srun_none.log")"
NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 timeout 300 scripts/launch.sh $n ./train_gpt_fp32 "${run[@]}" >"$tmp/socket.log" 2>&1
close "equivalence fp32 over sockets (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1)" "$tmp/socket.log" "$tmp/one_fp32.log" 1e-5 20 all

timeout 300 scripts/launch.sh $n ./train_gpt_bf16 "${run[@]}" -o "$tmp/A" -n 10 >"$tmp/a.log" 2>&1
timeout 300 scripts/launch.sh $n ./train_gpt_bf16 "${run[@]}" -o "$tmp/A2" -n 10 >"$tmp/a2.log" 2>&1
report "determinism: the $n-GPU run twice, the same bits" \
    "$(cmp -s <(numeric_steps "$tmp/a.log") <(numeric_steps "$tmp/a2.log") && cmp -s "$tmp/A/state_00000020.bin" "$tmp/A2/state_00000020.bin" && echo 1 || echo 0)" ""
mkdir -p "$tmp/B" "$tmp/C"
cp "$tmp/A"/*_00000010.bin "$tmp/B"/ && cp "$tmp/A"/*_00000010.bin "$tmp/C"/
timeout 300 scripts/launch.sh $n ./train_gpt_bf16 "${run[@]}" -o "$tmp/B" -n 10 -y 1 >"$tmp/b.log" 2>&1
report "resume on $n GPUs from step 10: the same bits as the run never stopped" \
    "$(grep -q '^resuming from step 10 ' "$tmp/b.log" && cmp -s "$tmp/A/state_00000020.bin" "$tmp/B/state_00000020.bin" && echo 1 || echo 0)" \
    "$(grep -m1 resuming "$tmp/b.log")"
./train_gpt_bf16 "${run[@]}" -o "$tmp/C" -n 10 -y 1 >"$tmp/c.log" 2>&1
# (exactly steps 11..20: a run that started over instead would print 20)
close "resume on 1 GPU from the $n-GPU step 10 (bf16)" "$tmp/a.log" "$tmp/c.log" 1e-2 10 loss

cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' ')
if awk -v c="$cap" 'BEGIN { exit !(c + 0 < 8.9) }'; then
    for c in "FP8 equivalence" "FP8 resume on all"; do echo "multi-GPU $c: skipped (FP8 needs compute capability 8.9, the GPU has $cap)"; skipped=$((skipped + 1)); done
else
    fp8_run=("${run[@]/#6e-4/5e-5}" -f8 1)
    ./train_gpt_bf16 "${fp8_run[@]}" >"$tmp/one_f8.log" 2>&1
    timeout 300 scripts/launch.sh $n ./train_gpt_bf16 "${fp8_run[@]}" -o "$tmp/F" -n 10 >"$tmp/f8.log" 2>&1
    close "FP8 equivalence: -f8 1 on $n GPUs against 1 GPU with accumulation" "$tmp/f8.log" "$tmp/one_f8.log" 1e-2 20 loss
    mkdir -p "$tmp/G" && cp "$tmp/F"/*_00000010.bin "$tmp/G"/
    timeout 300 scripts/launch.sh $n ./train_gpt_bf16 "${fp8_run[@]}" -o "$tmp/G" -n 10 -y 1 >"$tmp/g8.log" 2>&1
    report "FP8 resume on $n GPUs from step 10 (-f8 1): the same bits as the run never stopped" \
        "$(grep -q '^resuming from step 10 ' "$tmp/g8.log" && cmp -s <(numeric_steps "$tmp/f8.log" | awk '$1 > 10') <(numeric_steps "$tmp/g8.log") &&
            cmp -s "$tmp/F/state_00000020.bin" "$tmp/G/state_00000020.bin" && echo 1 || echo 0)" "$(grep -m1 resuming "$tmp/g8.log")"
fi

scripts/launch.sh $n ./train_gpt_bf16 -e d12 -i "$tmp/train.bin" -j "$tmp/val.bin" -b 4 -t 256 -x 100000 -v 0 -s 0 >"$tmp/k.log" 2>&1 &
launcher=$!
deadline=$((SECONDS + 120))
until grep -q '^step  *3/' "$tmp/k.log" 2>/dev/null || ((SECONDS > deadline)); do sleep 0.2; done
victim=$(pgrep -f "train_gpt_bf16 -e d12 -i $tmp/train.bin" | while read -r p; do grep -qz '^RANK=1$' /proc/$p/environ && echo "$p"; done | head -n 1)
killed_at=$SECONDS
[[ -n $victim ]] && kill -9 "$victim"
wait $launcher
rc=$?
took=$((SECONDS - killed_at))
report "kill -9 of rank 1: rank 0 ends with an error within 60 s" \
    "$([[ -n $victim && $rc -ne 0 && $took -le 60 ]] && grep -q '^error: rank 0: rank 1 ended' "$tmp/k.log" && echo 1 || echo 0)" \
    "$took s, exit code $rc: $(grep -m1 '^error' "$tmp/k.log")"
timeout 120 scripts/launch.sh $n bash -c './train_gpt_bf16 -e d12 -i '"$tmp/train.bin"' -j '"$tmp/val.bin"' -t 256 -x 2 -b $((RANK == 1 ? 5 : 4))' \
    >"$tmp/m.log" 2>&1
report "ranks started with different -b: refused, naming the difference" \
    "$([[ $? -ne 0 ]] && grep -q "'-b=5' where rank 0 has '-b=4'" "$tmp/m.log" && echo 1 || echo 0)" "$(grep -m1 '^error' "$tmp/m.log")"
timeout 120 scripts/launch.sh $((gpus + 1)) ./train_gpt_bf16 -e d12 -i "$tmp/train.bin" -j "$tmp/val.bin" -t 256 -x 2 >"$tmp/g.log" 2>&1
report "$((gpus + 1)) ranks on $gpus GPUs: an error" "$([[ $? -ne 0 ]] && grep -q 'at most one rank per GPU' "$tmp/g.log" && echo 1 || echo 0)" \
    "$(grep -m1 'one rank per GPU' "$tmp/g.log")"
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
