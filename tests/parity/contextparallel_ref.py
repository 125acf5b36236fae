#!/usr/bin/python3
"""PyTorch-Python reference for `mpt contextparallel` (src/experiments/contextparallel.cpp with
src/core/parallel/cp.cpp; run with the Python of the LibTorch mpt was built against: MPT_REF_PYTHON).

A real multi-process torch.distributed program: reads the resolved config and the CP degree c
(env.cp_degree) from an mpt result file, starts c processes (this one is rank 0, ranks 1 .. c-1
are spawned) joined by init_process_group("gloo") on 127.0.0.1, each with mpt's per-rank thread
count, and runs what mpt runs, written here as torch.autograd.Functions:

  ring        K/V blocks passed with dist.isend/irecv, c steps, FlashAttention-2's online softmax
              (running max m with the `shift` of fully masked rows, normaliser l, unnormalised acc),
              each query chunk of the balanced split computed on its own (narrow) against the keys it
              needs; backward from the saved log-sum-exp with D = rowsum(dy * y), K/V around again and
              the dK/dV partials travelling with their block back to its owner
  all_gather  K and V all-gathered (dist.all_gather into a list, then cat) along the sequence,
              dK and dV reduce-scattered in the backward: dist.reduce_scatter_tensor where mpt runs
              c10d's native Gloo reduce-scatter (LibTorch 2.x), else a ring reduce-scatter of
              isend/irecv summing chunk j in mpt's order ((in_{j+1} + in_{j+2}) + ...) + in_j
              (env.dist.reduce_scatter says which)
  ulysses     dist.all_to_all_single from sequence- to head-sharded q, k, v, the GPT block's own
              causal attention on whole heads, and back

with the sequence split contiguous or balanced (rank r holding chunks r and 2c-1-r of 2c).
The tiny GPT is lossscale_gpt_ref.py's TinyGpt (core/models/gpt's modules, init order and
forward), built from torch.manual_seed(seed) as mpt's seed_all does; its blocks run with the CP
attention on each rank's positions, the loss is cross_entropy(reduction='sum') / (B*T) all-reduced
(identity backward), the gradients all-reduced. The random data follow contextparallel.cpp's draw
order. Bytes sent are counted on this program's own send/collective calls with dist::CommCount's
ring-algorithm accounting (src/core/dist/group.hpp).

Rank 0 prints {"results": {...}}: every row of the tables attention (vs one process, vs the
exact float64 attention of the same fp32 inputs, the bound and err/bound of cp::attention_bounds),
gpt (loss, the differences from one process, per-parameter gradient differences, the loss bound),
balance (useful, computed and ran pairs) and comm (bytes sent, collectives, formula);
compare.py checks them against mpt's result file exactly. The timings (balance_times) are not
compared.
"""
import json
import math
import os
import re
import struct
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gloo_ranks  # noqa: E402
from lossscale_gpt_ref import TinyGpt  # noqa: E402

INF = float("inf")
U = 1.0 / 16777216.0  # fp32 unit roundoff (bounds::kFp32UnitRoundoff)
VARIANTS = ("ring", "all_gather", "ulysses")
SPLITS = ("contiguous", "balanced")


def gamma(n, u=U):
    nu = n * u
    assert nu < 1.0
    return nu / (1.0 - nu)


# ----------------------------------------------------------------------------
# The process group, with mpt's accounting of the bytes sent
# ----------------------------------------------------------------------------

def nbytes(t):
    return t.numel() * t.element_size()


class Comm:
    """This rank's group: c ranks of the default (Gloo) process group. Counts calls, payload
    and bytes sent per kind as dist::CommCount does: all-reduce 2(N-1)/N of the buffer,
    all-gather (N-1)/N of the output, reduce-scatter (N-1)/N of the input, all-to-all (N-1)/N of
    the input, send the tensor, recv 0."""

    def __init__(self, rank, size, ring_reduce_scatter):
        self.rank, self.size = rank, size
        self.ring_rs = ring_reduce_scatter
        self.counts = {}
        self.rs_calls = 0

    def share(self, b):
        return float(b) * (self.size - 1) / self.size

    def count(self, kind, payload, sent):
        c = self.counts.setdefault(kind, [0, 0, 0.0])
        c[0] += 1
        c[1] += payload
        c[2] += sent

    def reset(self):
        self.counts = {}

    def send(self, t, dst, tag):
        self.count("send", nbytes(t), float(nbytes(t)))
        return dist.isend(t, dst, tag=tag)

    def recv(self, t, src, tag):
        self.count("recv", nbytes(t), 0.0)
        return dist.irecv(t, src, tag=tag)

    def all_reduce(self, t):
        self.count("all_reduce", nbytes(t), 2.0 * self.share(nbytes(t)))
        dist.all_reduce(t)

    def all_gather(self, x):
        """x [n, ...] contiguous -> [size * n, ...], rank order along dim 0."""
        parts = [torch.empty_like(x) for _ in range(self.size)]
        self.count("all_gather", self.size * nbytes(x), self.share(self.size * nbytes(x)))
        dist.all_gather(parts, x)
        return torch.cat(parts, 0)

    def reduce_scatter(self, x):
        """x [size * n, ...] contiguous -> chunk `rank` [n, ...] summed over the ranks."""
        self.count("reduce_scatter", nbytes(x), self.share(nbytes(x)))
        n, r = self.size, self.rank
        out = torch.empty_like(x.chunk(n, 0)[0])
        if not self.ring_rs:
            dist.reduce_scatter_tensor(out, x)
            return out
        # The ring: at step s send the partial of chunk (r-s-1) mod n (at s = 0 this rank's own
        # chunk r-1) to r+1, receive that of chunk (r-s-2) mod n from r-1 and add this rank's own.
        chunks = x.chunk(n, 0)
        call = self.rs_calls
        self.rs_calls += 1
        received = torch.empty_like(out)
        to_send = chunks[(r - 1) % n].contiguous()
        for s in range(n - 1):
            tag = (1 << 20) + call * 8 + s
            rx = dist.irecv(received, (r - 1) % n, tag=tag)
            tx = dist.isend(to_send, (r + 1) % n, tag=tag)
            rx.wait()
            tx.wait()
            to_send = received + chunks[(r - s - 2) % n]
        return to_send

    def all_to_all(self, x):
        self.count("all_to_all", nbytes(x), self.share(nbytes(x)))
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x)
        return out


# ----------------------------------------------------------------------------
# Splits
# ----------------------------------------------------------------------------

def positions(T, c, r, split):
    if split == "contiguous":
        return torch.arange(r * (T // c), (r + 1) * (T // c), dtype=torch.long)
    n = T // (2 * c)
    return torch.cat([torch.arange(r * n, (r + 1) * n, dtype=torch.long),
                      torch.arange((2 * c - 1 - r) * n, (2 * c - r) * n, dtype=torch.long)])


def causal_pairs(T, c, r, split):
    return int((positions(T, c, r, split) + 1).sum())


def ring_computed_pairs(T, c, r, split):
    Tl = T // c
    if split == "contiguous":
        return (r + 1) * Tl * Tl
    return 3 * Tl * Tl // 4 + (c - 1) * Tl * Tl // 2


def local_chunks(T, c, r, split):
    """(begin, len, first position) of the runs of consecutive positions of rank r."""
    pos = positions(T, c, r, split)
    Tl = T // c
    if split == "contiguous":
        return [(0, Tl, int(pos[0]))]
    return [(0, Tl // 2, int(pos[0])), (Tl // 2, Tl // 2, int(pos[Tl // 2]))]


def needed_columns(qc, kcs):
    end = 0
    for kb, kl, kf in kcs:
        if kf <= qc[2] + qc[1] - 1:
            end = kb + kl
    return end


def future_mask(qpos, kpos):
    return kpos.unsqueeze(0) > qpos.unsqueeze(1)


def natural_order(T, c, split):
    return torch.argsort(torch.cat([positions(T, c, r, split) for r in range(c)]))


# ----------------------------------------------------------------------------
# The attention
# ----------------------------------------------------------------------------

class Attention:
    """One rank's context-parallel attention core (cp::Attention): variant, split, the pairs its
    ring computed and its call count (the ring's message tags)."""

    def __init__(self, comm, variant, split):
        self.comm, self.variant, self.split = comm, variant, split
        self.pairs = 0
        self.calls = 0

    def __call__(self, q, k, v):
        c = self.comm.size
        T = q.size(2) * c
        if self.variant == "ring":
            return Ring.apply(q, k, v, self)
        if self.variant == "all_gather":
            kf = GatherSeq.apply(k.contiguous(), self)
            vf = GatherSeq.apply(v.contiguous(), self)
            if self.split != "contiguous":
                order = natural_order(T, c, self.split)
                kf = kf.index_select(2, order)
                vf = vf.index_select(2, order)
            return rows_attention(q, kf, vf, positions(T, c, self.comm.rank, self.split))
        qh = SeqToHeads.apply(q.contiguous(), self)
        kh = SeqToHeads.apply(k.contiguous(), self)
        vh = SeqToHeads.apply(v.contiguous(), self)
        inverse = None
        if self.split != "contiguous":
            order = natural_order(T, c, self.split)
            inverse = torch.argsort(order)
            qh = qh.index_select(2, order)
            kh = kh.index_select(2, order)
            vh = vh.index_select(2, order)
        y = causal_attention(qh, kh, vh)
        if inverse is not None:
            y = y.index_select(2, inverse)
        return HeadsToSeq.apply(y.contiguous(), self)


def ring_tag(call, phase, step):
    return (call % ((1 << 30) // 64)) * 32 + phase * 8 + step


def ring_block_forward(q, kb, vb, mask, scale, m, l, acc):
    s = (torch.matmul(q, kb.transpose(-2, -1)) * scale).masked_fill(mask, -INF)
    m_new = torch.maximum(m, s.max(-1, keepdim=True)[0])
    shift = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
    p = torch.exp(s - shift)
    alpha = torch.exp(m - shift)
    l = alpha * l + p.sum(-1, keepdim=True)
    acc = alpha * acc + torch.matmul(p, vb)
    return m_new, l, acc


def ring_block_backward(q, kb, vb, mask, scale, lse, dy, D, dq, dkv):
    s = (torch.matmul(q, kb.transpose(-2, -1)) * scale).masked_fill(mask, -INF)
    p = torch.exp(s - lse)
    dkv.select(0, 1).add_(torch.matmul(p.transpose(-2, -1), dy))
    ds = p * (torch.matmul(dy, vb.transpose(-2, -1)) - D)
    dq.add_(torch.matmul(ds, kb) * scale)
    dkv.select(0, 0).add_(torch.matmul(ds.transpose(-2, -1), q) * scale)


class Ring(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, a):
        comm = a.comm
        ctx.a = a
        ctx.call = call = a.calls
        a.calls += 1
        c, r = comm.size, comm.rank
        Tl = q.size(2)
        T = Tl * c
        scale = 1.0 / math.sqrt(q.size(3))
        qpos = positions(T, c, r, a.split)
        qcs = local_chunks(T, c, r, a.split)
        m = torch.full((q.size(0), q.size(1), Tl, 1), -INF, dtype=q.dtype)
        l = torch.zeros((q.size(0), q.size(1), Tl, 1), dtype=q.dtype)
        acc = torch.zeros_like(q)
        kv = torch.stack([k, v]).contiguous()
        for s in range(c):
            src = (r - s + c) % c
            if s < c - 1:  # the next block travels while this one is computed
                incoming = torch.empty_like(kv)
                recv = comm.recv(incoming, (r - 1 + c) % c, ring_tag(call, 0, s))
                send = comm.send(kv, (r + 1) % c, ring_tag(call, 0, s))
            kpos = positions(T, c, src, a.split)
            kcs = local_chunks(T, c, src, a.split)
            for qc in qcs:
                ke = needed_columns(qc, kcs)
                if ke == 0:
                    continue
                b, n = qc[0], qc[1]
                mc, lc, ac = m.narrow(2, b, n), l.narrow(2, b, n), acc.narrow(2, b, n)
                m2, l2, a2 = ring_block_forward(q.narrow(2, b, n), kv[0].narrow(2, 0, ke), kv[1].narrow(2, 0, ke),
                                                future_mask(qpos.narrow(0, b, n), kpos.narrow(0, 0, ke)), scale,
                                                mc.clone(), lc.clone(), ac.clone())
                mc.copy_(m2)
                lc.copy_(l2)
                ac.copy_(a2)
                a.pairs += n * ke
            if s < c - 1:
                recv.wait()
                send.wait()
                kv = incoming
        y = acc / l
        lse = m + torch.log(l)
        ctx.save_for_backward(q, k, v, y, lse)
        return y

    @staticmethod
    def backward(ctx, grad):
        a = ctx.a
        comm = a.comm
        call = ctx.call
        q, k, v, y, lse = ctx.saved_tensors
        c, r = comm.size, comm.rank
        Tl = q.size(2)
        T = Tl * c
        scale = 1.0 / math.sqrt(q.size(3))
        qpos = positions(T, c, r, a.split)
        qcs = local_chunks(T, c, r, a.split)
        dy = grad.contiguous()
        D = (dy * y).sum(-1, keepdim=True)  # rowsum(dO * O), FlashAttention-2 Algorithm 2 line 4
        dq = torch.zeros_like(q)
        kv = torch.stack([k, v]).contiguous()
        dkv = torch.zeros_like(kv)
        nxt, prev = (r + 1) % c, (r - 1 + c) % c
        for s in range(c):
            src = (r - s + c) % c
            if s < c - 1:
                kv_in = torch.empty_like(kv)
                kv_recv = comm.recv(kv_in, prev, ring_tag(call, 2, s))
                kv_send = comm.send(kv, nxt, ring_tag(call, 2, s))
            kpos = positions(T, c, src, a.split)
            kcs = local_chunks(T, c, src, a.split)
            for qc in qcs:
                ke = needed_columns(qc, kcs)
                if ke == 0:
                    continue
                b, n = qc[0], qc[1]
                rows = lambda x: x.narrow(2, b, n)  # noqa: E731
                ring_block_backward(rows(q), kv[0].narrow(2, 0, ke), kv[1].narrow(2, 0, ke),
                                    future_mask(qpos.narrow(0, b, n), kpos.narrow(0, 0, ke)), scale, rows(lse),
                                    rows(dy), rows(D), rows(dq), dkv.narrow(3, 0, ke))
                a.pairs += n * ke
            # dK/dV of block src travel on with it; after the last hop this rank holds its own.
            if c > 1:
                dkv_in = torch.empty_like(dkv)
                dkv_recv = comm.recv(dkv_in, prev, ring_tag(call, 3, s))
                dkv_send = comm.send(dkv, nxt, ring_tag(call, 3, s))
                dkv_recv.wait()
                dkv_send.wait()
                dkv = dkv_in
            if s < c - 1:
                kv_recv.wait()
                kv_send.wait()
                kv = kv_in
        return dq, dkv[0], dkv[1], None


def gather_dim(x, comm, dim):
    return comm.all_gather(x.movedim(dim, 0).contiguous()).movedim(0, dim).contiguous()


def reduce_scatter_dim(x, comm, dim):
    return comm.reduce_scatter(x.movedim(dim, 0).contiguous()).movedim(0, dim).contiguous()


class GatherSeq(torch.autograd.Function):
    """Megatron's gather_from_sequence_parallel_region along dim 2: all-gather forward,
    reduce-scatter backward."""

    @staticmethod
    def forward(ctx, x, a):
        ctx.a = a
        return gather_dim(x, a.comm, 2)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_dim(grad, ctx.a.comm, 2), None


def seq_to_heads(x, comm):
    c = comm.size
    B, nh, Tl, hd = x.shape
    inp = x.reshape(B, c, nh // c, Tl, hd).permute(1, 0, 2, 3, 4).contiguous()
    out = comm.all_to_all(inp)
    return out.permute(1, 2, 0, 3, 4).reshape(B, nh // c, c * Tl, hd)


def heads_to_seq(x, comm):
    c = comm.size
    B, nhl, T, hd = x.shape
    inp = x.reshape(B, nhl, c, T // c, hd).permute(2, 0, 1, 3, 4).contiguous()
    out = comm.all_to_all(inp)
    return out.permute(1, 0, 2, 3, 4).reshape(B, c * nhl, T // c, hd)


class SeqToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, a):
        ctx.a = a
        return seq_to_heads(x, a.comm)

    @staticmethod
    def backward(ctx, grad):
        return heads_to_seq(grad, ctx.a.comm), None


class HeadsToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, a):
        ctx.a = a
        return heads_to_seq(x, a.comm)

    @staticmethod
    def backward(ctx, grad):
        return seq_to_heads(grad, ctx.a.comm), None


def rows_attention(q, k, v, qpos):
    hd, T = q.size(3), k.size(2)
    att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
    att = att.masked_fill(future_mask(qpos, torch.arange(T, dtype=torch.long)), -INF)
    return torch.matmul(torch.softmax(att, dim=-1), v)


def causal_attention(q, k, v):
    T, hd = q.size(2), q.size(3)
    att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    att = att.masked_fill(mask.logical_not(), -INF)
    return torch.matmul(torch.softmax(att, dim=-1), v)


# ----------------------------------------------------------------------------
# The exact attention and the bounds (cp::attention_bounds)
# ----------------------------------------------------------------------------

def attention_bounds(q32, k32, v32, dy32, blocks, grad_terms):
    with torch.no_grad():
        e_exp = 2 * U
        T, hd = q32.size(2), q32.size(3)
        nb = float(blocks)
        scale = struct.unpack("f", struct.pack("f", 1.0 / math.sqrt(hd)))[0]  # as the fp32 code multiplies
        q, k, v, dy = q32.double(), k32.double(), v32.double(), dy32.double()
        future = torch.ones(T, T, dtype=torch.bool).tril().logical_not()
        s = torch.matmul(q, k.transpose(-2, -1)) * scale
        s_m = s.masked_fill(future, -INF)
        lse = torch.logsumexp(s_m, -1, keepdim=True)
        w = torch.exp(s_m - lse)
        o = torch.matmul(w, v)
        open_ = future.logical_not().to(torch.float64)
        es = (torch.matmul(q.abs(), k.abs().transpose(-2, -1)) * (scale * gamma(hd)) + U * s.abs()) * open_
        Es = es.max(-1, keepdim=True)[0]
        R = ((s_m.max(-1, keepdim=True)[0] - s).abs() * open_).max(-1, keepdim=True)[0]
        eps = 2 * Es + (nb + 1) * (U * R + e_exp) + gamma(T + 2 * blocks + 2)
        w_absv = torch.matmul(w, v.abs())
        by = (eps + gamma(T + 2 * blocks)) * w_absv
        eps_b = 2 * eps + Es + U * (2 * lse.abs() + R + math.log(T)) + 2 * e_exp
        dP = torch.matmul(dy, v.transpose(-2, -1))
        dP_err = torch.matmul(dy.abs(), v.abs().transpose(-2, -1)) * gamma(hd)
        D = (dy * o).sum(-1, keepdim=True)
        dD = ((dy.abs() * by).sum(-1, keepdim=True) + gamma(hd) * (dy.abs() * o.abs()).sum(-1, keepdim=True)
              + (eps_b + gamma(T)) * (w * dP.abs()).sum(-1, keepdim=True) + (w * dP_err).sum(-1, keepdim=True))
        dS = w * (dP - D)
        dS_err = eps_b * (w * (dP - D).abs()) + w * (dP_err + dD) + 2 * U * (w * (dP - D).abs())
        refs = [o, torch.matmul(dS, k) * scale, torch.matmul(dS.transpose(-2, -1), q) * scale,
                torch.matmul(w.transpose(-2, -1), dy)]
        b_dv = (torch.matmul((eps_b * w).transpose(-2, -1), dy.abs())
                + gamma(T + grad_terms) * torch.matmul(w.transpose(-2, -1), dy.abs()))
        b_dq = scale * (torch.matmul(dS_err, k.abs()) + gamma(T + 2 * blocks + 1) * torch.matmul(dS.abs(), k.abs()))
        b_dk = scale * (torch.matmul(dS_err.transpose(-2, -1), q.abs())
                        + gamma(T + grad_terms + 1) * torch.matmul(dS.abs().transpose(-2, -1), q.abs()))
        hi = 1 + 2 * eps_b.max().item()
        return refs, [by * hi, b_dq * hi, b_dk * hi, b_dv * hi]


def max_abs(a, b):
    return (a.double() - b.double()).abs().max().item()


def worst_ratio(got, want, bound):
    d = (got.double() - want.double()).abs()
    r = torch.where(bound > 0, d / bound, torch.where(d > 0, torch.full_like(d, INF), torch.zeros_like(d)))
    return r.max().item()


def gather_sequence(local, comm, split, dim):
    """Every rank's share along `dim` -> the whole sequence in natural order (on every rank)."""
    c = comm.size
    parts = [torch.empty_like(local.contiguous()) for _ in range(c)]
    dist.all_gather(parts, local.contiguous())
    T = local.size(dim) * c
    sizes = list(local.shape)
    sizes[dim] = T
    full = torch.empty(sizes, dtype=local.dtype)
    for r in range(c):
        full.index_copy_(dim, positions(T, c, r, split), parts[r])
    return full


# ----------------------------------------------------------------------------
# The sections
# ----------------------------------------------------------------------------

def attention_rows(cfg, comm):
    m = cfg["model"]
    B, T, nh, hd = cfg["data"]["batch"], cfg["data"]["seq"], m["heads"], m["width"] // m["heads"]
    c, rank = comm.size, comm.rank
    torch.manual_seed(cfg["seed"])
    q, k, v, dy = (torch.randn(B, nh, T, hd) for _ in range(4))
    q1, k1, v1 = (x.clone().requires_grad_(True) for x in (q, k, v))
    y1 = causal_attention(q1, k1, v1)
    y1.backward(dy)
    one = [y1.detach(), q1.grad, k1.grad, v1.grad]
    rows = []

    def add_rows(run, got, blocks, terms):
        refs, bounds = attention_bounds(q, k, v, dy, blocks, terms)
        for name, g, o, ref, bnd in zip(("y", "dq", "dk", "dv"), got, one, refs, bounds):
            rows.append({"name": f"{run}/{name}", "vs_one_process": max_abs(g, o), "vs_exact": max_abs(g, ref),
                         "max_bound": bnd.max().item(), "worst_ratio": worst_ratio(g, ref, bnd)})

    if rank == 0:
        add_rows("one_process", one, 1, 1)
    for split in SPLITS:
        for variant in VARIANTS:
            pos = positions(T, c, rank, split)
            ql, kl, vl = (x.index_select(2, pos).requires_grad_(True) for x in (q, k, v))
            attn = Attention(comm, variant, split)
            yl = attn(ql, kl, vl)
            yl.backward(dy.index_select(2, pos))
            got = [gather_sequence(x, comm, split, 2) for x in (yl.detach(), ql.grad, kl.grad, vl.grad)]
            if rank == 0:
                add_rows(f"{variant}/{split}", got, c if variant == "ring" else 1, 1 if variant == "ulysses" else c)
    return rows


def mpt_name(name):
    """TinyGpt's parameter names as core/models/gpt registers them: h.0.ln_1.weight -> h0.ln_1.weight."""
    return re.sub(r"^h\.(\d+)\.", r"h\1.", name)


def new_gpt(cfg):
    m = cfg["model"]
    torch.manual_seed(cfg["seed"])
    return TinyGpt(m["vocab"], m["context"], m["width"], m["heads"], m["layers"], m["mlp_ratio"])


def block_forward(b, x, attn):
    """GptBlockImpl::forward with its attention core replaced by `attn` (q, k, v [B, nh, Tl, hd])."""
    B, C = x.size(0), x.size(2)
    hd = C // b.H
    qkv = b.c_attn(b.ln_1(x))
    Tl, Cq = qkv.size(1), qkv.size(2) // 3
    nh = Cq // hd
    q, k, v = qkv.split(Cq, dim=2)
    q = q.view(B, Tl, nh, hd).transpose(1, 2)
    k = k.view(B, Tl, nh, hd).transpose(1, 2)
    v = v.view(B, Tl, nh, hd).transpose(1, 2)
    y = attn(q, k, v)
    y = y.transpose(1, 2).contiguous().view(B, Tl, Cq)
    r = x + b.attn_proj(y)
    return r + b.mlp_proj(F.gelu(b.c_fc(b.ln_2(r))))


class ReduceFromTp(torch.autograd.Function):
    """All-reduce forward (a copy), identity backward."""

    @staticmethod
    def forward(ctx, x, comm):
        y = x.contiguous().clone()
        comm.all_reduce(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def gpt_loss(model, idx, tgt, pos, attn, B, T):
    x = model.wte(idx) + model.wpe(pos)
    for b in model.h:
        x = block_forward(b, x, attn)
    out = F.linear(model.ln_f(x), model.lm_head.weight)
    V = out.size(-1)
    local = F.cross_entropy(out.reshape(-1, V), tgt.reshape(-1), reduction="sum") / float(B * T)
    return ReduceFromTp.apply(local, attn.comm), out


def ce_reorder_bound(logits, targets):
    V = logits.size(1)
    g = gamma(max(V - 1, 1))
    delta = g + 2 * U * (1 + g)
    lg = logits.detach().double()
    m = lg.max(1)[0]
    log_s = (lg - m.unsqueeze(1)).exp().sum(1).log()
    ly = lg.gather(1, targets.view(-1, 1)).squeeze(1) - m
    return 2.0 * (-math.log1p(-delta) + 2 * U * (log_s.abs() + ly.abs()))


def gpt_rows(cfg, comm):
    B, T, V = cfg["data"]["batch"], cfg["data"]["seq"], cfg["model"]["vocab"]
    split = cfg["cp"]["split"]
    c, rank = comm.size, comm.rank
    full = new_gpt(cfg)
    idx = torch.randint(V, (B, T), dtype=torch.long)
    tgt = torch.randint(V, (B, T), dtype=torch.long)
    rows, comms = [], []
    if rank == 0:
        logits1 = full(idx)
        loss1 = F.cross_entropy(logits1.reshape(-1, V), tgt.reshape(-1))
        loss1.backward()
        rows.append({"name": "one_process", "loss": loss1.item(), "loss_diff": 0.0, "logits_diff": 0.0,
                     "grad_diff": 0.0, "grad_rel": 0.0})
    for variant in VARIANTS:
        model = new_gpt(cfg)
        pos = positions(T, c, rank, split)
        attn = Attention(comm, variant, split)
        comm.reset()
        loss, logits = gpt_loss(model, idx.index_select(1, pos), tgt.index_select(1, pos), pos, attn, B, T)
        loss.backward()
        comms.append(dict(comm.counts))
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
        logits = gather_sequence(logits.detach(), comm, split, 1)
        if rank != 0:
            continue
        grads = dict((mpt_name(n), p.grad) for n, p in model.named_parameters())
        per_param, gd, grel = {}, 0.0, 0.0
        for n, p in full.named_parameters():
            d = max_abs(grads[mpt_name(n)], p.grad)
            per_param[mpt_name(n)] = d
            gd = max(gd, d)
            grel = max(grel, d / max(p.grad.abs().max().item(), 1e-300))
        ld = max_abs(logits, logits1.detach())
        bound = 2 * (gamma(B * T + c) + U) * loss1.item()
        if ld > 0:
            dl = (logits.double() - logits1.detach().double()).abs().reshape(-1, V).max(1)[0]
            bound += ((2 * dl + ce_reorder_bound(logits1.detach().reshape(-1, V), tgt.reshape(-1))).sum()
                      / float(B * T)).item()
        rows.append({"name": variant, "loss": loss.item(), "loss_diff": abs(loss.item() - loss1.item()),
                     "loss_bound": bound, "logits_diff": ld, "grad_diff": gd, "grad_rel": grel, "grads": per_param})
    return rows, comms


def balance_rows(cfg, comm):
    m = cfg["model"]
    T, nh, hd = cfg["balance"]["seq"], m["heads"], m["width"] // m["heads"]
    c, rank = comm.size, comm.rank
    torch.manual_seed(cfg["seed"])
    q, k, v = (torch.randn(1, nh, T, hd) for _ in range(3))
    rows = []
    for split in SPLITS:
        pos = positions(T, c, rank, split)
        attn = Attention(comm, "ring", split)
        ran = 0
        for _ in range(cfg["balance"]["steps"]):
            attn.pairs = 0
            ql, kl, vl = (x.index_select(2, pos).requires_grad_(True) for x in (q, k, v))
            attn(ql, kl, vl).sum().backward()
            ran = attn.pairs // 2  # forward and backward compute the same pairs
        everyone = [torch.zeros(1, dtype=torch.long) for _ in range(c)]
        dist.all_gather(everyone, torch.tensor([ran], dtype=torch.long))
        total = sum(float(causal_pairs(T, c, r, split)) for r in range(c))
        for r in range(c):
            useful = causal_pairs(T, c, r, split)
            rows.append({"name": f"{split}/{r}", "useful": useful, "useful_vs_mean": useful / (total / c),
                         "computed": ring_computed_pairs(T, c, r, split), "ran": int(everyone[r][0])})
    return rows


def bytes_per_layer(variant, c, blk):
    if variant == "ring":
        return (2 * (c - 1) + 2 * (c - 1) + 2 * c) * blk * (1 if c > 1 else 0)
    if variant == "all_gather":
        return 4 * (c - 1) * blk
    return 8 * (c - 1) / c * blk


def comm_rows(cfg, c, comms):
    m = cfg["model"]
    B, T, L = cfg["data"]["batch"], cfg["data"]["seq"], m["layers"]
    blk = float(B * (T // c) * m["width"] * 4)
    rows = []
    for variant, counts in zip(VARIANTS, comms):
        sent, kinds = 0.0, []
        for kind in sorted(counts):
            if kind == "all_reduce":  # the loss's one float
                continue
            sent += counts[kind][2]
            kinds.append(f"{kind} x{counts[kind][0]}")
        formula = float(L) * bytes_per_layer(variant, float(c), blk)
        rows.append({"name": variant, "kinds": " ".join(kinds), "sent": sent, "formula": formula,
                     "per_layer_blocks": formula / float(L) / blk})
    return rows


def ranks_results(rank, c, doc):
    """One rank's work; rank 0's return value is the reference's results."""
    cfg = doc["config"]
    ring_rs = doc["env"].get("dist", {}).get("reduce_scatter", "ring").startswith("ring") or \
        not hasattr(dist, "reduce_scatter_tensor")
    comm = Comm(rank, c, ring_rs)
    results = {"attention": attention_rows(cfg, comm)}
    results["gpt"], comms = gpt_rows(cfg, comm)
    results["balance"] = balance_rows(cfg, comm)
    results["comm"] = comm_rows(cfg, c, comms)
    return results


def main():
    result_path = sys.argv[1]
    c = int(json.load(open(result_path))["env"]["cp_degree"])
    gloo_ranks.run(c, result_path, ranks_results, "contextparallel_ref.py")


if __name__ == "__main__":
    main()
