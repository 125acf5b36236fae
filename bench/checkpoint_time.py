#!/usr/bin/python3
"""PyTorch-Python twin of the step timing of `mpt checkpoint`, for the side-by-side speed
comparison (bench/bench.py, benchmark checkpoint).

    checkpoint_time.py MPT_RESULT.json

Builds the same network as tests/parity/checkpoint_ref.py (which bench.py runs first to
check that both compute the same gradients) from the resolved config, and times one
training step (zero the gradients, reseed, forward, backward, copy the gradients) plainly
and with torch.utils.checkpoint.checkpoint_sequential for every segment count of the
config, as mpt's median_step_time does: one warm-up, then the median of /timing/repeats.
Prints JSON {"step_time_s": {"none": {"step_s": ...}, "s=K...": {...}}} with mpt's row names.
Peak bytes are not measured here: LibTorch 1.13's Python profiler records no CPU
allocations, and mpt's figure comes from its own counting allocator.
"""
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint_sequential

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "parity"))
import mpt_threads  # noqa: E402  (tests/parity)

cfg = json.load(open(sys.argv[1]))["config"]
mpt_threads.use(sys.argv[1])  # as many intra-op threads as mpt ran with
n, w, batch = cfg["model"]["depth"], cfg["model"]["width"], cfg["data"]["batch"]
p, seed, repeats = cfg["model"]["dropout"], cfg["seed"], cfg["timing"]["repeats"]
DT = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[cfg["model"]["precision"]]


class Round(nn.Module):
    def forward(self, x):
        return x if DT is None else x.to(DT).to(torch.float32)


torch.manual_seed(seed)
net = nn.Sequential(*[nn.Sequential(nn.Linear(w, w), nn.ReLU(), nn.Dropout(p), Round()) for _ in range(n)])
x0 = torch.randn(batch, w)
y = torch.randn(batch, w)
net.train()


def step(segments):
    for q in net.parameters():
        if q.grad is None:
            q.grad = torch.zeros_like(q)
        else:
            q.grad.zero_()
    x = x0.detach().requires_grad_(True)
    torch.manual_seed(seed)
    out = net(x) if segments == 0 else checkpoint_sequential(net, segments, x, preserve_rng_state=True)
    F.mse_loss(out, y).backward()
    return [q.grad.detach().clone() for q in net.parameters()] + [x.grad.detach().clone()]


def median_time(segments):
    t = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step(segments)
        t.append(time.perf_counter() - t0)
    return sorted(t)[len(t) // 2]  # as mpt: t[size/2] of the sorted times


step(0)  # warm-up, as mpt
times = {"none": {"step_s": median_time(0)}}
s_sqrt = max(1, round(math.sqrt(n)))
for label in cfg["checkpoint"]["segments"]:
    s = s_sqrt if label == "sqrt" else n if label == "n" else int(label)
    name = f"s={s}" + (" (sqrt n)" if label == "sqrt" else "") + (" (n)" if label == "n" or s == n else "")
    if name not in times:
        times[name] = {"step_s": median_time(s)}
for k in times:
    times[k]["vs_none"] = times[k]["step_s"] / times["none"]["step_s"]
print(json.dumps({"step_time_s": times}))
