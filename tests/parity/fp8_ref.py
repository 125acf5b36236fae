#!/usr/bin/python3
"""PyTorch-Python twin of `mpt fp8`'s training for the recipes fp32, bf16 and tensorwise
(run with the Python of the LibTorch mpt was built against: MPT_REF_PYTHON).

Reads the resolved config from an mpt result file and trains the same MLP on the same batches
with the same SGD steps. The tensorwise recipe quantizes with PyTorch's own fp8 dtypes, as
torchao's float8 tensorwise path does, and the three GEMMs of each Linear multiply the
quantized operands in fp32 (fp8_common.py's QLinear); bf16 layers cast the operands to
bfloat16 and back. It prints the reference `results` (the loss of every step, the final train
loss and test accuracy); compare.py checks mpt's numbers against it exactly. Exit 77 when this
torch has no float8 dtypes (Debian's 1.13).
"""
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fmnist  # noqa: E402
from fp8_common import QLinear, recipe_kinds  # noqa: E402
import mpt_threads  # noqa: E402

if not hasattr(torch, "float8_e4m3fn"):
    print(f"SKIPPED: torch {torch.__version__} has no float8 dtypes", file=sys.stderr)
    sys.exit(77)

doc = json.load(open(sys.argv[1]))
mpt_threads.use(sys.argv[1])
cfg = doc["config"]
seed = cfg["seed"]
for r in cfg["recipes"]:
    if r not in ("fp32", "bf16", "tensorwise"):
        sys.exit(f"fp8_ref.py: no twin for recipe {r} (expected fp32, bf16, tensorwise)")

train_x, train_y = fmnist.load(cfg["data"]["dir"], "train", cfg["data"]["train_samples"])
test_x, test_y = fmnist.load(cfg["data"]["dir"], "test", cfg["data"]["test_samples"])
widths = [784] + cfg["model"]["hidden"] + [10]
L = len(widths) - 1


def kinds_of(recipe, layer):
    return recipe_kinds(recipe, cfg["model"]["fp8_layers"] == "all" or 0 < layer < L - 1, cfg["format"])


torch.manual_seed(seed)
mods = [nn.Flatten()]
for i in range(L):
    mods.append(nn.Linear(widths[i], widths[i + 1]))
    if i + 1 < L:
        mods.append(nn.ReLU())
init = [p.detach().clone() for p in nn.Sequential(*mods).parameters()]


def forward(params, kinds, x):
    h = x.reshape(x.shape[0], -1)
    for i in range(L):
        z = QLinear.apply(h, params[2 * i], params[2 * i + 1], kinds[i])
        h = torch.relu(z) if i + 1 < L else z
    return h


def evaluate(params, kinds, xs, ys):
    return fmnist.evaluate(lambda x: forward(params, kinds, x), xs, ys)


steps, lr = cfg["train"]["steps"], cfg["train"]["lr"]
batch = min(cfg["train"]["batch"], train_x.shape[0])
per_epoch = train_x.shape[0] // batch
history, rows = {}, []
for recipe in cfg["recipes"]:
    params = [p.clone().requires_grad_(True) for p in init]
    kinds = [kinds_of(recipe, i) for i in range(L)]
    losses = []
    for step in range(steps):
        epoch = step // per_epoch
        perm = torch.randperm(train_x.shape[0], generator=torch.Generator().manual_seed(seed + 1000003 * (epoch + 1)))
        idx = perm[(step % per_epoch) * batch:(step % per_epoch) * batch + batch]
        x, y = train_x.index_select(0, idx), train_y.index_select(0, idx)
        for p in params:
            p.grad = None
        loss = F.cross_entropy(forward(params, kinds, x), y)
        loss.backward()
        with torch.no_grad():
            for p in params:
                p.add_(p.grad, alpha=-lr)
        losses.append(loss.item())
    te_loss, te_acc = evaluate(params, kinds, test_x, test_y)
    history[recipe] = losses
    rows.append({"name": recipe, "test_loss": te_loss, "test_accuracy": te_acc, "last_loss": losses[-1]})

print(json.dumps({"history": history, "recipes": rows}))
