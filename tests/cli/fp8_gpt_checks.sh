#!/usr/bin/env bash
# fp8_gpt_checks.sh MPT [mpt fp8 args with gpt.enabled=true...]: runs `mpt fp8 args... -q --out FILE` and
# asserts what the GPT section's definitions imply (docs/fp8.md, section 3):
#  - the ledger holds out, dgrad and wgrad of exactly the blocks' four Linears per fp8 recipe (lm_head is
#    not an fp8 GEMM), each with a nonzero error against fp32 (the operands were quantized);
#  - current scaling (tensorwise, rowwise, blockwise, RCEIL MX) maps a block's amax to at most the element
#    max, so only that one element per scale block can reach the max (by the fp32 rounding of x·s): the
#    saturated fraction is at most 1 / (elements per block): 1/numel per tensor, 1/k per row, 1/tile and
#    1/B² for blockwise, 1/mx.block for MX; FLOOR MX clips by design and is not bounded;
#  - tensorwise's scale is s = fp8_max / amax: 448 for E4M3 x and W, 57344 for E5M2 dy under HYBRID
#    (relative 1e-6: s and the ledger's 1/scale are fp32 values);
#  - the rows come in /recipes' order, each with a loss per step; the gap columns are the recipe's losses
#    minus bf16's (bf16's own gaps are 0).
set -eu
mpt=$1; shift
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$mpt" "$@" -q --out "$tmp/r.json"
/usr/bin/python3 - "$tmp/r.json" <<'PY'
import json, math, sys
doc = json.load(open(sys.argv[1]))
cfg, res = doc["config"], doc["results"]
recipes = cfg["recipes"]
fp8 = [r for r in recipes if r not in ("fp32", "bf16")]
layers = cfg["gpt"]["model"]["layers"]
linears = [f"h{i}.{n}" for i in range(layers) for n in ("c_attn", "attn_proj", "c_fc", "mlp_proj")]
ledger = {r["name"]: r for r in res["gpt_ledger"]}
want = {f"{r} / {l} / {g}" for r in fp8 for l in linears for g in ("out", "dgrad", "wgrad")}
assert set(ledger) == want, f"ledger rows: missing {sorted(want - set(ledger))[:3]}, extra {sorted(set(ledger) - want)[:3]}"
g = cfg["gpt"]["model"]
C, H, tokens = g["width"], g["width"] * g["mlp_ratio"], cfg["gpt"]["batch"] * g["context"]
shape = {"c_attn": (C, 3 * C), "attn_proj": (C, C), "c_fc": (C, H), "mlp_proj": (H, C)}  # (in, out)
tile, wb, mx = cfg["blockwise"]["tile"], cfg["blockwise"]["weight_block"], cfg["mx"]["block"]
for name, row in ledger.items():
    assert row["rel_error"] > 0, f"{name}: rel error {row['rel_error']} (nothing quantized?)"
    k_in, n_out = shape[row["layer"].split(".")[1]]
    # operands as [rows, k]: out: x [T, in], W [out, in]; dgrad: dy [T, out], W^T [in, out]; wgrad: dy^T [out, T], x^T [in, T]
    a_rows, b_rows, k = {"out": (tokens, n_out, k_in), "dgrad": (tokens, k_in, n_out), "wgrad": (n_out, k_in, tokens)}[row["gemm"]]
    weight_b = row["gemm"] != "wgrad"  # B is W (or W^T) in out and dgrad
    per_block = {"tensorwise": (a_rows * k, b_rows * k), "rowwise": (k, k), "mxfp8": (mx, mx),
                 "blockwise": (tile, wb * wb if weight_b else tile)}.get(row["recipe"])
    if per_block:
        for op, elems in zip(("a", "b"), per_block):
            assert row[op + "_saturated"] <= 1 / elems + 1e-12, \
                f"{name}: operand {op} saturated {row[op + '_saturated']} > 1/{elems}"
    if row["recipe"] == "tensorwise":
        grad_max = 57344.0 if cfg["format"] == "hybrid" else 448.0
        a_max = grad_max if row["gemm"] in ("dgrad", "wgrad") else 448.0
        b_max = 448.0
        for op, fmax in (("a", a_max), ("b", b_max)):
            s, amax = row[op + "_scale"], row[op + "_amax"]
            assert abs(s * amax / fmax - 1) < 1e-6, f"{name}: {op} scale {s} x amax {amax} != {fmax}"
rows = {r["name"]: r for r in res["gpt_recipes"]}
assert [r["name"] for r in res["gpt_recipes"]] == recipes
if "bf16" in rows:
    for r in rows.values():
        assert math.isclose(r["val_gap_bf16"], r["val_loss"] - rows["bf16"]["val_loss"], abs_tol=1e-12), r
    assert rows["bf16"]["val_gap_bf16"] == 0 and rows["bf16"]["train_gap_bf16"] == 0
hist = res["gpt_history"]
assert all(len(hist[r]) == cfg["gpt"]["steps"] for r in recipes)
print(f"ok: {len(ledger)} GEMMs in the GPT ledger, current scaling unsaturated, tensorwise s = max/amax; "
      f"val loss fp32 {rows['fp32']['val_loss']:.4f}")
PY
