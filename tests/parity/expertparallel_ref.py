#!/usr/bin/python3
"""PyTorch-Python reference for `mpt expertparallel` (src/experiments/expertparallel.cpp with
src/core/models/moe.cpp and src/core/parallel/ep.cpp; run with the Python of the LibTorch mpt was
built against: MPT_REF_PYTHON).

A real multi-process torch.distributed program: reads the resolved config and the EP degree e
(env.ep_degree) from an mpt result file, starts e processes (this one is rank 0, ranks 1 .. e-1
are spawned) joined by init_process_group("gloo") on 127.0.0.1, each with mpt's per-rank thread
count, and runs what mpt runs:

  model       the MoE GPT of core/models/moe built from torch.manual_seed(seed) in mpt's order
              (wte, wpe, per block ln_1, c_attn, attn_proj, ln_2, mlp.router (no bias),
              mlp.experts[i].c_fc, .c_proj for i = 0 .. E-1, then ln_f, lm_head (no bias)); the
              attention half of lossscale_gpt_ref.py's Block (gpt_attention_residual), every Linear
              through F.linear
  routing     softmax probs of the router, topk on probs (+ the bias for aux_free), the picked probs
              renormalised over the k when k > 1 (the raw prob when k = 1), Megatron's "position"
              drops (cumsum of the routing map), capacity = max(1, min(N, ceil(N k cf / E))), the
              Switch loss alpha E sum f_i P_i (aux_loss); dispatch into and combine from the
              capacity-padded [E, cap, C] buffers with mpt's cat/index_select padding row, the k
              gated outputs summed in slot order
  experts     sharded E/e per rank, reached by dist.all_to_all_single as a torch.autograd.Function
              (the same exchange on the gradient); one process holding every expert runs expert i
              once on every group's buffer rows in group order (moe::LocalExperts)
  losses      per group sum-reduced cross-entropy / the batch's tokens + its share of the Switch
              loss; one process adds the e groups' losses in group order
  training    the dense gradients all-reduced (dist.all_reduce), torch.optim.SGD with momentum, the
              aux_free bias b_i += gamma sign(mean - load_i) from the all-reduced loads

on the text batches of lossscale_gpt_ref.py's corpus (core/io/data's cleaning, the sorted
characters, the first 90%): step s's global batch of e*b sequences from nanoGPT's get_batch with
one torch.Generator().manual_seed(seed), rank r taking rows r*b .. (r+1)*b - 1. All-to-all bytes
are counted on this program's own calls with dist::CommCount's accounting (src/core/dist/group.hpp:
payload the input, (e-1)/e of it sent).

Rank 0 prints the reference `results`: every row of the tables vs_one_process (loss, its
difference from one process and bound, the logits, routing, expert and dense gradient
differences and the dense err/bound, the dropped fraction), balance (first/last-10 imbalance,
dropped and loss, and the per-step arrays imbalance, dropped, loss and loads), tokens_per_expert,
loss_curve, dropped_vs_capacity and comm (calls, bytes sent and payload, and the formulas);
compare.py checks them against mpt's result file exactly. mpt's results hold no timings, so
every key is compared.
"""
import json
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gloo_ranks  # noqa: E402
from lossscale_gpt_ref import clean  # noqa: E402

INF = float("inf")
NAN = float("nan")
U = 1.0 / 16777216.0  # fp32 unit roundoff (bounds::kFp32UnitRoundoff)
TEXT_VAL_FRACTION = 0.1  # kTextValFraction (core/models/gpt_spec.hpp)


def gamma(n, u=U):
    nu = n * u
    assert nu < 1.0
    return nu / (1.0 - nu)


def nan_max(a, b):
    return NAN if math.isnan(a) or math.isnan(b) else max(a, b)


def max_abs(a, b):
    """max |a - b| in float64 (0 for two empty tensors)."""
    if a.numel() == 0:
        return 0.0
    return (a.double() - b.double()).abs().max().item()


# ----------------------------------------------------------------------------
# The process group, with mpt's accounting of the all-to-all bytes
# ----------------------------------------------------------------------------

def nbytes(t):
    return t.numel() * t.element_size()


class Comm:
    """This rank's group: e ranks of the default (Gloo) process group. Counts the all-to-alls as
    dist::CommCount does: calls, payload (the input) and (N-1)/N of it sent (0 for one rank)."""

    def __init__(self, rank, size):
        self.rank, self.size = rank, size
        self.reset()

    def reset(self):
        self.calls, self.payload, self.sent = 0, 0, 0.0

    def all_to_all(self, x):
        inp = x.contiguous()
        out = torch.empty_like(inp)
        self.calls += 1
        self.payload += nbytes(inp)
        self.sent += float(nbytes(inp)) * (self.size - 1) / self.size if self.size > 1 else 0.0
        dist.all_to_all_single(out, inp)
        return out


class AllToAll(torch.autograd.Function):
    """ep.cpp's AllToAll: equal chunks along dim 0, chunk j to rank j; the gradient goes back by
    the same exchange."""

    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return comm.all_to_all(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.comm.all_to_all(grad), None


def max_over(x):
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


# ----------------------------------------------------------------------------
# The MoE GPT (core/models/moe)
# ----------------------------------------------------------------------------

class MoeConfig:
    def __init__(self, cfg, balance):
        m = cfg["moe"]
        self.experts = m["experts"]
        self.top_k = m["top_k"]
        self.capacity_factor = m["capacity_factor"]
        self.balance = balance
        self.aux_loss_coeff = m["aux_loss_coeff"]
        self.bias_update_rate = m["bias_update_rate"]


def capacity(tokens, m):
    c = math.ceil(float(tokens) * float(m.top_k) * m.capacity_factor / float(m.experts))
    return max(1, min(tokens, int(c)))


class Routing:
    pass


def route(logits, bias, m, cap):
    N, E, k = logits.size(0), logits.size(1), m.top_k
    r = Routing()
    r.capacity = cap
    r.probs = torch.softmax(logits.to(torch.float32), dim=-1)
    with torch.no_grad():
        scores = r.probs.detach()
        if m.balance == "aux_free":
            scores = scores + bias.to(scores.dtype)
        r.expert = torch.topk(scores, k, dim=-1)[1]  # largest first
    r.gate = r.probs.gather(1, r.expert)
    if k > 1:
        r.gate = r.gate / r.gate.sum(-1, keepdim=True)
    with torch.no_grad():
        rmap = torch.zeros(N, E, dtype=torch.long).scatter_(1, r.expert, 1)
        position = rmap.cumsum(0) - 1
        pos_k = position.gather(1, r.expert)
        r.slot = torch.where(pos_k < cap, pos_k, torch.full_like(pos_k, -1))
        r.counts = rmap.sum(0)
        r.kept = torch.clamp_max(r.counts, cap)
        if m.balance == "aux_loss":
            f = r.counts.to(torch.float32) / float(N * k)
            with torch.enable_grad():
                r.aux = (r.probs.mean(0) * f).sum() * (m.aux_loss_coeff * float(E))
        else:
            r.aux = torch.zeros((), dtype=torch.float32)
    return r


def buffer_rows(r, E):
    pad = E * r.capacity
    return torch.where(r.slot >= 0, r.expert * r.capacity + r.slot, torch.full_like(r.slot, pad))


def dispatch(h, r):
    N, C, E, cap = h.size(0), h.size(1), r.probs.size(1), r.capacity
    with torch.no_grad():
        rows = buffer_rows(r, E).reshape(-1)
        tokens = torch.arange(N, dtype=torch.long).unsqueeze(1).expand(N, r.slot.size(1)).reshape(-1)
        src = torch.full((E * cap + 1,), N, dtype=torch.long).index_put_((rows,), tokens).narrow(0, 0, E * cap)
    padded = torch.cat([h, torch.zeros(1, C, dtype=h.dtype)], 0)
    return padded.index_select(0, src).view(E, cap, C)


def combine(out, r):
    E, cap, C = out.shape
    N, k = r.slot.shape
    flat = torch.cat([out.reshape(E * cap, C), torch.zeros(1, C, dtype=out.dtype)], 0)
    rows = buffer_rows(r, E)
    picked = flat.index_select(0, rows.reshape(-1)).view(N, k, C)
    y = picked.select(1, 0) * r.gate.select(1, 0).unsqueeze(1)
    for j in range(1, k):
        y = y + picked.select(1, j) * r.gate.select(1, j).unsqueeze(1)
    return y


class Expert(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.c_fc = nn.Linear(C, H)
        self.c_proj = nn.Linear(H, C)

    def forward(self, x):
        return F.linear(F.gelu(F.linear(x, self.c_fc.weight, self.c_fc.bias)), self.c_proj.weight, self.c_proj.bias)


class MoeMlp(nn.Module):
    def __init__(self, C, H, E):
        super().__init__()
        self.router = nn.Linear(C, E, bias=False)
        self.experts = nn.ModuleList([Expert(C, H) for _ in range(E)])
        self.register_buffer("expert_bias", torch.zeros(E))


class MoeBlock(nn.Module):
    def __init__(self, C, heads, ratio, E):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.attn_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.mlp = MoeMlp(C, ratio * C, E)


def attention_residual(b, x):
    """gpt_attention_residual: x + attn_proj(causal softmax(q k^T / sqrt(hd)) v), as
    lossscale_gpt_ref.py's Block runs its attention half."""
    B, hd = x.size(0), x.size(2) // b.heads
    qkv = F.linear(b.ln_1(x), b.c_attn.weight, b.c_attn.bias)
    T, C = qkv.size(1), qkv.size(2) // 3
    nh = C // hd
    q, k, v = qkv.split(C, dim=2)
    q = q.view(B, T, nh, hd).transpose(1, 2)
    k = k.view(B, T, nh, hd).transpose(1, 2)
    v = v.view(B, T, nh, hd).transpose(1, 2)
    att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    att = att.masked_fill(mask.logical_not(), -INF)
    att = torch.softmax(att, dim=-1)
    y = torch.matmul(att, v)
    y = y.transpose(1, 2).contiguous().view(B, T, C)
    y = F.linear(y, b.attn_proj.weight, b.attn_proj.bias)
    return x + y


class LayerRouting:
    def __init__(self, counts, kept, cap):
        self.counts, self.kept, self.capacity = counts, kept, cap


class LocalExperts:
    """One process holding every expert: expert i once on [G*cap, C], the groups in order."""

    def run(self, mlp, buffers):
        G, E, cap, C = buffers.shape
        x = buffers.permute(1, 0, 2, 3).reshape(E, G * cap, C)
        ys = [mlp.experts[i](x[i]) for i in range(E)]
        return torch.stack(ys).view(E, G, cap, C).permute(1, 0, 2, 3)


class ExpertParallel:
    """ep::ExpertParallel: this rank's [1, E, cap, C] buffers out by all-to-all, its E/e experts on
    every rank's rows in rank order, the outputs back by the inverse all-to-all."""

    def __init__(self, comm):
        self.comm = comm

    def run(self, mlp, buffers):
        assert buffers.size(0) == 1
        e = self.comm.size
        E, cap, C = buffers.size(1), buffers.size(2), buffers.size(3)
        El = E // e
        first = self.comm.rank * El
        recv = AllToAll.apply(buffers[0], self.comm).view(e, El, cap, C)
        x = recv.permute(1, 0, 2, 3).reshape(El, e * cap, C)
        ys = [mlp.experts[first + i](x[i]) for i in range(El)]
        y = torch.stack(ys).view(El, e, cap, C).permute(1, 0, 2, 3)
        return AllToAll.apply(y, self.comm).view(1, E, cap, C)


class MoeGpt(nn.Module):
    def __init__(self, V, T, C, heads, L, ratio, moe):
        super().__init__()
        self.width = C
        self.moe = moe
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([MoeBlock(C, heads, ratio, moe.experts) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.aux = []

    def forward(self, idx, experts, routing=None):
        G = len(idx)
        T, C = idx[0].size(1), self.width
        pos = torch.arange(T, dtype=torch.long)
        x = [self.wte(i) + self.wpe(pos) for i in idx]
        self.aux = [[] for _ in range(G)]
        if routing is not None:
            routing.clear()
        B = idx[0].size(0)
        N = B * T
        cap = capacity(N, self.moe)
        for block in self.h:
            r, bufs, routes = [None] * G, [None] * G, [None] * G
            for g in range(G):
                r[g] = attention_residual(block, x[g])
                h = block.ln_2(r[g]).reshape(N, C)
                routes[g] = route(F.linear(h, block.mlp.router.weight), block.mlp.expert_bias, self.moe, cap)
                bufs[g] = dispatch(h, routes[g])
                self.aux[g].append(routes[g].aux)
            out = experts.run(block.mlp, torch.stack(bufs))
            for g in range(G):
                x[g] = r[g] + combine(out[g], routes[g]).view(B, T, C)
            if routing is not None:
                routing.append(LayerRouting(torch.stack([rt.counts for rt in routes]),
                                            torch.stack([rt.kept for rt in routes]), cap))
        return [F.linear(self.ln_f(xg), self.lm_head.weight) for xg in x]

    def aux_loss(self, g, total_groups):
        s = torch.zeros((), dtype=torch.float32)
        for a in self.aux[g]:
            s = s + a
        return s / float(total_groups)

    def update_bias(self, loads):
        if self.moe.balance != "aux_free":
            return
        with torch.no_grad():
            for l, b in enumerate(self.h):
                load = loads[l].to(torch.float32)
                b.mlp.expert_bias.add_(torch.sign(load.mean() - load) * self.moe.bias_update_rate)


def group_lm_loss(logits, targets, total_tokens):
    V = logits.size(-1)
    return F.cross_entropy(logits.reshape(-1, V).to(torch.float32), targets.reshape(-1),
                           reduction="sum") / float(total_tokens)


def rank_loss(m, logits, targets, g, groups):
    total = targets.numel() * groups
    return group_lm_loss(logits, targets, total) + m.aux_loss(g, groups)


def is_expert_param(name):
    return ".mlp.experts." in name


# ----------------------------------------------------------------------------
# Expert parallelism (core/parallel/ep)
# ----------------------------------------------------------------------------

def drop_remote_experts(model, e, r):
    with torch.no_grad():
        for b in model.h:
            E = len(b.mlp.experts)
            El = E // e
            first = r * El
            for i in range(E):
                if first <= i < first + El:
                    continue
                for p in b.mlp.experts[i].parameters():
                    p.data = torch.empty(0, dtype=p.dtype)


def allreduce_dense_grads(model, want_abs=False):
    abs_sum = {}
    for name, p in model.named_parameters():
        if is_expert_param(name) or p.grad is None:
            continue
        if want_abs:
            a = p.grad.abs()
            dist.all_reduce(a)
            abs_sum[name] = a
        dist.all_reduce(p.grad)
    return abs_sum


# ----------------------------------------------------------------------------
# The experiment
# ----------------------------------------------------------------------------

class Run:
    def __init__(self, cfg, comm):
        self.cfg, self.comm = cfg, comm
        d, m = cfg["data"], cfg["model"]
        text = b"".join(clean(open(os.path.join(d["text_dir"], name), "rb").read()) for name in d["text_files"])
        chars = sorted(set(text))
        index = {c: i for i, c in enumerate(chars)}
        ids = torch.tensor([index[c] for c in text], dtype=torch.long)
        train = ids[: int(math.floor((1.0 - TEXT_VAL_FRACTION) * len(ids)))]
        self.V, self.T, self.C, self.L = len(chars), m["context"], m["width"], m["layers"]
        self.e, self.b, self.steps = comm.size, d["batch"], cfg["train"]["steps"]
        # draw_batches: text_batch (nanoGPT's get_batch) from one generator seeded with /seed.
        gen = torch.Generator().manual_seed(cfg["seed"])
        xs, ys = [], []
        for _ in range(self.steps):
            ix = torch.randint(len(train) - self.T, (self.e * self.b,), generator=gen)
            offsets = ix.unsqueeze(1) + torch.arange(self.T, dtype=torch.long).unsqueeze(0)
            xs.append(train[offsets])
            ys.append(train[offsets + 1])
        self.x, self.y = torch.stack(xs), torch.stack(ys)

    def inputs(self, step):
        return self.x[step].chunk(self.e)

    def targets(self, step):
        return self.y[step].chunk(self.e)

    def build(self, balance):
        m = self.cfg["model"]
        torch.manual_seed(self.cfg["seed"])
        return MoeGpt(self.V, m["context"], m["width"], m["heads"], m["layers"], m["mlp_ratio"],
                      MoeConfig(self.cfg, balance))

    def gather_reference(self, balance, ep_model):
        one = self.build(balance)
        comm, e, E = self.comm, self.comm.size, ep_model.moe.experts
        with torch.no_grad():
            mine = dict(ep_model.named_parameters())
            for name, p in one.named_parameters():
                if not is_expert_param(name):
                    p.copy_(mine[name])
            for l, blk in enumerate(one.h):
                blk.mlp.expert_bias.copy_(ep_model.h[l].mlp.expert_bias)
                for i in range(E):
                    owner = i // (E // e)
                    dst = list(blk.mlp.experts[i].parameters())
                    src = list(ep_model.h[l].mlp.experts[i].parameters())
                    for p in range(len(dst)):
                        if comm.rank == owner:
                            dst[p].copy_(src[p])
                        dist.broadcast(dst[p], owner)
        return one

    def check_step(self, balance, when, ep_model, step, rows):
        comm = self.comm
        e, r = comm.size, comm.rank
        one = self.gather_reference(balance, ep_model)
        local = LocalExperts()
        one_routing = []
        xs, ys = self.inputs(step), self.targets(step)
        one_logits = one(list(xs), local, one_routing)
        one_loss = None
        for q in range(e):
            lq = rank_loss(one, one_logits[q], ys[q], q, e)
            one_loss = lq if q == 0 else one_loss + lq
        one_loss.backward()
        experts = ExpertParallel(comm)
        ep_model.zero_grad(set_to_none=True)
        comm.reset()
        routing = []
        logits = ep_model([xs[r]], experts, routing)
        loss = rank_loss(ep_model, logits[0], ys[r], 0, e)
        loss.backward()
        out = {"calls": comm.calls, "payload": comm.payload, "sent": comm.sent, "capacity": routing[0].capacity}
        my_loss = loss.item()
        losses = torch.tensor([my_loss], dtype=torch.float32)
        dist.all_reduce(losses)
        ep_loss = losses.item()
        a = torch.tensor([abs(my_loss)], dtype=torch.float64)
        dist.all_reduce(a)
        abs_losses = a.item()
        abs_sum = allreduce_dense_grads(ep_model, want_abs=True)

        logits_diff = max_over(max_abs(logits[0], one_logits[r]))
        routing_diff, dropped, choices = 0, 0, 0
        for lr, olr in zip(routing, one_routing):
            routing_diff += ((lr.counts[0] - olr.counts[r]).abs().sum().item()
                             + (lr.kept[0] - olr.kept[r]).abs().sum().item())
            dropped += (olr.counts - olr.kept).sum().item()
            choices += olr.counts.sum().item()
        routing_diff = int(max_over(float(routing_diff)))
        expert_diff, dense_ratio, dense_diff = 0.0, 0.0, 0.0
        gam = 2 * gamma(e - 1) / (1 - gamma(e - 1))  # the bound of a reordered sum, its sum|part| itself an fp32 sum
        ep_params = dict(ep_model.named_parameters())
        for name, po in one.named_parameters():
            p = ep_params[name]
            if is_expert_param(name):
                if p.numel() > 0:
                    expert_diff = nan_max(expert_diff, max_abs(p.grad, po.grad))
                continue
            d = (p.grad.double() - po.grad.double()).abs()
            bound = abs_sum[name].double() * gam
            ratio = torch.where(bound > 0, d / bound,
                                torch.where(d > 0, torch.full_like(d, INF), torch.zeros_like(d)))
            dense_ratio = nan_max(dense_ratio, ratio.max().item())
            dense_diff = nan_max(dense_diff, d.max().item())
        expert_diff = max_over(expert_diff)
        dense_ratio = max_over(dense_ratio)
        dense_diff = max_over(dense_diff)
        loss_bound = gam * abs_losses
        loss_diff = abs(ep_loss - one_loss.item())
        rows.append({"name": f"{balance}/{when}", "loss": ep_loss, "loss_diff": loss_diff, "loss_bound": loss_bound,
                     "logits_diff": logits_diff, "routing_diff": routing_diff,
                     "dropped": float(dropped) / float(choices),
                     "expert_grad_diff": expert_diff, "dense_grad_diff": dense_diff, "dense_grad_ratio": dense_ratio})
        ep_model.zero_grad(set_to_none=True)
        return out

    def train(self, model, opt):
        comm = self.comm
        e, r = comm.size, comm.rank
        experts = ExpertParallel(comm)
        c = {"loss": [], "imbalance": [], "dropped": [], "loads": []}
        for s in range(self.steps):
            opt.zero_grad(set_to_none=True)
            routing = []
            logits = model([self.inputs(s)[r]], experts, routing)
            loss = rank_loss(model, logits[0], self.targets(s)[r], 0, e)
            loss.backward()
            allreduce_dense_grads(model)
            opt.step()
            counts = [lr.counts[0] for lr in routing]
            kept = [lr.kept[0] for lr in routing]
            stats = torch.stack([torch.stack(counts), torch.stack(kept)]).to(torch.float64)  # [2, L, E]
            dist.all_reduce(stats)
            model.update_bias(stats[0])
            l = loss.detach().to(torch.float64).reshape(1)
            dist.all_reduce(l)
            c["loss"].append(l.item())
            c["loads"].append(stats[0].to(torch.long))
            loads = stats[0].to(torch.float64)
            c["imbalance"].append((loads.max(1)[0] / loads.mean(1)).max().item())
            c["dropped"].append(((stats[0] - stats[1]).sum() / stats[0].sum()).item())
        return c

    def dropped_fraction(self, model, cf, step):
        comm = self.comm
        with torch.no_grad():
            saved = model.moe.capacity_factor
            model.moe.capacity_factor = cf
            routing = []
            model([self.inputs(step)[comm.rank]], ExpertParallel(comm), routing)
            model.moe.capacity_factor = saved
            s = torch.zeros(2, dtype=torch.float64)
            for lr in routing:
                s[0] += (lr.counts - lr.kept).sum().item()
                s[1] += lr.counts.sum().item()
            dist.all_reduce(s)
            return (s[0] / s[1]).item()

    def results(self):
        cfg, comm = self.cfg, self.comm
        e, b, steps, T, C, L = self.e, self.b, self.steps, self.T, self.C, self.L
        E = cfg["moe"]["experts"]
        balances = cfg["moe"]["balances"]
        checks, curves, runs, first = [], {}, {}, None
        for m in balances:
            model = self.build(m)
            drop_remote_experts(model, e, comm.rank)
            opt = torch.optim.SGD(model.parameters(), lr=cfg["train"]["lr"], momentum=cfg["train"]["momentum"],
                                  foreach=False)
            sc = self.check_step(m, "initial", model, 0, checks)  # 1
            if m == balances[0]:
                first = sc
            curves[m] = self.train(model, opt)  # 2
            self.check_step(m, "trained", model, steps - 1, checks)
            runs[m] = model

        def mean_last(x, n=10):
            n = min(n, len(x))
            s = 0.0
            for v in x[len(x) - n:]:
                s += v
            return s / float(n)

        balance, tokens = [], []
        for m in balances:
            c = curves[m]
            loads = [[[int(v) for v in l[i]] for i in range(L)] for l in c["loads"]]
            balance.append({"name": m, "imbalance_first": c["imbalance"][0],
                            "imbalance_last": mean_last(c["imbalance"]),
                            "dropped_first": c["dropped"][0], "dropped_last": mean_last(c["dropped"]),
                            "loss_first": c["loss"][0], "loss_last": mean_last(c["loss"]),
                            "imbalance": c["imbalance"], "dropped": c["dropped"], "loss": c["loss"], "loads": loads})
            for i in range(L):
                row = {"name": f"{m}/h{i}", "capacity": e * capacity(b * T, MoeConfig(cfg, m))}
                for x in range(E):
                    row[f"e{x}"] = int(c["loads"][-1][i][x])
                tokens.append(row)
        curve = []
        every = max(1, steps // 10)
        for s in range(0, steps, every):
            row = {"step": s + 1}
            for m in balances:
                row[m] = curves[m]["loss"][s]
            curve.append(row)
        if (steps - 1) % every != 0:
            row = {"step": steps}
            for m in balances:
                row[m] = curves[m]["loss"][-1]
            curve.append(row)

        # 3. Dropped fraction vs capacity factor: the initial router (a fresh model) and each trained one.
        fresh = self.build(balances[0])
        drop_remote_experts(fresh, e, comm.rank)
        mc = MoeConfig(cfg, balances[0])
        drops = []
        for cf in cfg["capacity"]["factors"]:
            mc.capacity_factor = cf
            row = {"capacity_factor": cf, "capacity": capacity(b * T, mc),
                   "initial": self.dropped_fraction(fresh, cf, 0)}
            for m in balances:
                row[m] = self.dropped_fraction(runs[m], cf, 0)
            drops.append(row)

        # 4. All-to-all bytes per step (the first check step: forward and backward).
        cap = first["capacity"]
        per_layer = 4.0 * float(e - 1) / float(e) * float(E * cap * C) * 4.0 if e > 1 else 0.0
        payload_per_layer = 4.0 * float(E * cap * C) * 4.0
        comm_rows = [{"name": "all_to_all", "calls": first["calls"], "sent": first["sent"],
                      "formula": float(L) * per_layer, "payload": float(first["payload"]),
                      "payload_formula": float(L) * payload_per_layer}]
        return {"vs_one_process": checks, "balance": balance, "tokens_per_expert": tokens, "loss_curve": curve,
                "dropped_vs_capacity": drops, "comm": comm_rows}


def ranks_results(rank, e, doc):
    """One rank's work; rank 0's return value is the reference's results."""
    return Run(doc["config"], Comm(rank, e)).results()


def main():
    result_path = sys.argv[1]
    doc = json.load(open(result_path))
    if doc["config"].get("mesh", {}).get("steps", 0) > 0:
        sys.exit("expertparallel_ref.py mirrors the expert-parallel sections; /mesh/steps > 0 (the DP x TP mesh) "
                 "is not mirrored")
    gloo_ranks.run(int(doc["env"]["ep_degree"]), result_path, ranks_results, "expertparallel_ref.py")


if __name__ == "__main__":
    main()
