#!/usr/bin/python3
"""PyTorch-Python DistributedDataParallel on Gloo: the same model, batch and N as an
`mpt dataparallel` run, for the side-by-side speed comparison (bench/bench.py, benchmark ddp).

    dataparallel_ddp.py MPT_RESULT.json N STEPS

Spawns N processes (torch.multiprocessing, Gloo, 127.0.0.1) and trains the MLP 784-hidden-10
with SGD on the same Fashion-MNIST batches as mpt: the first /train/samples images, shuffled
with torch.randperm seeded as mpt's shuffled_indices, rank r reading indices r, r+N, ... in
local batches of global_batch/N; the model built from the same seed (DDP broadcasts rank
0's parameters, as mpt's reducer does); DDP with the config's bucket_cap_mb. Step time as
mpt measures it (batch selection, forward, backward with the all-reduce, optimizer step),
the median of the steps after the first (as mpt's: a few steps wait a time slice for the
all-reduce; docs/performance.md, "The DDP step's spread").
Prints {"step_ms", "final_loss" (the last step's loss averaged over ranks, as mpt's
training table), "steps"} from rank 0 as JSON.
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "parity"))
import fmnist  # noqa: E402  (the loader shared with the parity references)
import mpt_threads  # noqa: E402


def worker(rank, n, port, cfg, steps, q, threads):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    # Bound as mpt binds its ranks (core/runtime's bind_cpus, env.threads_policy.cpu_bind): rank r
    # on its own `threads` CPUs when the ranks' threads fit; before Gloo and the intra-op pool start
    # their threads, which inherit it. The comparison is of the front ends, not of the binding.
    allowed = sorted(os.sched_getaffinity(0))
    if os.environ.get("MPT_CPU_BIND") != "none" and n > 1 and n * threads <= len(allowed):
        os.sched_setaffinity(0, allowed[rank * threads:(rank + 1) * threads])
    torch.set_num_threads(threads)  # as many as each mpt rank ran with (env.threads_policy)
    mpt_threads.resolve_vml_dispatch()  # as every mpt process does (pytorch/pytorch#188792)
    dist.init_process_group("gloo", rank=rank, world_size=n)
    t = cfg["train"]
    images, labels = fmnist.load(cfg["data"]["dir"], "train", t["samples"])
    perm = torch.randperm(images.shape[0], generator=torch.Generator().manual_seed(cfg["seed"]))
    shard = perm[rank::n]
    torch.manual_seed(cfg["seed"])
    net = nn.Sequential(nn.Flatten(), nn.Linear(784, t["hidden"]), nn.ReLU(), nn.Linear(t["hidden"], 10))
    ddp = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=cfg["ddp"]["bucket_cap_mb"])
    opt = torch.optim.SGD(ddp.parameters(), lr=t["lr"])
    b = t["global_batch"] // n
    timed, loss = [], None
    for s in range(steps):
        t0 = time.perf_counter()
        idx = shard[s * b:(s + 1) * b]
        x, y = images.index_select(0, idx), labels.index_select(0, idx)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        if s > 0:
            timed.append(time.perf_counter() - t0)
    final = torch.tensor([loss.item()], dtype=torch.float64)
    dist.all_reduce(final)
    if rank == 0:
        timed.sort()
        q.put((timed[len(timed) // 2] if timed else 0.0, final.item() / n))
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
    threads = mpt_threads.use(sys.argv[1], per_rank=True)
    mp.spawn(worker, args=(n, port, cfg, steps, q, threads), nprocs=n, join=True)
    step_s, final_loss = q.get()
    print(json.dumps({"step_ms": step_s * 1e3, "final_loss": final_loss, "n": n, "steps": steps}))


if __name__ == "__main__":
    main()
