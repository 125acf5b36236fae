#!/usr/bin/env bash
# The benchmark entry point in its quickest form (three benchmarks, one round, small runs: the
# mlp inner loop, emulated and native, and the lossscale whole-run pair, defaults with the sweep only):
# checks that it runs, that mpt and PyTorch-Python computed the same numbers, and that the
# result file is valid JSON with the expected keys. Timings are never asserted.
#   bench_smoke.sh MPT [REF_PYTHON]   (REF_PYTHON: the Python with the same LibTorch as MPT)
set -u
mpt=$1
export MPT_REF_PYTHON=${2:-/usr/bin/python3}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
if ! "$MPT_REF_PYTHON" -c 'import torch' 2>/dev/null; then echo "SKIPPED: $MPT_REF_PYTHON has no torch"; exit 77; fi
/usr/bin/python3 bench/bench.py --quick --only mlp --only mlp_native --only lossscale --mpt "$mpt" --out "$tmp/b.json" > "$tmp/out" 2> "$tmp/err"
code=$?
cat "$tmp/out"
[ $code = 0 ] || { echo "FAIL: bench.py exited $code"; cat "$tmp/err"; exit 1; }
grep -q "^# OK: equal results" "$tmp/out" || { echo "FAIL: no OK footer"; exit 1; }
/usr/bin/python3 - "$tmp/b.json" "$tmp/err" <<'PY' || exit 1
import json, math, sys
d = json.load(open(sys.argv[1]))
assert d["schema_version"] == 2, d["schema_version"]
for k in ("date", "host", "cpus", "mpt", "python_torch", "threads", "rounds", "quick", "loadavg_start", "cpu"):
    assert k in d["context"], f"context lacks {k}"
assert isinstance(d["context"]["cpu"].get("kind"), str) and d["context"]["cpu"]["kind"], d["context"]["cpu"]
assert d["mismatches"] == [], d["mismatches"]
assert d["benchmarks"] == ["mlp", "mlp_native", "lossscale"], d["benchmarks"]
rows = {r["name"]: r for r in d["rows"]}
for name in ("mlp_fp32", "mlp_bf16", "mlp_fp16", "fp16_vs_fp32", "bf16_vs_fp32", "fp16+master+dynamic_vs_fp32"):
    assert name in rows, f"no row {name}: {sorted(rows)}"
for name in ("mlp_fp32", "mlp_bf16", "mlp_fp16", "fp16_vs_fp32"):
    r = rows[name]
    for k in ("mpt", "python", "ratio"):
        assert isinstance(r[k], float) and math.isfinite(r[k]) and r[k] > 0, f"{name}.{k} = {r[k]!r}"
    assert r["rounds"] == 1 and len(r["mpt_samples"]) == 1, r
    assert r["ratio_min"] <= r["ratio"] <= r["ratio_max"], r  # one round: all three the same
# the native pair (bf16 and fp16 tensors, LibTorch's kernels; fp16 only where this LibTorch has a CPU
# fp16 matmul): bench.py checked its losses, lost updates and gradient underflow equal to the twin's
for name in ["mlp_native_fp32", "mlp_native_bf16"] + (["mlp_native_fp16"] if "no CPU fp16 matmul" not in open(sys.argv[2]).read() else []):
    r = rows.get(name)
    assert r is not None, f"no row {name}: {sorted(rows)}"
    for k in ("mpt", "python", "ratio"):
        assert isinstance(r[k], float) and math.isfinite(r[k]) and r[k] > 0, f"{name}.{k} = {r[k]!r}"
    if name != "mlp_native_fp32":  # the floor beside each low-precision row: its GEMMs alone, below the step
        f = rows.get(name + "_gemm_floor")
        assert f is not None, f"no row {name}_gemm_floor: {sorted(rows)}"
        assert 0 < f["mpt"] and f["python"] == r["python"], (f, r)  # timings: never compared as such
assert "mlp_native_fp16_vs_fp32" not in rows, "the step ratios are the emulated pair's"
# the whole-run pair: wall time and peak RSS of both processes, after compare.py found them equal
r = rows.get("lossscale_sweep")
assert r is not None, f"no row lossscale_sweep: {sorted(rows)}"
assert r["group"] == "whole" and r["metric"] == "wall" and r["rounds"] == 1, r
for k in ("mpt", "python", "ratio"):
    assert isinstance(r[k], float) and math.isfinite(r[k]) and r[k] > 0, f"lossscale_sweep.{k} = {r[k]!r}"
for k in ("mpt_rss_bytes", "python_rss_bytes"):
    assert isinstance(r[k], int) and r[k] > 1 << 20, f"lossscale_sweep.{k} = {r[k]!r}"
assert "lossscale_sweep_large" not in rows, "--quick runs the defaults pair only"
print("ok:", len(rows), "rows")
PY
