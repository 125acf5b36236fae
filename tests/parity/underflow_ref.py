#!/usr/bin/python3
"""PyTorch-Python reference for `mpt underflow` (run with the Python of the LibTorch mpt was built against: MPT_REF_PYTHON).

Reads the resolved config from an mpt result file, recomputes every deterministic
number with PyTorch-Python in the same construction order, and prints the reference
`results` as JSON on stdout. compare.py then checks mpt's numbers against it exactly.
"""
import json
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import mpt_threads  # noqa: E402  (tests/parity)

DT = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def rnd(x, fmt):
    """Value stored by format fmt for an fp32 tensor x, returned as fp32."""
    return x.to(DT[fmt]).to(torch.float32)


def formats(names):
    rows = []
    for n in names:
        fi = torch.finfo(DT[n])
        mant = {"fp32": 23, "fp16": 10, "bf16": 7}[n]
        emin = int(math.log2(fi.tiny))
        rows.append({"name": n, "bits": fi.bits, "exponent_bits": fi.bits - 1 - mant, "mantissa_bits": mant,
                     "max": fi.max, "min_normal": fi.tiny, "min_subnormal": 2.0 ** (emin - mant), "eps": fi.eps})
    return rows


def classify(s, fmt):
    if math.isnan(s):
        return "nan"
    if math.isinf(s):
        return "inf"
    if s == 0:
        return "zero"
    return "subnormal" if abs(s) < torch.finfo(DT[fmt]).tiny else "normal"


def casts(values, fmts):
    rows = []
    for v in values:
        v = float(v)  # "nan", "inf", "-inf" as the config may hold them
        v32 = torch.tensor([v], dtype=torch.float32)
        row = {"name": f"{v:g}", "fp32": v32.item()}
        for n in fmts:
            s = rnd(v32, n).item()
            row[n] = s
            x = v32.item()
            row[n + "_rel_err"] = None if not math.isfinite(x) else 0.0 if x == 0 else abs(s - x) / abs(x)
            row[n + "_class"] = classify(s, n)
        rows.append(row)
    return rows


def gradients(cfg, depth):
    torch.manual_seed(cfg["seed"])
    d, width, layers = cfg["model"]["input_dim"], cfg["model"]["width"], []
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.Sigmoid()]
        d = width
    layers.append(nn.Linear(width, 1))
    net = nn.Sequential(*layers)
    x = torch.randn(cfg["data"]["batch"], cfg["model"]["input_dim"])
    y = torch.randn(cfg["data"]["batch"], 1)
    loss = F.mse_loss(net(x), y)
    loss.backward()
    rows = []
    lins = [m for m in net if isinstance(m, nn.Linear)]
    tiny16 = torch.finfo(torch.float16).tiny
    for i, lin in enumerate(lins):
        g = lin.weight.grad
        n = g.numel()
        nz = g != 0
        h, b = rnd(g, "fp16"), rnd(g, "bf16")
        rows.append({"name": f"d{depth}.L{i + 1:02d}", "depth": depth, "layer": i + 1,
                     "shape": f"{g.shape[0]}x{g.shape[1]}",
                     "mean_abs": g.abs().mean().item(), "max_abs": g.abs().max().item(),
                     "zero_fp32": (~nz).sum().item() / n,
                     "underflow_fp16": (nz & (h == 0)).sum().item() / n,
                     "underflow_bf16": (nz & (b == 0)).sum().item() / n,
                     "subnormal_fp16": (nz & (h != 0) & (h.abs() < tiny16)).sum().item() / n})
    allg = torch.cat([p.grad.flatten() for p in net.parameters()])
    return rows, loss.item(), allg


def histogram(g, lo, hi):
    nz = g[g != 0]
    e = torch.frexp(nz).exponent.long() - 1
    e = e.clamp(lo, hi - 1) - lo
    return {"counts": torch.bincount(e, minlength=hi - lo).tolist(), "zeros": g.numel() - nz.numel(),
            "edges": list(range(lo, hi + 1))}


M64 = (1 << 64) - 1


def splitmix64(z):
    """SplitMix64 (Steele, Lea, Flood 2014), as core/quant.cpp."""
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def derive_seed(seed, stream):
    return splitmix64(seed ^ splitmix64(stream))


def random_bits(seed, index):
    return splitmix64((splitmix64(seed) + index) & M64)


def sr_bf16(x, seed):
    """Stochastic rounding of a one-element fp32 tensor to bf16: (bits + r) & 0xFFFF0000 (torchao's form)."""
    b = int(x.view(torch.int32).item()) & 0xFFFFFFFF
    b = (b + (random_bits(seed, 0) & 0xFFFF)) & 0xFFFF0000
    return torch.tensor([b - (1 << 32) if b >= 1 << 31 else b], dtype=torch.int32).view(torch.float32)


def updates(start, step, count, seed):
    rows = []
    for name, fmt, master, update in [("fp32", "fp32", False, "nearest"), ("fp16", "fp16", False, "nearest"),
                                      ("bf16", "bf16", False, "nearest"), ("fp16+fp32_master", "fp16", True, "nearest"),
                                      ("bf16+fp32_master", "bf16", True, "nearest"), ("bf16+sr", "bf16", False, "sr"),
                                      ("bf16+kahan", "bf16", False, "kahan")]:
        w = rnd(torch.tensor([start], dtype=torch.float32), fmt)
        m = torch.tensor([start], dtype=torch.float32)
        u = rnd(torch.tensor([step], dtype=torch.float32), "fp32" if master else fmt)
        c = torch.zeros(1)  # Kahan compensation (optimi's kahan_comp), bf16 values
        expected = (m if master else w).item() + count * u.item()  # stored start + n * applied update
        lost = 0
        for i in range(count):
            if master:
                m2 = m + u
                lost += int(u.item() != 0 and m2.item() == m.item())
                m = m2
                w = rnd(m, fmt)
            elif update == "sr":
                w2 = sr_bf16(w + u, derive_seed(seed, i))
                lost += int(u.item() != 0 and w2.item() == w.item())
                w = w2
            elif update == "kahan":
                # optimi SGD, kahan_sum: c += -lr*g; tmp = w; w += c; c += tmp - w (every op rounded to bf16)
                c1 = rnd(c + u, "bf16")
                w1 = rnd(w + c1, "bf16")
                c2 = rnd(c1 + rnd(w - w1, "bf16"), "bf16")
                lost += int(u.item() != 0 and w1.item() == w.item() and c2.item() == c.item())
                w, c = w1, c2
            else:
                w2 = rnd(w + u, fmt)
                lost += int(u.item() != 0 and w2.item() == w.item())
                w = w2
        if step != 0 and u.item() == 0:  # the update itself rounds to 0: lost at every step
            lost = count
        rows.append({"name": name, "final": (m if master else w).item(), "expected": expected, "lost": lost,
                     "working_copy": w.item()})
    return rows


def main():
    cfg = json.load(open(sys.argv[1]))["config"]
    mpt_threads.use(sys.argv[1])  # the threads mpt ran with (reduction order)
    depths = cfg["model"]["depth"] if isinstance(cfg["model"]["depth"], list) else [cfg["model"]["depth"]]
    lo, hi = cfg["histogram"]["min_log2"], cfg["histogram"]["max_log2"]
    out = {"formats": formats(cfg["formats"]), "casts": casts(cfg["cast"]["values"], cfg["cast"]["formats"]),
           "gradients": [], "loss": {}}
    for d in depths:
        rows, loss, allg = gradients(cfg, d)
        out["gradients"] += rows
        out["loss"][f"d{d}"] = loss
        out[f"histogram_d{d}"] = histogram(allg, lo, hi)
    out["updates"] = updates(cfg["updates"]["start"], cfg["updates"]["step"], cfg["updates"]["count"], cfg["seed"])
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
