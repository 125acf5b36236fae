"""The fp8 twins' quantized Linear (tests/parity/fp8_ref.py for the MLP, fp8_gpt_ref.py for the
tiny GPT): mpt's core/numerics/quant tensorwise recipe written with PyTorch's own fp8 dtypes, as
torchao's float8 tensorwise path does (hp_tensor_and_scale_to_float8 with amax_to_scale):

    s = float32(fp8_max / max(amax, 1e-12))   (the division in float64)
    x_hat = (x * s).clamp(-fp8_max, fp8_max).to(torch.float8_e4m3fn | float8_e5m2).float() / s

The three GEMMs of a Linear (out = x W^T + b, dgrad = dy W, wgrad = dy^T x) multiply the
quantized operands in fp32 in a torch.autograd.Function (QLinear); bf16 casts the operands to
bfloat16 and back, fp32 leaves them as they are.
"""
import torch


def quant(t, kind):
    """The dequantized operand as mpt's core/numerics/quant gives it (fp8: a contiguous copy first)."""
    if kind == "fp32":
        return t
    if kind == "bf16":
        return t.to(torch.bfloat16).to(torch.float32)
    t = t.contiguous()
    fmax = torch.finfo(kind).max
    amax = t.abs().max().to(torch.float64)
    s = (fmax / torch.clamp(amax, min=1e-12)).to(torch.float32)
    return (t * s).clamp(-fmax, fmax).to(kind).to(torch.float32) / s


class QLinear(torch.autograd.Function):
    """x [M, in], w [out, in], b [out] -> [M, out], every GEMM on operands quantized as kinds
    says: {"x": kind, "w": kind, "dy": kind} with kind "fp32", "bf16" or an fp8 dtype."""

    @staticmethod
    def forward(ctx, x, w, b, kinds):
        ctx.save_for_backward(x, w)
        ctx.kinds = kinds
        return torch.addmm(b, quant(x, kinds["x"]), quant(w, kinds["w"]).t())

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        k = ctx.kinds
        dx = quant(dy, k["dy"]).mm(quant(w.t(), k["w"]).t())
        dw = quant(dy.t(), k["dy"]).mm(quant(x.t(), k["x"]).t())
        return dx, dw, dy.sum(0), None


def recipe_kinds(recipe, fp8, fmt):
    """The operand kinds of a Linear under `recipe` (fp32, bf16, tensorwise); `fp8`: whether the
    recipe quantizes this Linear; fmt: mpt's /format (hybrid: dy in E5M2, e4m3: all E4M3)."""
    if recipe == "tensorwise" and fp8:
        dy = torch.float8_e5m2 if fmt == "hybrid" else torch.float8_e4m3fn
        return {"x": torch.float8_e4m3fn, "w": torch.float8_e4m3fn, "dy": dy}
    k = "fp32" if recipe == "fp32" else "bf16"
    return {"x": k, "w": k, "dy": k}
