#!/usr/bin/env bash
# mpt plan --calibrate: this machine from a `mpt collectives` result (its busbw and latency), its
# GEMM rates and memory bandwidth measured here; then a plan on the system the result file holds.
set -eu
mpt=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$mpt" collectives -q --config configs/collectives_quick.json --out "$tmp/c.json"
out=$("$mpt" plan --calibrate --set calibrate.collectives="$tmp/c.json" --set calibrate.gemm_n=256 --out "$tmp/cal.json")
echo "$out"
echo "$out" | grep -q "This machine as mpt measures it (2 ranks per node" || { echo "FAIL: no calibration table"; exit 1; }
/usr/bin/python3 - "$tmp/cal.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["timings"]["system"]
assert s["devices_per_node"] == 2, s
assert s["peak_tflops"]["fp32"] > 0 and s["memory_bandwidth_gbps"] > 0, s
for op in ("all_reduce", "all_gather", "reduce_scatter", "send_recv"):
    assert s["intra_node"][op]["busbw_gbps"] > 0, (op, s)
PY
plan=$("$mpt" plan --set system="$tmp/cal.json" --set model.preset=mpt-gpt --set train.recipe=fp32 --set layout.dp=2 \
       --set layout.tp=1 --set layout.pp=1 --set train.global_batch=8 --set train.recompute=none)
echo "$plan"
echo "$plan" | grep -q "on this machine (" || { echo "FAIL: the plan did not use the calibrated system"; exit 1; }
echo ok
