#!/usr/bin/python3
"""PyTorch-Python DistributedDataParallel on Gloo: the same model, batch and N as an
`mpt dataparallel` run, for the side-by-side speed comparison (bench/dataparallel.sh).

    dataparallel_ddp.py MPT_RESULT.json N STEPS

Spawns N processes (torch.multiprocessing, Gloo, 127.0.0.1), trains the MLP 784-hidden-10
with SGD on Fashion-MNIST-shaped random inputs (step time does not depend on pixel values),
local batch global_batch/N, DDP defaults (bucket_cap_mb 25, gradient_as_bucket_view off).
Prints {"step_ms": mean over steps after the first} from rank 0 as JSON.
"""
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


def worker(rank, n, port, cfg, steps, q):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(cfg["threads"] or torch.get_num_threads())  # as mpt: /threads, 0 = default
    dist.init_process_group("gloo", rank=rank, world_size=n)
    torch.manual_seed(cfg["seed"])
    t = cfg["train"]
    net = nn.Sequential(nn.Flatten(), nn.Linear(784, t["hidden"]), nn.ReLU(), nn.Linear(t["hidden"], 10))
    ddp = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=cfg["ddp"]["bucket_cap_mb"])
    opt = torch.optim.SGD(ddp.parameters(), lr=t["lr"])
    b = t["global_batch"] // n
    x, y = torch.randn(b, 1, 28, 28), torch.randint(0, 10, (b,))
    total = 0.0
    for s in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
        if s > 0:
            total += time.perf_counter() - t0
    if rank == 0:
        q.put(total / (steps - 1))
    dist.destroy_process_group()


def main():
    cfg = json.load(open(sys.argv[1]))["config"]
    n, steps = int(sys.argv[2]), int(sys.argv[3])
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    mp.spawn(worker, args=(n, port, cfg, steps, q), nprocs=n, join=True)
    print(json.dumps({"step_ms": q.get() * 1e3, "n": n, "steps": steps}))


if __name__ == "__main__":
    main()
