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
mpt has no such output), step_s, gemm_floor_s and gemm_calls_s (the step's GEMMs alone, and
their per-call cost: gemm_floor),
gemm_flops (the floating-point operations of those GEMMs: gemm_flops) and elementwise_s (the
size-dependent time of the step's other kernels: elementwise_floor).
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


def median_time(f, repeats):
    """Seconds of one call of f: the median of `repeats` timed calls (the upper one for an even
    count), after one untimed call."""
    f()
    t = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        t.append(time.perf_counter() - t0)
    return sorted(t)[len(t) // 2]


def gemm_floor(layers, x, ranges, repeats):
    """The step's matrix products alone: for each micro-batch and Linear layer, the GEMMs autograd
    runs (forward addmm(b, a, W.t()); backward g.t() @ a for the weight — mm_mat2_backward's form
    for a transposed mat2 — and g @ W for the input, which the first layer does not need), each
    timed alone on tensors of its shape (median of `repeats`, after one untimed call), summed.
    What no front end can go below with these kernels: mpt and Python run the same MKL sgemm.
    Returns (that sum, the same calls' per-call cost: each timed on 1 x 1 tensors), in seconds."""
    def med(f):
        return median_time(f, repeats)
    total = calls = 0.0
    one_by_one = torch.ones(1, 1)
    addmm_fixed = med(lambda: torch.addmm(one_by_one[0], one_by_one, one_by_one.t()))
    mm_fixed = med(lambda: one_by_one.t().mm(one_by_one))
    with torch.no_grad():
        for b, e in ranges:
            a = x[b:e].reshape(e - b, -1).contiguous()
            for i, lin in enumerate(layers):
                w, bias = lin.weight, lin.bias
                out = torch.addmm(bias, a, w.t())
                g = torch.randn_like(out)
                total += med(lambda: torch.addmm(bias, a, w.t()))
                total += med(lambda: g.t().mm(a))
                calls += addmm_fixed + mm_fixed
                if i > 0:
                    total += med(lambda: g.mm(w))
                    calls += mm_fixed
                a = torch.relu(out)
    return total, calls


def elementwise_floor(h, ranges, repeats):
    """The size-dependent time of the step's kernels other than its GEMMs, summed over the
    micro-batches: for each, the ops autograd runs besides addmm/mm (2 ReLUs, log-softmax, NLL
    loss and their backwards, 2 threshold_backward, the 3 bias-gradient sums, the 6 gradient
    accumulations `grad += g`, and the 6 fresh output buffers) timed as one sequence on tensors of
    the micro-batch's shapes, minus the same sequence on 1-row, 1-unit tensors (what is left is
    the work that grows with the data, not the per-call cost, which the step's fixed overhead
    holds). Median of `repeats`, after one untimed call."""
    def med(f):
        return median_time(f, repeats)

    def sequence(m, hid, fan_in):
        g = torch.Generator().manual_seed(0)
        r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
        act, logits, y = r(m, hid), r(m, 10), torch.randint(0, 10, (m,), generator=g)
        logp, d_logits, d_act = F.log_softmax(logits, 1), r(m, 10), r(m, hid)
        grads = [(r(hid, fan_in), r(hid, fan_in)), (r(hid, hid), r(hid, hid)), (r(10, hid), r(10, hid)),
                 (r(hid), r(hid)), (r(hid), r(hid)), (r(10), r(10))]
        total_weight, one = torch.tensor(float(m)), torch.tensor(1.0)
        aten = torch.ops.aten

        def f():
            torch.relu(act), torch.relu(act)
            aten._log_softmax(logits, 1, False)
            aten.nll_loss_forward(logp, y, None, 1, -100)
            aten.nll_loss_backward(one, logp, y, None, 1, -100, total_weight)
            aten._log_softmax_backward_data(d_logits, logp, 1, torch.float32)
            aten.threshold_backward(d_act, act, 0), aten.threshold_backward(d_act, act, 0)
            d_act.sum(0, True), d_act.sum(0, True), d_logits.sum(0, True)
            for acc, new in grads:
                acc.add_(new)
            for shape in ((m, hid), (m, hid), (m, hid), (m, hid), (hid, fan_in), (m, 10)):
                torch.empty(*shape)
        return f
    fixed = med(sequence(1, 1, 1))
    return sum(max(0.0, med(sequence(e - b, h, 784)) - fixed) for b, e in ranges)


def gemm_flops(widths, ranges):
    """The step's GEMM work in floating-point operations (2 per multiply-add): per micro-batch of m
    samples and Linear layer fan_in -> fan_out, 2 m fan_in fan_out for the forward product and as
    much for the weight gradient, and as much again for the input gradient except at the first
    layer (what gemm_floor times). For 784-128-128-10 and batch 512: 259.7 MFLOP, whatever k."""
    total = 0
    for b, e in ranges:
        m = e - b
        for i, (fan_in, fan_out) in enumerate(zip(widths, widths[1:])):
            total += 2 * m * fan_in * fan_out * (2 if i == 0 else 3)
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
        floor, calls = gemm_floor(layers, x, split(batch, k), cfg["timing"]["repeats"])
        out[f"B/{k}"] = {"loss": loss, "grad_abs_sum": sum(p.grad.abs().sum().item() for p in net.parameters()),
                         "step_s": sorted(times)[len(times) // 2],
                         "gemm_floor_s": floor, "gemm_calls_s": calls,
                         "gemm_flops": gemm_flops([784, h, h, 10], split(batch, k)),
                         "elementwise_s": elementwise_floor(h, split(batch, k), cfg["timing"]["repeats"])}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
