# What the lab scripts for the device (device_layernorm.sh, device_attention.sh) share. Each sources
# it right after its header comment, which runs up to its `usage:` line and is its -h text:
#   source "$(dirname "$0")/device_lab.sh" LOGDIR "$@"
# It answers -h, refuses stray arguments, enters the repo root, empties $OUT/LOGDIR (OUT defaults
# to ./out), sets PY, and defines run; the script ends with `exit $status`.
set -uo pipefail
lab_name=$1
shift
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then sed -n '2,/usage:/p' "$0"; exit 0; fi
[[ $# -eq 0 ]] || { echo "error: unexpected argument '$1' (see -h)" >&2; exit 1; }
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
logs=${OUT:-out}/$lab_name
mkdir -p "$logs"
rm -f "$logs"/*.log
PY=${PYTHON:-python3}
# Nsight Compute, kernel times only, clocks left alone (METHOD.md), one CSV row per kernel.
ncu_times=(--clock-control none --metrics gpu__time_duration.sum --csv --page raw --print-units base)
status=0
run() {  # run LOG COMMAND...: append to $logs/LOG.log (few files: the device returns at most 8), remember a failure
    local name=$1; shift
    echo "=== $*" | tee -a "$logs/$name.log"
    "$@" 2>&1 | tee -a "$logs/$name.log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || { echo "!!! $name failed"; status=1; }
}
