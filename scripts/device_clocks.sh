#!/usr/bin/env bash
# Clocks and power while the labs benchmark and while training runs, in one device call: do kernels
# run slower in training than in their lab because the GPU clocks down under sustained load?
# nvidia-smi samples SM clock, power, temperature and the clock-event reasons every 20 ms into
# $OUT/clocks/smi.csv while: the attention backward and forward labs (header version, B=64) run
# alone, then training (d12, bf16, B=64, 30 steps, then 12 steps with -pf 1), then the labs again
# right after. Each phase's start and end go to $OUT/clocks/phases.log; the summary prints each
# phase's median SM clock and power. Needs the prepared data (data/prepare_tinyshakespeare.py).
set -u
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-out}
log=$OUT/clocks
mkdir -p "$log"
trap 'tar -czf "$OUT/clocks_logs.tgz" -C "$OUT" clocks' EXIT
make -j16 train_gpt_bf16 dev/cuda/attention_backward dev/cuda/attention_forward > "$log/build.log" 2>&1 ||
    { tail -n 20 "$log/build.log"; exit 1; }
[[ -f data/tinyshakespeare/tiny_shakespeare_train.bin ]] ||
    GPT_MIRROR=${GPT_MIRROR:-.carry/mirror} python3 data/prepare_tinyshakespeare.py > "$log/data.log" 2>&1 ||
    { tail -n 5 "$log/data.log"; exit 1; }
reasons=clocks_event_reasons.active
nvidia-smi --query-gpu=$reasons --format=csv > /dev/null 2>&1 || reasons=clocks_throttle_reasons.active
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,$reasons \
    --format=csv,noheader,nounits -lms 20 > "$log/smi.csv" 2> "$log/smi.err" &
smi=$!
sleep 2
now() { date +%s.%N; }
phase() {  # phase NAME COMMAND...: run, log, record start and end
    local name=$1 t0
    shift
    t0=$(now)
    "$@" > "$log/$name.log" 2>&1
    echo "$name $t0 $(now) rc=$?" >> "$log/phases.log"
}
phase idle sleep 2
phase attn_bwd_cold ./dev/cuda/attention_backward 11 --no-validate
phase attn_fwd_cold ./dev/cuda/attention_forward 9 --no-validate
phase train_b64 ./train_gpt_bf16 -b 64 -x 30 -v 0 -s 0
phase train_b64_pf ./train_gpt_bf16 -b 64 -x 12 -v 0 -s 0 -pf 1
phase attn_bwd_after ./dev/cuda/attention_backward 11 --no-validate
phase attn_fwd_after ./dev/cuda/attention_forward 9 --no-validate
kill $smi
sleep 0.2
# nvidia-smi's timestamp is local wall time "YYYY/MM/DD HH:MM:SS.mmm": to epoch seconds, then the
# median clock / power / the most frequent reason over each phase's window.
python3 - "$log" <<'EOF'
import sys, datetime, statistics, collections
d = sys.argv[1]
rows = []
for line in open(f"{d}/smi.csv"):
    f = [x.strip() for x in line.split(",")]
    if len(f) < 6: continue
    try:
        t = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        rows.append((t, float(f[1]), float(f[2]), float(f[3]), float(f[4]), f[5]))
    except ValueError:
        pass
print(f"{len(rows)} samples")
for line in open(f"{d}/phases.log"):
    name, t0, t1, rc = line.split()
    sel = [r for r in rows if float(t0) <= r[0] <= float(t1)]
    if not sel:
        print(f"{name}: no samples"); continue
    reasons = collections.Counter(r[5] for r in sel).most_common(2)
    print(f"{name:16s} {float(t1)-float(t0):6.1f} s  SM MHz median {statistics.median(r[1] for r in sel):6.0f} "
          f"min {min(r[1] for r in sel):5.0f}  power W median {statistics.median(r[3] for r in sel):5.0f} "
          f"max {max(r[3] for r in sel):5.0f}  temp {max(r[4] for r in sel):3.0f} C  reasons {reasons}  {rc}")
EOF
for f in "$log"/attn_*.log; do echo "== $(basename "$f")"; grep -E "^  +(9|11) " "$f"; done
grep -hE "^done|median step" "$log/train_b64.log"
sed -n '/^GPU time per step/,$p' "$log/train_b64_pf.log"
