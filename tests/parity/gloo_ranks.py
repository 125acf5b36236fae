"""The multi-process harness of the torch.distributed twins (contextparallel_ref.py,
expertparallel_ref.py): n real processes on 127.0.0.1 joined by init_process_group("gloo"), this
one rank 0 and ranks 1 .. n-1 spawned, each with mpt's per-rank thread count; rank 0 prints what
its body returns as JSON (compare.py reads it)."""
import datetime
import json
import os
import socket
import sys

import torch.distributed as dist
import torch.multiprocessing as mp

import mpt_threads


def _rank(rank, n, port, result_path, body):
    mpt_threads.use(result_path, per_rank=True)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=60))
    results = body(rank, n, json.load(open(result_path)))
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        json.dump(results, sys.stdout)
        sys.stdout.flush()


def run(n, result_path, body, name):
    """Runs body(rank, n, doc) on n Gloo ranks (doc: mpt's result file); rank 0 prints its return
    value. A failed rank ends the others (rank 0's failure terminates the spawned ranks, which
    would wait for it until the group's timeout) and exits naming `name`. `body` must be a
    module-level function (spawn pickles it)."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, n, port, result_path, body)) for r in range(1, n)]
    for p in procs:
        p.start()
    try:
        _rank(0, n, port, result_path, body)
    except BaseException:
        for p in procs:
            p.terminate()
        raise
    finally:
        for p in procs:
            p.join(120)
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if bad:
        sys.exit(f"{name}: a rank exited with {bad}")
