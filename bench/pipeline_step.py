#!/usr/bin/python3
"""PyTorch-Python twin of one `mpt pipeline` step (bench/bench.py, benchmark pipeline_step).

    pipeline_step.py MPT_RESULT.json SCHEDULE M STEPS [--torch-defaults]

Reads the resolved config of an mpt pipeline result file and runs, in one thread, what a
PyTorch user without a pipeline runtime writes for the same microbatched step: the sweep's MLP
(tests/parity/pipeline_ref.py: same seed and construction order), the batch in M microbatches,
for each forward, loss_j / M, backward, in order — the gradients every stage of mpt's executor
accumulates (B0, B1, ... per stage). STEPS identical steps; the step time is the median one's,
timed from the first forward to the last backward as mpt's run_pipeline times its ops (the upper median for an even count, as mpt picks).
Prints JSON: the step's loss and max |g - g_full| (the values mpt's sweep row `SCHEDULE.mM` holds,
compared exactly by bench.py before timing), step_ms (median) and every step's time.
"""
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "parity"))
import mpt_threads  # noqa: E402
from pipeline_ref import mlp, stage, grads, reset  # noqa: E402


def main():
    torch_defaults = "--torch-defaults" in sys.argv  # PyTorch's own threads (bench.py's defaults rows)
    if torch_defaults:
        sys.argv.remove("--torch-defaults")
    path, m, steps = sys.argv[1], int(sys.argv[3]), int(sys.argv[4])
    cfg = json.load(open(path))["config"]
    if not torch_defaults:
        mpt_threads.use(path)
    widths, batch = cfg["pipeline"]["widths"], cfg["pipeline"]["batch"]
    torch.manual_seed(cfg["seed"])
    layers = mlp(widths)
    x = torch.randn(batch, widths[0])
    y = torch.randn(batch, widths[-1])
    n = len(layers)
    F.mse_loss(stage(layers, 0, n, x), y).backward()
    full = grads(layers)
    xs, ys = x.chunk(m), y.chunk(m)
    times, total, g = [], 0.0, None
    for _ in range(steps + 1):  # one untimed warm-up step, as mpt's
        reset(layers)
        total = 0.0
        t0 = time.perf_counter()
        for xj, yj in zip(xs, ys):
            lj = F.mse_loss(stage(layers, 0, n, xj), yj) / m
            total += lj.item()
            lj.backward()
        times.append(time.perf_counter() - t0)
        g = grads(layers)
    times = times[1:]
    diff = max((a - b).abs().max().item() for a, b in zip(full, g))
    print(json.dumps({"loss": total, "grad_max_abs_diff": diff, "step_ms": sorted(times)[len(times) // 2] * 1e3,
                      "step_ms_samples": [t * 1e3 for t in times]}))


if __name__ == "__main__":
    main()
