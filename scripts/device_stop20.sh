#!/usr/bin/env bash
# Stop 20's device calls, each fitting one 10-minute call. Logs under $OUT/stop20/, all of them in
# $OUT/stop20_partN.tgz (scripts/device_lib.sh). The ablation timing that chose this stop's work is
# scripts/device_ablate.sh (its own call). What ran: PART 1 the code of d1014c9 (AB base 95f954e),
# then with SKIP_CHECKS=1 that of c21d475; PART 3 ffe8005 (AB base c21d475); PART 4 2418512 (AB base
# c21d475); PART 5 2e01c32, whose matmul benchmark stopped at fcproj's 1-GEMM row (inp buffer too
# small, fixed in f8df50a, not run since). PART 2 has not run. PART 3 needs the lab's version 14, removed
# since: check out 2e01c32 to run it.
#   PART=1  the bias gradients from the weight gradients' GEMMs (a column of ones after each LayerNorm
#           output): the matmul and LayerNorm forward labs' --check, test/test_gpt.sh, then a B=64
#           training A/B of source trees (AB_DIRS, default .carry/ab/base = the code before and the
#           working tree; scripts/device_ab_dirs.sh), -ov 1 and -ov 0 (AB_FLAGS). SKIP_CHECKS=1: the A/B only.
#   PART=2  the matmul lab's benchmark (the 1-GEMM dweight + dbias rows beside dweight and the gemv).
#   PART=3  the dq kernel through a ring of shared-memory stages (attention backward lab version 14):
#           versions 13 and 14 validated (14 = 13 bit for bit at every ring depth) and benchmarked, 14
#           at 2 and 4 stages too, then a B=64 training A/B of source trees (AB_DIRS, default
#           .carry/ab/base and the working tree).
#   PART=4  the code as it lands: the changed labs' --check (matmul, LayerNorm forward, attention
#           backward), the unit tests, test/test_gpt.sh, a B=64 training A/B of source trees (AB_DIRS,
#           default .carry/ab/base and the working tree), B=32, and 200 steps of bf16 (validation every
#           50, against the fp32 curve of stop 19).
#   PART=5  the landed tree: the attention backward lab's --check (the header back on version 13's dq
#           kernel), B=64 training, then the matmul lab's benchmark (PART 2's) within the call's time.
set -u
PARTS=12345
NAME=stop20
source "$(dirname "$0")/device_lib.sh"
if [[ $PART == 1 ]]; then
    [[ ${SKIP_CHECKS:-0} == 1 ]] || {
    step matmul_check 120 ./dev/cuda/matmul --check
    grep -E "1 GEMM|inp ld|ld " "$log/matmul_check.log" | grep -c " ok " | sed 's/^/ones-column checks ok: /'
    step layernorm_forward_check 120 ./dev/cuda/layernorm_forward --check
    step test_gpt 300 bash test/test_gpt.sh
    grep -E "weight stream|determinism" "$log/test_gpt.log" | sort | uniq -c
    }
    OUT="$log" DIRS="${AB_DIRS:-.carry/ab/base .}" FLAGS="${AB_FLAGS:--ov 1;-ov 0}" PF=0 timeout "$(secs_left 590)" \
        bash scripts/device_ab_dirs.sh
elif [[ $PART == 2 ]]; then
    step matmul_bench 400 ./dev/cuda/matmul
    grep -E "^(qkv|attproj|fc|fcproj|lmhead) |per step|reference" "$log/matmul_bench.log" | grep -vE " 3 " | head -n 60
elif [[ $PART == 3 ]]; then
    step attn_13_14 200 ./dev/cuda/attention_backward 13 14
    grep -E "v14 .*= v13|FAIL|^  1[34] " "$log/attn_13_14.log" | grep -vE "bitwise identical$" | head -n 20
    grep -cE "bitwise identical$" "$log/attn_13_14.log" | sed 's/^/bit checks identical: /'
    for st in 2 4; do echo "--dq-stages $st: $(timeout 60 ./dev/cuda/attention_backward 13 14 --no-validate --dq-stages $st | grep -E "^  1[34] " | tr -s ' ' | tr '\n' ' ')"; done
    OUT="$log" DIRS="${AB_DIRS:-.carry/ab/base .}" PF=0 timeout "$(secs_left 590)" bash scripts/device_ab_dirs.sh
elif [[ $PART == 4 ]]; then
    for lab in matmul layernorm_forward attention_backward; do step "check_$lab" 120 "./dev/cuda/$lab" --check; done
    unit_tests
    step test_gpt 330 bash test/test_gpt.sh
    grep -E "weight stream|determinism" "$log/test_gpt.log" | sort | uniq -c
    OUT="$log" DIRS="${AB_DIRS:-.carry/ab/base .}" PF=0 timeout 170 bash scripts/device_ab_dirs.sh
    timeout 30 ./train_gpt_bf16 -b 32 -x 20 -v 0 -s 0 > "$log/B32.log" 2>&1
    echo "B=32 (rc $?): $(grep -E "^done" "$log/B32.log")"
    timeout "$(secs_left 590)" ./train_gpt_bf16 -x 200 -v 50 -s 0 > "$log/curve_bf16.log" 2>&1
    echo "bf16 200 steps (rc $?): $(grep -E "^step +[0-9]+ \| val loss" "$log/curve_bf16.log" | awk '{printf "%s:%s ", $2, $NF}')"
elif [[ $PART == 5 ]]; then
    step check_attention_backward 60 ./dev/cuda/attention_backward --check
    timeout 40 ./train_gpt_bf16 -b 64 -x 20 -v 0 -s 0 > "$log/B64.log" 2>&1
    echo "B=64 (rc $?): $(grep -E "^done" "$log/B64.log")"
    step matmul_bench "$(secs_left 280)" ./dev/cuda/matmul
    grep -E "^(qkv|attproj|fc|fcproj|lmhead) |per step|reference" "$log/matmul_bench.log" | grep -vE " 3 " | head -n 60
fi
echo "done at $((SECONDS - started)) s"
