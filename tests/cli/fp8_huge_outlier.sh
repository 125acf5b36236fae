#!/usr/bin/env bash
# fp8_huge_outlier.sh MPT [mpt fp8 args...]: the GEMM error statistics stay correct at the top of
# /outlier/factor's range. Runs the outlier section at factors 1e3 and 1e30 and checks, from the
# result files:
#  - every GEMM error (ledger and outlier tables) is a finite number: an error computed with fp32 norms
#    overflows once the operands' squares sum past 3.4e38 and reads 0 (finite / inf) or nan (inf / inf);
#  - current scaling's error at the outlier step is above 0 at both factors and within 2x of each other:
#    it takes s from the batch's own amax, so scaling the batch by a power of ten moves the fp8 codes
#    only by the rounding of x * factor in fp32, not by the magnitude.
set -eu
mpt=$1; shift
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$mpt" "$@" -q --set outlier.factor=1e3 --out "$tmp/small.json"
"$mpt" "$@" -q --set outlier.factor=1e30 --out "$tmp/huge.json"
/usr/bin/python3 - "$tmp/small.json" "$tmp/huge.json" <<'PY'
import json, math, sys
def errors(path):
    doc = json.load(open(path))
    res, at = doc["results"], doc["config"]["outlier"]["step"]
    found = {}
    for table in ("outlier", "ledger"):
        for i, row in enumerate(res.get(table, [])):
            for k, v in row.items():
                if k.endswith("rel_error") and v is not None:
                    assert isinstance(v, (int, float)) and math.isfinite(v), f"{path}: /results/{table}/{i}/{k} = {v!r}"
                    found[(table, i, k)] = v
    cur = {r["step"]: r for r in res["outlier"]}[at]["current_rel_error"]
    assert found, f"{path}: no GEMM error found"
    return cur, len(found)
small, n1 = errors(sys.argv[1])
huge, n2 = errors(sys.argv[2])
assert small > 0 and huge > 0, f"current scaling's error at the outlier: {small} (1e3), {huge} (1e30)"
assert 0.5 < huge / small < 2, f"current scaling's error at the outlier: {small} at 1e3, {huge} at 1e30"
print(f"ok: {n1} + {n2} GEMM errors finite; current scaling at the outlier {small:.4g} (1e3) vs {huge:.4g} (1e30)")
PY
