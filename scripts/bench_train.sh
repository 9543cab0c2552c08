#!/usr/bin/env bash
# usage: [LLMC=/path/to/train_gpt2cu] [FP8=1] [GPUS="2 4"] [ROUNDS=2] [STEPS=30] [TORCH=1] bash scripts/bench_train.sh [MODEL:B[:STEPS] ...]
#
# Training throughput, ours beside llm.c and PyTorch, bf16, T=1024 (T=...), on one GPU (GPUS: more). Each MODEL:B
# (default d12:64; e.g. d12:64 d24:32 d48:8; d48:8:20 runs 20 steps there, not STEPS) runs ours, with
# FP8=1 ours again with its linear layers in FP8 (-f8 1), and, when LLMC names llm.c's train_gpt2cu
# binary, llm.c, in turn, ROUNDS times (ours, ours FP8, llm.c, ours, ...), so clock drift hits every
# side alike. A run's figure is its median step time after WARMUP steps (default 5); a side's figure
# is the median of its runs' medians; tok/s = B*T / that. PyTorch (scripts/bench_torch_gpt.py: the
# reference model, torch.compile, SDPA flash, bf16 autocast) runs once per MODEL:B after them.
# Ends with one table: model, B, ours tok/s, llm.c tok/s, ours/llm.c, PyTorch tok/s, ours peak memory,
# and with FP8=1 ours FP8 tok/s, FP8/bf16 and its peak memory. Then, at the first MODEL:B: a -pf 1
# breakdown of ours (GPU time per kernel family, with FP8=1 of -f8 1 too; PROFILE=0: not) and ours
# with -r 0 and -r 1 (every activation kept / GELU recomputed: memory; RECOMPUTE=0: not).
# GPUS="2 4": ours also data-parallel on 2 and on 4 GPUs of this machine (scripts/launch.sh, B a GPU,
# -d B*T*GPUs: no accumulation), in the same rounds, and a second table: tokens/s against one GPU's,
# and rank 0's peak memory (with ZeRO-1 each GPU keeps 1/GPUs of the AdamW state and master weights).
#
# Environment:
#   LLMC        llm.c's train_gpt2cu (built with its Makefile); empty: no llm.c column
#   LLMC_FLAGS  llm.c's flags beyond data, model, B, T and steps (default "-ge 2 -r 0": GELU fused
#               both ways and every activation kept, the work ours does by default; llm.c's own
#               default recomputes GELU, -r 1)
#   FLAGS       extra flags for ours (train_gpt_bf16 -h), e.g. "-tw 1"; FP8=1's runs add -f8 1 to them
#   FP8=1       the FP8 side (compute capability 8.9+; the setup's memory line shows its FP8 copies)
#   GPUS        GPU counts from 2 to 99 for the data-parallel sides (default none)
#   DATA        token file for every side (default Tiny Shakespeare's training file, prepared if
#               missing; llm.c gets it as -i and -j: the validation file is too small at B=64)
#   ROUNDS STEPS WARMUP T   as above (defaults 2, 30, 5, 1024)
#   TORCH=0     no PyTorch;  PYTHON: the Python with PyTorch (default build/python, else python3)
#   OUT         log folder (default out/bench);  RUN_LIMIT: seconds a run may take (default 600)
# Step times: ours prints each step's wall time from the end of the step before; llm.c times its
# training section with CUDA events; PyTorch synchronizes around each step. All exclude validation.
set -uo pipefail
# Paths given in the environment or as arguments are relative to where the script was started.
here=$PWD
abs_path() { if [[ $1 == /* ]]; then echo "$1"; else echo "$here/$1"; fi; }
cd "$(dirname "$0")/.." || exit 1
export PATH=/usr/local/cuda/bin:$PATH
if [[ ${1:-} == -h || ${1:-} == --help ]]; then sed -n '2,/^set -uo/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0; fi
OUT=${OUT:+$(abs_path "$OUT")}
OUT=${OUT:-out/bench}
ROUNDS=${ROUNDS:-2} STEPS=${STEPS:-30} WARMUP=${WARMUP:-5} T=${T:-1024}
LLMC=${LLMC:+$(abs_path "$LLMC")} LLMC_FLAGS=${LLMC_FLAGS:--ge 2 -r 0} FLAGS=${FLAGS:-}
RUN_LIMIT=${RUN_LIMIT:-600}
PY=${PYTHON:-$(cat build/python 2>/dev/null || echo python3)}
DATA=${DATA:+$(abs_path "$DATA")}
DATA=${DATA:-data/tinyshakespeare/tiny_shakespeare_train.bin}
configs=("$@")
[[ ${#configs[@]} -gt 0 ]] || configs=(d12:64)
for c in "${configs[@]}"; do
    [[ $c =~ ^d[0-9]+:[1-9][0-9]*(:[1-9][0-9]{0,6})?$ ]] || { echo "error: '$c' is not MODEL:B[:STEPS] (e.g. d12:64, d48:8:20)" >&2; exit 1; }
done
[[ ${FP8:-0} == 0 || ${FP8:-0} == 1 ]] || { echo "error: FP8 must be 0 or 1, got '$FP8'" >&2; exit 1; }
FP8=${FP8:-0}
read -ra gpu_counts <<<"${GPUS:-}"
for n in "${gpu_counts[@]}"; do
    if ! [[ $n =~ ^[1-9][0-9]?$ ]] || ((n < 2)); then echo "error: GPUS holds GPU counts from 2 to 99, got '$n'" >&2; exit 1; fi
done
for var in ROUNDS STEPS T; do
    [[ ${!var} =~ ^[1-9][0-9]{0,6}$ ]] || { echo "error: $var must be a positive integer, got '${!var}'" >&2; exit 1; }
done
[[ $WARMUP =~ ^[0-9]{1,7}$ ]] || { echo "error: WARMUP must be an integer >= 0, got '$WARMUP'" >&2; exit 1; }
((STEPS > WARMUP)) || { echo "error: STEPS ($STEPS) must exceed WARMUP ($WARMUP)" >&2; exit 1; }
for c in "${configs[@]}"; do
    [[ $c =~ :.*: ]] && ((${c##*:} <= WARMUP)) && { echo "error: '$c': its steps must exceed WARMUP ($WARMUP)" >&2; exit 1; }
done
[[ -z $LLMC || -x $LLMC ]] || { echo "error: LLMC=$LLMC is not an executable" >&2; exit 1; }
mkdir -p "$OUT"

# The median of a run's step times (ms) after WARMUP steps: ours' and llm.c's step lines both read
# "step N/M | ... | 112.3 ms | ...".
median() { sort -g | awk '{a[NR] = $1} END {if (NR) printf "%.2f\n", NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
median_step_ms() {
    grep -E '^step +[0-9]+/[0-9]+ \|' "$1" | grep -oE '\| [0-9.]+ ms \|' | awk -v w="$WARMUP" 'NR > w {print $2}' | median
}
tok_s() { awk -v b="$1" -v t="$T" -v ms="$2" 'BEGIN {if (ms > 0) printf "%.0f", b * t / (ms / 1000); else print "-"}'; }

make -j train_gpt_bf16 > "$OUT/build.log" 2>&1 || { tail -n 20 "$OUT/build.log"; exit 1; }
if [[ ! -f $DATA ]]; then
    "$PY" data/prepare_tinyshakespeare.py > "$OUT/data.log" 2>&1 || { tail -n 5 "$OUT/data.log"; exit 1; }
fi
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,power.limit --format=csv,noheader
echo "ours: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo '+changes'), flags: ${FLAGS:-none}; llm.c: ${LLMC:-not run}${LLMC:+ ($LLMC_FLAGS)}"

declare -A side_ms side_mem torch_tok
status=0  # 1 when a run of ours or llm.c failed or printed no step times
# run_side SIDE LOG COMMAND...: one run of this MODEL:B's round; its median step, and its peak memory
# where it prints one (ours), go to SIDE.
run_side() {
    local side=$1 log=$2 rc ms mem
    shift 2
    timeout "$RUN_LIMIT" "$@" > "$log" 2>&1
    rc=$? ms=$(median_step_ms "$log") mem=$(grep -oE 'peak GPU memory [0-9.]+ GiB' "$log")
    printf '%s B=%s round %s %-9s rc %s, median step %s ms%s\n' "$model" "$B" "$r" "$side:" "$rc" "${ms:--}" "${mem:+ $mem}"
    [[ $rc == 0 && -n $ms ]] || { status=1; tail -n 3 "$log"; }
    [[ -n $ms ]] && side_ms[$c $side]+="$ms "
    side_mem[$c $side]=$(awk '{print $4}' <<<"$mem")
}
# ours_cmd [FLAG...]: ours' command line for this MODEL:B and $steps steps, those flags before FLAGS, in `cmd`.
ours_cmd() {
    # shellcheck disable=SC2206  # FLAGS is a list of flags
    cmd=(./train_gpt_bf16 -e "$model" -b "$B" -t "$T" -x "$steps" -v 0 -s 0 -i "$DATA" "$@" $FLAGS)
}
for c in "${configs[@]}"; do
    IFS=: read -r model B steps <<<"$c"
    steps=${steps:-$STEPS}
    for r in $(seq "$ROUNDS"); do
        ours_cmd
        run_side ours "$OUT/ours_${model}_B${B}_$r.log" "${cmd[@]}"
        for n in "${gpu_counts[@]}"; do  # n ranks, B a GPU: -d B*T*n, no accumulation
            ours_cmd -d $((B * T * n))
            run_side "ours x$n" "$OUT/ours_x${n}_${model}_B${B}_$r.log" scripts/launch.sh "$n" "${cmd[@]}"
        done
        if [[ $FP8 == 1 ]]; then
            ours_cmd -f8 1
            run_side "ours FP8" "$OUT/ours_fp8_${model}_B${B}_$r.log" "${cmd[@]}"
            [[ $r == 1 ]] && grep -oE '^memory: .*' "$OUT/ours_fp8_${model}_B${B}_$r.log" | sed 's/^/    /'
        fi
        if [[ -n $LLMC ]]; then
            # -v: llm.c validates at the first and last step whatever it is (and divides by it: not 0);
            # -m 1: one validation batch; -s 0: no samples. Validation is outside its timed section.
            # shellcheck disable=SC2086  # LLMC_FLAGS is a list of flags
            run_side llm.c "$OUT/llmc_${model}_B${B}_$r.log" "$LLMC" -i "$DATA" -j "$DATA" -e "$model" -b "$B" -t "$T" -x "$steps" \
                -v "$steps" -m 1 -s 0 $LLMC_FLAGS
        fi
    done
    if [[ ${TORCH:-1} == 1 ]]; then
        log="$OUT/pytorch_${model}_B${B}.log"
        timeout "$RUN_LIMIT" "$PY" scripts/bench_torch_gpt.py --model "$model" --batch "$B" --seq "$T" --steps "$steps" > "$log" 2>&1
        echo "$model B=$B PyTorch: rc $?, $(grep -oE 'median step .*' "$log" || tail -n 1 "$log")"
        torch_tok[$c]=$(grep -oE '= [0-9,]+ tok/s' "$log" | tr -d ',' | awk '{print $2}')
    fi
done

side_tok_s() { tok_s "$2" "$(echo "${side_ms[$1]:-}" | tr ' ' '\n' | grep . | median)"; }  # KEY B
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a > 0 && b > 0) printf "%.3fx", a / b; else print "-"}'; }
echo
head="| model | B | ours tok/s | llm.c tok/s | ours / llm.c | PyTorch tok/s | ours peak memory |"
rule="|---|---|---|---|---|---|---|"
[[ $FP8 == 1 ]] && head+=" ours FP8 tok/s | FP8 / bf16 | FP8 peak memory |" rule+="---|---|---|"
echo "$head"
echo "$rule"
for c in "${configs[@]}"; do
    IFS=: read -r model B _ <<<"$c"
    o=$(side_tok_s "$c ours" "$B") l=$(side_tok_s "$c llm.c" "$B")
    line="| $model | $B | $o | $l | $(ratio "$o" "$l") | ${torch_tok[$c]:--} | ${side_mem[$c ours]:--} GiB |"
    if [[ $FP8 == 1 ]]; then
        f=$(side_tok_s "$c ours FP8" "$B")
        line+=" $f | $(ratio "$f" "$o") | ${side_mem[$c ours FP8]:--} GiB |"
    fi
    echo "$line"
done
echo "(T=$T bf16; each side: median over $ROUNDS runs of each run's median step after $WARMUP warm-up steps of $STEPS, or of a MODEL:B:STEPS's own)"
if [[ ${#gpu_counts[@]} -gt 0 ]]; then
    echo
    echo "| model | B a GPU | GPUs | tokens/s | vs 1 GPU | peak memory (rank 0) |"
    echo "|---|---|---|---|---|---|"
    for c in "${configs[@]}"; do
        IFS=: read -r model B _ <<<"$c"
        o=$(side_tok_s "$c ours" "$B")
        echo "| $model | $B | 1 | $o | 1x | ${side_mem[$c ours]:--} GiB |"
        for n in "${gpu_counts[@]}"; do
            m=$(side_tok_s "$c ours x$n" $((B * n)))
            echo "| $model | $B | $n | $m | $(ratio "$m" "$o") | ${side_mem[$c ours x$n]:--} GiB |"
        done
    done
fi

IFS=: read -r model B _ <<<"${configs[0]}"
if [[ ${PROFILE:-1} == 1 ]]; then
    for f8 in 0 $([[ $FP8 == 1 ]] && echo 1); do
        log="$OUT/ours_${model}_B${B}_f8${f8}_pf.log"
        steps=12 ours_cmd -pf 1 -f8 "$f8"
        timeout "$RUN_LIMIT" "${cmd[@]}" > "$log" 2>&1
        echo
        echo "$model B=$B, -f8 $f8 -pf 1 (12 steps): $(grep -E '^done' "$log")"
        sed -n '/^GPU time per step/,$p' "$log"
    done
fi
if [[ ${RECOMPUTE:-1} == 1 ]]; then
    echo
    for r in 0 1; do
        log="$OUT/ours_${model}_B${B}_r$r.log"
        steps=12 ours_cmd -r "$r"
        timeout "$RUN_LIMIT" "${cmd[@]}" > "$log" 2>&1
        echo "$model B=$B -r $r (12 steps): $(grep -oE 'median step .*' "$log" || tail -n 1 "$log")"
    done
fi
exit "$status"
