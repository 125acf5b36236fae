#!/usr/bin/python3
"""PyTorch-Python twin of the accumulated step `mpt accumulate` times in its memory table
(bench/bench.py, benchmark accumulate_step).

    accumulate_step.py MPT_RESULT.json

Reads the resolved config of an mpt accumulate result file and, for every k of
memory.micro_batches, times what src/experiments/accumulate.cpp's memory table times: zero the
gradients, then one step of memory.batch samples in k micro-batches (each loss = mean
cross-entropy x size/B, backward, loss.item()) on the MLP 784-H-H-10 (H = memory.hidden, ReLU,
nn.Linear initialised from the seed in construction order), the first memory.batch images. One
untimed warm-up step, then the median of timing.repeats steps (the upper one for an even count), as mpt's median_seconds.
Prints JSON: per "B/k" the step's summed loss, the gradients' sum of |g| (printed for a look:
mpt has no such output), step_s and gemm_floor_s (the step's GEMMs alone: gemm_floor).
"""
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "parity"))
import fmnist  # noqa: E402
import mpt_threads  # noqa: E402


def split(n, k):
    r, b = [], 0
    for i in range(k):
        ln = n // k + (1 if i < n % k else 0)
        r.append((b, b + ln))
        b += ln
    return r


def gemm_floor(layers, x, ranges, repeats):
    """The step's matrix products alone: for each micro-batch and Linear layer, the GEMMs autograd
    runs (forward addmm(b, a, W.t()); backward g.t() @ a for the weight — mm_mat2_backward's form
    for a transposed mat2 — and g @ W for the input, which the first layer does not need), each
    timed alone on tensors of its shape (median of `repeats`, after one untimed call), summed.
    What no front end can go below with these kernels: mpt and Python run the same MKL sgemm."""
    def med(f):
        f()
        t = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            f()
            t.append(time.perf_counter() - t0)
        return sorted(t)[len(t) // 2]
    total = 0.0
    with torch.no_grad():
        for b, e in ranges:
            a = x[b:e].reshape(e - b, -1).contiguous()
            for i, lin in enumerate(layers):
                w, bias = lin.weight, lin.bias
                out = torch.addmm(bias, a, w.t())
                g = torch.randn_like(out)
                total += med(lambda: torch.addmm(bias, a, w.t()))
                total += med(lambda: g.t().mm(a))
                if i > 0:
                    total += med(lambda: g.mm(w))
                a = torch.relu(out)
    return total


def main():
    path = sys.argv[1]
    cfg = json.load(open(path))["config"]
    mpt_threads.use(path)
    mem, seed = cfg["memory"], cfg["seed"]
    images, labels = fmnist.load(cfg["data"]["dir"], "train", cfg["data"]["samples"])
    h, batch = mem["hidden"], mem["batch"]
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Flatten(), nn.Linear(784, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 10))
    x, y = images[:batch], labels[:batch]

    def step(k):
        for p in net.parameters():
            p.grad = torch.zeros_like(p) if p.grad is None else p.grad.zero_()
        s = 0.0
        for b, e in split(batch, k):
            loss = F.cross_entropy(net(x[b:e]), y[b:e]) * ((e - b) / batch)
            loss.backward()
            s += loss.item()
        return s

    out = {}
    ks = mem["micro_batches"]
    layers = [m for m in net if isinstance(m, nn.Linear)]
    if ks:
        step(ks[0])  # warm-up: first-touch allocations, as mpt's
    for k in ks:
        times = []
        for _ in range(cfg["timing"]["repeats"]):
            t0 = time.perf_counter()
            loss = step(k)
            times.append(time.perf_counter() - t0)
        out[f"B/{k}"] = {"loss": loss, "grad_abs_sum": sum(p.grad.abs().sum().item() for p in net.parameters()),
                         "step_s": sorted(times)[len(times) // 2],
                         "gemm_floor_s": gemm_floor(layers, x, split(batch, k), cfg["timing"]["repeats"])}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
