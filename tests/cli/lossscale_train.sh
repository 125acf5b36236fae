#!/usr/bin/env bash
# lossscale_train.sh MPT: a tiny `mpt lossscale` training run (a few hundred Fashion-MNIST
# samples). Checks that fp32 and fp16+master+dynamic both reduce the training loss, that pure
# fp16 loses more than 10x the updates of fp16+master+dynamic (at least 1 %), and that
# the result file has every per-recipe field, the loss curve and the scale history.
set -eu
mpt=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$mpt" lossscale -q --out "$tmp/r.json" --set "sweep.scales=[1,65536]" --set gpt.enabled=false \
  --set train.train_samples=400 --set train.test_samples=200 --set train.steps=60 --set train.batch=32 \
  --set train.hidden.depth=2 --set train.hidden.width=32 --set train.hidden.activation=sigmoid \
  --set train.lr=0.5 --set train.log_every=20 \
  --set 'train.recipes=["fp32","fp16+master+dynamic","fp16"]' --set train.scaler.growth_interval=10
/usr/bin/python3 - "$tmp/r.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
res, tim = d["results"], d["timings"]
rows = {r["name"]: r for r in res["recipes"]}
assert set(rows) == {"fp32", "fp16+master+dynamic", "fp16"}, rows.keys()
fields = ["final_train_loss", "test_accuracy", "skipped_steps", "final_scale", "lost_updates", "grad_underflow",
          "first_loss", "last_loss", "format", "master_weights", "scaling"]
for n, r in rows.items():
    for f in fields:
        assert f in r, f"{n}: missing {f}"
    h = res["history"][n]
    assert len(h["loss"]) == 60 and len(h["scale"]) == 60, f"{n}: history length"
    assert tim["recipes"][n]["peak_bytes"] > 0 and tim["recipes"][n]["step_time_s"] > 0, f"{n}: timings"
for n in ("fp32", "fp16+master+dynamic"):
    h = res["history"][n]["loss"]
    first, last = sum(h[:10]) / 10, sum(h[-10:]) / 10
    assert last < 0.8 * first, f"{n}: loss did not go down: {first} -> {last}"
    assert rows[n]["test_accuracy"] > 0.3, f"{n}: test accuracy {rows[n]['test_accuracy']}"
dyn = res["history"]["fp16+master+dynamic"]["scale"]
assert dyn[0] == 65536.0 and max(dyn) > 65536.0, "dynamic scale never grew with growth_interval 10"
assert rows["fp32"]["grad_underflow"] == 0 and rows["fp32"]["final_scale"] == 1
# pure fp16 rounds its weights after every update: it loses updates the fp32 master copy keeps
assert rows["fp16"]["lost_updates"] > 0.01, rows["fp16"]["lost_updates"]
assert rows["fp16"]["lost_updates"] > 10 * rows["fp16+master+dynamic"]["lost_updates"], \
    (rows["fp16"]["lost_updates"], rows["fp16+master+dynamic"]["lost_updates"])
assert "safe_window" in res and "sweep" in res and "loss_curve" in res
print("ok: fp32 and fp16+master+dynamic learn; pure fp16 loses updates; every field present")
PY
