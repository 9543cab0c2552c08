#!/usr/bin/env bash
# usage: [LLMC=/path/to/train_gpt2cu] [ROUNDS=2] [STEPS=30] [TORCH=1] bash scripts/bench_train.sh [MODEL:B ...]
#
# Training throughput, ours beside llm.c and PyTorch, bf16, T=1024 (T=...), on one GPU. Each MODEL:B
# (default d12:64; e.g. d12:64 d24:32 d48:8) runs ours and, when LLMC names llm.c's train_gpt2cu
# binary, llm.c in turn, ROUNDS times (ours, llm.c, ours, llm.c, ...), so clock drift hits both
# alike. A run's figure is its median step time after WARMUP steps (default 5); a side's figure is
# the median of its runs' medians; tok/s = B*T / that. PyTorch (scripts/bench_torch_gpt.py: the
# reference model, torch.compile, SDPA flash, bf16 autocast) runs once per MODEL:B after them.
# Ends with one table: model, B, ours tok/s, llm.c tok/s, ours/llm.c, PyTorch tok/s, ours peak memory.
# Then, at the first MODEL:B: a -pf 1 breakdown of ours (GPU time per kernel family; PROFILE=0: not)
# and ours with -r 0 and -r 1 (every activation kept / GELU recomputed: memory; RECOMPUTE=0: not).
#
# Environment:
#   LLMC        llm.c's train_gpt2cu (built with its Makefile); empty: no llm.c column
#   LLMC_FLAGS  llm.c's flags beyond data, model, B, T and steps (default "-ge 2 -r 0": GELU fused
#               both ways and every activation kept, the work ours does by default; llm.c's own
#               default recomputes GELU, -r 1)
#   FLAGS       extra flags for ours (train_gpt_bf16 -h), e.g. "-tw 1"
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
    [[ $c =~ ^d[0-9]+:[0-9]+$ ]] || { echo "error: '$c' is not MODEL:B (e.g. d12:64)" >&2; exit 1; }
done
for var in ROUNDS STEPS T; do
    [[ ${!var} =~ ^[1-9][0-9]{0,6}$ ]] || { echo "error: $var must be a positive integer, got '${!var}'" >&2; exit 1; }
done
[[ $WARMUP =~ ^[0-9]{1,7}$ ]] || { echo "error: WARMUP must be an integer >= 0, got '$WARMUP'" >&2; exit 1; }
((STEPS > WARMUP)) || { echo "error: STEPS ($STEPS) must exceed WARMUP ($WARMUP)" >&2; exit 1; }
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

declare -A ours_ms llmc_ms torch_tok ours_mem
status=0  # 1 when a run of ours or llm.c failed or printed no step times
for c in "${configs[@]}"; do
    model=${c%:*} B=${c#*:}
    for r in $(seq "$ROUNDS"); do
        log="$OUT/ours_${model}_B${B}_$r.log"
        # shellcheck disable=SC2086  # FLAGS is a list of flags
        timeout "$RUN_LIMIT" ./train_gpt_bf16 -e "$model" -b "$B" -t "$T" -x "$STEPS" -v 0 -s 0 -i "$DATA" $FLAGS > "$log" 2>&1
        rc=$? ms=$(median_step_ms "$log")
        echo "$model B=$B round $r ours:  rc $rc, median step ${ms:--} ms $(grep -oE 'peak GPU memory [0-9.]+ GiB' "$log")"
        [[ $rc == 0 && -n $ms ]] || { status=1; tail -n 3 "$log"; }
        [[ -n $ms ]] && ours_ms[$c]+="$ms "
        ours_mem[$c]=$(grep -oE 'peak GPU memory [0-9.]+ GiB' "$log" | awk '{print $4}')
        if [[ -n $LLMC ]]; then
            log="$OUT/llmc_${model}_B${B}_$r.log"
            # -v: llm.c validates at the first and last step whatever it is (and divides by it: not 0);
            # -m 1: one validation batch; -s 0: no samples. Validation is outside its timed section.
            # shellcheck disable=SC2086  # LLMC_FLAGS is a list of flags
            timeout "$RUN_LIMIT" "$LLMC" -i "$DATA" -j "$DATA" -e "$model" -b "$B" -t "$T" -x "$STEPS" -v "$STEPS" -m 1 -s 0 \
                $LLMC_FLAGS > "$log" 2>&1
            rc=$? ms=$(median_step_ms "$log")
            echo "$model B=$B round $r llm.c: rc $rc, median step ${ms:--} ms"
            [[ $rc == 0 && -n $ms ]] || { status=1; tail -n 3 "$log"; }
            [[ -n $ms ]] && llmc_ms[$c]+="$ms "
        fi
    done
    if [[ ${TORCH:-1} == 1 ]]; then
        log="$OUT/pytorch_${model}_B${B}.log"
        timeout "$RUN_LIMIT" "$PY" scripts/bench_torch_gpt.py --model "$model" --batch "$B" --seq "$T" --steps "$STEPS" > "$log" 2>&1
        echo "$model B=$B PyTorch: rc $?, $(grep -oE 'median step .*' "$log" || tail -n 1 "$log")"
        torch_tok[$c]=$(grep -oE '= [0-9,]+ tok/s' "$log" | tr -d ',' | awk '{print $2}')
    fi
done

echo
echo "| model | B | ours tok/s | llm.c tok/s | ours / llm.c | PyTorch tok/s | ours peak memory |"
echo "|---|---|---|---|---|---|---|"
for c in "${configs[@]}"; do
    model=${c%:*} B=${c#*:}
    o=$(tok_s "$B" "$(echo "${ours_ms[$c]:-}" | tr ' ' '\n' | grep . | median)")
    l=$(tok_s "$B" "$(echo "${llmc_ms[$c]:-}" | tr ' ' '\n' | grep . | median)")
    ratio=$(awk -v o="$o" -v l="$l" 'BEGIN {if (o > 0 && l > 0) printf "%.3fx", o / l; else print "-"}')
    echo "| $model | $B | $o | $l | $ratio | ${torch_tok[$c]:--} | ${ours_mem[$c]:--} GiB |"
done
echo "(T=$T bf16; each side: median over $ROUNDS runs of each run's median step after $WARMUP warm-up steps of $STEPS)"

model=${configs[0]%:*} B=${configs[0]#*:}
if [[ ${PROFILE:-1} == 1 ]]; then
    log="$OUT/ours_${model}_B${B}_pf.log"
    # shellcheck disable=SC2086
    timeout "$RUN_LIMIT" ./train_gpt_bf16 -e "$model" -b "$B" -t "$T" -x 12 -v 0 -s 0 -i "$DATA" -pf 1 $FLAGS > "$log" 2>&1
    echo
    echo "$model B=$B, -pf 1 (12 steps): $(grep -E '^done' "$log")"
    sed -n '/^GPU time per step/,$p' "$log"
fi
if [[ ${RECOMPUTE:-1} == 1 ]]; then
    echo
    for r in 0 1; do
        log="$OUT/ours_${model}_B${B}_r$r.log"
        # shellcheck disable=SC2086
        timeout "$RUN_LIMIT" ./train_gpt_bf16 -e "$model" -b "$B" -t "$T" -x 12 -v 0 -s 0 -i "$DATA" -r "$r" $FLAGS > "$log" 2>&1
        echo "$model B=$B -r $r (12 steps): $(grep -oE 'median step .*' "$log" || tail -n 1 "$log")"
    done
fi
exit "$status"
