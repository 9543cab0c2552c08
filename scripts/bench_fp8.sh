#!/usr/bin/env bash
# usage: [ROUNDS=1] [T=1024] [FLAGS=...] [DATA=tokens.bin] [OUT=out/bench_fp8] bash scripts/bench_fp8.sh [MODEL:B:STEPS ...]
#
# Training throughput of train_gpt_bf16 with its linear layers in FP8 (-f8 1) beside bf16 (-f8 0), on
# one GPU. Each MODEL:B:STEPS (default d48:8:6 d12:64:20) runs -f8 0 then -f8 1, ROUNDS times, so clock
# drift hits both alike. A run's figure is its median step time after WARMUP steps (default a quarter
# of STEPS, at least 2: the first steps tune every matmul plan); a side's figure is the median of its
# runs'; tok/s = B*T / that. Ends with one table: model, B, tok/s at -f8 0 and -f8 1, their ratio,
# each side's peak GPU memory and final train loss (a look, not a check: test/test_fp8.sh checks).
# Environment:
#   DATA        token file (default: synthetic tokens from test/train_inputs.py in OUT, enough for the
#               longest run; the speed does not depend on which tokens)
#   FLAGS       extra flags for both sides (train_gpt_bf16 -h), e.g. "-r 1"
#   PF=1        then a -pf 1 run of each side at the first MODEL:B:STEPS (GPU time per kernel family,
#               the FP8 casts as fwd.fp8cast, bwd.fp8cast and opt.fp8cast)
#   ROUNDS WARMUP T   as above (defaults 1, STEPS/4 but at least 2, 1024)
#   OUT         log folder (default out/bench_fp8);  RUN_LIMIT: seconds a run may take (default 600)
#   PYTHON      the Python for test/train_inputs.py (numpy; default build/python, else python3)
set -uo pipefail
# Paths given in the environment are relative to where the script was started.
here=$PWD
abs_path() { if [[ $1 == /* ]]; then echo "$1"; else echo "$here/$1"; fi; }
cd "$(dirname "$0")/.." || exit 1
export PATH=/usr/local/cuda/bin:$PATH
if [[ ${1:-} == -h || ${1:-} == --help ]]; then sed -n '2,/^set -uo/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0; fi
OUT=${OUT:+$(abs_path "$OUT")}
OUT=${OUT:-out/bench_fp8}
ROUNDS=${ROUNDS:-1} T=${T:-1024} FLAGS=${FLAGS:-} PF=${PF:-0} RUN_LIMIT=${RUN_LIMIT:-600}
PY=${PYTHON:-$(cat build/python 2>/dev/null || echo python3)}
DATA=${DATA:+$(abs_path "$DATA")}
configs=("$@")
[[ ${#configs[@]} -gt 0 ]] || configs=(d48:8:6 d12:64:20)
for c in "${configs[@]}"; do
    [[ $c =~ ^d[0-9]+:[1-9][0-9]*:[1-9][0-9]*$ ]] || { echo "error: '$c' is not MODEL:B:STEPS (e.g. d12:64:20)" >&2; exit 1; }
done
for var in ROUNDS T; do
    [[ ${!var} =~ ^[1-9][0-9]{0,6}$ ]] || { echo "error: $var must be a positive integer, got '${!var}'" >&2; exit 1; }
done
[[ -z ${WARMUP:-} || $WARMUP =~ ^[0-9]{1,7}$ ]] || { echo "error: WARMUP must be an integer >= 0, got '$WARMUP'" >&2; exit 1; }
mkdir -p "$OUT"

median() { sort -g | awk '{a[NR] = $1} END {if (NR) printf "%.2f\n", NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
warmup_of() { echo "${WARMUP:-$(($1 / 4 > 2 ? $1 / 4 : 2))}"; }
median_step_ms() {  # LOG WARMUP: step lines read "step N/M | ... | 112.3 ms | ..."
    grep -E '^step +[0-9]+/[0-9]+ \|' "$1" | grep -oE '\| [0-9.]+ ms \|' | awk -v w="$2" 'NR > w {print $2}' | median
}
tok_s() { awk -v b="$1" -v t="$T" -v ms="$2" 'BEGIN {if (ms > 0) printf "%.0f", b * t / (ms / 1000); else print "-"}'; }

make -j train_gpt_bf16 > "$OUT/build.log" 2>&1 || { tail -n 20 "$OUT/build.log"; exit 1; }
if [[ -z $DATA ]]; then
    tokens=0
    for c in "${configs[@]}"; do
        IFS=: read -r _ B steps <<<"$c"
        tokens=$((B * T * steps + T + 1 > tokens ? B * T * steps + T + 1 : tokens))
    done
    DATA=$OUT/tokens.bin
    "$PY" test/train_inputs.py tokens "$DATA" "$tokens" > "$OUT/data.log" 2>&1 || { tail -n 5 "$OUT/data.log"; exit 1; }
fi
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,power.limit --format=csv,noheader
echo "train_gpt_bf16 at $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo '+changes'), T=$T, flags: ${FLAGS:-none}"

declare -A side_ms side_mem side_loss
status=0  # 1 when a run failed or printed no step times
for c in "${configs[@]}"; do
    IFS=: read -r model B steps <<<"$c"
    w=$(warmup_of "$steps")
    for r in $(seq "$ROUNDS"); do
        for f8 in 0 1; do
            log="$OUT/${model}_B${B}_f8${f8}_$r.log"
            # shellcheck disable=SC2086  # FLAGS is a list of flags
            timeout "$RUN_LIMIT" ./train_gpt_bf16 -e "$model" -b "$B" -t "$T" -x "$steps" -v 0 -s 0 -i "$DATA" -f8 "$f8" $FLAGS \
                > "$log" 2>&1
            rc=$? ms=$(median_step_ms "$log" "$w")
            echo "$model B=$B round $r -f8 $f8: rc $rc, median of steps $((w + 1))..$steps ${ms:--} ms" \
                "$(grep -oE 'peak GPU memory [0-9.]+ GiB' "$log")"
            [[ $rc == 0 && -n $ms ]] || { status=1; tail -n 3 "$log"; continue; }
            key="$c $f8"
            side_ms[$key]+="$ms "
            side_mem[$key]=$(grep -oE 'peak GPU memory [0-9.]+' "$log" | awk '{print $4}')
            side_loss[$key]=$(grep -oE 'final train loss [0-9.]+' "$log" | awk '{print $4}')
            [[ $f8 == 1 && $r == 1 ]] && grep -oE '^memory: .*' "$log" | sed 's/^/    /'
        done
    done
done

if [[ $PF == 1 ]]; then
    IFS=: read -r model B steps <<<"${configs[0]}"
    for f8 in 0 1; do
        log="$OUT/${model}_B${B}_f8${f8}_pf.log"
        # shellcheck disable=SC2086
        timeout "$RUN_LIMIT" ./train_gpt_bf16 -e "$model" -b "$B" -t "$T" -x "$steps" -v 0 -s 0 -i "$DATA" -f8 "$f8" -pf 1 $FLAGS \
            > "$log" 2>&1 || status=1
        echo "--- -pf 1 breakdown, $model B=$B -f8 $f8:"
        sed -n '/^done:/,$p' "$log" | tail -n +2
    done
fi

echo
printf '%-6s %4s %12s %12s %7s %14s %14s %12s %12s\n' model B "-f8 0 tok/s" "-f8 1 tok/s" "1 / 0" "-f8 0 peak GiB" "-f8 1 peak GiB" "-f8 0 loss" "-f8 1 loss"
for c in "${configs[@]}"; do
    IFS=: read -r model B steps <<<"$c"
    ms0=$(tr ' ' '\n' <<<"${side_ms["$c 0"]:-}" | grep . | median) ms1=$(tr ' ' '\n' <<<"${side_ms["$c 1"]:-}" | grep . | median)
    t0=$(tok_s "$B" "${ms0:-0}") t1=$(tok_s "$B" "${ms1:-0}")
    ratio=$(awk -v a="$t0" -v b="$t1" 'BEGIN {if (a > 0 && b > 0) printf "%.3f", b / a; else print "-"}')
    printf '%-6s %4s %12s %12s %7s %14s %14s %12s %12s\n' "$model" "$B" "$t0" "$t1" "$ratio" "${side_mem["$c 0"]:--}" \
        "${side_mem["$c 1"]:--}" "${side_loss["$c 0"]:--}" "${side_loss["$c 1"]:--}"
done
echo "logs: $OUT"
exit $status
