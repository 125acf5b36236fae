#!/usr/bin/python3
"""PyTorch-Python twin of `mpt fp4`'s training, every variant (fp32, bf16, nvfp4, nvfp4_no_sr,
nvfp4_no_rht, nvfp4_no_2d, nvfp4_no_bf16, mxfp4); run with the Python of the LibTorch mpt was
built against (MPT_REF_PYTHON).

    fp4_ref.py MPT_RESULT.json [--change CHOICE]  > reference.json

Reads the resolved config from an mpt result file and trains the same MLP (784 - hidden - 10,
torch.manual_seed(seed) then nn.Linear's init) on the same batches (torch.randperm with the seed
seed + 1000003*(epoch + 1)) with the same SGD steps on fp32 master weights, as fp8_ref.py does.
Each Linear is a torch.autograd.Function whose three GEMMs (out = x W^T + b, dgrad = dy W,
wgrad = dy^T x) multiply quantize-dequantized operands in fp32 with torch.mm / torch.addmm.
The quantizers are written here from their definitions, on values, not ported from core/numerics/quant's
bit manipulation:

  E2M1 (FP4), round to nearest even: the grid 0, 0.5, 1, 1.5, 2, 3, 4, 6; with E = floor(log2 |t|)
      (torch.frexp) the step is ulp = 2^(max(E, 0) - 1), and q = torch.round(|t| / ulp) * ulp
      (torch.round rounds half to even; |t| / ulp is exact); |t| is clamped at 6 first.
  E2M1, stochastic rounding (NVFP4 paper §4.3; mpt's bits): q = ulp * floor(|t| / ulp + U), U
      the top k bits of SplitMix64(seed, flat index) / 2^k, k the number of bits of |t|'s 24-bit
      fp32 significand below ulp (integer arithmetic in Python, exact). Which random bits are
      added is mpt's convention (no standard fixes it), so the twin takes it from mpt: the top k
      of the 64; |t| < 2^-41 (k >= 64) gives 0, as mpt's `shift >= 64` case.
  UE4M3 block scales: s = clamp(amax_block / 6 / s_tensor, 2^-6, 448) rounded to E4M3 (3
      mantissa bits: ulp 2^(E - 3), torch.round), under the fp32 tensor scale
      s_tensor = amax / (448 * 6) (1 where amax = 0); elements t = x * ((1 / s_tensor) / s),
      dequantized as q * (s_tensor * s) (torchao nvfp4_quantize's order, in fp32).
  Blocks: 1x16 along each GEMM's reduction dim (x, dy, dy^T, x^T), 16x16 for W and W^T (2-D:
      the same blocks either way); nvfp4_no_2d: W and W^T in 1x16 along their own last dim.
  E8M0 scales (MXFP4, OCP MX v1.0 §6.3, FLOOR): e = clamp(floor(log2 amax) - 2, -127, 128) + 127
      over 1x32 blocks, amax = 0 giving e = 0; t = x / max(2^(e-127), 2^-126) and the
      dequantized value q * 2^(e-127) (torchao to_mx's clamp of the divisor at 2^-126).
  RHT (wgrad, NVFP4 paper §4.2): every 16 consecutive elements along the batch of both dy^T and
      x^T multiplied by T = H16 diag(signs) / 4, H16 the Sylvester Hadamard matrix (Kronecker
      powers of [[1, 1], [1, -1]]), sign j negative when the top bit of SplitMix64(seed, j) is set.
  bf16: t.to(torch.bfloat16).to(torch.float32) (round to nearest even).

Seeds as mpt derives them (core/numerics/quant_recipe.cpp): layer l's recipe seed is seed + 7919*(l + 1); a GEMM
g (out 0, dgrad 1, wgrad 2) of step t gets gs = SplitMix64(rs ^ SplitMix64(3t + g)); operand A
rounds with SplitMix64(gs + 1), B with SplitMix64(gs + 2), the RHT signs use
SplitMix64(gs ^ 0x52485431). SplitMix64 and random_bits are underflow_ref.py's.

The first and last Linear are bf16 (the first too is 4-bit in nvfp4_no_bf16). It prints the
reference `results` (history, the variants table with the GEMM errors at ledger.step, the loss
curve); compare.py checks mpt's numbers against it exactly.

--change CHOICE makes the twin wrong on purpose, to show the parity test can fail:
  sr_seed      operand A's stochastic rounding uses SplitMix64(gs + 3) instead of gs + 1
  rht_signs    the RHT signs from the lowest bit instead of the top one
  scale_floor  the UE4M3 block scale rounded down (toward zero) instead of to nearest even
  tensor_scale no fp32 tensor scale under the UE4M3 block scales
  e8m0_ceil    MX scales with CEIL instead of FLOOR
  batches      the permutation of epoch e seeded with seed + 1000003*e
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fmnist  # noqa: E402
import mpt_threads  # noqa: E402
from underflow_ref import M64, random_bits, splitmix64  # noqa: E402  mpt's SplitMix64

ap = argparse.ArgumentParser()
ap.add_argument("result")
ap.add_argument("--change", default="", choices=["", "sr_seed", "rht_signs", "scale_floor", "tensor_scale", "e8m0_ceil",
                                                  "batches"])
args = ap.parse_args()
CHANGE = args.change

doc = json.load(open(args.result))
mpt_threads.use(args.result)
cfg = doc["config"]
seed = cfg["seed"]
VARIANTS = ("fp32", "bf16", "nvfp4", "nvfp4_no_sr", "nvfp4_no_rht", "nvfp4_no_2d", "nvfp4_no_bf16", "mxfp4")
for v in cfg["variants"]:
    if v not in VARIANTS:
        sys.exit(f"fp4_ref.py: no twin for variant {v} (expected one of {', '.join(VARIANTS)})")

train_x, train_y = fmnist.load(cfg["data"]["dir"], "train", cfg["data"]["train_samples"])
test_x, test_y = fmnist.load(cfg["data"]["dir"], "test", cfg["data"]["test_samples"])
widths = [784] + cfg["model"]["hidden"] + [10]
L = len(widths) - 1
E2M1_MAX, E4M3_MAX = 6.0, 448.0


# ───────────────────────────── element roundings ─────────────────────────────

def pow2(k):
    """2^k as fp32 for an int64 tensor k in [-126, 127], built exactly from its exponent field."""
    return ((k + 127) << 23).to(torch.int32).view(torch.float32)


def floor_log2(a):
    """floor(log2 a) for positive finite fp32 a (int64); frexp gives a = m * 2^e with m in [0.5, 1)."""
    return torch.frexp(a).exponent.to(torch.int64) - 1


def e2m1_rne(t):
    """t (fp32, |t| <= 6 after the clamp) rounded to the nearest E2M1 value, ties to even."""
    a = t.abs()
    ulp = pow2(floor_log2(a).clamp(min=0) - 1)  # a = 0: frexp's exponent 0 gives ulp 0.5, q = 0
    q = torch.round(a / ulp) * ulp
    return torch.copysign(q.clamp(max=E2M1_MAX), t)


def e2m1_sr(t, seed):
    """t (fp32) stochastically rounded to E2M1 with random bits SplitMix64(seed, flat index)."""
    a = t.abs().contiguous()
    m, e = torch.frexp(a)
    E = e.to(torch.int64) - 1
    sig = (m.double() * 2.0**24).to(torch.int64)  # the 24-bit significand: a = sig * 2^(e - 24)
    k = (E.clamp(min=0) - 1) - (e.to(torch.int64) - 24)  # bits of sig below the target's ulp (>= 22)
    base = splitmix64(seed)
    n = []
    for i, (s, kk) in enumerate(zip(sig.flatten().tolist(), k.flatten().tolist())):
        if s == 0 or kk >= 64:
            n.append(0)
        else:
            r = splitmix64((base + i) & M64)  # random_bits(seed, i)
            n.append((s + (r >> (64 - kk))) >> kk)
    n = torch.tensor(n, dtype=torch.float32).reshape(a.shape)
    q = n * pow2(E.clamp(min=0) - 1)
    return torch.copysign(q.clamp(max=E2M1_MAX), t)


def e4m3_rne(s):
    """Positive fp32 s in [2^-6, 448] (E4M3's normal range) rounded to E4M3, ties to even."""
    ulp = pow2(floor_log2(s) - 3)
    if CHANGE == "scale_floor":
        return torch.floor(s / ulp) * ulp
    return torch.round(s / ulp) * ulp


# ───────────────────────────── block quantizers ─────────────────────────────

def blocks_of(x, block):
    """x [R, C] (made contiguous) viewed as [R/br, br, C/bc, bc] and its block amax [R/br, C/bc]."""
    R, C = x.shape
    br, bc = block
    xb = x.contiguous().reshape(R // br, br, C // bc, bc)
    return xb, xb.abs().amax(dim=(1, 3))


def nvfp4(x, block, sr_seed=None):
    """NVFP4 quantize-dequantize of fp32 x [R, C]: E2M1 in `block` blocks, UE4M3 scales, fp32 tensor scale."""
    xb, amax = blocks_of(x, block)
    tmax = amax.max()
    if CHANGE == "tensor_scale":
        pts = torch.ones(())
    else:
        pts = tmax / (E4M3_MAX * E2M1_MAX) if tmax.item() != 0 else torch.ones(())
    s = (amax / E2M1_MAX / pts).clamp(2.0**-6, E4M3_MAX)
    sf = e4m3_rne(s)
    mul = (1.0 / pts) / sf
    deq = pts * sf
    t = (xb * mul[:, None, :, None]).clamp(-E2M1_MAX, E2M1_MAX)
    q = e2m1_rne(t) if sr_seed is None else e2m1_sr(t, sr_seed)
    return (q * deq[:, None, :, None]).reshape(x.shape)


def mxfp4(x):
    """MXFP4 quantize-dequantize of fp32 x [R, C]: E2M1 in 1x32 blocks, E8M0 scales by FLOOR."""
    xb, amax = blocks_of(x, (1, 32))
    p = torch.where(amax == 0, torch.full_like(amax, -127, dtype=torch.int64), floor_log2(amax))
    if CHANGE == "e8m0_ceil":
        p = p + (amax != pow2(p.clamp(-126, 127))).to(torch.int64)
    e = (p - 2).clamp(-127, 128) + 127  # 2 = floor(log2 6), E2M1's largest exponent
    deq = torch.tensor([2.0 ** (v - 127) for v in e.flatten().tolist()], dtype=torch.float32).reshape(e.shape)
    mul = 1.0 / deq.clamp(min=2.0**-126)
    t = (xb * mul[:, None, :, None]).clamp(-E2M1_MAX, E2M1_MAX)
    return (e2m1_rne(t) * deq[:, None, :, None]).reshape(x.shape)


def quantize(x, spec, seed):
    """The operand a GEMM multiplies: fp32 as is, bf16 rounded, or 4-bit quantize-dequantized."""
    kind = spec["kind"]
    if kind == "fp32":
        return x
    if kind == "bf16":
        return x.to(torch.bfloat16).to(torch.float32)
    if kind == "mxfp4":
        return mxfp4(x)
    sr = spec.get("sr", False)
    if sr and CHANGE == "sr_seed" and spec.get("side") == "a":
        seed = splitmix64((seed_of_gemm[0] + 3) & M64)
    return nvfp4(x, spec["block"], seed if sr else None)


def hadamard16():
    h = torch.ones(1, 1)
    for _ in range(4):
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


H16 = hadamard16()


def rht16(x, seed):
    """x [..., K] with every 16 consecutive elements v replaced by T v, T = H16 diag(signs) / 4."""
    bit = (lambda r: r & 1) if CHANGE == "rht_signs" else (lambda r: r >> 63)
    signs = torch.tensor([-1.0 if bit(random_bits(seed, j)) else 1.0 for j in range(16)])
    T = (H16 * signs[None, :] / 4).contiguous()
    return x.reshape(*x.shape[:-1], x.shape[-1] // 16, 16).matmul(T.t()).reshape(x.shape)


# ───────────────────────────── recipes and the quantized Linear ─────────────────────────────

def layer_recipe(v, l):
    """Variant v's recipe of layer l: {gemm: (spec A, spec B, rht)} and its seed."""
    edge = l == L - 1 or (l == 0 and v != "nvfp4_no_bf16")
    if v in ("fp32", "bf16") or edge:
        k = {"kind": "fp32" if v == "fp32" else "bf16"}
        return {g: (k, k, False) for g in ("out", "dgrad", "wgrad")}, 0
    rs = (seed + 7919 * (l + 1)) & M64
    if v == "mxfp4":
        k = {"kind": "mxfp4"}
        return {g: (k, k, False) for g in ("out", "dgrad", "wgrad")}, rs
    act = {"kind": "nvfp4", "block": (1, 16)}
    wt = {"kind": "nvfp4", "block": (1, 16) if v == "nvfp4_no_2d" else (16, 16)}
    grad = {"kind": "nvfp4", "block": (1, 16), "sr": v != "nvfp4_no_sr", "side": "a"}
    return {"out": (act, wt, False), "dgrad": (grad, wt, False), "wgrad": (grad, act, v != "nvfp4_no_rht")}, rs


seed_of_gemm = [0]  # the GEMM seed gs in use (for --change sr_seed)


def gemm_seed(rs, step, g):
    return splitmix64(rs ^ splitmix64((3 * step + g) & M64))


def qgemm(a, bt, rec, gs, bias=None, errors=None):
    """C = Q(A) Q(Bt)^T (+ bias); appends ||C - C_fp32|| / ||C_fp32|| to `errors` when given."""
    sa, sb, rht = rec
    a_in, b_in = a, bt
    if rht:
        rseed = splitmix64(gs ^ 0x52485431)
        a_in, b_in = rht16(a, rseed), rht16(bt, rseed)
    seed_of_gemm[0] = gs
    qa = quantize(a_in, sa, splitmix64((gs + 1) & M64))
    qb = quantize(b_in, sb, splitmix64((gs + 2) & M64))
    c = torch.addmm(bias, qa, qb.t()) if bias is not None else qa.mm(qb.t())
    if errors is not None:
        ref = torch.addmm(bias, a, bt.t()) if bias is not None else a.mm(bt.t())
        # in float64, as mpt's relative_error: an fp32 norm overflows for large operands
        den, num = ref.double().norm().item(), (c.double() - ref.double()).norm().item()
        errors.append(num / den if den > 0 else (0.0 if num == 0 else math.inf))
    return c


class Layer:
    def __init__(self, v, l):
        self.recipe, self.seed = layer_recipe(v, l)
        self.four_bit = self.recipe["out"][0]["kind"] in ("nvfp4", "mxfp4")
        self.step = 0           # forwards so far (mpt's QuantLinear::step_)
        self.record = False     # this step's GEMM errors are recorded (the ledger step)
        self.errors = {}


class QLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, layer):
        ctx.save_for_backward(x, w)
        ctx.layer, ctx.step = layer, layer.step
        errs = [] if layer.record else None
        y = qgemm(x, w, layer.recipe["out"], gemm_seed(layer.seed, layer.step, 0), bias=b, errors=errs)
        if errs:
            layer.errors["out"] = errs[0]
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        layer, step = ctx.layer, ctx.step
        ed, ew = ([], []) if layer.record else (None, None)
        dx = qgemm(dy, w.t(), layer.recipe["dgrad"], gemm_seed(layer.seed, step, 1), errors=ed)
        dw = qgemm(dy.t(), x.t(), layer.recipe["wgrad"], gemm_seed(layer.seed, step, 2), errors=ew)
        if ed:
            layer.errors["dgrad"], layer.errors["wgrad"] = ed[0], ew[0]
        return dx, dw, dy.sum(0), None


def forward(params, layers, x):
    h = x.reshape(x.shape[0], -1)
    for i, layer in enumerate(layers):
        z = QLinear.apply(h, params[2 * i], params[2 * i + 1], layer)
        layer.step += 1
        h = torch.relu(z) if i + 1 < L else z
    return h


def evaluate(params, layers, xs, ys):
    return fmnist.evaluate(lambda x: forward(params, layers, x), xs, ys)


# ───────────────────────────── the ablation grid ─────────────────────────────

torch.manual_seed(seed)
mods = [nn.Flatten()]
for i in range(L):
    mods.append(nn.Linear(widths[i], widths[i + 1]))
    if i + 1 < L:
        mods.append(nn.ReLU())
init = [p.detach().clone() for p in nn.Sequential(*mods).parameters()]

steps, lr = cfg["train"]["steps"], cfg["train"]["lr"]
ledger_step = cfg["ledger"]["step"]
batch = min(cfg["train"]["batch"], train_x.shape[0])
per_epoch = train_x.shape[0] // batch
runs = {}
for v in cfg["variants"]:
    params = [p.clone().requires_grad_(True) for p in init]
    layers = [Layer(v, l) for l in range(L)]
    losses = []
    for step in range(steps):
        for layer in layers:
            layer.record = step == ledger_step
        epoch = step // per_epoch
        pseed = seed + 1000003 * (epoch if CHANGE == "batches" else epoch + 1)
        perm = torch.randperm(train_x.shape[0], generator=torch.Generator().manual_seed(pseed))
        idx = perm[(step % per_epoch) * batch:(step % per_epoch) * batch + batch]
        x, y = train_x.index_select(0, idx), train_y.index_select(0, idx)
        for p in params:
            p.grad = None
        loss = F.cross_entropy(forward(params, layers, x), y)
        loss.backward()
        with torch.no_grad():
            for p in params:
                p.add_(p.grad, alpha=-lr)
        losses.append(loss.item())
    for layer in layers:
        layer.record = False
    test_loss, test_acc = evaluate(params, layers, test_x, test_y)
    # Mean GEMM error over the 4-bit layers (every layer for fp32 and bf16).
    err = {}
    for g in ("out", "dgrad", "wgrad"):
        vals = [layer.errors[g] for layer in layers if (v in ("fp32", "bf16") or layer.four_bit) and g in layer.errors]
        err[g] = sum(vals) / len(vals) if vals else math.nan
    runs[v] = {"loss": losses, "test_loss": test_loss, "test_accuracy": test_acc, "errors": err}


def gap(base, v, key):
    return runs[v][key] - runs[base][key] if base in runs else None


def num(x):
    return x if math.isfinite(x) else ("nan" if math.isnan(x) else ("inf" if x > 0 else "-inf"))


rows, history = [], {}
for v in cfg["variants"]:
    r = runs[v]
    rows.append({"name": v, "test_loss": r["test_loss"], "test_accuracy": r["test_accuracy"],
                 "loss_gap_bf16": gap("bf16", v, "test_loss"), "loss_gap_nvfp4": gap("nvfp4", v, "test_loss"),
                 "accuracy_gap_bf16": gap("bf16", v, "test_accuracy"),
                 "out_error": num(r["errors"]["out"]), "dgrad_error": num(r["errors"]["dgrad"]),
                 "wgrad_error": num(r["errors"]["wgrad"]), "last_loss": r["loss"][-1]})
    history[v] = r["loss"]
curve = []
for s in range(0, steps, cfg["train"]["log_every"]):
    row = {"name": f"step{s}", "step": s}
    row.update({v: runs[v]["loss"][s] for v in cfg["variants"]})
    curve.append(row)
print(json.dumps({"history": history, "variants": rows, "loss_curve": curve}))
