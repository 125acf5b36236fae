#!/usr/bin/python3
"""PyTorch-Python reference for `mpt shard` (run with the Python of the LibTorch mpt was built
against: MPT_REF_PYTHON).

Reads the resolved config from an mpt result file and trains the one-process reference of
mpt's equivalence table in PyTorch-Python: nn.Sequential MLP after torch.manual_seed, the
Fashion-MNIST permutation of core/io/data (torch.randperm with its own generator), every rank's
local batch (indices r, r+N, ... of it) accumulated over the micro-batches, each rank's gradient
divided by N and summed in rank order, then torch.optim.SGD; and the whole-batch run. Prints the
reference `results`: the loss curve (the "single" column, and every stage's column, which equal
it bit for bit for N <= 2) and each stage's difference from the whole-batch run. compare.py
checks them exactly. SGD only: torch.optim.Adam (Python) updates the first moment with lerp_,
LibTorch's C++ torch::optim::Adam with mul_ + add_, which round differently — mpt claims
equality with the latter, which its own one-process run uses.
"""
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fmnist  # noqa: E402
import mpt_threads  # noqa: E402
import shard_common  # noqa: E402

doc = json.load(open(sys.argv[1]))
mpt_threads.use(sys.argv[1], per_rank=True)
cfg = doc["config"]
assert cfg["optimizer"]["name"] == "sgd", "shard_ref.py mirrors torch.optim.SGD only (see the docstring)"
n = doc["env"]["shard_world_size"]
seed, steps, micro, gb = cfg["seed"], cfg["train"]["steps"], cfg["train"]["micro_batches"], cfg["train"]["global_batch"]
b = gb // n
images, labels = fmnist.load(cfg["data"]["dir"], "train", cfg["train"]["samples"])
perm = torch.randperm(images.shape[0], generator=torch.Generator().manual_seed(seed))


def mlp():
    torch.manual_seed(seed)
    layers, d = [nn.Flatten()], 784
    for h in cfg["model"]["hidden"]:
        layers += [nn.Linear(d, h), nn.ReLU()]
        d = h
    layers.append(nn.Linear(d, 10))
    return nn.Sequential(*layers)


def local(r, step):
    return perm[r::n][step * b:(step + 1) * b]


def local_batch(r, step):
    idx = local(r, step)
    return images[idx], labels[idx]


shard_common.print_reference(cfg, n, steps, mlp, local_batch, F.cross_entropy)
