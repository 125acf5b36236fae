#!/usr/bin/python3
"""PyTorch-Python reference for `mpt checkpoint` (run with the Python of the LibTorch mpt was built against: MPT_REF_PYTHON).

Rebuilds the same network from the resolved config (same seed and construction order:
n blocks of Linear(w, w) + ReLU + Dropout, then x and y from randn), runs it plainly and
with torch.utils.checkpoint.checkpoint_sequential for every segment count of the result
file, and prints the reference `results` (loss, and per row the gradient difference and
the number of blocks recomputed, counted with forward hooks during backward) as JSON.
compare.py checks mpt's numbers against it exactly. Peak bytes are not compared.

    checkpoint_ref.py MPT_RESULT.json [--timed]

--timed (bench/bench.py's whole-run pair): after the numbers, also run the timed steps mpt
runs (timing.repeats steps for the plain net and for every RNG-restoring row), so that both
processes do the same work; the output is the same.
"""
import json
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint_sequential
import mpt_threads  # noqa: E402  (tests/parity)

doc = json.load(open(sys.argv[1]))
mpt_threads.use(sys.argv[1])  # the threads mpt ran with (reduction order)
cfg = doc["config"]
n, w, batch = cfg["model"]["depth"], cfg["model"]["width"], cfg["data"]["batch"]
p, seed = cfg["model"]["dropout"], cfg["seed"]

DT = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[cfg["model"].get("precision", "fp32")]


class Round(nn.Module):
    """Emulated compute: the block's output stored in the format, returned as fp32."""

    def forward(self, x):
        return x if DT is None else x.to(DT).to(torch.float32)


torch.manual_seed(seed)
blocks = [nn.Sequential(nn.Linear(w, w), nn.ReLU(), nn.Dropout(p), Round()) for _ in range(n)]
net = nn.Sequential(*blocks)
x0 = torch.randn(batch, w)
y = torch.randn(batch, w)
net.train()

calls = [0]
for b in blocks:
    b[0].register_forward_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))


def step(segments, preserve=True):
    """Gradients (parameters, then input), loss, and Linear calls made during backward."""
    for q in net.parameters():
        q.grad = torch.zeros_like(q)
    x = x0.detach().requires_grad_(True)
    torch.manual_seed(seed)
    out = net(x) if segments == 0 else checkpoint_sequential(net, segments, x, preserve_rng_state=preserve)
    loss = F.mse_loss(out, y)
    calls[0] = 0
    loss.backward()
    grads = [q.grad.clone() for q in net.parameters()] + [x.grad.clone()]
    return grads, loss.item(), calls[0]


def diff(a, b):
    return max((u - v).abs().max().item() for u, v in zip(a, b))


plain, loss, _ = step(0)
s_sqrt = max(1, round(math.sqrt(n)))
rows = [{"name": "none", "segments": 0, "max_abs_diff": 0.0, "recomputed_blocks": 0}]
seen = set()
results = {"loss": loss}
for label in cfg["checkpoint"]["segments"]:
    s = s_sqrt if label == "sqrt" else n if label == "n" else int(label)
    name = f"s={s}" + (" (sqrt n)" if label == "sqrt" else "") + (" (n)" if label == "n" or s == n else "")
    if name in seen:
        continue
    seen.add(name)
    g, _, recomputed = step(s)
    rows.append({"name": name, "segments": s, "max_abs_diff": diff(g, plain), "recomputed_blocks": recomputed})
if cfg["checkpoint"]["no_rng_row"]:
    g, _, recomputed = step(s_sqrt, preserve=False)
    rows.append({"name": f"s={s_sqrt} no rng restore", "segments": s_sqrt, "max_abs_diff": diff(g, plain),
                 "recomputed_blocks": recomputed})
    results["no_rng_restore_max_abs_diff"] = diff(g, plain)
results["segments"] = rows
if "--timed" in sys.argv[2:]:
    for s in [0] + [r["segments"] for r in rows[1:] if "no rng" not in r["name"]]:
        for _ in range(cfg["timing"]["repeats"]):
            step(s)
print(json.dumps(results))
