#!/usr/bin/env bash
# fp8_checks.sh MPT [mpt fp8 args...]: runs `mpt fp8 args... -q --out FILE` and asserts the lesson's claims,
# each derived from the recipes' definitions (docs/fp8.md):
#  - outlier: current scaling takes s from the batch itself, so at the outlier step at most the amax
#    element reaches the fp8 max (< 0.1 %); delayed scaling's s comes from earlier steps, so a batch
#    x factor (>= 100) saturates (> 10 % of x). Then, with 'max', the scale stays small (< 1/10 of the
#    step before the outlier) for exactly amax_history_len steps and recovers (> 1/10) after;
#    with 'most_recent' for one step.
#  - MX: FLOOR clips some blocks of the trained operands (the weights' uniform init puts block amaxes
#    near 2^-k·(1.75..2)); RCEIL clips none (its eager fp32 log2 errs only within ~2^-20 of a binade edge).
set -eu
mpt=$1; shift
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$mpt" "$@" -q --out "$tmp/r.json"
/usr/bin/python3 - "$tmp/r.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
cfg, res = doc["config"], doc["results"]
at, n = cfg["outlier"]["step"], cfg["delayed"]["amax_history_len"]
assert cfg["outlier"]["factor"] >= 100, "the checks assume an outlier factor >= 100"
rows = {r["step"]: r for r in res["outlier"]}
o = rows[at]
assert o["current_saturated"] < 1e-3, f"current scaling saturated {o['current_saturated']} at the outlier"
assert o["delayed_max_saturated"] > 0.1, f"delayed scaling saturated only {o['delayed_max_saturated']} at the outlier"
assert o["delayed_recent_saturated"] > 0.1
before = rows[at - 1]["delayed_max_scale"]
for s, r in rows.items():
    if s <= at:
        continue
    small = r["delayed_max_scale"] < before / 10
    assert small == (s <= at + n), f"step {s}: delayed max scale {r['delayed_max_scale']} vs {before} before the outlier"
    small_recent = r["delayed_recent_scale"] < rows[at - 1]["delayed_recent_scale"] / 10
    assert small_recent == (s == at + 1), f"step {s}: most_recent scale {r['delayed_recent_scale']}"
mx = res["mx_saturated_blocks"]
assert mx["floor"] > 0 and mx["rceil"] == 0, f"MX saturated blocks: {mx}"
print(f"ok: outlier saturates delayed ({o['delayed_max_saturated']:.3f}) not current ({o['current_saturated']:.4f}); "
      f"small scale for {n} steps; MX saturated blocks FLOOR {mx['floor']}, RCEIL {mx['rceil']}")
PY
