#!/usr/bin/env bash
# test_gpt against PyTorch at three configurations, in both precisions (needs a GPU):
#   d12 (GPT-2 124M) at B=4 T=64; a 2-layer model with GPT-2's head size (64) at B=2 T=1024 (the long
#   sequence: flash attention over 16 tiles of keys); and a small odd model whose C (39), head size
#   (13), vocabulary (1237) and T (37) are multiples of none of 8, 32, 128.
# For each: gpt_reference.py writes a checkpoint and a reference state (fp32, TF32 off, on the GPU
# when PyTorch sees one), test_gpt_{fp32,bf16} compares against it, saves its model after the K steps,
# and gpt_reference.py scores those models back on the same batch (the other direction; one PyTorch
# process per configuration).
# Each run takes the precision's default GELU path (fp32: -ge 0 -r 0; bf16: -ge 2 -r 0) and LM head
# (bf16 on Hopper: the exp head of lm_head.cuh, where C is a multiple of 8); at d12 B=4 T=64 extra
# runs take the other paths, same bounds: fp32 -ge 2 -r 1 (fused GELU, recomputed), bf16 -ge 0 -r 0
# (separate GELU kernels), -ge 2 -r 1 and -lx 0 (the logits and the classifier). Runs with fusion
# also probe which GELU formula cuBLASLt's epilogues compute.
# Without a GPU every check is reported as skipped. Ends with `N passed, N failed, N skipped`.
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
configs=("d12 4 64" "L=2,NH=4,C=256,V=1237,maxT=1024 2 1024" "L=2,NH=3,C=39,V=1237,maxT=50 3 37")
precisions=(fp32 bf16)
# "" = the build's defaults; the other entries are the extra GELU-path runs, first configuration only.
declare -A extra_runs=([fp32]="-ge 2 -r 1" [bf16]="-ge 0 -r 0;-ge 2 -r 1;-lx 0")
runs_of() {  # prec first_config: one line per run's test_gpt flags
    echo ""
    if [[ $2 == 1 ]]; then tr ';' '\n' <<<"${extra_runs[$1]}"; fi
}
passed=0 failed=0 skipped=0

if ! nvidia-smi -L >/dev/null 2>&1; then
    first=1
    for cfg in "${configs[@]}"; do
        for prec in "${precisions[@]}"; do
            mapfile -t runs < <(runs_of "$prec" "$first")
            for flags in "${runs[@]}"; do
                echo "test_gpt_$prec ($cfg${flags:+ $flags}): skipped (no CUDA device)"
                skipped=$((skipped + 1))
            done
        done
        first=0
    done
    echo "$passed passed, $failed failed, $skipped skipped"
    exit 0
fi

dir=test/ref
mkdir -p "$dir"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
first=1
for cfg in "${configs[@]}"; do
    read -r model B T <<<"$cfg"
    name=$(echo "${model}_B${B}_T${T}" | tr ',=' '__')
    echo "=== $model B=$B T=$T"
    if ! "$PYTHON" gpt_reference.py init --model "$model" --seed 1337 --out "$dir/$name.ckpt" ||
       ! "$PYTHON" gpt_reference.py state --checkpoint "$dir/$name.ckpt" -B "$B" -T "$T" --seed 42 --steps 10 \
           --out "$dir/$name.state"; then
        echo "FAIL: gpt_reference.py could not write the reference for $cfg"
        failed=$((failed + 1))
        first=0
        continue
    fi
    afters=() ours=() tols=() labels=()
    for prec in "${precisions[@]}"; do
        mapfile -t runs < <(runs_of "$prec" "$first")
        for flags in "${runs[@]}"; do
            after="$dir/$name.$prec$(echo "$flags" | tr -d ' -').after.ckpt"
            # shellcheck disable=SC2086  # $flags is a list of flags
            ./test_gpt_$prec -e "$dir/$name.ckpt" -rf "$dir/$name.state" -s "$after" $flags 2>&1 | tee "$log"
            rc=${PIPESTATUS[0]}
            line=$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$log" | tail -n 1)
            if [[ -z "$line" ]]; then
                echo "FAIL: test_gpt_$prec${flags:+ $flags} ended without a count line (exit code $rc)"
                failed=$((failed + 1))
                continue
            fi
            read -r p _ f _ s _ <<<"${line//,/}"
            passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
            [[ $rc -ne 0 && $f -eq 0 ]] && failed=$((failed + 1))
            label="test_gpt_$prec${flags:+ $flags}"
            if [[ $p -eq 0 && $f -eq 0 && $s -gt 0 ]]; then  # the run skipped everything (no usable GPU): nothing to score
                echo "  PyTorch scores the model $label trained: skipped (the run trained nothing)"
                skipped=$((skipped + 1))
                continue
            fi
            afters+=("$after") labels+=("$label")
            ours+=("$(sed -n 's/^loss after [0-9]* steps: //p' "$log")")
            # Relative bounds on the loss of the trained model, ours against PyTorch's fp32: fp32 runs
            # differ by summation order only (measured up to 1.3e-7 at these shapes, and PyTorch prints
            # 6 decimals, ~2e-7 of a loss near 2.4): 1e-5. bf16 runs carry bf16's rounding (2^-9) of every
            # activation through the model and 10 updates (measured up to 2.4e-3, at d12 B=4 T=64): 1e-2.
            tols+=("$([[ $prec == fp32 ]] && echo 1e-5 || echo 1e-2)")
        done
    done
    # The other direction: PyTorch scores every model test_gpt trained (one process for all of them).
    # It stops at a checkpoint it cannot read, so a missing value is a failure, as is any value that is
    # not a finite number.
    theirs=()
    if ((${#afters[@]} > 0)); then
        mapfile -t theirs < <("$PYTHON" gpt_reference.py loss --checkpoint "${afters[@]}" -B "$B" -T "$T" --seed 42 | sed -n 's/^loss //p')
    fi
    number='^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$'
    for i in "${!afters[@]}"; do
        a=${ours[i]:-missing} b=${theirs[i]:-missing} tol=${tols[i]}
        if [[ $a =~ $number && $b =~ $number && -s ${afters[i]} ]] &&
            awk -v a="$a" -v b="$b" -v t="$tol" 'BEGIN { d = a - b; d = d < 0 ? -d : d; m = b < 0 ? -b : b; exit !(d <= t * m) }'; then
            echo "  PyTorch scores the model ${labels[i]} trained: ok    ours $a PyTorch $b (bound $tol relative)"
            passed=$((passed + 1))
        else
            echo "  PyTorch scores the model ${labels[i]} trained: FAIL  ours $a PyTorch $b (bound $tol relative)"
            failed=$((failed + 1))
        fi
    done
    first=0
done
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
