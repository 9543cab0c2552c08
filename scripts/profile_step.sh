#!/usr/bin/env bash
# usage: [B=64] [MODEL=d12] [FLAGS="..."] bash scripts/profile_step.sh
#
# Where one training step's GPU time goes. First the -pf 1 breakdown (train_gpt times each kernel
# family with CUDA events over the steps after the first: the GPU time per phase, at the clocks
# training runs at). Then, kernel by kernel: Nsight Compute (ncu) times every kernel of the last step
# of a `train_gpt_bf16 -pf 1` run (-pf 1 brackets that step with cudaProfilerStart/Stop, and ncu
# starts with --profile-from-start off), and the kernels are summed by name, largest first. ncu
# runs each kernel alone, at the clock an idle GPU gives one kernel, with clocks left alone
# (--clock-control none): its times say which kernels hold the time, not what a step costs (a step
# under sustained load runs at the power cap, slower; docs/performance.md).
# Environment: MODEL B T FLAGS (as train_gpt_bf16 -h; defaults d12 64 1024, none), DATA (token file,
# default Tiny Shakespeare's training file, prepared if missing), NCU (default ncu; NCU=none: the
# breakdown only), OUT (log folder, default out/profile_step), RUN_LIMIT (seconds a run may take,
# default 600).
set -uo pipefail
# Paths given in the environment or as arguments are relative to where the script was started.
here=$PWD
abs_path() { if [[ $1 == /* ]]; then echo "$1"; else echo "$here/$1"; fi; }
cd "$(dirname "$0")/.." || exit 1
export PATH=/usr/local/cuda/bin:$PATH
if [[ ${1:-} == -h || ${1:-} == --help ]]; then sed -n '2,/^set -uo/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0; fi
[[ $# -eq 0 ]] || { echo "error: unexpected argument '$1' (settings go in the environment; -h)" >&2; exit 1; }
OUT=${OUT:+$(abs_path "$OUT")}
OUT=${OUT:-out/profile_step}
MODEL=${MODEL:-d12} B=${B:-64} T=${T:-1024} FLAGS=${FLAGS:-} NCU=${NCU:-ncu}
RUN_LIMIT=${RUN_LIMIT:-600}
PY=${PYTHON:-$(cat build/python 2>/dev/null || echo python3)}
DATA=${DATA:+$(abs_path "$DATA")}
DATA=${DATA:-data/tinyshakespeare/tiny_shakespeare_train.bin}
mkdir -p "$OUT"
make -j train_gpt_bf16 > "$OUT/build.log" 2>&1 || { tail -n 20 "$OUT/build.log"; exit 1; }
if [[ ! -f $DATA ]]; then
    "$PY" data/prepare_tinyshakespeare.py > "$OUT/data.log" 2>&1 || { tail -n 5 "$OUT/data.log"; exit 1; }
fi
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,power.limit --format=csv,noheader
run=(./train_gpt_bf16 -e "$MODEL" -b "$B" -t "$T" -v 0 -s 0 -i "$DATA" -pf 1)
read -r -a extra <<< "$FLAGS"

timeout "$RUN_LIMIT" "${run[@]}" -x 12 "${extra[@]}" > "$OUT/breakdown.log" 2>&1
echo "$MODEL B=$B T=$T ${FLAGS:+[$FLAGS] }-pf 1, 12 steps (rc $?): $(grep -E '^done' "$OUT/breakdown.log")"
sed -n '/^GPU time per step/,$p' "$OUT/breakdown.log"

if [[ $NCU == none ]] || ! command -v "$NCU" > /dev/null; then
    echo "no per-kernel times: ncu not found (NCU=$NCU)"
    exit 0
fi
# Three steps: the first tunes the matmuls, the last is the one profiled.
timeout "$RUN_LIMIT" "$NCU" --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv --page raw \
    --print-units base "${run[@]}" -x 3 "${extra[@]}" > "$OUT/kernels_raw.log" 2>&1
rc=$?
echo
echo "kernels of one step under ncu (rc $rc; raw: $OUT/kernels_raw.log):"
"$PY" - "$OUT/kernels_raw.log" <<'EOF'
# Sums ncu's per-kernel times by kernel name (template arguments dropped), largest first.
import csv, re, sys
rows = [l for l in open(sys.argv[1]) if l.startswith('"')]
total, by_name = 0.0, {}
for r in csv.DictReader(rows):
    try:  # ncu writes thousands separators ("805,760"); the units row is not a number
        ns = float(r["gpu__time_duration.sum"].replace(",", ""))
    except (KeyError, ValueError):
        continue
    name = re.sub(r"<.*", "", re.sub(r"^void ", "", r["Kernel Name"])).split("(")[0]
    n, t = by_name.get(name, (0, 0.0))
    by_name[name] = (n + 1, t + ns)
    total += ns
if not by_name:
    sys.exit("no kernel times in ncu's output")
print(f"{sum(n for n, _ in by_name.values())} kernels, {total / 1e6:.2f} ms in all (each alone, ncu)")
for name, (n, t) in sorted(by_name.items(), key=lambda kv: -kv[1][1]):
    print(f"{t / 1e6:9.3f} ms {100 * t / total:5.1f}%  x{n:<4d} {name}")
EOF
