#!/usr/bin/env bash
# Data-parallel training on 2 GPUs of this machine (scripts/launch.sh; NCCL), d12, B=4 T=256, -d 4096:
#   equivalence   2 GPUs (2 micro-batches each) against 1 GPU (4 micro-batches), 20 steps: every
#                 step's loss and gradient norm within 1e-5 relative in fp32, 1e-2 in bf16; the same
#                 over sockets alone (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1: how nodes without
#                 InfiniBand talk)
#   determinism   the 2-GPU run twice: the same step lines and final state file, byte for byte
#   resume        saved on 2 at step 10, resumed on 2: the same bits as the run never stopped;
#                 resumed on 1: within the equivalence bounds
#   failures      kill -9 of rank 1: rank 0 ends with one line within 60 s; ranks started with
#                 different flags are refused; more ranks than GPUs is an error
# Needs 2 GPUs; elsewhere every check says `skipped (needs 2 GPUs)`. Ends with `N passed, N failed, N skipped`.
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
checks=("equivalence fp32" "equivalence bf16" "equivalence over sockets" "determinism" "resume on 2" "resume on 1"
        "kill one rank" "different flags" "more ranks than GPUs")
passed=0 failed=0 skipped=0
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [[ $gpus -lt 2 ]]; then
    for c in "${checks[@]}"; do echo "multi-GPU $c: skipped (needs 2 GPUs, found $gpus)"; skipped=$((skipped + 1)); done
    echo "$passed passed, $failed failed, $skipped skipped"
    exit 0
fi
export NCCL_NVLS_ENABLE=0  # NVLink multicast buys nothing at these sizes
export MASTER_PORT=$((20000 + RANDOM % 20000))
report() {
    if [[ $2 -eq 1 ]]; then passed=$((passed + 1)); printf '  %-66s ok    %s\n' "$1" "$3"
    else failed=$((failed + 1)); printf '  %-66s FAIL  %s\n' "$1" "$3"; fi
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PYTHON" test/train_inputs.py tokens "$tmp/train.bin" 300000 --vocab 50257 --seed 1
"$PYTHON" test/train_inputs.py tokens "$tmp/val.bin" 20000 --vocab 50257 --seed 2
run=(-e d12 -i "$tmp/train.bin" -j "$tmp/val.bin" -b 4 -t 256 -d 4096 -x 20 -u 5 -l 6e-4 -q 1 -v 10 -m 2 -s 0 -sd 3)
steps_of() { sed -nE 's/^step +([0-9]+)\/[0-9]+ \| loss ([^ ]+) \| norm ([^ ]+) .*/\1 \2 \3/p' "$1"; }
# close NAME A B TOL: step lines of logs A and B: same steps, loss and norm within TOL relative
close() {
    local worst
    worst=$(join <(steps_of "$2") <(steps_of "$3") | awk -v n="$(steps_of "$2" | wc -l)" '
        { for (i = 2; i <= 3; i++) { r = ($i - $(i + 2)) / ($(i + 2) == 0 ? 1 : $(i + 2)); r = r < 0 ? -r : r; if (r > w) w = r } c++ }
        END { printf "%.2e %d %d", w, c, n }')
    read -r w c n <<<"$worst"
    report "$1" "$(awk -v w="$w" -v t="$4" -v c="$c" -v n="$n" 'BEGIN { print (c == n && n >= 20 && w <= t) ? 1 : 0 }')" \
        "worst relative difference $w over $c steps (bound $4)"
}
for prec in fp32 bf16; do
    tol=$([[ $prec == fp32 ]] && echo 1e-5 || echo 1e-2)
    ./train_gpt_$prec "${run[@]}" >"$tmp/one_$prec.log" 2>&1
    timeout 300 scripts/launch.sh 2 ./train_gpt_$prec "${run[@]}" >"$tmp/two_$prec.log" 2>&1
    close "equivalence $prec: 2 GPUs against 1 GPU with accumulation" "$tmp/two_$prec.log" "$tmp/one_$prec.log" "$tol"
done
NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 timeout 300 scripts/launch.sh 2 ./train_gpt_fp32 "${run[@]}" >"$tmp/socket.log" 2>&1
close "equivalence fp32 over sockets (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1)" "$tmp/socket.log" "$tmp/one_fp32.log" 1e-5

timeout 300 scripts/launch.sh 2 ./train_gpt_bf16 "${run[@]}" -o "$tmp/A" -n 10 >"$tmp/a.log" 2>&1
timeout 300 scripts/launch.sh 2 ./train_gpt_bf16 "${run[@]}" -o "$tmp/A2" -n 10 >"$tmp/a2.log" 2>&1
report "determinism: the 2-GPU run twice, the same bits" \
    "$(cmp -s <(steps_of "$tmp/a.log") <(steps_of "$tmp/a2.log") && cmp -s "$tmp/A/state_00000020.bin" "$tmp/A2/state_00000020.bin" && echo 1 || echo 0)" ""
mkdir -p "$tmp/B" "$tmp/C"
cp "$tmp/A"/*_00000010.bin "$tmp/B"/ && cp "$tmp/A"/*_00000010.bin "$tmp/C"/
timeout 300 scripts/launch.sh 2 ./train_gpt_bf16 "${run[@]}" -o "$tmp/B" -n 10 -y 1 >"$tmp/b.log" 2>&1
report "resume on 2 GPUs from step 10: the same bits as the run never stopped" \
    "$(cmp -s "$tmp/A/state_00000020.bin" "$tmp/B/state_00000020.bin" && echo 1 || echo 0)" "$(grep -m1 resuming "$tmp/b.log")"
./train_gpt_bf16 "${run[@]}" -o "$tmp/C" -n 10 -y 1 >"$tmp/c.log" 2>&1
close "resume on 1 GPU from the 2-GPU step 10 (bf16)" <(cat "$tmp/a.log") "$tmp/c.log" 1e-2

scripts/launch.sh 2 ./train_gpt_bf16 -e d12 -i "$tmp/train.bin" -j "$tmp/val.bin" -b 4 -t 256 -x 100000 -v 0 -s 0 >"$tmp/k.log" 2>&1 &
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
timeout 120 scripts/launch.sh 2 bash -c './train_gpt_bf16 -e d12 -i '"$tmp/train.bin"' -j '"$tmp/val.bin"' -t 256 -x 2 -b $((RANK + 4))' \
    >"$tmp/m.log" 2>&1
report "ranks started with different -b: refused, naming the difference" \
    "$([[ $? -ne 0 ]] && grep -q "'-b=5' where rank 0 has '-b=4'" "$tmp/m.log" && echo 1 || echo 0)" "$(grep -m1 '^error' "$tmp/m.log")"
timeout 120 scripts/launch.sh $((gpus + 1)) ./train_gpt_bf16 -e d12 -i "$tmp/train.bin" -j "$tmp/val.bin" -t 256 -x 2 >"$tmp/g.log" 2>&1
report "$((gpus + 1)) ranks on $gpus GPUs: an error" "$([[ $? -ne 0 ]] && grep -q 'at most one rank per GPU' "$tmp/g.log" && echo 1 || echo 0)" \
    "$(grep -m1 'one rank per GPU' "$tmp/g.log")"
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
