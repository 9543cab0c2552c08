#!/usr/bin/env bash
# Where one training step's GPU time goes, kernel by kernel: Nsight Compute times every kernel of one
# steady B=64 step of d12 bf16 (train_gpt -pf 1 brackets its last step with cudaProfilerStart/Stop),
# and the attention labs' kernels at B=64 NH=12 T=1024 HS=64. ncu runs each kernel alone, so its
# times are at the clock an idle GPU gives one kernel, not the power-capped clock of training; they say
# which kernels hold the time, not what a step costs. Clocks left alone (--clock-control none,
# METHOD.md). Needs GPT_MIRROR (or the prepared data) for training. Logs: $OUT/profile_step/*.log.
#   usage: bash scripts/device_profile_step.sh [-h]
source "$(dirname "$0")/device_lab.sh" profile_step "$@"
run build make -j16 train_gpt_bf16 dev/cuda/attention_forward dev/cuda/attention_backward
[[ -f data/tinyshakespeare/tiny_shakespeare_train.bin ]] || run data "$PY" data/prepare_tinyshakespeare.py
run step_raw timeout 400 ncu "${ncu_times[@]}" --profile-from-start off ./train_gpt_bf16 -b 64 -x 3 -v 0 -s 0 -pf 1
run step "$PY" - "$logs/step_raw.log" <<'EOF'
# Sums ncu's per-kernel times by kernel name (template arguments dropped), largest first.
import csv, re, sys
rows = [l for l in open(sys.argv[1]) if l.startswith('"')]
table = list(csv.DictReader(rows))
total, by_name = 0.0, {}
for r in table:
    try:  # ncu writes thousands separators ("805,760")
        ns = float(r["gpu__time_duration.sum"].replace(",", ""))
    except (KeyError, ValueError):
        continue  # the units row
    name = re.sub(r"<.*", "", re.sub(r"^void ", "", r["Kernel Name"])).split("(")[0]
    n, t = by_name.get(name, (0, 0.0))
    by_name[name] = (n + 1, t + ns)
    total += ns
print(f"{sum(n for n, _ in by_name.values())} kernels, {total / 1e6:.2f} ms in all (each alone, ncu)")
for name, (n, t) in sorted(by_name.items(), key=lambda kv: -kv[1][1]):
    print(f"{t / 1e6:9.3f} ms {100 * t / total:5.1f}%  x{n:<4d} {name}")
EOF
run attention timeout 200 ncu "${ncu_times[@]}" -k "regex:(forward|backward)" -c 8 ./dev/cuda/attention_backward 11 --no-validate
run attention_fwd timeout 200 ncu "${ncu_times[@]}" -k "regex:forward" -c 4 ./dev/cuda/attention_forward 9 11 --no-validate
exit $status
