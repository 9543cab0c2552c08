#!/usr/bin/env bash
# Attention kernels under development, in one device call: validates and benchmarks the named forward
# and backward lab versions (FWD, BWD: version lists; put the header's, 9 and 11, beside the new
# ones), twice; compute-sanitizer memcheck and racecheck of each at a small shape; each backward
# version's kernels timed one by one with ncu. Logs: $OUT/attention_dev/*.log.
#   usage: FWD="9 10 11" BWD="11 12 13" bash scripts/device_attention_dev.sh [-h]
source "$(dirname "$0")/device_lab.sh" attention_dev "$@"
FWD=${FWD:-9 10 11}
BWD=${BWD:-11 12 13}
run build make -j16 dev/cuda/attention_forward dev/cuda/attention_backward
run fwd ./dev/cuda/attention_forward $FWD
run bwd ./dev/cuda/attention_backward $BWD
run fwd2 ./dev/cuda/attention_forward $FWD --no-validate
run bwd2 ./dev/cuda/attention_backward $BWD --no-validate
for v in $FWD; do
    run sanitize timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 ./dev/cuda/attention_forward "$v" --no-validate -b 1 -n 2 -t 100
done
for v in $BWD; do
    run sanitize timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 ./dev/cuda/attention_backward "$v" --no-validate -b 1 -n 2 -t 300
    run sanitize timeout 120 compute-sanitizer --tool racecheck --error-exitcode 1 ./dev/cuda/attention_backward "$v" --no-validate -b 1 -n 2 -t 300
done
for v in $BWD; do
    run ncu_bwd timeout 100 ncu "${ncu_times[@]}" -k "regex:backward" -c 4 ./dev/cuda/attention_backward "$v" --no-validate
done
exit $status
