#!/usr/bin/python3
"""PyTorch-Python reference for section 3 of `mpt lossscale` (the tiny GPT), fp32 policy.

Reads the resolved config from an mpt result file and trains, as mpt does: the fortunes
corpus cleaned as core/io/data's clean_fortune_text (separator lines dropped, a backspace takes
back the character before it, tabs to spaces, printable ASCII and newlines kept), a sorted
character vocabulary, the first 90% for training; the tiny GPT of core/models/gpt written as nanoGPT
writes it (pre-LayerNorm, causal self-attention spelled out, GELU MLP, no dropout, no tying)
built in the same module order from torch.manual_seed(seed); nanoGPT's get_batch from
torch.Generator().manual_seed(seed); torch.optim.SGD with momentum. Prints the per-step losses
as JSON on stdout; compare.py checks mpt's results.gpt_history.fp32.loss against them exactly.
"""
import json
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import mpt_threads  # noqa: E402  (tests/parity)


def clean(raw):
    out = []
    for line in raw.split(b"\n")[: -1 if raw.endswith(b"\n") else None]:
        if line == b"%":
            continue
        start = len(out)
        for c in line:
            if c == 8:
                if len(out) > start:
                    out.pop()
            elif c == 9:
                out.append(32)
            elif 0x20 <= c <= 0x7E:
                out.append(c)
        out.append(10)
    return bytes(out)


class Block(nn.Module):
    def __init__(self, C, H, ratio):
        super().__init__()
        self.H = H
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.attn_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, ratio * C)
        self.mlp_proj = nn.Linear(ratio * C, C)

    def forward(self, x, lin=None):
        """lin(module, x): how the four Linears run (None: module(x); fp8_gpt_ref.py quantizes)."""
        lin = lin or (lambda mod, h: mod(h))
        B, T, C = x.shape
        hd = C // self.H
        q, k, v = lin(self.c_attn, self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.H, hd).transpose(1, 2)
        k = k.view(B, T, self.H, hd).transpose(1, 2)
        v = v.view(B, T, self.H, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(mask.logical_not(), float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        r = x + lin(self.attn_proj, y)
        return r + lin(self.mlp_proj, F.gelu(lin(self.c_fc, self.ln_2(r))))


class TinyGpt(nn.Module):
    def __init__(self, V, T, C, H, L, ratio=4):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, H, ratio) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)

    def forward(self, idx, lin=None):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, dtype=torch.long))
        for b in self.h:
            x = b(x, lin)
        return self.lm_head(self.ln_f(x))


def main():
    cfg = json.load(open(sys.argv[1]))["config"]
    mpt_threads.use(sys.argv[1])
    g = cfg["gpt"]
    text = b"".join(clean(open(f"{g['text_dir']}/{name}", "rb").read()) for name in g["text_files"])
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([index[c] for c in text], dtype=torch.long)
    train = ids[: int(math.floor(0.9 * len(ids)))]
    m = g["model"]
    T = m["context"]
    torch.manual_seed(cfg["seed"])
    model = TinyGpt(len(chars), T, m["width"], m["heads"], m["layers"])
    opt = torch.optim.SGD(model.parameters(), lr=g["lr"], momentum=g["momentum"])
    gen = torch.Generator().manual_seed(cfg["seed"])
    losses = []
    for _ in range(g["steps"]):
        ix = torch.randint(len(train) - T, (g["batch"],), generator=gen)
        offsets = ix.unsqueeze(1) + torch.arange(T, dtype=torch.long).unsqueeze(0)
        x, y = train[offsets], train[offsets + 1]
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        losses.append(loss.item())
        loss.backward()
        opt.step()
        opt.zero_grad()
    json.dump({"gpt_history": {"fp32": {"loss": losses}}}, sys.stdout)


if __name__ == "__main__":
    main()
