#!/usr/bin/python3
"""PyTorch-Python reference for `mpt accumulate` (run with the Python of the LibTorch mpt was built against: MPT_REF_PYTHON).

Reads the resolved config from an mpt result file, repeats every deterministic
computation in PyTorch-Python in the same order (Fashion-MNIST IDX files, the same seeds,
models, micro-batch splits and loss scalings) and prints the reference `results` as JSON:
gradient differences, both training curves, each normalisation variant's error and the
BatchNorm comparison. compare.py checks mpt's numbers against it exactly. The memory
table (allocator bytes) is not compared.
"""
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fmnist  # noqa: E402
import mpt_threads  # noqa: E402  (tests/parity)

doc = json.load(open(sys.argv[1]))
mpt_threads.use(sys.argv[1])  # the threads mpt ran with (reduction order)
cfg = doc["config"]
seed = cfg["seed"]


n_samples = cfg["data"]["samples"]
images, labels = fmnist.load(cfg["data"]["dir"], "train", n_samples)


def mlp(hidden, bn):
    torch.manual_seed(seed)
    layers = [nn.Flatten(), nn.Linear(784, hidden)] + ([nn.BatchNorm1d(hidden)] if bn else []) + \
             [nn.ReLU(), nn.Linear(hidden, 10)]
    return nn.Sequential(*layers)


def split(n, k):
    r, b = [], 0
    for i in range(k):
        ln = n // k + (1 if i < n % k else 0)
        r.append((b, b + ln))
        b += ln
    return r


def zero(net):
    for p in net.parameters():
        p.grad = torch.zeros_like(p)


def grads(net):
    return [p.grad.detach().clone() for p in net.parameters()]


def diff(a, b):
    return max((u - v).abs().max().item() for u, v in zip(a, b))


def max_abs(a):
    return max(t.abs().max().item() for t in a)


def full_grad(net, x, y):
    zero(net)
    F.cross_entropy(net(x), y).backward()
    return grads(net)


def accumulate(net, x, y, k):
    n, s = x.shape[0], 0.0
    for b, e in split(n, k):
        loss = F.cross_entropy(net(x[b:e]), y[b:e]) * ((e - b) / n)
        loss.backward()
        s += loss.item()
    return s


res = {}
B, hidden = cfg["batch"], cfg["model"]["hidden"]

# 1. gradients
net = mlp(hidden, False)
x, y = images[:B], labels[:B]
g_full = full_grad(net, x, y)
scale = max_abs(g_full)
rows = []
for k in cfg["micro_batches"]:
    zero(net)
    accumulate(net, x, y, k)
    dd = diff(grads(net), g_full)
    rows.append({"micro_batches": k, "max_abs_diff": dd, "rel_diff": dd / scale})
res["gradients"] = rows

# 2. training
a, b = mlp(hidden, False), mlp(hidden, False)
lr, k, steps = cfg["train"]["lr"], cfg["train"]["micro_batches"], cfg["train"]["steps"]
opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=lr), torch.optim.SGD(b.parameters(), lr=lr)
order = torch.randperm(n_samples, generator=torch.Generator().manual_seed(seed + 1))
rows = []
for s in range(steps):
    idx = order[torch.arange(s * B, (s + 1) * B) % n_samples]
    x, y = images[idx], labels[idx]
    opt_a.zero_grad(set_to_none=False)
    loss = F.cross_entropy(a(x), y)
    loss.backward()
    opt_a.step()
    opt_b.zero_grad(set_to_none=False)
    lb = accumulate(b, x, y, k)
    opt_b.step()
    with torch.no_grad():
        pd = max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))
    la = loss.item()
    rows.append({"step": s + 1, "loss_full": la, "loss_accum": lb, "loss_diff": abs(la - lb), "param_diff": pd})
res["training"] = rows

# 3. normalisation (a): unequal micro-batches
rows = []
un, uk = cfg["unequal"]["samples"], cfg["unequal"]["micro_batches"]
net = mlp(hidden, False)
x, y = images[:un], labels[:un]
g_full = full_grad(net, x, y)
for name, fn in (("mean/k", lambda o, t: F.cross_entropy(o, t) / float(uk)),
                 ("sum/N", lambda o, t: F.cross_entropy(o, t, reduction="sum") / float(un))):
    zero(net)
    for b_, e_ in split(un, uk):
        fn(net(x[b_:e_]), y[b_:e_]).backward()
    rows.append({"name": name, "max_abs_diff": diff(grads(net), g_full)})

# 3. normalisation (b): padded tokens
t = cfg["tokens"]
nseq, ln, tk, dim, classes = t["sequences"], t["max_len"], t["micro_batches"], t["dim"], t["classes"]
torch.manual_seed(seed)
net = nn.Sequential(nn.Linear(dim, 32), nn.ReLU(), nn.Linear(32, classes))
x = torch.randn(nseq, ln, dim)
y = torch.randint(classes, (nseq, ln))
lengths = torch.randint(1, ln + 1, (nseq,))
mask = (torch.arange(ln).unsqueeze(0) < lengths.unsqueeze(1)).float()


def token_loss(b_, e_):
    logits = net(x[b_:e_])
    ce = F.cross_entropy(logits.reshape(-1, classes), y[b_:e_].reshape(-1), reduction="none")
    return ce.reshape(e_ - b_, ln) * mask[b_:e_]


total = mask.sum().item()
zero(net)
(token_loss(0, nseq).sum() / total).backward()
g_full = grads(net)
for name, fn in (("token_mean/k", lambda b_, e_: token_loss(b_, e_).sum() / mask[b_:e_].sum() / float(tk)),
                 ("seq_mean/N", lambda b_, e_: (token_loss(b_, e_).sum(1) / mask[b_:e_].sum(1)).sum() / float(nseq)),
                 ("sum/total_tokens", lambda b_, e_: token_loss(b_, e_).sum() / total)):
    zero(net)
    for b_, e_ in split(nseq, tk):
        fn(b_, e_).backward()
    rows.append({"name": name, "max_abs_diff": diff(grads(net), g_full)})
res["normalisation"] = rows

# 4. BatchNorm
rows = []
x, y = images[:B], labels[:B]
for bn in (True, False):
    a, b = mlp(hidden, bn), mlp(hidden, bn)
    a.train(), b.train()
    g_full = full_grad(a, x, y)
    zero(b)
    accumulate(b, x, y, cfg["batchnorm"]["micro_batches"])
    dd = diff(grads(b), g_full)
    rm = (a[2].running_mean - b[2].running_mean).abs().max().item() if bn else 0.0
    rows.append({"name": "with_batchnorm" if bn else "without_batchnorm", "max_abs_diff": dd,
                 "rel_diff": dd / max_abs(g_full), "running_mean_diff": rm})
res["batchnorm"] = rows
print(json.dumps(res))
