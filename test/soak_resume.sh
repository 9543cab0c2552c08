#!/usr/bin/env bash
# usage: [STEPS=1500] [KILLS=12] [PRECISION=bf16] [SEED=1] bash test/soak_resume.sh
#
# A soak test of checkpoints and resume on a GPU (minutes; not part of `make test`): a small model
# trains STEPS steps with a checkpoint every 50 (keep 3), once straight through (U), and once killed
# with kill -9 at KILLS random steps ahead of the run (half of them just after a checkpoint step,
# while its save runs), each time restarted with -y 1, then run to the end. The final
# checkpoint must equal U's byte for byte, and every loss the interrupted runs logged (main.log and
# metrics.csv, steps trained twice included) must equal U's loss at that step, bit for bit (the
# printed digits of a float). Also reports how many kills landed while a checkpoint was being
# written. Ends with `N passed, N failed, N skipped`.
set -u
cd "$(dirname "$0")/.."
STEPS=${STEPS:-1500} KILLS=${KILLS:-12} PRECISION=${PRECISION:-bf16} SEED=${SEED:-1}
PYTHON=${PYTHON:-python3}
bin=./train_gpt_$PRECISION
passed=0 failed=0
report() {
    if [[ $2 -eq 1 ]]; then passed=$((passed + 1)); printf '  %-66s ok    %s\n' "$1" "$3"
    else failed=$((failed + 1)); printf '  %-66s FAIL  %s\n' "$1" "$3"; fi
}
if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "soak: skipped (no CUDA device)"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
[[ -x $bin ]] || { echo "FAIL: $bin is not built"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PYTHON" test/train_inputs.py tokens "$tmp/train.bin" 200000 --seed 11
"$PYTHON" test/train_inputs.py tokens "$tmp/val.bin" 20000 --seed 12
"$PYTHON" test/train_inputs.py tokenizer "$tmp/tok.bin" 1237
"$PYTHON" gpt_reference.py init --model L=4,NH=4,C=128,V=1237,maxT=64 --seed 5 --out "$tmp/model.ckpt" >/dev/null
run=(-e "$tmp/model.ckpt" -i "$tmp/train.bin" -j "$tmp/val.bin" -z "$tmp/tok.bin" -b 8 -t 64 -x "$STEPS" -u 20 -l 1e-3
     -v 100 -m 2 -s 0 -n 50 -nk 3)

started=$SECONDS
$bin "${run[@]}" -o "$tmp/U" >"$tmp/u.log" 2>&1
rc=$?
straight=$((SECONDS - started))
report "uninterrupted run of $STEPS steps ($straight s)" "$([[ $rc -eq 0 ]] && echo 1 || echo 0)" "exit code $rc"

RANDOM=$SEED
kills=0 mid_save=0
logged() { grep -o '^s:[0-9]* trl' "$tmp/K/main.log" 2>/dev/null | tr -dc '0-9\n' | sort -n | tail -n 1; }
for ((i = 1; i <= KILLS; i++)); do
    last=$(logged)
    last=${last:-0}
    # The next kill: at a step not logged yet, every other one right after a checkpoint step (while
    # the save that follows it runs), the others anywhere.
    if ((i % 2)); then target=$(((last / 50 + 1 + RANDOM % 3) * 50)); else target=$((last + 1 + RANDOM % 120)); fi
    ((target >= STEPS - 5)) && break
    $bin "${run[@]}" -o "$tmp/K" -y 1 >>"$tmp/k.log" 2>&1 &
    pid=$!
    until grep -q "^s:$target trl" "$tmp/K/main.log" 2>/dev/null || ! kill -0 $pid 2>/dev/null; do sleep 0.002; done
    if kill -0 $pid 2>/dev/null; then
        compgen -G "$tmp/K/*.tmp.*" >/dev/null && mid_save=$((mid_save + 1))
        kill -9 $pid
        kills=$((kills + 1))
    fi
    wait $pid 2>/dev/null
done
$bin "${run[@]}" -o "$tmp/K" -y 1 >>"$tmp/k.log" 2>&1
rc=$?
report "$kills kill -9 ($mid_save while a checkpoint was being written), then -y 1 to the end" \
    "$([[ $rc -eq 0 && $kills -ge 10 ]] && echo 1 || echo 0)" "exit code $rc, $kills kills landed (at least 10 wanted)"
final=$(printf 'state_%08d.bin' "$STEPS")
report "final $final identical to the uninterrupted run's" "$(cmp -s "$tmp/U/$final" "$tmp/K/$final" && echo 1 || echo 0)" ""
final=$(printf 'model_%08d.bin' "$STEPS")
report "final $final identical to the uninterrupted run's" "$(cmp -s "$tmp/U/$final" "$tmp/K/$final" && echo 1 || echo 0)" ""
# Every logged loss: main.log lines "s:STEP trl:LOSS" / "s:STEP tel:LOSS", the same value for a step every time.
bad=$(awk 'NR == FNR { want[$1 " " substr($2, 1, 3)] = $2; next }
           { k = $1 " " substr($2, 1, 3); n++; if (!(k in want) || want[k] != $2) { bad++ } }
           END { printf "%d of %d", bad, n }' "$tmp/U/main.log" "$tmp/K/main.log")
report "every loss in the interrupted runs' main.log equals the straight run's" "$([[ $bad == 0\ of* ]] && echo 1 || echo 0)" "$bad differ"
steps_logged=$(grep -c '^s:[0-9]* trl:' "$tmp/K/main.log")
report "the interrupted runs logged every step at least once ($steps_logged lines)" \
    "$([[ $(grep '^s:[0-9]* trl:' "$tmp/K/main.log" | sort -u | wc -l) -eq $STEPS ]] && echo 1 || echo 0)" ""
echo "$passed passed, $failed failed, 0 skipped"
[[ $failed -eq 0 ]]
