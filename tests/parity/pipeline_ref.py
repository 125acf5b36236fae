#!/usr/bin/python3
"""PyTorch-Python reference for `mpt pipeline` (run with the Python of the LibTorch mpt was built against: MPT_REF_PYTHON).

Reads the resolved config from an mpt result file and recomputes, in the same
construction order (model, then inputs, then targets, after torch.manual_seed):
  - exact_split: the whole model's gradient and the split one (boundary detached and
    requiring grad, later stage backpropagates to it, earlier stage resumes with
    out.backward(boundary.grad)); per parameter sum |g|, max abs difference, bitwise equality;
  - the sweep's microbatched gradient (loss_j / m, backward per microbatch in order, as every
    stage of mpt's executor accumulates B0, B1, ...) against the full-batch one, and its loss;
  - the zb-h1 programs of the `schedules` table, from torch.distributed.pipelining's own
    construction (_get_1f1b_rank_ops with enable_zero_bubble=True and one stage per rank, what
    ScheduleInterleavedZeroBubble builds), where this PyTorch has it (2.x; not 1.13); and the zb-v
    programs from ScheduleZBVZeroBubble._calculate_single_rank_operations (2 chunks per rank in a V).
Prints the reference `results` as JSON; compare.py checks mpt's numbers against it exactly.
The TwoStageNet of the lesson is widths [8, 16, 16, 16, 1] cut at 2:
  stage1 = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
  stage2 = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
"""
import json
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import mpt_threads  # noqa: E402  (tests/parity)


def mlp(widths):
    return [nn.Linear(widths[i], widths[i + 1]) for i in range(len(widths) - 1)]


def stage(layers, b, e, x):
    for i in range(b, e):
        x = layers[i](x)
        if i != len(layers) - 1:
            x = F.relu(x)
    return x


def balanced_cuts(n, k):
    cuts, at = [], 0
    for s in range(k - 1):
        at += n // k + (1 if s < n % k else 0)
        cuts.append(at)
    return cuts


def grads(layers):
    return [p.grad.detach().clone() for l in layers for p in l.parameters()]


def reset(layers):
    for l in layers:
        for p in l.parameters():
            p.grad = None


def exact_split(cfg, name, cuts, rows, losses):
    widths = cfg["split"]["widths"]
    torch.manual_seed(cfg["seed"])
    layers = mlp(widths)
    x = torch.randn(cfg["split"]["batch"], widths[0])
    y = torch.randn(cfg["split"]["batch"], widths[-1])
    n = len(layers)
    bounds = [0] + cuts + [n]
    ranges = list(zip(bounds[:-1], bounds[1:]))

    loss_whole = F.mse_loss(stage(layers, 0, n, x), y)
    loss_whole.backward()
    whole = grads(layers)
    reset(layers)

    inputs, outputs = [], []
    for k, (b, e) in enumerate(ranges):
        inp = x if k == 0 else outputs[-1].detach().requires_grad_(True)
        inputs.append(inp)
        outputs.append(stage(layers, b, e, inp))
    loss_split = F.mse_loss(outputs[-1], y)
    loss_split.backward()
    for k in range(len(ranges) - 2, -1, -1):
        outputs[k].backward(inputs[k + 1].grad)
    split = grads(layers)

    for i, (gw, gs) in enumerate(zip(whole, split)):
        layer = i // 2
        st = next(k for k, (b, e) in enumerate(ranges) if layer < e)
        rows.append({"name": f"{name}.L{layer + 1}.{'weight' if i % 2 == 0 else 'bias'}", "stages": len(ranges),
                     "stage": st + 1, "shape": "x".join(str(s) for s in gw.shape),
                     "grad_abs_sum": gw.abs().sum().item(), "max_abs_diff": (gw - gs).abs().max().item(),
                     "bitwise_equal": "yes" if torch.equal(gw, gs) else "no"})
    losses[name] = {"whole": loss_whole.item(), "split": loss_split.item()}


def sweep(cfg):
    widths, batch = cfg["pipeline"]["widths"], cfg["pipeline"]["batch"]
    torch.manual_seed(cfg["seed"])
    layers = mlp(widths)
    x = torch.randn(batch, widths[0])
    y = torch.randn(batch, widths[-1])
    n = len(layers)
    full_loss = F.mse_loss(stage(layers, 0, n, x), y)
    full_loss.backward()
    full = grads(layers)
    rows = []
    for kind in cfg["pipeline"]["schedules"]:
        ms = [1] if kind == "naive" else cfg["pipeline"]["microbatches"]
        if kind == "interleaved-1f1b":  # Megatron's requirement: m a multiple of the stages
            ms = [m for m in ms if m % cfg["pipeline"]["stages"] == 0]
        for m in ms:
            reset(layers)
            total = 0.0
            for xj, yj in zip(x.chunk(m), y.chunk(m)):
                lj = F.mse_loss(stage(layers, 0, n, xj), yj) / m
                total += lj.item()
                lj.backward()
            g = grads(layers)
            diff = max((a - b).abs().max().item() for a, b in zip(full, g))
            rows.append({"name": "naive" if kind == "naive" else f"{kind}.m{m}", "schedule": kind, "microbatches": m,
                         "grad_max_abs_diff": diff, "loss": total})
    return full_loss.item(), rows


def zb_h1_programs(p, m):
    """Per rank: torch.distributed.pipelining's zero-bubble 1F1B order for one stage per rank, as
    "F0 B0 W0 ..." (BACKWARD_INPUT printed as B), or None when this PyTorch lacks it."""
    try:
        from torch.distributed.pipelining import schedules as S
        get_ops, warmup_of = S._get_1f1b_rank_ops, S._get_warmup_ops
    except (ImportError, AttributeError):
        return None
    names = {S._ComputationType.FORWARD: "F", S._ComputationType.BACKWARD_INPUT: "B",
             S._ComputationType.BACKWARD_WEIGHT: "W"}
    out = []
    for rank in range(p):
        # ScheduleInterleavedZeroBubble._calculate_single_rank_operations with n_local_stages = 1.
        warmup = warmup_of(rank, 1, m, p, m, multiply_factor=1)
        fwd_bwd = m - warmup
        ops = get_ops(1, p, warmup, fwd_bwd, m - fwd_bwd, rank, lambda step: rank, lambda step: rank,
                      num_1f1b_microbatches=rank, enable_zero_bubble=True)
        out.append(" ".join(f"{names[a.computation_type]}{a.microbatch_index}" for a in ops if a is not None))
    return out


def zb_v_programs(p, m):
    """Per rank: torch.distributed.pipelining's ZB-V order (ScheduleZBVZeroBubble), as "F0.0 F1.0 ..."
    (microbatch.chunk; chunk 0 = virtual stage rank, chunk 1 = 2p - 1 - rank; BACKWARD_INPUT printed as
    B; torch's None slots dropped), or None when this PyTorch lacks it. The method reads only the group
    size, m and the stage count of the schedule object, so a stand-in object carries them."""
    try:
        import types
        from torch.distributed.pipelining import schedules as S
        build = S.ScheduleZBVZeroBubble._calculate_single_rank_operations
    except (ImportError, AttributeError):
        return None
    names = {S._ComputationType.FORWARD: "F", S._ComputationType.BACKWARD_INPUT: "B",
             S._ComputationType.BACKWARD_WEIGHT: "W"}
    this = types.SimpleNamespace(pp_group_size=p, _n_microbatches=m, num_stages=2 * p)
    out = []
    for rank in range(p):
        ops = build(this, rank)
        out.append(" ".join(f"{names[a.computation_type]}{a.microbatch_index}.{0 if a.stage_index == rank else 1}"
                            for a in ops if a is not None))
    return out


def schedules_rows(cfg):
    """The `schedules` table's rows (names; zb-h1 with its program), or None without the reference."""
    p, m = cfg["pipeline"]["stages"], cfg["gantt"]["microbatches"]
    zb = zb_h1_programs(p, m)
    if zb is None:
        return None
    zbv = zb_v_programs(p, m) if "zb-v" in cfg["pipeline"]["schedules"] else None
    rows = []
    for kind in cfg["pipeline"]["schedules"]:
        if kind == "naive" or (kind == "interleaved-1f1b" and m % p != 0):
            continue
        for s in range(p):
            row = {"name": f"{kind}.s{s}"}
            if kind == "zb-h1":
                row["program"] = zb[s]
            if kind == "zb-v" and zbv is not None:
                row["program"] = zbv[s]
            rows.append(row)
    return rows


def main():
    cfg = json.load(open(sys.argv[1]))["config"]
    mpt_threads.use(sys.argv[1])  # the threads mpt ran with (reduction order)
    n = len(cfg["split"]["widths"]) - 1
    cases = [(f"k{len(cfg['split']['cuts']) + 1}", cfg["split"]["cuts"])]
    cases += [(f"k{k}_balanced", balanced_cuts(n, k)) for k in cfg["split"]["extra_stages"] if k >= 2]
    rows, losses = [], {}
    for name, cuts in cases:
        exact_split(cfg, name, cuts, rows, losses)
    full_loss, sweep_rows = sweep(cfg)
    ref = {"exact_split": rows, "split_loss": losses, "full_batch_loss": full_loss, "sweep": sweep_rows}
    sched = schedules_rows(cfg)
    if sched is not None and any(k != "naive" for k in cfg["pipeline"]["schedules"]):
        ref["schedules"] = sched
    json.dump(ref, sys.stdout)


if __name__ == "__main__":
    main()
