#!/usr/bin/env bash
# Stop 21's device calls, each fitting one 10-minute call. Logs under $OUT/stop21/, all of them in
# $OUT/stop21_partN.tgz (scripts/device_lib.sh). What ran: PART 1 on 1ec6466 (A/B base 09b1575),
# PART 4 on 77badd4 (base 09b1575, o1 1ec6466), PART 5 on 8ba3744 (1ec6466's GPU code), PART 6 on
# 4a97604 (A/B old 1ec6466), PART 7, 2 and 3 on baf19ef / fc3ba30 (4a97604's GPU code), then
# scripts/bench_train.sh on fc3ba30 in a call of its own. PART 8 (B=64 with and without train_gpt
# -th 1, the LM head's GEMMs tuned under sustained load) ran on 4139f77 and went with its flag
# (reverted): check that commit out to run it. PART 9 ran on 80ff566 (A/B old: the commit before it),
# then PART 0 on the same code (run then as the same commands typed into the call).
#   PART=1  the attention backward's dk/dv kernel with dv's product issued after dS (lab version 14,
#           not serialized by ptxas): versions 13 and 14 validated (14 = 13 bit for bit) and
#           benchmarked, the matmul lab's --check (stop 20's new shape), then a B=64 training A/B of
#           source trees (AB_DIRS, default .carry/ab/base = the code before, and the working tree).
#   PART=4  lab versions 13, 14, 15 validated and benchmarked, then a B=64 training A/B of source trees
#           (AB_DIRS, default .carry/ab/base, .carry/ab/o1 and the working tree). Ran on commit 77badd4
#           (version 15 and the header on it; reverted since): check it out to run this part.
#   PART=5  B=64 training with and without the widened matmul tuning (-tw 1), two rounds.
#   PART=6  the attention kernels' tile loaders with constant trip counts: the attention labs' --check,
#           compute-sanitizer memcheck at B=1 NH=2 T=100 (T not a multiple of a tile), the labs'
#           header versions of the tree before (.carry/ab/o1) and this one benchmarked in turn, then a
#           B=64 training A/B of the two trees.
#   PART=7  the wgmma versions of both attention labs benchmarked (forward 10-12, backward 12-14), twice.
#   PART=9  the attention forward with the last key tile's masked half skipped: the forward lab's
#           --check and memcheck, versions 9 and 11 of the tree before (.carry/ab/o2) and this one
#           benchmarked in turn, a B=64 training A/B of the two trees (the loss bits must not move).
#   PART=0  the code as it lands, briefly: the attention backward lab's --check, test/test_gpt.sh,
#           B=64 and B=32 training (30 steps).
#   PART=2  the code as it lands: every lab's --check, the unit tests, test/test_gpt.sh, B=64 and B=32
#           training, PyTorch's reference model (compile + SDPA) at B=32 and 64 in the same call.
#   PART=3  a -pf 1 breakdown at B=64, the attention kernels beside PyTorch's SDPA
#           (attention_vs_torch.py), 200 steps of bf16 (validation every 50), then the matmul lab's
#           benchmark (stop 20's fix of its 1-GEMM rows) in the call's remaining time.
set -u
PARTS=012345679
NAME=stop21
source "$(dirname "$0")/device_lib.sh"
# test/test_gpt.sh, then 30 steps of B=64 and B=32 training (PART 0 and 2).
test_gpt_and_throughput() {
    step test_gpt 330 bash test/test_gpt.sh
    grep -E "weight stream|determinism" "$log/test_gpt.log" | sort | uniq -c
    for b in 64 32; do
        timeout 40 ./train_gpt_bf16 -b $b -x 30 -v 0 -s 0 > "$log/B$b.log" 2>&1
        echo "B=$b (rc $?): $(grep -E "^done" "$log/B$b.log")"
    done
}
if [[ $PART == 1 ]]; then
    step attn_13_14 200 ./dev/cuda/attention_backward 13 14
    grep -E "v14 = v13|FAIL|^  1[34] " "$log/attn_13_14.log" | grep -vE "bitwise identical$" | head -n 20
    grep -cE "bitwise identical$" "$log/attn_13_14.log" | sed 's/^/bit checks identical: /'
    step matmul_check 150 ./dev/cuda/matmul --check
    OUT="$log" DIRS="${AB_DIRS:-.carry/ab/base .}" PF=0 timeout "$(secs_left 590)" bash scripts/device_ab_dirs.sh
elif [[ $PART == 4 ]]; then
    step attn_13_15 200 ./dev/cuda/attention_backward 13 14 15
    grep -E "v1[45] = v13|FAIL|^  1[345] " "$log/attn_13_15.log" | grep -vE "bitwise identical$" | head -n 20
    grep -cE "bitwise identical$" "$log/attn_13_15.log" | sed 's/^/bit checks identical: /'
    OUT="$log" DIRS="${AB_DIRS:-.carry/ab/base .carry/ab/o1 .}" PF=0 timeout "$(secs_left 590)" bash scripts/device_ab_dirs.sh
elif [[ $PART == 5 ]]; then
    OUT="$log" DIRS=. FLAGS="-tw 0;-tw 1" PF=0 timeout "$(secs_left 590)" bash scripts/device_ab_dirs.sh
elif [[ $PART == 6 ]]; then
    old=${OLD:-.carry/ab/o1}
    make -C "$old" -j16 dev/cuda/attention_forward dev/cuda/attention_backward > "$log/build_old.log" 2>&1 || tail -n 20 "$log/build_old.log"
    step check_attention_forward 120 ./dev/cuda/attention_forward --check
    step check_attention_backward 120 ./dev/cuda/attention_backward --check
    for v in "attention_forward 4 5 9 10 11 12" "attention_backward 4 9 10 12 13 14"; do
        step "memcheck_${v%% *}" 120 compute-sanitizer --tool memcheck --error-exitcode 1 ./dev/cuda/$v --no-validate -b 1 -n 2 -t 100
        tail -n 2 "$log/memcheck_${v%% *}.log"
    done
    for r in 1 2; do
        for d in "$old" .; do
            echo "round $r $d: fwd $(./$d/dev/cuda/attention_forward 11 --no-validate 2>/dev/null | grep -E '^  11 ' | tr -s ' ')" \
                "| bwd $(./$d/dev/cuda/attention_backward 14 --no-validate 2>/dev/null | grep -E '^  14 ' | tr -s ' ')"
        done
    done
    OUT="$log" DIRS="$old ." PF=0 timeout "$(secs_left 590)" bash scripts/device_ab_dirs.sh
elif [[ $PART == 7 ]]; then
    for r in 1 2; do
        ./dev/cuda/attention_forward 9 10 11 12 --no-validate | grep -E "^  [0-9]+ " | sed "s/^/round $r fwd/"
        ./dev/cuda/attention_backward 11 12 13 14 --no-validate | grep -E "^  [0-9]+ " | sed "s/^/round $r bwd/"
    done
elif [[ $PART == 9 ]]; then
    old=${OLD:-.carry/ab/o2}
    make -C "$old" -j16 dev/cuda/attention_forward > "$log/build_old.log" 2>&1 || tail -n 20 "$log/build_old.log"
    step check_attention_forward 120 ./dev/cuda/attention_forward --check
    step memcheck_forward 120 compute-sanitizer --tool memcheck --error-exitcode 1 ./dev/cuda/attention_forward 9 10 11 12 --no-validate -b 1 -n 2 -t 100
    tail -n 1 "$log/memcheck_forward.log"
    for r in 1 2; do
        for d in "$old" .; do
            echo "round $r $d: $(./$d/dev/cuda/attention_forward 9 11 --no-validate 2>/dev/null | grep -E '^  (9|11) ' | tr -s ' ' | tr '\n' ' ')"
        done
    done
    OUT="$log" DIRS="$old ." STEPS=30 PF=0 timeout "$(secs_left 590)" bash scripts/device_ab_dirs.sh
elif [[ $PART == 0 ]]; then
    step check_attention_backward 120 ./dev/cuda/attention_backward --check
    test_gpt_and_throughput
elif [[ $PART == 2 ]]; then
    lab_check
    unit_tests
    test_gpt_and_throughput
    timeout "$(secs_left 590)" "$PY" scripts/bench_torch_gpt.py --batch 32 64 --steps 30 > "$log/torch.log" 2>&1
    echo "PyTorch (rc $?):"; tail -n 4 "$log/torch.log"
elif [[ $PART == 3 ]]; then
    timeout 60 ./train_gpt_bf16 -b 64 -x 12 -v 0 -s 0 -pf 1 > "$log/B64_pf.log" 2>&1
    echo "breakdown (rc $?): $(grep -E '^done' "$log/B64_pf.log")"
    sed -n '/^GPU time per step/,$p' "$log/B64_pf.log" | grep -vE ' 0\.0[0-9]+ ms'
    step attention_vs_torch 120 "$PY" dev/cuda/attention_vs_torch.py
    tail -n 12 "$log/attention_vs_torch.log"
    timeout 200 ./train_gpt_bf16 -x 200 -v 50 -s 0 > "$log/curve_bf16.log" 2>&1
    echo "bf16 200 steps (rc $?): $(grep -E "^step +[0-9]+ \| val loss" "$log/curve_bf16.log" | awk '{printf "%s:%s ", $2, $NF}')"
    step matmul_bench "$(secs_left 590)" ./dev/cuda/matmul
    grep -E "^(qkv|attproj|fc|fcproj|lmhead) |per step|reference" "$log/matmul_bench.log" | grep -vE " 3 " | head -n 60
fi
echo "done at $((SECONDS - started)) s"
