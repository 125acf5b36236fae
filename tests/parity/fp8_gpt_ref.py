#!/usr/bin/python3
"""PyTorch-Python twin of section 3 of `mpt fp8` (the tiny GPT) for the recipes fp32, bf16 and
tensorwise (run with the Python of the LibTorch mpt was built against: MPT_REF_PYTHON).

Reads the resolved config from an mpt result file and trains as mpt does: the fortunes corpus,
vocabulary, split, batches and model of lossscale_gpt_ref.py (nanoGPT's order, built from
torch.manual_seed(seed) for every recipe), torch.optim.SGD with momentum; the four Linears of
every block (c_attn, attn_proj, c_fc, mlp_proj) run their three GEMMs on the [B*T, C]-folded
activation through fp8_common.py's QLinear under the recipe (tensorwise: x and W in E4M3, dy in
E5M2 with /format hybrid, E4M3 with e4m3), everything else in fp32. Validation: eval_batches
batches of the validation split from a generator seeded with seed + 1, under no_grad. Prints the
reference `results` (gpt_history: every step's loss; gpt_recipes: train loss = mean of the last
mean_of_last losses, val loss, last loss); compare.py checks mpt's numbers against it exactly.
Exit 77 when this torch has no float8 dtypes (Debian's 1.13).
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp8_common import QLinear, recipe_kinds  # noqa: E402
from lossscale_gpt_ref import TinyGpt, clean  # noqa: E402
import mpt_threads  # noqa: E402

if not hasattr(torch, "float8_e4m3fn"):
    print(f"SKIPPED: torch {torch.__version__} has no float8 dtypes", file=sys.stderr)
    sys.exit(77)


def quantized(kinds):
    """The GPT's Linear runner (TinyGpt.forward's lin): mod (nn.Linear) on x [B, T, in] through
    QLinear on the folded [B*T, in] operand, as core/numerics/quant's quantized_linear folds it."""
    def lin(mod, x):
        y = QLinear.apply(x.reshape(-1, x.shape[-1]), mod.weight, mod.bias, kinds)
        return y.reshape(*x.shape[:-1], mod.weight.shape[0])
    return lin


def loss_of(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def batch_of(tokens, n, T, gen):
    ix = torch.randint(len(tokens) - T, (n,), generator=gen)
    offsets = ix.unsqueeze(1) + torch.arange(T, dtype=torch.long).unsqueeze(0)
    return tokens[offsets], tokens[offsets + 1]


def main():
    cfg = json.load(open(sys.argv[1]))["config"]
    mpt_threads.use(sys.argv[1])
    g, seed = cfg["gpt"], cfg["seed"]
    for r in cfg["recipes"]:
        if r not in ("fp32", "bf16", "tensorwise"):
            sys.exit(f"fp8_gpt_ref.py: no twin for recipe {r} (expected fp32, bf16, tensorwise)")
    text = b"".join(clean(open(f"{g['text_dir']}/{name}", "rb").read()) for name in g["text_files"])
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([index[c] for c in text], dtype=torch.long)
    split = int(math.floor(0.9 * len(ids)))
    train, val = ids[:split], ids[split:]
    m = g["model"]
    T = m["context"]
    last = min(g["mean_of_last"], g["steps"])
    history, rows = {}, []
    for recipe in cfg["recipes"]:
        lin = quantized(recipe_kinds(recipe, True, cfg["format"]))
        torch.manual_seed(seed)
        model = TinyGpt(len(chars), T, m["width"], m["heads"], m["layers"], m["mlp_ratio"])
        opt = torch.optim.SGD(model.parameters(), lr=g["lr"], momentum=g["momentum"])
        gen = torch.Generator().manual_seed(seed)
        losses = []
        for _ in range(g["steps"]):
            x, y = batch_of(train, g["batch"], T, gen)
            loss = loss_of(model(x, lin), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        vgen = torch.Generator().manual_seed(seed + 1)
        total = 0.0
        with torch.no_grad():
            for _ in range(g["eval_batches"]):
                x, y = batch_of(val, g["batch"], T, vgen)
                total += loss_of(model(x, lin), y).item()
        val_loss = total / max(g["eval_batches"], 1)
        train_loss = sum(losses[len(losses) - last:]) / last
        history[recipe] = losses
        rows.append({"name": recipe, "train_loss": train_loss, "val_loss": val_loss, "last_loss": losses[-1]})
    json.dump({"gpt_history": history, "gpt_recipes": rows}, sys.stdout)


if __name__ == "__main__":
    main()
