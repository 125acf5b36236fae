#!/usr/bin/python3
"""PyTorch-Python reference for `mpt shard` on the tiny GPT (/model/name = gpt; run with the
Python of the LibTorch mpt was built against: MPT_REF_PYTHON).

Reads the resolved config from an mpt result file and trains the one-process reference of
mpt's equivalence table in PyTorch-Python, as shard_ref.py does for the MLP: the fortunes corpus
and the tiny GPT of lossscale_gpt_ref.py (core/io/data's cleaning, nanoGPT's model in core/models/gpt's
module order from torch.manual_seed(seed)); every step's global batch of sequences drawn by
nanoGPT's get_batch from torch.Generator().manual_seed(seed); rank r's sequences r, r+N, ...
of it accumulated over the micro-batches, each rank's gradient divided by N and summed in rank
order, then torch.optim.SGD; and the whole-batch run. Prints the reference `results` (the loss
curve, every stage's column equal to it for N <= 2, each stage's difference from the
whole-batch run); compare.py checks them exactly. SGD only (see shard_ref.py on Adam).
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mpt_threads  # noqa: E402
import shard_common  # noqa: E402
from lossscale_gpt_ref import TinyGpt, clean  # noqa: E402

doc = json.load(open(sys.argv[1]))
mpt_threads.use(sys.argv[1], per_rank=True)
cfg = doc["config"]
assert cfg["model"]["name"] == "gpt", "shard_gpt_ref.py mirrors /model/name = gpt"
assert cfg["optimizer"]["name"] == "sgd", "shard_gpt_ref.py mirrors torch.optim.SGD only (see shard_ref.py)"
n = doc["env"]["shard_world_size"]
seed, steps, micro, gb = cfg["seed"], cfg["train"]["steps"], cfg["train"]["micro_batches"], cfg["train"]["global_batch"]
m = cfg["model"]["gpt"]
T = m["context"]
d = cfg["data"]
text = b"".join(clean(open(f"{d['text_dir']}/{name}", "rb").read()) for name in d["text_files"])
chars = sorted(set(text))
index = {c: i for i, c in enumerate(chars)}
ids = torch.tensor([index[c] for c in text], dtype=torch.long)
train_ids = ids[: int(math.floor(0.9 * len(ids)))]
gen = torch.Generator().manual_seed(seed)
batches = []
for _ in range(steps):  # core/io/data's text_batch: nanoGPT's get_batch
    ix = torch.randint(len(train_ids) - T, (gb,), generator=gen)
    offsets = ix.unsqueeze(1) + torch.arange(T, dtype=torch.long).unsqueeze(0)
    batches.append((train_ids[offsets], train_ids[offsets + 1]))


def model():
    torch.manual_seed(seed)
    return TinyGpt(len(chars), T, m["width"], m["heads"], m["layers"], m["mlp_ratio"])


def loss_of(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def local_batch(r, step):
    x, y = batches[step]
    return x[r::n], y[r::n]


shard_common.print_reference(cfg, n, steps, model, local_batch, loss_of)
