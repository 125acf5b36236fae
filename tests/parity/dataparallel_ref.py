#!/usr/bin/python3
"""PyTorch-Python reference for `mpt dataparallel`, sections 1-2 (run with the Python of the LibTorch mpt was built against: MPT_REF_PYTHON).

Reads the resolved config from an mpt result file and recomputes the equivalence and
uneven-shard tables in the same construction order as mpt (seed, model, inputs, targets;
shards by torch.tensor_split; sums in shard order). Prints the reference `results` as JSON.
"""
import copy
import json
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import mpt_threads  # noqa: E402  (tests/parity)


def grads_on_copy(net, x, y):
    c = copy.deepcopy(net)
    F.mse_loss(c(x), y).backward()
    return [(n, p.grad.detach().clone()) for n, p in c.named_parameters()]


def shard_grads(seed, in_dim, hidden, n, shards):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, 1))
    x = torch.randn(n, in_dim)
    y = torch.randn(n, 1)
    whole = grads_on_copy(net, x, y)
    xs, ys = torch.tensor_split(x, shards), torch.tensor_split(y, shards)
    per = [grads_on_copy(net, a, b) for a, b in zip(xs, ys)]
    sizes = [a.shape[0] for a in xs]
    naive, weighted = [], []
    for p in range(len(whole)):
        s = per[0][p][1].clone()
        w = per[0][p][1] * float(sizes[0])
        for k in range(1, len(per)):
            s += per[k][p][1]
            w += per[k][p][1] * float(sizes[k])
        naive.append(s / float(len(per)))
        weighted.append(w / float(n))
    return whole, naive, weighted, sizes


def mad(a, b):
    return (a - b).abs().max().item()


def main():
    cfg = json.load(open(sys.argv[1]))["config"]
    mpt_threads.use(sys.argv[1])  # the threads mpt ran with (reduction order)
    e = cfg["equivalence"]
    whole, naive, _, _ = shard_grads(cfg["seed"], e["in_dim"], e["hidden"], e["batch"], e["shards"])
    eq = []
    for (name, g), a in zip(whole, naive):
        shape = f"{g.shape[0]}x{g.shape[1]}" if g.dim() == 2 else f"{g.shape[0]}"
        eq.append({"name": name, "shape": shape, "max_abs_grad": g.abs().max().item(), "max_abs_diff": mad(g, a)})
    whole, naive, weighted, sizes = shard_grads(cfg["seed"], e["in_dim"], e["hidden"], e["uneven_samples"],
                                                e["uneven_shards"])
    un = []
    for (name, g), a, w in zip(whole, naive, weighted):
        un.append({"name": name, "max_abs_grad": g.abs().max().item(), "naive_diff": mad(g, a),
                   "weighted_diff": mad(g, w)})
    json.dump({"equivalence": eq, "uneven": un, "uneven_shard_sizes": sizes}, sys.stdout)


if __name__ == "__main__":
    main()
