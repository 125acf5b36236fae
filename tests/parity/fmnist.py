"""Fashion-MNIST as mpt's core/io/data reads it (IDX files, gzip), for the PyTorch-Python twins:
tests/parity/accumulate_ref.py, bench/mlp_train.py, bench/dataparallel_ddp.py.

    images, labels = fmnist.load(DIR, "train", N)   # the first N: float (N,1,28,28), int64 (N)

Images are scaled to [0, 1] and normalised with mpt's mean 0.2860 and std 0.3530.
"""
import gzip
import os
import struct

import torch


def read_idx(path):
    raw = gzip.open(path).read()
    magic, count = struct.unpack(">II", raw[:8])
    dims = [count] + [struct.unpack(">I", raw[8 + 4 * i:12 + 4 * i])[0] for i in range((magic & 0xFF) - 1)]
    off = 4 + 4 * len(dims)
    return torch.frombuffer(bytearray(raw[off:]), dtype=torch.uint8).reshape(dims)


def load(d, split, n):
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(os.path.join(d, f"{prefix}-images-idx3-ubyte.gz"))[:n]
    labels = read_idx(os.path.join(d, f"{prefix}-labels-idx1-ubyte.gz"))[:n].long()
    return ((images.float() / 255.0 - 0.2860) / 0.3530).unsqueeze(1).contiguous(), labels


def evaluate(logits_of, xs, ys, chunk=1000):
    """Test loss and accuracy as mpt's evaluation computes them: cross-entropy of logits_of(x) over
    chunks of `chunk` samples (no grad), each chunk's mean loss weighted by its size."""
    import torch.nn.functional as F
    loss, correct = 0.0, 0.0
    with torch.no_grad():
        for i in range(0, xs.shape[0], chunk):
            x, y = xs[i:i + chunk], ys[i:i + chunk]
            logits = logits_of(x)
            loss += F.cross_entropy(logits, y).item() * x.shape[0]
            correct += (logits.argmax(1) == y).sum().item()
    return loss / xs.shape[0], correct / xs.shape[0]
