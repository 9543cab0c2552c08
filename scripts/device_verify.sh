#!/usr/bin/env bash
# Verification of a change to GPU code in two device calls that each fit 10 minutes, newest risk first
# (PART=1 then PART=2, back to back so the machine stays warm; the whole `make test` is
# scripts/device_check.sh). Logs under $OUT/verify/, archived in $OUT/verify_partN.tgz (scripts/device_lib.sh).
#   PART=1  build; every lab --check (LayerNorm, attention); test/test_gpt.sh (both precisions, every
#           configuration); LayerNorm benchmark of the header's versions (forward 5, backward 7 and 8)
#           with a memcheck of the backward; training throughput of ours (scripts/bench_train.sh, no
#           PyTorch).
#   PART=2  test/test_resume.sh and test/test_train_cli.sh; `make train`; a longer run's validation
#           curve (-x $CURVE_STEPS); PyTorch's side of the training benchmark; the LayerNorm
#           side-by-side with PyTorch.
#   PART=3  every lab --check; the LayerNorm lab (header versions) and its side-by-side with PyTorch;
#           the attention backward profile (scripts/device_profile_attention.sh); 200 steps of bf16
#           and of fp32 from the same seed, validation loss every 50 (bf16 should track fp32).
#   PART=4  a change to the training loop's kernels, quickly: build; every lab --check; the
#           classifier lab's benchmark; the unit tests (build/test); the attention forward lab
#           (versions 4, 5, 7, 8, 9) and backward lab (4, 10, 11) at B=64 (and 4, 11 at HS 80, 128), a
#           memcheck of backward 10 and 11, the attention side-by-side with PyTorch; test/test_gpt.sh;
#           training throughput at B=16 and B=64, each with the phase breakdown.
#   PART=5  the figures a closing note quotes, no checks: the attention side-by-side twice; training
#           throughput at B=16, 32, 64 (breakdown at 64, memory with -r 1) beside PyTorch's at 32 and
#           64; 200 steps of bf16 and of fp32 from the same seed (bf16 should track fp32).
#   PART=6  stop 13's measurements before choosing: every lab --check (matmul and classifier
#           included), the classifier's versions at training size, the unit tests, test/test_resume.sh,
#           training throughput at B=64 with the breakdown (matmul tuning and the sync-free step).
#   PART=7  stop 14's kernels and A/B: build; the LayerNorm and attention backward labs' --check and
#           their benchmarks with and without the fused bias gradients; B=64 training with the side
#           stream off and on (-ov 0/1/0/1; the 20 losses must match bit for bit), the breakdown of each.
#   PART=8  stop 14's checks: test/test_gpt.sh, the unit tests, test/test_resume.sh (batches staged
#           across steps), test/test_train_cli.sh (every lab's --check: PART=9; together they ran past
#           the 600 s a device call may take).
#   PART=9  every lab's --check; then B=64 training with the weight stream off and on (-ov 0 / 1, two
#           rounds, scripts/device_flag_ab.sh: the losses must be the same bits).
set -u
PARTS=123456789
NAME=verify
source "$(dirname "$0")/device_lib.sh"
if [[ $PART == 1 ]]; then
    lab_check
    step test_gpt bash test/test_gpt.sh
    OUT="$log" TORCH=0 FWD_VERSIONS=5 BWD_VERSIONS="7 8" SANITIZE=1 bash scripts/device_layernorm.sh > "$log/layernorm.log" 2>&1
    echo "--- layernorm lab: exit $?"
    grep -E "^  [0-9]+ +(fp32|bf16) +[0-9]+ " "$log/layernorm.log" | tail -n 30
    grep -E "ERROR SUMMARY|!!!" "$log/layernorm.log"
    OUT="$log" BATCHES="16 32 64" STEPS=20 TORCH=0 PROFILE_BATCHES=16 timeout 200 bash scripts/bench_train.sh 2>&1 | tail -n 90
elif [[ $PART == 2 ]]; then
    step test_resume bash test/test_resume.sh
    step test_train_cli bash test/test_train_cli.sh
    started=$SECONDS
    timeout 150 make train > "$log/make_train.log" 2>&1
    echo "--- make train: exit $?, $((SECONDS - started)) s"
    grep -E "^(device|batch|memory|done)|val loss|sample" "$log/make_train.log" | tail -n 14
    ./train_gpt_bf16 -x "${CURVE_STEPS:-400}" -v 25 -s 0 > "$log/curve.log" 2>&1
    echo "--- curve (-x ${CURVE_STEPS:-400} -v 25):"
    grep -E "val loss|^done" "$log/curve.log" | tr '\n' ';' | sed 's/step *//g'; echo
    timeout 300 "$PY" scripts/bench_torch_gpt.py --batch ${TORCH_BATCHES:-32 64} --steps 20 2>&1 | grep -vE "^\s*$|Warning|warn" | tee "$log/pytorch.log" | tail -n 20
    PYTHONUNBUFFERED=1 timeout 200 "$PY" dev/cuda/layernorm_vs_torch.py > "$log/vs_torch.log" 2>&1
    echo "--- layernorm vs torch: exit $?"
    tail -n 16 "$log/vs_torch.log"
    for dt in fp32 bf16; do ./dev/cuda/layernorm_backward 7 8 --dtype $dt; done > "$log/ln_backward.log" 2>&1
    grep -E "^  [0-9]+ +(fp32|bf16) +[0-9]+ |copy" "$log/ln_backward.log"
    for r in 0 1; do  # the same 20 steps at B=64 with every activation kept and with GELU recomputed
        ./train_gpt_bf16 -b 64 -x 20 -v 0 -s 0 -r $r > "$log/b64_r$r.log" 2>&1
        echo "-r $r B=64: $(grep -E '^step +[0-9]+/' "$log/b64_r$r.log" | awk '{printf "%s ", $5}')"
    done
elif [[ $PART == 4 ]]; then
    lab_check
    step classifier ./dev/cuda/classifier
    grep -E "^  [0-9]+ +(fp32|bf16) |copy" "$log/classifier.log"
    unit_tests
    step attention_forward ./dev/cuda/attention_forward 4 5 7 8 9 --no-validate
    grep -E "^ *(4|5|7|8|9) +bf16" "$log/attention_forward.log"
    step attention_backward ./dev/cuda/attention_backward 4 10 11 --no-validate
    grep -E "TFLOP|^ *(v|version)? *(4|10|11) " "$log/attention_backward.log" | tail -n 8
    for hs in 80 128; do ./dev/cuda/attention_backward 4 11 --no-validate -s $hs -n $((768 / hs)); done > "$log/attention_backward_hs.log" 2>&1
    grep -E "HS=|^ *(4|11) " "$log/attention_backward_hs.log"
    step sanitizer timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 ./dev/cuda/attention_backward 10 11 --no-validate -b 1 -n 2 -t 100
    grep -E "ERROR SUMMARY" "$log/sanitizer.log"
    PYTHONUNBUFFERED=1 timeout 120 "$PY" dev/cuda/attention_vs_torch.py > "$log/attention_vs_torch.log" 2>&1
    echo "--- attention vs torch: exit $?"
    tail -n 14 "$log/attention_vs_torch.log"
    step test_gpt bash test/test_gpt.sh
    OUT="$log" BATCHES="16 64" STEPS=20 TORCH=0 PROFILE_BATCHES="16 64" GELU_BATCH=none RECOMPUTE_BATCH=none timeout 200 bash scripts/bench_train.sh 2>&1 | tail -n 60
elif [[ $PART == 5 ]]; then
    for i in 1 2; do
        PYTHONUNBUFFERED=1 timeout 120 "$PY" dev/cuda/attention_vs_torch.py > "$log/attention_vs_torch_$i.log" 2>&1
        echo "--- attention vs torch ($i): exit $?"
        grep -E "^(ours|torch) |ours / torch|agreement" "$log/attention_vs_torch_$i.log"
    done
    OUT="$log" BATCHES="16 32 64" STEPS=20 TORCH_BATCHES="32 64" PROFILE_BATCHES=64 GELU_BATCH=none RECOMPUTE_BATCH=64 timeout 330 bash scripts/bench_train.sh 2>&1 | tail -n 60
    for p in bf16 fp32; do  # same seed: bf16 should track fp32's validation loss
        timeout 120 ./train_gpt_$p -x 200 -v 50 -s 0 > "$log/curve_$p.log" 2>&1
        echo "$p 200 steps (rc $?): $(grep -E "^step +[0-9]+ \| val loss" "$log/curve_$p.log" | awk '{printf "%s:%s ", $2, $NF}') $(grep -oE "median step .* tok/s" "$log/curve_$p.log")"
    done
elif [[ $PART == 6 ]]; then
    lab_check
    step classifier ./dev/cuda/classifier 2 3 4 5 --rows 65536
    grep -E "^  [0-9]+ +(fp32|bf16) |copy|not run" "$log/classifier.log"
    unit_tests
    step test_resume bash test/test_resume.sh
    OUT="$log" BATCHES="64" STEPS=20 TORCH=0 PROFILE_BATCHES="64" GELU_BATCH=none RECOMPUTE_BATCH=none timeout 200 bash scripts/bench_train.sh 2>&1 | tail -n 40
elif [[ $PART == 7 ]]; then
    for p in layernorm_backward attention_backward; do step check_$p ./dev/cuda/$p --check; done
    step ln_bench ./dev/cuda/layernorm_backward 8 -C 768
    grep -E "^  [0-9]+|copy" "$log/ln_bench.log" | tail -n 12
    step attn_bench ./dev/cuda/attention_backward 11 --no-validate
    grep -E "TFLOP|^ *(v|version)? *11" "$log/attn_bench.log" | tail -n 8
    for ov in 0 1 0 1; do
        ./train_gpt_bf16 -b 64 -x 20 -v 0 -s 0 -ov $ov > "$log/b64_ov$ov.log" 2>&1
        echo "-ov $ov B=64 (rc $?): $(grep -E '^done' "$log/b64_ov$ov.log")"
        grep -E '^step +[0-9]+/' "$log/b64_ov$ov.log" | awk '{print $5}' > "$log/losses_ov$ov.txt"
    done
    cmp -s "$log/losses_ov0.txt" "$log/losses_ov1.txt" && echo "losses -ov 0 and 1: bit-identical ($(tail -n 1 "$log/losses_ov1.txt"))" ||
        { echo "losses -ov 0 and 1: DIFFERENT"; paste "$log/losses_ov0.txt" "$log/losses_ov1.txt" | tail -n 5; }
    for ov in 0 1; do
        ./train_gpt_bf16 -b 64 -x 12 -v 0 -s 0 -pf 1 -ov $ov > "$log/profile_ov$ov.log" 2>&1
        echo "breakdown -ov $ov: $(grep -E '^done' "$log/profile_ov$ov.log")"
        sed -n '/^GPU time per step/,$p' "$log/profile_ov$ov.log"
    done
elif [[ $PART == 8 ]]; then
    step test_gpt bash test/test_gpt.sh
    grep -E "weight stream|determinism" "$log/test_gpt.log" | sort | uniq -c
    unit_tests
    step test_resume bash test/test_resume.sh
    step test_train_cli bash test/test_train_cli.sh
elif [[ $PART == 9 ]]; then
    lab_check
    OUT="$log" FLAGSETS="-ov 0;-ov 1" ROUNDS=2 STEPS=20 BATCHES=64 timeout 200 bash scripts/device_flag_ab.sh 2>&1 | grep -E "^B=|^breakdown"
elif [[ $PART == 3 ]]; then
    lab_check
    OUT="$log" FWD_VERSIONS=5 BWD_VERSIONS=8 timeout 300 bash scripts/device_layernorm.sh > "$log/layernorm.log" 2>&1
    echo "--- layernorm lab and side-by-side: exit $?"
    grep -E "^  [0-9]+ +(fp32|bf16) +[0-9]+ |!!!" "$log/layernorm.log"
    sed -n '/^forward$/,$p' "$log/layernorm.log"
    for p in bf16 fp32; do  # same seed: bf16 should track fp32's validation loss
        timeout 120 ./train_gpt_$p -x 200 -v 50 -s 0 > "$log/curve_$p.log" 2>&1
        echo "$p 200 steps (rc $?): $(grep -E "^step +[0-9]+ \| val loss" "$log/curve_$p.log" | awk '{printf "%s:%s ", $2, $NF}') $(grep -oE "median step .* tok/s" "$log/curve_$p.log")"
    done
    OUT="$log" timeout 240 bash scripts/device_profile_attention.sh > "$log/profile.log" 2>&1
    echo "--- attention backward profile: exit $?"
    grep -E "^  [a-z_]+kernel|flash_bwd|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|!!!" "$log/profile.log" | head -n 40
fi
