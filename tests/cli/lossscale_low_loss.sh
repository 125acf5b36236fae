#!/usr/bin/env bash
# train.loss_in_low_precision computes log-softmax and the loss in the recipe's format instead of
# fp32 (autocast's policy). The switch must reach the numbers: with it, the fp16 and bf16 recipes'
# losses change while fp32's stays bit-identical. Usage: lossscale_low_loss.sh MPT
set -eu
mpt=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
args=(lossscale -q --set train.enabled=true --set gpt.enabled=false --set sweep.scales='[1]' --set train.train_samples=300
      --set train.test_samples=100 --set train.steps=30 --set train.batch=30 --set train.hidden.width=16
      --set 'train.recipes=["fp32","fp16","bf16"]')
"$mpt" "${args[@]}" --out "$tmp/fp32loss.json"
"$mpt" "${args[@]}" --set train.loss_in_low_precision=true --out "$tmp/lowloss.json"
/usr/bin/python3 - "$tmp/fp32loss.json" "$tmp/lowloss.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
ra = {r["name"]: r for r in a["results"]["recipes"]}
rb = {r["name"]: r for r in b["results"]["recipes"]}
assert b["config"]["train"]["loss_in_low_precision"] is True
for n in ("fp32", "fp16", "bf16"):
    print(f"{n}: loss in fp32 {ra[n]['final_train_loss']}  loss in low precision {rb[n]['final_train_loss']}")
assert ra["fp32"]["final_train_loss"] == rb["fp32"]["final_train_loss"], "fp32 must not change"
assert a["results"]["history"]["fp32"] == b["results"]["history"]["fp32"], "fp32 curve must not change"
for n in ("fp16", "bf16"):
    assert a["results"]["history"][n]["loss"] != b["results"]["history"][n]["loss"], f"{n}: the switch changed nothing"
print("ok: the switch changes the low-precision recipes only")
PY
