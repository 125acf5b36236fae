"""The one-process references of `mpt shard`'s equivalence table, shared by shard_ref.py (the MLP)
and shard_gpt_ref.py (the tiny GPT): what each step's gradient is when N ranks each accumulate
their local batch over the micro-batches and the ranks' gradients, each divided by N, are summed in
rank order (DDP's and ZeRO's all-reduce / reduce-scatter for N <= 2), then torch.optim.SGD; and the
whole batch through one forward. Prints the reference `results` that compare.py checks exactly.
"""
import json
import sys

import torch


def train(net, cfg, n, steps, micro, local_batch, loss_of, whole):
    """Trains `net` (built after torch.manual_seed) for `steps` SGD steps. local_batch(r, step) ->
    (x, y) of rank r; whole: the ranks' batches concatenated in rank order, one forward.
    Returns (flat parameters after each step, loss of each step)."""
    o = cfg["optimizer"]
    opt = torch.optim.SGD(net.parameters(), lr=o["lr"], momentum=o["momentum"], weight_decay=o["weight_decay"])
    params, losses = [], []
    for step in range(steps):
        if whole:
            opt.zero_grad()
            parts = [local_batch(r, step) for r in range(n)]
            loss = loss_of(net(torch.cat([x for x, _ in parts])), torch.cat([y for _, y in parts]))
            loss.backward()
            losses.append(loss.item())
        else:
            total, loss_sum = None, 0.0
            for r in range(n):
                for p in net.parameters():
                    p.grad = None
                x, y = local_batch(r, step)
                xs, ys = x.tensor_split(micro), y.tensor_split(micro)
                acc = 0.0
                for k in range(micro):
                    loss = loss_of(net(xs[k]), ys[k]) / float(micro)
                    loss.backward()
                    acc += loss.item()
                loss_sum += acc
                terms = [p.grad.clone() if n == 1 else p.grad / float(n) for p in net.parameters()]
                total = terms if total is None else [t + u for t, u in zip(total, terms)]
            for p, g in zip(net.parameters(), total):
                p.grad = g
            losses.append(loss_sum / n)
        opt.step()
        params.append(torch.cat([p.detach().reshape(-1) for p in net.parameters()]))
    return params, losses


def print_reference(cfg, n, steps, make_net, local_batch, loss_of):
    """Trains the rank-order and the whole-batch references and prints mpt's `results` for them:
    every stage's loss equals the single process's for N <= 2, and each stage's difference from the
    whole-batch run is the reference's."""
    same, same_losses = train(make_net(), cfg, n, steps, cfg["train"]["micro_batches"], local_batch, loss_of, False)
    whole, _ = train(make_net(), cfg, n, steps, cfg["train"]["micro_batches"], local_batch, loss_of, True)
    vs_whole = max((a - c).abs().max().item() for a, c in zip(same, whole))
    stages = list(cfg["train"]["stages"])
    runs = ([] if stages and stages[0] == 0 else ["stage0"]) + [f"stage{s}" for s in stages]
    rows = []
    for t in range(steps):
        row = {"single": same_losses[t]}
        if n <= 2:
            row.update({name: same_losses[t] for name in runs})
        rows.append(row)
    out = {"loss": rows}
    if n <= 2 and not cfg["zero"]["reduce_every_micro_batch"]:
        out["equivalence"] = [{"name": name, "vs_whole_batch": vs_whole, "vs_single": 0.0} for name in runs]
    json.dump(out, sys.stdout)
