#!/usr/bin/env bash
# Checkpoints, resume and determinism of train_gpt on the GPU, in both precisions:
#   determinism      two runs, same seed and flags, 20 steps: identical step (loss, norm) and val lines,
#                    and identical final state files (parameters and AdamW state, bit for bit)
#   resume           A: 20 steps, checkpoint every 10. B: 10 steps, then -y 1 -x 20. B's steps 11..20
#                    and val losses equal A's bit for bit, and B's final checkpoint files equal A's
#                    byte for byte. With -sh 1 and -d 2*B*T (loader state, accumulation) and the
#                    shuffled data wrapping into a second epoch after the resume. -q 1 holds the
#                    learning rate constant after warm-up, so the schedule does not depend on -x
#                    (B's first half runs with -x 10).
#   another -b       (fp32) A's checkpoint of step 10 resumed with -b 8 in place of -b 4 (the same -d: one
#                    micro-batch a step in place of two): steps 11..20 and the val losses within 1e-5
#                    relative of A's (test/compare_steps.sh's close: the same sequences, another
#                    rounding); and a run at -b 8 from the start against A: every step and val loss
#                    within 1e-5
#   outlier guard    U: 170 steps of a small model with -sl 1.5 -sg 1.5 (updates skipped from step 129 on),
#                    checkpoints at 140 and 170; R: the same stopped at 140, then -y 1. Checkpoint 140
#                    holds both windows full; U skips updates after 140; R's steps 141..170 (loss, norm,
#                    what was skipped and why) are U's, and so is its final checkpoint, byte for byte
#   keep-K           -n 5 -nk 2 -x 20: exactly the checkpoints of steps 15 and 20 remain; -v 0 ends
#                    without a validation loss
#   corrupt newest   a byte flipped in A's newest state file: -y 1 warns once (naming the file),
#                    resumes from step 10 and repeats A's steps 11..20
#   faults, signals  (bf16) a small model's run of 20 steps with checkpoints every 10, against the same
#                    run never interrupted (U): killed (-9, by build/test/libfault_inject.so) before
#                    7 file operations spread over the step-10 save, then -y 1: the final
#                    checkpoint and every step line are U's; ENOSPC / EIO in the step-20 save: one
#                    error line, exit 1, step 10 kept, and -y 1 finishes as U; SIGTERM / SIGINT
#                    between checkpoints (as step 7's first batch is read ahead, the read counted by
#                    checkpoint_tool batches): exit code 75 with a checkpoint of the step it stopped at,
#                    and -y 1 finishes as U; two signals at once are one stop; a second SIGTERM a
#                    second later ends the program at once
#   OOM              -e d12 -b 4096 -t 1024: exit 1, one line `error: out of GPU memory ...` with the
#                    requested and free sizes
#   non-finite       a model whose logits overflow: three skipped updates, each named, then exit 1
#   exp head         (bf16, where lm_head.cuh runs) a model with one huge logit (wte[1236][0] = 1e4): rows
#                    whose loss passes 44 are refused, so step 1 is skipped, named, and the run goes on
#                    with the logits (-lx 0: no skipped step); with validation at step 0 that validation
#                    reruns with the logits and no step is skipped; a checkpoint written after the
#                    switch resumes with the logits, saying so
# Without a GPU every check is reported as skipped. Ends with `N passed, N failed, N skipped`.
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
read -r -a precisions <<<"${PRECISIONS:-fp32 bf16}"  # PRECISIONS="bf16" runs one
checks=(determinism resume outlier-guard keep-K corrupt-newest faults-and-signals oom non-finite)  # fp32 adds another-b, bf16 exp-head
passed=0 failed=0 skipped=0

if ! nvidia-smi -L >/dev/null 2>&1; then
    for prec in "${precisions[@]}"; do
        for check in "${checks[@]}" $([[ $prec == fp32 ]] && echo another-b) $([[ $prec == bf16 ]] && echo exp-head); do
            echo "train_gpt_$prec $check: skipped (no CUDA device)"
            skipped=$((skipped + 1))
        done
    done
    echo "$passed passed, $failed failed, $skipped skipped"
    exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
shim=$PWD/build/test/libfault_inject.so
report() {  # name ok(1/0) detail
    if [[ $2 -eq 1 ]]; then
        passed=$((passed + 1))
        printf '  %-62s ok    %s\n' "$1" "$3"
    else
        failed=$((failed + 1))
        printf '  %-62s FAIL  %s\n' "$1" "$3"
    fi
}
show() { sed 's/^/      | /' "$1" | tail -n "${2:-6}"; }
# "step loss norm" of every step line, "step val-loss" of every val line
steps_of() { sed -nE 's/^step +([0-9]+)\/[0-9]+ \| loss ([^ ]+) \| norm ([^ ]+) .*/\1 \2 \3/p' "$1"; }
vals_of() { sed -nE 's/^step +([0-9]+) \| val loss ([^ ]+).*/\1 \2/p' "$1"; }
# "step loss norm why" of every step line, why the outlier guard's reasons for a skipped update or "-"
guard_steps_of() {
    awk '/^step +[0-9]+\// { split($2, s, "/"); at = index($0, "| skipped: ")
                            print s[1], $5, $8, at ? substr($0, at + 11) : "-" }' "$1"
}
in_range() { awk -v lo="$1" -v hi="$2" '$1 >= lo && $1 <= hi'; }
source test/compare_steps.sh  # close (two runs' lines within a relative bound), train, same
# ---- inputs: learnable synthetic tokens (ids < 1237, so they fit both models), tokenizers, models
set -e
gen() { "$PYTHON" test/train_inputs.py "$@"; }
gen tokens "$tmp/train.bin" 30000            # 117 sequences of 257 at -t 256, 8 a step at -d 2048: epoch 2 starts in step 15
gen tokens "$tmp/val.bin" 6000 --seed 1
gen tokens "$tmp/big.bin" 4194305 --seed 2   # B*T+1 at -b 4096 -t 1024
gen tokenizer "$tmp/tok50257.bin" 50257
gen tokenizer "$tmp/tok1237.bin" 1237
"$PYTHON" gpt_reference.py init --model L=2,NH=3,C=39,V=1237,maxT=50 --seed 3 --out "$tmp/tiny.ckpt" >/dev/null
# A small model with GPT-2's head size (64: flash attention in bf16) and the small vocabulary.
"$PYTHON" gpt_reference.py init --model L=2,NH=4,C=256,V=1237,maxT=256 --seed 4 --out "$tmp/small.ckpt" >/dev/null
# Non-finite: wte = +-3e38 with random signs and lnfw = 3e38: the logits overflow, in either precision.
"$PYTHON" - "$tmp/tiny.ckpt" "$tmp/blowup.ckpt" <<'EOF'
import sys
import numpy as np
data = np.fromfile(sys.argv[1], np.uint8)
h = data[:1024].view(np.int32)
L, C, Vp = int(h[2]), int(h[4]), int(h[7])
p = data[1024:].view(np.float32).copy()
p[:Vp * C] = np.where(np.random.default_rng(0).random(Vp * C) < 0.5, -3e38, 3e38)
p[p.size - 2 * C:p.size - C] = 3e38  # lnfw (lnfb is last)
h = h.copy()
h[8] = 0  # the payload changed: no crc32 recorded (0), so the loader reaches the values
open(sys.argv[2], "wb").write(h.tobytes() + p.tobytes())
EOF
# The exp head's refusal: token 1236's logit is 1e4 times lnf's first value (wte is the first tensor).
"$PYTHON" test/train_inputs.py edit "$tmp/small.ckpt" "$tmp/loud.ckpt" --set-float $((1236 * 256))=1e4 --set-int 8=0
set +e

small_common=(-e "$tmp/small.ckpt" -i "$tmp/train.bin" -j "$tmp/val.bin" -z "$tmp/tok1237.bin" -t 256 -d 2048 -sh 1 -sd 7
    -l 1e-3 -u 3 -q 1 -v 5 -m 2 -s 0)
small_run=("${small_common[@]}" -b 4)

for prec in "${precisions[@]}"; do
    bin=train_gpt_$prec
    echo "=== ./$bin"
    if [[ ! -x $bin ]]; then
        echo "  FAIL: ./$bin is not built (make $bin)"
        failed=$((failed + 1))
        continue
    fi
    p=$tmp/$prec
    mkdir -p "$p"

    # ---- determinism
    train "$p/d1" "${small_run[@]}" -x 20 -o "$p/D1"  # -o: one checkpoint, at the end
    rc1=$rc
    train "$p/d2" "${small_run[@]}" -x 20 -o "$p/D2"
    if [[ $rc1 -ne 0 || $rc -ne 0 ]]; then
        report "[$prec] determinism: two runs" 0 "exit codes $rc1 and $rc"
        show "$p/d1.err"
    else
        steps_of "$p/d1.out" >"$p/d1.steps"; steps_of "$p/d2.out" >"$p/d2.steps"
        vals_of "$p/d1.out" >"$p/d1.vals"; vals_of "$p/d2.out" >"$p/d2.vals"
        same "[$prec] determinism: step lines (loss, norm) of 20 steps" "$p/d1.steps" "$p/d2.steps" 20
        same "[$prec] determinism: val lines (steps 0, 5, .., 20)" "$p/d1.vals" "$p/d2.vals" 5
        f=state_00000020.bin  # master weights and AdamW state after 20 steps: exact, not 6 decimals
        if cmp -s "$p/D1/$f" "$p/D2/$f"; then report "[$prec] determinism: final $f identical, byte for byte" 1 ""
        else report "[$prec] determinism: final $f identical, byte for byte" 0 "$(cmp "$p/D1/$f" "$p/D2/$f" 2>&1 | head -n 1)"; fi
    fi
    rm -rf "$p/D1" "$p/D2"

    # ---- resume
    train "$p/a" "${small_run[@]}" -x 20 -o "$p/A" -n 10
    rca=$rc
    train "$p/b1" "${small_run[@]}" -x 10 -o "$p/B" -n 10
    rcb1=$rc
    train "$p/b2" "${small_run[@]}" -x 20 -o "$p/B" -n 10 -y 1
    if [[ $rca -ne 0 || $rcb1 -ne 0 || $rc -ne 0 ]]; then
        report "[$prec] resume: runs A, B (10 steps), B resumed" 0 "exit codes $rca, $rcb1, $rc"
        show "$p/a.err"; show "$p/b1.err"; show "$p/b2.err"
    else
        report "[$prec] resume: B says it resumes from step 10" "$(grep -q '^resuming from step 10 ' "$p/b2.out" && echo 1 || echo 0)" \
            "$(grep -m1 '^resuming' "$p/b2.out")"
        steps_of "$p/a.out" >"$p/a.steps"; vals_of "$p/a.out" >"$p/a.vals"
        steps_of "$p/b1.out" >"$p/b1.steps"
        steps_of "$p/b2.out" >"$p/b2.steps"; vals_of "$p/b2.out" >"$p/b2.vals"
        in_range 1 10 <"$p/a.steps" >"$p/a.first"
        in_range 11 20 <"$p/a.steps" >"$p/a.second"
        in_range 10 20 <"$p/a.vals" >"$p/a.vals2"
        same "[$prec] resume: B's steps 1..10 = A's" "$p/a.first" "$p/b1.steps" 10
        same "[$prec] resume: resumed B's steps 11..20 = A's (loss, norm)" "$p/a.second" "$p/b2.steps" 10
        same "[$prec] resume: resumed B's val losses (10, 15, 20) = A's" "$p/a.vals2" "$p/b2.vals" 3
        for kind in model state; do
            f=${kind}_00000020.bin
            if cmp -s "$p/A/$f" "$p/B/$f"; then report "[$prec] resume: B's $f = A's, byte for byte" 1 ""
            else report "[$prec] resume: B's $f = A's, byte for byte" 0 "$(cmp "$p/A/$f" "$p/B/$f" 2>&1 | head -n 1)"; fi
        done
    fi

    # ---- another -b (fp32: bf16's roundings differ more between batch shapes than the bound)
    if [[ $prec == fp32 ]]; then
        if [[ -e $p/A/state_00000010.bin ]]; then
            mkdir -p "$p/E" && cp "$p/A"/*_00000010.bin "$p/E"/
            train "$p/e" "${small_common[@]}" -b 8 -x 20 -o "$p/E" -n 10 -y 1
            close "[$prec] another -b: A's step 10 resumed at -b 8, steps 11..20 against A's" "$p/a.out" "$p/e.out" 1e-5 10 loss
            close "[$prec] another -b: resumed at -b 8, val losses (10, 15, 20) against A's" "$p/a.out" "$p/e.out" 1e-5 3 loss vals
        else
            report "[$prec] another -b: A's step 10 resumed at -b 8" 0 "run A left no state_00000010.bin"
        fi
        train "$p/f" "${small_common[@]}" -b 8 -x 20
        close "[$prec] another -b: a run at -b 8 against A (-b 4), every step" "$p/a.out" "$p/f.out" 1e-5 20 loss
        close "[$prec] another -b: a run at -b 8 against A, val losses (0, 5, .., 20)" "$p/a.out" "$p/f.out" 1e-5 5 loss vals
    fi

    # ---- outlier guard: its windows are part of a checkpoint
    guard=(-e "$tmp/tiny.ckpt" -i "$tmp/train.bin" -j "$tmp/val.bin" -z "$tmp/tok1237.bin" -b 4 -t 32 -sh 1 -sd 7
           -l 1e-3 -u 3 -q 1 -v 0 -s 0 -n 140 -sl 1.5 -sg 1.5)
    train "$p/gu" "${guard[@]}" -x 170 -o "$p/GU"
    rcu=$rc
    train "$p/gr" "${guard[@]}" -x 140 -o "$p/GR"
    rcr=$rc
    train "$p/gr2" "${guard[@]}" -x 170 -o "$p/GR" -y 1
    if [[ $rcu -ne 0 || $rcr -ne 0 || $rc -ne 0 ]]; then
        report "[$prec] outlier guard: runs U, R (140 steps), R resumed" 0 "exit codes $rcu, $rcr, $rc"
        show "$p/gu.err"; show "$p/gr.err"; show "$p/gr2.err"
    else
        held=$("$PYTHON" - "$p/GR/state_00000140.bin" <<'EOF'
import sys
import numpy as np
sys.path.insert(0, "data")
import file_formats as ff
data = open(sys.argv[1], "rb").read()
windows = np.frombuffer(data[-ff.OUTLIER_WINDOWS.itemsize:], ff.OUTLIER_WINDOWS)[0]
print(ff.TRAIN_STATE.unpack(data)["outlier_bytes"], int(windows["loss"]["count"]), int(windows["norm"]["count"]))
EOF
)
        report "[$prec] outlier guard: checkpoint 140 holds both windows, full" "$([[ $held == "2064 128 128" ]] && echo 1 || echo 0)" \
            "outlier_bytes and counts: $held"
        report "[$prec] outlier guard: R resumed says its windows hold 128 values each" \
            "$(grep -q '^outlier guard: .* 128 and 128 held now' "$p/gr2.out" && echo 1 || echo 0)" "$(grep -m1 '^outlier guard' "$p/gr2.out")"
        guard_steps_of "$p/gu.out" | in_range 141 170 >"$p/gu.second"
        guard_steps_of "$p/gr2.out" >"$p/gr2.steps"
        nskip=$(grep -vc ' -$' "$p/gu.second")
        report "[$prec] outlier guard: U skips updates after step 140" "$([[ $nskip -ge 1 ]] && echo 1 || echo 0)" \
            "$nskip of steps 141..170, $(grep -c '| skipped: ' "$p/gu.out") in all"
        same "[$prec] outlier guard: resumed R's steps 141..170 = U's (loss, norm, skipped)" "$p/gu.second" "$p/gr2.steps" 30
        for f in state_00000170.bin model_00000170.bin; do
            if cmp -s "$p/GU/$f" "$p/GR/$f"; then report "[$prec] outlier guard: R's $f = U's, byte for byte" 1 ""
            else report "[$prec] outlier guard: R's $f = U's, byte for byte" 0 "$(cmp "$p/GU/$f" "$p/GR/$f" 2>&1 | head -n 1)"; fi
        done
    fi
    rm -rf "$p/GU" "$p/GR"

    # ---- keep-K (the small model: only the files matter)
    train "$p/k" -e "$tmp/tiny.ckpt" -i "$tmp/train.bin" -j "$tmp/val.bin" -z "$tmp/tok1237.bin" -b 4 -t 32 -x 20 \
        -v 0 -s 0 -o "$p/K" -n 5 -nk 2
    left=$(cd "$p/K" 2>/dev/null && ls -A | grep -vE '^(main\.log|metrics\.csv)$' | tr '\n' ' ')
    want="model_00000015.bin model_00000020.bin state_00000015.bin state_00000020.bin "
    report "[$prec] keep-K: -n 5 -nk 2 -x 20 leaves steps 15 and 20 only" "$([[ $rc -eq 0 && $left == "$want" ]] && echo 1 || echo 0)" \
        "exit code $rc; files: $left"

    # ---- corrupt newest: a byte of A's state_00000020.bin flipped
    if [[ -e $p/A/state_00000020.bin ]]; then
        cp -r "$p/A" "$p/C"
        "$PYTHON" test/train_inputs.py edit "$p/A/state_00000020.bin" "$p/C/state_00000020.bin" --flip -4096
        train "$p/c" "${small_run[@]}" -x 20 -o "$p/C" -n 10 -y 1
        nerr=$(grep -c '' "$p/c.err")
        ok=0
        [[ $rc -eq 0 && $nerr -eq 1 ]] && grep -q '^warning: .*state_00000020\.bin' "$p/c.err" &&
            grep -q '^resuming from step 10 ' "$p/c.out" && ok=1
        report "[$prec] corrupt newest: one warning naming it, resumes from 10" $ok "exit code $rc; stderr: $(head -c 200 "$p/c.err")"
        steps_of "$p/c.out" >"$p/c.steps"
        same "[$prec] corrupt newest: steps 11..20 = A's" "$p/a.second" "$p/c.steps" 10
    else
        report "[$prec] corrupt newest" 0 "run A left no state_00000020.bin"
    fi

    # ---- faults during a real save, and signals (bf16 only: the protocol is the same in both builds).
    # A small model, 20 steps, checkpoints every 10: U is the run never interrupted.
    if [[ $prec == bf16 ]]; then
        small=(-e "$tmp/tiny.ckpt" -i "$tmp/train.bin" -j "$tmp/val.bin" -z "$tmp/tok1237.bin" -b 4 -t 32 -d 256 -sh 1
               -sd 7 -l 1e-3 -u 3 -q 1 -v 5 -m 2 -s 0 -n 10)
        train "$p/u" "${small[@]}" -x 20 -o "$p/U"
        steps_of "$p/u.out" >"$p/u.steps"
        # same_run NAME DIR LOG...: DIR's final checkpoint is U's, byte for byte, and the logs' step lines are U's
        same_run() {
            local name=$1 dir=$2 why="" f
            shift 2
            for f in state_00000020.bin model_00000020.bin; do cmp -s "$dir/$f" "$p/U/$f" || why+="$f differs; "; done
            for f in "$@"; do steps_of "$f"; done | sort -n -u >"$p/merged.steps"
            # every step line a run printed is U's line for that step (a step run twice prints it twice)
            join <(sort -k1,1 "$p/merged.steps") <(sort -k1,1 "$p/u.steps") | awk '$2 != $4 || $3 != $5 { bad = 1 } END { exit bad }' ||
                why+="a step's loss or norm differs from U's; "
            report "$name" "$([[ -z $why ]] && echo 1 || echo 0)" "${why:-final checkpoint and every step line as in U}"
        }
        # The file operations of the first save (step 10), counted on a run of its own.
        rm -f "$p/trace"
        FAULT_ONLY="$p/T" FAULT_AFTER=model_00000010 FAULT_TRACE="$p/trace" LD_PRELOAD=$shim train "$p/t" "${small[@]}" -x 10 -o "$p/T"
        ops=$(grep -c '' "$p/trace" 2>/dev/null)
        report "[$prec] faults: the step-10 save makes $ops file operations" "$([[ $ops -ge 18 ]] && echo 1 || echo 0)" \
            "$(awk '{print $2}' "$p/trace" 2>/dev/null | uniq -c | awk '{printf "%s %s, ", $1, $2}')"
        # kill -9 before some of them, spread over the save; then -y 1 runs to step 20.
        for k in 1 4 6 9 15 17 19; do  # the model file's create, fsync, rename; the state file's create, fsync, rename; after
            d=$p/kill_$k
            (FAULT_ONLY="$d" FAULT_AFTER=model_00000010 FAULT_AT=$k FAULT_ACTION=kill LD_PRELOAD=$shim train "$p/k$k" "${small[@]}" -x 20 -o "$d"
             exit $rc) 2>/dev/null
            rck=$?
            train "$p/k${k}r" "${small[@]}" -x 20 -o "$d" -y 1
            if [[ $rck -ne 137 || $rc -ne 0 ]]; then
                report "[$prec] faults: killed before op $k of the save, then -y 1" 0 "exit codes $rck (expected 137) and $rc"
                show "$p/k${k}r.err"
            else
                same_run "[$prec] faults: killed before op $k of the save, -y 1: the same run as U" "$d" "$p/k$k.out" "$p/k${k}r.out"
            fi
        done
        # A full disk during the second save: one error line, exit 1, the first checkpoint intact; -y 1 then finishes the run.
        for action in enospc eio; do
            d=$p/$action
            FAULT_ONLY="$d/state_00000020" FAULT_AT=2 FAULT_ACTION=$action LD_PRELOAD=$shim train "$p/$action" "${small[@]}" -x 20 -o "$d"
            nerr=$(grep -c '' "$p/$action.err")
            ok=0
            [[ $rc -eq 1 && $nerr -eq 1 && $(head -n 1 "$p/$action.err") == "error: writing checkpoint for step 20: "* && -e $d/state_00000010.bin &&
               ! -e $d/state_00000020.bin && ! -e $d/model_00000020.bin ]] && ok=1
            report "[$prec] faults: $action while the step-20 save writes: one error line, exit 1, step 10 kept" $ok \
                "exit code $rc; $(head -n 1 "$p/$action.err")"
            train "$p/${action}r" "${small[@]}" -x 20 -o "$d" -y 1
            same_run "[$prec] faults: after $action, -y 1: the same run as U" "$d" "$p/$action.out" "$p/${action}r.out"
        done
        # SIGTERM / SIGINT: the step in progress finishes, a checkpoint is written, exit code 75; -y 1 goes on.
        # The signal comes from the fault library at the first read of step 7's batches (after the
        # training data's header, its fingerprint and the reads of steps 1..6: one per run of
        # consecutive sequences in a micro-batch, as checkpoint_tool batches counts them): while step 6
        # runs, as the first batch of step 7 is read ahead, so the stop must also put that batch back.
        step7=$(build/test/checkpoint_tool batches "$tmp/train.bin" 32 256 4 1 7 1 6 | awk '$1 == "batch" { n += $5 } END { print n + 3 }')
        for sig in TERM INT; do
            d=$p/sig$sig
            FAULT_ONLY="$tmp/train.bin" FAULT_AT=$step7 FAULT_ACTION=${sig,,} LD_PRELOAD=$shim train "$p/sig$sig" "${small[@]}" -x 20 -o "$d"
            stopped=$(sed -nE 's/^stopped at step ([0-9]+) by a signal.*/\1/p' "$p/sig$sig.out")
            ok=0
            [[ $rc -eq 75 && $stopped == 6 && -e $d/state_00000006.bin ]] && ok=1
            report "[$prec] signals: SIG$sig during step 6: exit code 75, checkpoint of step 6" $ok "exit code $rc, stopped at ${stopped:-none}"
            train "$p/sig${sig}r" "${small[@]}" -x 20 -o "$d" -y 1
            same_run "[$prec] signals: SIG$sig, then -y 1: the same run as U" "$d" "$p/sig$sig.out" "$p/sig${sig}r.out"
        done
        # Two signals at once (a terminal's Ctrl-C and a launcher passing it on) are one stop.
        FAULT_ONLY="$tmp/train.bin" FAULT_AT=$step7 FAULT_ACTION=term LD_PRELOAD=$shim \
            "./$bin" "${small[@]}" -x 20 -o "$p/sig2" >"$p/sig2.out" 2>"$p/sig2.err" </dev/null &
        pid=$!
        until grep -q '^step  *3/' "$p/sig2.out" 2>/dev/null || ! kill -0 $pid 2>/dev/null; do sleep 0.002; done
        kill -INT $pid; kill -TERM $pid
        wait $pid
        rcs=$?
        report "[$prec] signals: SIGINT and SIGTERM at once: one stop, exit code 75" \
            "$([[ $rcs -eq 75 ]] && grep -q '^stopped at step' "$p/sig2.out" && echo 1 || echo 0)" "exit code $rcs"
        # A second signal a second or more after the first ends the program at once (killed by it).
        # Each read of the training data is slowed to 3 s, so the run is still in its first step.
        FAULT_ONLY="$tmp/train.bin" FAULT_SLEEP_MS=3000 LD_PRELOAD=$shim \
            "./$bin" "${small[@]}" -x 20 -o "$p/sig3" >"$p/sig3.out" 2>"$p/sig3.err" </dev/null &
        pid=$!
        deadline=$((SECONDS + 120))
        until grep -q '^device:' "$p/sig3.out" 2>/dev/null || ! kill -0 $pid 2>/dev/null || ((SECONDS > deadline)); do sleep 0.01; done
        kill -TERM $pid; sleep 1.5; kill -TERM $pid
        wait $pid
        rcs=$?
        report "[$prec] signals: a second SIGTERM 1.5 s later ends it at once (killed by the signal)" \
            "$([[ $rcs -eq 143 ]] && ! grep -q '^stopped at' "$p/sig3.out" && echo 1 || echo 0)" "exit code $rcs"
    fi

    # ---- out of GPU memory
    train "$p/oom" -e d12 -i "$tmp/big.bin" -j "$tmp/big.bin" -z "$tmp/tok50257.bin" -b 4096 -t 1024 -x 1 -u 0 -v 0 -s 0
    nerr=$(grep -c '' "$p/oom.err")
    ok=0
    [[ $rc -eq 1 && $nerr -eq 1 ]] && grep -qE '^error: out of GPU memory.*requested [0-9.]+ .*free [0-9.]+ .*-b' "$p/oom.err" && ok=1
    report "[$prec] oom: -e d12 -b 4096 -t 1024 fails with one line" $ok "exit code $rc: $(head -c 300 "$p/oom.err")"

    # ---- non-finite loss: each skipped update named, the run stops after three in a row
    train "$p/nf" -e "$tmp/blowup.ckpt" -i "$tmp/train.bin" -j "$tmp/val.bin" -z "$tmp/tok1237.bin" -b 4 -t 32 -x 10 -v 0 -s 0
    nwarn=$(grep -cE '^warning: step [123]: non-finite' "$p/nf.err")
    ok=0
    [[ $rc -eq 1 && $nwarn -eq 3 && $(tail -n 1 "$p/nf.err") == "error: stopping at step 3"* ]] && ok=1
    report "[$prec] non-finite: 3 skipped updates named, then exit 1" $ok "exit code $rc, $nwarn warnings; last: $(tail -n 1 "$p/nf.err")"

    # ---- the exp head's refused rows: the run goes on with the logits (bf16 only)
    if [[ $prec == bf16 ]]; then
        loud=(-e "$tmp/loud.ckpt" -i "$tmp/train.bin" -j "$tmp/val.bin" -z "$tmp/tok1237.bin" -b 4 -t 256 -s 0)
        train "$p/lx" "${loud[@]}" -x 4 -v 0 -n 2 -o "$p/LX"
        rc_a=$rc
        train "$p/lx0" "${loud[@]}" -x 4 -v 0 -lx 0
        rc_b=$rc
        train "$p/lxv" "${loud[@]}" -x 2 -v 2 -m 1
        rc_c=$rc
        train "$p/lxr" "${loud[@]}" -x 6 -v 0 -n 2 -o "$p/LX" -y 1
        rc_d=$rc
        finite_after_1=$(steps_of "$p/lx.out" | awk '$1 > 1 && $2 ~ /^[0-9.]+$/' | wc -l)
        ok=0
        [[ $rc_a -eq 0 && $rc_b -eq 0 && $rc_c -eq 0 && $rc_d -eq 0 ]] &&
            grep -q 'LM head exp (-lx 1)' "$p/lx.out" &&
            [[ $(grep -c '^warning: step 1 was non-finite with the exp LM head' "$p/lx.err") -eq 1 ]] &&
            [[ $(grep -c '^warning: step 1: non-finite loss, update skipped' "$p/lx.err") -eq 1 ]] &&
            [[ $finite_after_1 -eq 3 ]] &&
            ! grep -q 'non-finite' "$p/lx0.err" &&
            [[ $(grep -c '^warning: validation 0 was non-finite with the exp LM head' "$p/lxv.err") -eq 1 ]] &&
            ! grep -q 'warning: step' "$p/lxv.err" && [[ $(vals_of "$p/lxv.out" | awk '$2 ~ /^[0-9.]+$/' | wc -l) -eq 2 ]] &&
            grep -q 'written with the logits and the classifier: resuming so (-lx 0)' "$p/lxr.out" &&
            ! grep -q 'non-finite' "$p/lxr.err" && ok=1
        report "[$prec] exp head: refused rows skip one step, then the logits" $ok \
            "exit codes $rc_a $rc_b $rc_c $rc_d; finite steps after 1: $finite_after_1; stderr: $(head -c 300 "$p/lx.err")"
        [[ $ok -eq 1 ]] || { show "$p/lx.out"; show "$p/lxv.err"; show "$p/lxr.out"; }
    fi
    rm -rf "$p"
done
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
