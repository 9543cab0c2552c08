#!/usr/bin/env bash
# A whole training run of ours beside PyTorch's (needs a GPU): train_gpt and `gpt_reference.py train`
# with the same checkpoint, token files and flags; every step's loss and gradient norm, and every
# validation loss, must agree: train_gpt_fp32 within 1e-5 relative, train_gpt_bf16 within 1e-2. (fp32:
# both sides differ by summation order only; bf16: ours rounds every activation and gradient to bf16,
# 2^-9 relative, where PyTorch keeps fp32, and the gap grows over the updates: the bound test_gpt.sh
# uses, where 10 updates at d12 measured up to 2.4e-3.)
#
# Runs, on d12 (GPT-2 124M's shape, gpt_reference.py init) and synthetic learnable tokens
# (test/train_inputs.py, 32,769 training and 8,193 validation tokens):
#   1. -b 16 -t 64 -d 2048 -x 12 -v 0 -s 0 -sh 0            2 micro-batches a step, sequences in order
#                                                            (fp32 and bf16)
#   2. -b 8 -t 64 -d 2048 -x 12 -v 4 -m 2 -s 0 -sh 1 -sd 7 -l 1e-4 -u 2
#                                                            4 micro-batches, shuffled, validation (fp32);
#                                                            a gentler learning rate: at 6e-4 this run's
#                                                            loss jumps (gradient norm 68 at step 4) and
#                                                            the jumps magnify the last-bit differences of
#                                                            any two fp32 implementations to ~1e-5 by step 9
#   3. -e d6 -b 8 -t 64 -x 3 -v 0 -s 0 -sh 0                train_gpt's own random init on both sides (fp32)
#   4. -e tiny -b 4 -t 32 -x 180 -v 50 -m 2 -sh 1 -sd 7 -l 1e-3 -u 3 -q 1 -sl 1 -sg 2.2
#                                                            the outlier guard (fp32): a small model
#                                                            (L=2,NH=3,C=39,V=1237) on tokens of its
#                                                            vocabulary; the gradient norm spikes once past
#                                                            the window (one update skipped on the CPU, step
#                                                            153; the nearest z 0.12 from its Z)
#   5. -e tiny -b 4 -t 32 -x 160 -v 0 -sh 1 -sd 7 -l 0 -u 0 -sl 1.5 -sg 1.5
#                                                            the guard on values without a trend (-l 0): a
#                                                            loss and two norms skipped (3 on the CPU, the
#                                                            nearest z 0.09 from its Z)
#      Both must skip the updates of the same steps, for the same value, as the reference, its printed z
#      within 0.01; and skip at least one.
# train_gpt prints norms with 4 decimals and losses with 6: a value may also differ by half of its
# last printed digit (the reference's values come from its metrics.csv, 6 decimals).
#
# Note for users: with the default warm-up to 6e-4 (-u 10 -l 6e-4) on a few repeated batches, the
# loss jumps around step 9 (gradient norm ~138 at d12, B=16 x 4 micro-batches) in PyTorch and in
# train_gpt alike: the recipe causes it, not the kernels (docs/reference_training.md).
#
# Without a GPU every check is reported as skipped. Ends with `N passed, N failed, N skipped`.
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
runs=("fp32|-b 16 -t 64 -d 2048 -x 12 -v 0 -s 0 -sh 0"
      "bf16|-b 16 -t 64 -d 2048 -x 12 -v 0 -s 0 -sh 0"
      "fp32|-b 8 -t 64 -d 2048 -x 12 -v 4 -m 2 -s 0 -sh 1 -sd 7 -l 1e-4 -u 2"
      "fp32|-e d6 -b 8 -t 64 -x 3 -v 0 -s 0 -sh 0"
      "fp32|-e tiny -b 4 -t 32 -x 180 -v 50 -m 2 -s 0 -sh 1 -sd 7 -l 1e-3 -u 3 -q 1 -sl 1 -sg 2.2"
      "fp32|-e tiny -b 4 -t 32 -x 160 -v 0 -s 0 -sh 1 -sd 7 -l 0 -u 0 -sl 1.5 -sg 1.5")
passed=0 failed=0 skipped=0

if ! nvidia-smi -L >/dev/null 2>&1; then
    for run in "${runs[@]}"; do
        echo "train_gpt_${run%%|*} ${run#*|} beside gpt_reference.py train: skipped (no CUDA device)"
        skipped=$((skipped + 1))
    done
    echo "$passed passed, $failed failed, $skipped skipped"
    exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! "$PYTHON" gpt_reference.py init --model d12 --seed 1337 --out "$tmp/d12.ckpt" >/dev/null ||
   ! "$PYTHON" test/train_inputs.py tokens "$tmp/train.bin" 32769 --vocab 50257 ||
   ! "$PYTHON" test/train_inputs.py tokens "$tmp/val.bin" 8193 --vocab 50257 --seed 1 ||
   ! "$PYTHON" gpt_reference.py init --model L=2,NH=3,C=39,V=1237,maxT=50 --seed 3 --out "$tmp/tiny.ckpt" >/dev/null ||
   ! "$PYTHON" test/train_inputs.py tokens "$tmp/train1237.bin" 30000 ||
   ! "$PYTHON" test/train_inputs.py tokens "$tmp/val1237.bin" 6000 --seed 1 ||
   ! "$PYTHON" test/train_inputs.py tokenizer "$tmp/tok1237.bin" 1237; then
    echo "FAIL: could not write the checkpoint and token files"
    echo "0 passed, 1 failed, 0 skipped"
    exit 1
fi

# compare OURS_LOG REFERENCE_DIR TOL [REFERENCE_LOG]: prints every step side by side; ends with the
# count line of its checks (losses, norms, and validation losses when the run validates). With
# REFERENCE_LOG (the reference's printed lines; runs with the outlier guard) also the updates skipped.
compare() {
    "$PYTHON" - "$@" <<'EOF'
import csv, math, re, sys
ours_log, ref_dir, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
ref_log = sys.argv[4] if len(sys.argv) > 4 else None
step_re = re.compile(r"^step +(\d+)/\d+ \| loss (\S+) \| norm (\S+) \|")
skip_re = re.compile(r"^step +(\d+)/\d+ \|.* \| skipped: (.*)$")
reason_re = re.compile(r"(loss|norm) z (\S+) > \S+")
val_re = re.compile(r"^step +(\d+) \| val loss (\S+)$")
ours, ours_val = {}, {}
for line in open(ours_log):
    if m := step_re.match(line):
        ours[int(m[1])] = (m[2], m[3])
    elif m := val_re.match(line.strip()):
        ours_val[int(m[1])] = m[2]
rows = list(csv.DictReader(open(f"{ref_dir}/metrics.csv")))
theirs = {int(r["step"]): (float(r["train_loss"]), float(r["grad_norm"])) for r in rows if r["train_loss"]}
theirs_val = {int(r["step"]): float(r["val_loss"]) for r in rows if r["val_loss"]}

def err(printed, ref):  # relative error, less half a unit of the last printed digit; inf unless both finite
    if not (math.isfinite(float(printed)) and math.isfinite(ref)):
        return math.inf
    half = 0.5 * 10.0 ** -len(printed.split(".")[1]) if "." in printed else 0.5
    return max(0.0, abs(float(printed) - ref) - half - 5e-7) / max(abs(ref), 1e-12)

print(f"  {'step':>5} {'loss ours':>11} {'PyTorch':>11} {'norm ours':>11} {'PyTorch':>11}")
for s in sorted(theirs):
    o = ours.get(s, ("-", "-"))
    print(f"  {s:5d} {o[0]:>11} {theirs[s][0]:11.6f} {o[1]:>11} {theirs[s][1]:11.6f}")
passed = failed = 0
for what, a, b in (("losses", {s: v[0] for s, v in ours.items()}, {s: v[0] for s, v in theirs.items()}),
                   ("gradient norms", {s: v[1] for s, v in ours.items()}, {s: v[1] for s, v in theirs.items()}),
                   ("validation losses", ours_val, theirs_val)):
    if not a and not b:  # a run without validation
        continue
    same = sorted(a) == sorted(b)
    worst = max((err(a[s], b[s]) for s in b), default=0.0) if same else float("inf")
    ok = same and worst <= tol
    passed, failed = passed + ok, failed + (not ok)
    print(f"  {len(b)} {what}{' (steps ' + str(sorted(a)) + ' vs ' + str(sorted(b)) + ')' if not same else ''}: "
          f"{'ok' if ok else 'FAIL'}  worst {worst:.2e}, bound {tol:g} relative")
if ref_log:  # the outlier guard: {step: {value: printed z}} of the updates skipped on each side
    def skips(path):
        return {int(m[1]): {name: float(z) for name, z in reason_re.findall(m[2])}
                for m in map(skip_re.match, open(path)) if m}
    ours_skips, ref_skips = skips(ours_log), skips(ref_log)
    same = {s: sorted(v) for s, v in ours_skips.items()} == {s: sorted(v) for s, v in ref_skips.items()}
    worst = max((abs(ours_skips[s][k] - v) for s, zs in ref_skips.items() for k, v in zs.items()), default=0.0) if same else math.inf
    ok = same and len(ref_skips) > 0 and worst <= 0.01
    passed, failed = passed + ok, failed + (not ok)
    listed = lambda d: ", ".join(f"{s} ({'+'.join(sorted(v))})" for s, v in sorted(d.items())) or "none"  # noqa: E731
    print(f"  updates skipped by the outlier guard, ours: {listed(ours_skips)}; PyTorch: {listed(ref_skips)}: "
          f"{'ok' if ok else 'FAIL'}  worst printed z apart {worst:.1e}, bound 0.01; at least one skip")
print(f"{passed} passed, {failed} failed, 0 skipped")
EOF
}

i=0
for run in "${runs[@]}"; do
    i=$((i + 1))
    prec=${run%%|*}
    read -r -a flags <<<"${run#*|}"
    ours_only=()
    if [[ ${flags[1]} == tiny ]]; then  # the small model, on tokens of its vocabulary (and ours on its tokenizer)
        flags[1]=$tmp/tiny.ckpt
        flags+=(-i "$tmp/train1237.bin" -j "$tmp/val1237.bin")
        ours_only=(-z "$tmp/tok1237.bin")
    else
        [[ ${flags[0]} == -e ]] || flags=(-e "$tmp/d12.ckpt" "${flags[@]}")
        flags+=(-i "$tmp/train.bin" -j "$tmp/val.bin")
    fi
    tol=$([[ $prec == fp32 ]] && echo 1e-5 || echo 1e-2)
    echo "=== run $i: train_gpt_$prec ${flags[*]}"
    if [[ ! -x ./train_gpt_$prec ]]; then
        echo "  FAIL: ./train_gpt_$prec is not built (make train_gpt_$prec)"
        failed=$((failed + 1))
        continue
    fi
    if ! ./train_gpt_"$prec" "${flags[@]}" "${ours_only[@]}" >"$tmp/ours_$i.log" 2>&1; then
        tail -n 5 "$tmp/ours_$i.log"
        echo "  FAIL: train_gpt_$prec exited with an error"
        failed=$((failed + 1))
        continue
    fi
    if ! "$PYTHON" gpt_reference.py train "${flags[@]}" -o "$tmp/ref_$i" >"$tmp/ref_$i.log" 2>&1; then
        tail -n 5 "$tmp/ref_$i.log"
        echo "  FAIL: gpt_reference.py train exited with an error"
        failed=$((failed + 1))
        continue
    fi
    guard_log=()
    [[ " ${flags[*]} " == *" -sl "* || " ${flags[*]} " == *" -sg "* ]] && guard_log=("$tmp/ref_$i.log")
    compare "$tmp/ours_$i.log" "$tmp/ref_$i" "$tol" "${guard_log[@]}" | tee "$tmp/compare.log"
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$tmp/compare.log" | tail -n 1)
    if [[ -z $line ]]; then
        echo "  FAIL: the comparison ended without a count line"
        failed=$((failed + 1))
        continue
    fi
    read -r p _ f _ _ _ <<<"${line//,/}"
    passed=$((passed + p)) failed=$((failed + f))
done
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
