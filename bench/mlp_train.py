#!/usr/bin/python3
"""PyTorch-Python twin of the training loop of `mpt lossscale` (section 2, the recipes), for
the side-by-side speed comparison (bench/bench.py, benchmarks mlp_*).

    mlp_train.py MPT_RESULT.json [RECIPE ...] [--torch-defaults]

Reads the resolved config from an mpt lossscale result file and trains the same MLP
(784 -> width x depth -> 10, nn.Linear initialisation from the same seed) on the same
Fashion-MNIST batches (torch.randperm with a generator seeded as mpt's shuffled_indices)
with plain SGD, op for op as src/experiments/lossscale.cpp does it:
  - emulated storage: fp32 math, every stored tensor rounded to the recipe's format
    (parameters, each layer's output and activation in forward, the gradient entering
    each of them in backward: a torch.autograd.Function like core/train/amp's StorageRound);
  - gradient-underflow counting hooks (low-precision recipes) and the lost-update count
    of the SGD update, which mpt also computes inside its timed loop.
Recipes: fp32, fp16, bf16, fp16+master, bf16+master (no loss scaling). Default: the
recipes of the config that are among those.

With train.compute = "native" in the config, the twin of core/train/amp_recipe's native path instead:
parameters, inputs, layer outputs and activations are tensors of the format's dtype (pure
recipes hold their weights in it; +master recipes cast the fp32 masters each step), LibTorch's
bf16 / fp16 kernels compute; the loss in fp32 from the logits cast up; the gradient underflow
counted from dW = dz^T h and db = sum dz recomputed in fp32 by a hook on each layer's output; the
SGD update w - lr*g in fp32 math, stored back in the weights' dtype (core/train/amp's
sgd_update_counting_lost).

Prints JSON: per recipe the loss of every step, the lost-update and underflow counts and
step_time_s = (time of the whole training loop) / steps, measured exactly like mpt's.
"""
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "parity"))
from fmnist import load  # noqa: E402  (the loader shared with the parity references)
import mpt_threads  # noqa: E402

SUPPORTED = ["fp32", "fp16", "bf16", "fp16+master", "bf16+master"]
DTYPE = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def round_to(x, fmt):
    x = x.float()
    return x if DTYPE[fmt] is None else x.to(DTYPE[fmt]).float()


class StorageRound(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fmt):
        ctx.fmt = fmt
        return round_to(x, fmt)

    @staticmethod
    def backward(ctx, g):
        return round_to(g, ctx.fmt), None


def emulate(x, fmt):
    return x if fmt == "fp32" else StorageRound.apply(x, fmt)


def batches(cfg, images, labels):
    """The training batches of every step, as mpt's train_recipe draws them: a permutation per
    epoch (torch.randperm seeded as mpt's shuffled_indices), batch after batch of it."""
    t = cfg["train"]
    steps, batch = t["steps"], min(t["batch"], images.shape[0])
    per_epoch = images.shape[0] // batch
    perm, perm_epoch = None, -1
    for step in range(steps):
        epoch = step // per_epoch
        if epoch != perm_epoch:
            g = torch.Generator().manual_seed(cfg["seed"] + 1000003 * (epoch + 1))
            perm, perm_epoch = torch.randperm(images.shape[0], generator=g), epoch
        idx = perm.narrow(0, (step % per_epoch) * batch, batch)
        yield images.index_select(0, idx), labels.index_select(0, idx)


def sgd_loop(cfg, images, labels, params, forward, stored_next, losses, counts):
    """The timed training loop both twins share: per batch, gradients to None, cross-entropy of
    forward(x), loss.item(), backward, then per parameter u = fp32(g)·lr, the next weight
    stored_next(p, u) (w - u rounded to what p stores) and the lost-update count (u != 0 and the
    stored weight unchanged). Appends to `losses`, adds to `counts`; returns seconds per step."""
    lr = torch.tensor(cfg["train"]["lr"], dtype=torch.float32).item()  # mpt holds lr as a float
    t0 = time.perf_counter()
    for x, y in batches(cfg, images, labels):
        for p in params:
            p.grad = None
        loss = F.cross_entropy(forward(x), y)
        losses.append(loss.item())
        loss.backward()
        with torch.no_grad():
            for p in params:
                if p.grad is None:
                    continue
                u = p.grad.float() * lr  # .float() of an fp32 gradient is the tensor itself
                nxt = stored_next(p, u)
                intended = u != 0
                counts["lost"] += (intended & (nxt == p)).sum().item()
                counts["updates"] += intended.sum().item()
                p.copy_(nxt)
    return (time.perf_counter() - t0) / cfg["train"]["steps"]


def train(cfg, recipe, init, images, labels):
    t = cfg["train"]
    fmt = recipe.split("+")[0]
    master = "+master" in recipe
    stored = "fp32" if master else fmt
    act = t["hidden"]["activation"]
    params = [round_to(p, stored).clone().requires_grad_(True) for p in init]
    counts = {"underflow": 0, "total": 0, "lost": 0, "updates": 0}
    losses = []

    def hook(g):
        nz = g != 0
        counts["underflow"] += (nz & (round_to(g, fmt) == 0)).sum().item()
        counts["total"] += g.numel()

    def forward(x):
        h = emulate(x.reshape(x.shape[0], -1), fmt)
        layers = len(params) // 2
        for i in range(layers):
            w, b = emulate(params[2 * i], fmt), emulate(params[2 * i + 1], fmt)
            if fmt != "fp32":
                w.register_hook(hook)
                b.register_hook(hook)
            h = emulate(F.linear(h, w, b), fmt)
            if i + 1 < layers:
                h = torch.sigmoid(h) if act == "sigmoid" else torch.tanh(h) if act == "tanh" else torch.relu(h)
                h = emulate(h, fmt)
        return h

    step_s = sgd_loop(cfg, images, labels, params, forward, lambda p, u: round_to(p - u, stored), losses, counts)
    return {"loss": losses, "lost_update_count": counts["lost"], "grad_underflow_count": counts["underflow"],
            "step_time_s": step_s}


def train_native(cfg, recipe, init, images, labels):
    """train() for train.compute = "native" (see the module docstring): the same batches and
    counts, the format's own kernels."""
    t = cfg["train"]
    fmt = recipe.split("+")[0]
    master = "+master" in recipe
    dt = DTYPE[fmt] or torch.float32
    act = t["hidden"]["activation"]
    params = [(p.clone() if master or fmt == "fp32" else p.to(dt).clone()).requires_grad_(True) for p in init]
    counts = {"underflow": 0, "total": 0, "lost": 0, "updates": 0}
    losses = []

    def count(g):
        counts["underflow"] += ((g != 0) & (g.to(dt).float() == 0)).sum().item()
        counts["total"] += g.numel()

    def forward(x):
        h = x.reshape(x.shape[0], -1).to(dt)
        layers = len(params) // 2
        for i in range(layers):
            w, b = params[2 * i].to(dt), params[2 * i + 1].to(dt)  # no-ops for pure recipes
            z = F.linear(h, w, b)
            if fmt != "fp32":
                def hook(dz, inp=h.detach()):
                    d32 = dz.float()
                    count(d32.t().mm(inp.float()))
                    count(d32.sum(0))
                z.register_hook(hook)
            h = z
            if i + 1 < layers:
                h = torch.sigmoid(h) if act == "sigmoid" else torch.tanh(h) if act == "tanh" else torch.relu(h)
        return h

    # forward(x).float(): the loss in fp32 from the logits cast up (core/train/amp_recipe's loss_fn)
    step_s = sgd_loop(cfg, images, labels, params, lambda x: forward(x).float(),
                      lambda p, u: (p.float() - u).to(p.dtype), losses, counts)
    return {"loss": losses, "lost_update_count": counts["lost"], "grad_underflow_count": counts["underflow"],
            "grad_total": counts["total"], "step_time_s": step_s,
            "gemm_floor_s": gemm_floor(params, t["batch"], dt, fmt != "fp32")}


def gemm_floor(params, batch, dt, counted):
    """The native step's matrix products alone, seconds: per layer the forward F.linear, the weight
    gradient dz^T h and (all but the first layer) the input gradient dz W in the format's dtype, and,
    where the underflow is counted, the fp32 dz^T h the count recomputes; each timed alone on tensors
    of the step's shapes (median of 21, after one untimed call), summed. No front end running these
    kernels can take less (bench.py's *_gemm_floor rows)."""
    def med(f):
        f()
        ts = []
        for _ in range(21):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
        return sorted(ts)[len(ts) // 2]
    total = 0.0
    with torch.no_grad():
        for i in range(len(params) // 2):
            w, b = params[2 * i].to(dt), params[2 * i + 1].to(dt)
            h = torch.randn(batch, w.shape[1]).to(dt)
            dz = torch.randn(batch, w.shape[0]).to(dt)
            total += med(lambda: F.linear(h, w, b))
            total += med(lambda: dz.t().mm(h))
            if i > 0:
                total += med(lambda: dz.mm(w))
            if counted:
                d32, h32 = dz.float(), h.float()
                total += med(lambda: d32.t().mm(h32))
    return total


def train_plain(cfg, init, images, labels):
    """The loop a user would write for the fp32 recipe, counting nothing: nn.Sequential of
    nn.Linear (same initial weights), F.cross_entropy, torch.optim.SGD (foreach), loss.item()
    per step. Same batches, same arithmetic as mpt's fp32 recipe: its losses must be equal."""
    t = cfg["train"]
    steps = t["steps"]
    act = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}[t["hidden"]["activation"]]
    layers = []
    for i in range(len(init) // 2):
        w = init[2 * i]
        lin = nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            lin.weight.copy_(w)
            lin.bias.copy_(init[2 * i + 1])
        layers += [lin, act()] if 2 * i + 2 < len(init) else [lin]
    net = nn.Sequential(*layers)
    lr = torch.tensor(t["lr"], dtype=torch.float32).item()
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    losses = []
    t0 = time.perf_counter()
    for x, y in batches(cfg, images, labels):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x.reshape(x.shape[0], -1)), y)
        losses.append(loss.item())
        loss.backward()
        opt.step()
    return {"loss": losses, "step_time_s": (time.perf_counter() - t0) / steps}


def main():
    # --torch-defaults: PyTorch's own intra-op threads (what a user's loop gets), not mpt's.
    torch_defaults = "--torch-defaults" in sys.argv
    if torch_defaults:
        sys.argv.remove("--torch-defaults")
    cfg = json.load(open(sys.argv[1]))["config"]
    recipes = sys.argv[2:] or [r for r in cfg["train"]["recipes"] if r in SUPPORTED]
    for r in recipes:
        if r not in SUPPORTED + ["plain"]:
            sys.exit(f"mlp_train.py: recipe {r!r} not supported (supported: {', '.join(SUPPORTED)})")
    if not torch_defaults:
        mpt_threads.use(sys.argv[1])  # as many intra-op threads as mpt ran with
    t = cfg["train"]
    images, labels = load(t["data_dir"], "train", t["train_samples"])
    torch.manual_seed(cfg["seed"])
    init, d = [], 28 * 28
    for i in range(t["hidden"]["depth"] + 1):
        out = 10 if i == t["hidden"]["depth"] else t["hidden"]["width"]
        lin = nn.Linear(d, out)
        init += [lin.weight.detach().clone(), lin.bias.detach().clone()]
        d = out
    native = t.get("compute") == "native"
    out = {r: (train_native if native else train)(cfg, r, init, images, labels) for r in recipes if r != "plain"}
    if "plain" in recipes:
        out["plain"] = train_plain(cfg, init, images, labels)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
