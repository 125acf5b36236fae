#!/usr/bin/python3
"""PyTorch-Python reference for section 1 of `mpt lossscale` (the static loss-scale sweep).

Reads the resolved config from an mpt result file, rebuilds the deep sigmoid net of
`mpt underflow` in the same construction order (seed, model, x, y), and for every scale
S computes the gradients of S*loss, casts them to fp16 and reports the first layer's and
all parameters' underflow/overflow fractions, the error of the unscaled gradient and the
safe window, as JSON on stdout. compare.py checks mpt's numbers against it exactly.
"""
import json
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import mpt_threads  # noqa: E402  (tests/parity)


def name(s):
    m, e = math.frexp(s)
    return f"2^{e - 1}" if m == 0.5 else f"{s:g}"


def fractions(g):
    n = g.numel()
    h = g.half().float()
    nz = g != 0
    under = (nz & (h == 0)).sum().item() / n
    over = (torch.isfinite(g) & ~torch.isfinite(h)).sum().item() / n
    return under, over


def error(scaled, inv, ref):
    back = scaled.half().float() * inv
    if not torch.isfinite(back).all():
        return "inf"
    # in float64, as mpt's relative_error
    den = ref.double().norm().item()
    num = (back.double() - ref.double()).norm().item()
    if den == 0:
        return 0.0 if num == 0 else "inf"
    return num / den


def main():
    cfg = json.load(open(sys.argv[1]))["config"]
    mpt_threads.use(sys.argv[1])  # the threads mpt ran with (reduction order)
    sw = cfg["sweep"]
    torch.manual_seed(cfg["seed"])
    d, width, layers = sw["model"]["input_dim"], sw["model"]["width"], []
    for _ in range(sw["model"]["depth"]):
        layers += [nn.Linear(d, width), nn.Sigmoid()]
        d = width
    layers.append(nn.Linear(width, 1))
    net = nn.Sequential(*layers)
    x = torch.randn(sw["data"]["batch"], sw["model"]["input_dim"])
    y = torch.randn(sw["data"]["batch"], 1)

    def grads(s):
        net.zero_grad()
        loss = F.mse_loss(net(x), y)
        (loss * torch.tensor(s, dtype=torch.float32)).backward()
        return net[0].weight.grad.clone(), torch.cat([p.grad.flatten() for p in net.parameters()])

    ref_first, ref_all = grads(1.0)
    rows, lowest, highest = [], None, None
    for s in sorted(sw["scales"]):
        gf, ga = grads(s)
        inv = torch.tensor(s, dtype=torch.float32).double().reciprocal().float()
        fu, fo = fractions(gf)
        au, ao = fractions(ga)
        rows.append({"name": name(s), "scale": s, "first_underflow": fu, "first_overflow": fo,
                     "all_underflow": au, "all_overflow": ao,
                     "first_error": error(gf, inv, ref_first), "all_error": error(ga, inv, ref_all)})
        if fu == 0 and fo == 0 and lowest is None:  # a first layer all inf is no fix
            lowest = s
        if ao == 0:
            highest = s
    empty = lowest is None or highest is None or lowest > highest
    out = {"sweep": rows,
           "safe_window": {"lowest": "nan" if lowest is None else lowest,
                           "highest": "nan" if highest is None else highest, "empty": empty}}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
