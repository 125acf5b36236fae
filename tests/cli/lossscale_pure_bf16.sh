#!/usr/bin/env bash
# lossscale_pure_bf16.sh MPT [ARGS...]: pure-bf16 training without master weights (Zamirai et al. 2020).
# The default training setting of `mpt lossscale` (400 SGD steps at lr 0.01, where pure bf16
# loses most updates): checks that bf16+sr and bf16+kahan keep the weights in bf16 (weight
# bytes: 2 per parameter, plus 2 for Kahan's buffer) yet each recover at least three quarters
# of pure bf16's loss gap to fp32 (measured: bf16 +0.112, sr +0.002, kahan +0.001), that Kahan
# loses under 1 % of its updates where pure bf16 loses over half, and that SR's "lost" steps
# (w unchanged) are counted like bf16's, i.e. most of them.
set -eu
mpt=$1; shift
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$mpt" lossscale -q --out "$tmp/r.json" --set "sweep.scales=[1]" --set gpt.enabled=false \
  --set 'train.recipes=["fp32","bf16","bf16+sr","bf16+kahan"]' "$@"
/usr/bin/python3 - "$tmp/r.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = {r["name"]: r for r in d["results"]["recipes"]}
cost = d["timings"]["recipes"]
loss = {n: r["final_train_loss"] for n, r in rows.items()}
gap = {n: loss[n] - loss["fp32"] for n in loss}
print("loss gap to fp32:", {n: round(g, 4) for n, g in gap.items()})
print("lost updates:", {n: r["lost_updates"] for n, r in rows.items()})
assert gap["bf16"] > 0.02, f"pure bf16 should lag fp32 in this setting: {gap}"
for n in ("bf16+sr", "bf16+kahan"):
    assert abs(gap[n]) < 0.25 * gap["bf16"], f"{n} did not recover 3/4 of bf16's gap: {gap}"
    assert rows[n]["master_weights"] is False and rows[n]["format"] == "bf16", rows[n]
assert rows["bf16"]["lost_updates"] > 0.5, rows["bf16"]
assert rows["bf16+kahan"]["lost_updates"] < 0.01, rows["bf16+kahan"]
assert rows["bf16+sr"]["lost_updates"] > 0.3, rows["bf16+sr"]
assert cost["bf16+sr"]["weight_bytes"] == cost["bf16"]["weight_bytes"] == cost["fp32"]["weight_bytes"] // 2, cost
assert cost["bf16+kahan"]["weight_bytes"] == 2 * cost["bf16"]["weight_bytes"], cost
print("OK")
PY
