#!/usr/bin/env python3
"""Reference tables for mpt's quantizers (src/core/numerics/quant.*), from PyTorch's own casts and torchao.

    make_tables.py --out DIR     write the tables into DIR
    make_tables.py --check DIR   regenerate them and compare with DIR's; exit 0 equal, 1 different,
                                 77 when this torch has no float8 dtypes (Debian's torch 1.13)

Tables (text, hex, small enough to commit):
  bf16_<fmt>.rle   all 2^16 bf16 bit patterns (as fp32) cast to <fmt>, run-length coded: a line
                   "START CODE" says patterns START.. (up to the next line's START) give CODE.
                   e4m3fn, e5m2, e8m0fnu: torch's casts (x.to(torch.float8_*).view(torch.uint8)).
                   e2m3, e3m2, e2m1: torchao's _f32_to_floatx_unpacked (torch 2.15 has the dtype
                   float4_e2m1fn_x2 but no cast to it; fp6 has no dtype), or the port of it below
                   when torchao is not importable (the port is checked against torchao when it is).
  fp32_cases.txt   random fp32 bit patterns (all classes) plus ties, subnormals, overflow, ±inf,
                   NaN: "BITS e4m3fn e5m2 e8m0fnu e2m3 e3m2 e2m1" codes per line.
  blocks.txt       MX (torchao to_mx, FLOOR/CEIL/EVEN/RCEIL), NVFP4 (nvfp4_quantize, one and two
                   levels) and float8 (amax_to_scale + to_fp8_saturated, tensorwise / rowwise /
                   pow2) on a 32x64 tensor of random and adversarial rows, then the fp8 cases
                   again on a 4x64 tensor with NaN and ±inf (a second "input" section). Needs torchao
                   (PYTHONPATH=<dir with torchao 0.18.0>); without it --check skips this file.
                   Per case: element codes, scale codes (fp32 cases: 1/scale bits) and an FNV-1a 64
                   hash of the dequantized fp32 values.
"""
import argparse
import filecmp
import os
import struct
import sys
import tempfile

import torch

SEED = 20260601


# ───────── port of torchao 0.18.0 torchao/prototype/custom_fp_utils.py:_f32_to_floatx_unpacked ─────────
def _n_ones(n):
    return (1 << n) - 1


def floatx_unpacked(x, ebits, mbits):
    """torchao's fp32 -> sub-byte float (round to nearest even, saturating, no NaN/inf), same steps."""
    assert x.dtype == torch.float
    exp_bias = _n_ones(ebits - 1)
    max_int = _n_ones(ebits + mbits)
    sign_mask = 1 << (ebits + mbits)
    magic_adder = _n_ones(23 - mbits - 1)
    max_normal = 2 ** (_n_ones(ebits) - exp_bias) * (_n_ones(mbits + 1) / (2**mbits))
    min_normal = 2 ** (1 - exp_bias)
    denorm_exp = (127 - exp_bias) + (23 - mbits) + 1
    denorm_mask_int = denorm_exp << 23
    denorm_mask_float = torch.tensor(denorm_mask_int, dtype=torch.int32).view(torch.float32)
    x = x.view(torch.int32)
    sign = x & 0x80000000
    x = x ^ sign
    x = x.view(torch.float)
    saturate_mask = x >= max_normal
    denormal_mask = torch.logical_and(torch.logical_not(saturate_mask), x < min_normal)
    normal_mask = torch.logical_not(torch.logical_or(saturate_mask, denormal_mask))
    denormal_x = x + denorm_mask_float
    denormal_x = denormal_x.view(torch.int32)
    denormal_x -= denorm_mask_int
    denormal_x = denormal_x.to(torch.uint8)
    normal_x = x.view(torch.int32)
    mant_odd = (normal_x >> (23 - mbits)) & 1
    val_to_add = ((exp_bias - 127) << 23) + magic_adder
    normal_x += val_to_add
    normal_x += mant_odd
    normal_x = normal_x >> (23 - mbits)
    normal_x = normal_x.to(torch.uint8)
    x = torch.full_like(x, max_int, dtype=torch.uint8)
    x = torch.where(denormal_mask, denormal_x, x)
    x = torch.where(normal_mask, normal_x, x)
    sign_lp = sign >> (23 + 8 - mbits - ebits)
    sign_lp = sign_lp.to(torch.uint8)
    sign_lp = sign_lp & sign_mask
    x = x | sign_lp
    return x.to(torch.uint8)


def have_torchao():
    try:
        import torchao.prototype.mx_formats.mx_tensor  # noqa: F401
        return True
    except Exception:
        return False


SUBBYTE = {"e2m3": (2, 3), "e3m2": (3, 2), "e2m1": (2, 1)}


def subbyte_cast(x, name):
    ebits, mbits = SUBBYTE[name]
    ours = floatx_unpacked(x.contiguous(), ebits, mbits)
    if have_torchao():
        from torchao.prototype.custom_fp_utils import _f32_to_floatx_unpacked
        ref = _f32_to_floatx_unpacked(x.contiguous(), ebits, mbits)
        assert torch.equal(ours, ref), f"the port of _f32_to_floatx_unpacked differs from torchao for {name}"
    return ours


def element_codes(x):
    """{format: uint8 codes} for fp32 tensor x."""
    out = {
        "e4m3fn": x.to(torch.float8_e4m3fn).view(torch.uint8),
        "e5m2": x.to(torch.float8_e5m2).view(torch.uint8),
        "e8m0fnu": x.to(torch.float8_e8m0fnu).view(torch.uint8),
    }
    for n in SUBBYTE:
        out[n] = subbyte_cast(x, n)
    return out


def bf16_all():
    pats = torch.arange(65536, dtype=torch.int32)
    return (pats << 16).view(torch.float32)


def special_fp32():
    f = []
    # ties and their neighbours at each format's grid, overflow thresholds, subnormals
    for v in [448, 464, 465, 479, 480, 481, 500, 57344, 61439, 61440, 61441, 65536, 6, 6.5, 7, 7.5, 7.75, 8, 28, 30, 32,
              2**-6, 2**-9, 2**-10, 1.5 * 2**-10, 2**-14, 2**-16, 2**-17, 1.5 * 2**-17, 0.25, 0.75, 1.25, 1.0625, 1.1875,
              2**-127, 2**-126, 1.5 * 2**-127, 2**127, 1.5 * 2**127, 1e-45, 1e-40, 3.4028234663852886e38, 0.0]:
        for s in (1, -1):
            f.append(s * float(v))
    f += [float("inf"), float("-inf"), float("nan"), -float("nan")]
    bits = [struct.unpack("<I", struct.pack("<f", v))[0] for v in f]
    # payload NaNs and the bf16-exact neighbours of powers of two
    bits += [0x7F800001, 0xFFC00001, 0x7FFFFFFF, 0x00000001, 0x807FFFFF, 0x3F800001, 0x3F7FFFFF, 0x43E00000, 0x43E7FFFF, 0x43E80000]
    # ties for every element format: value = (odd multiple of half a unit) in each binade
    g = torch.Generator().manual_seed(SEED)
    for _ in range(300):
        e = int(torch.randint(-20, 20, (1,), generator=g))
        m = int(torch.randint(0, 16, (1,), generator=g))
        v = (16 + m + 0.5) * 2.0 ** (e - 4)  # a tie at 4 fraction bits, and nearby grids
        bits.append(struct.unpack("<I", struct.pack("<f", v))[0])
    return bits


def fp32_cases():
    g = torch.Generator().manual_seed(SEED)
    rnd = torch.randint(-(2**31), 2**31 - 1, (1500,), generator=g, dtype=torch.int64)
    bits = special_fp32() + [int(b) & 0xFFFFFFFF for b in rnd]
    # random values in the formats' ranges (the random patterns above are mostly huge or tiny)
    v = torch.randn(1000, generator=g) * torch.exp2(torch.randint(-18, 18, (1000,), generator=g).float())
    bits += [int(b) & 0xFFFFFFFF for b in v.view(torch.int32).tolist()]
    return bits


def write_rle(path, codes):
    codes = codes.tolist()
    with open(path, "w") as f:
        prev = None
        for i, c in enumerate(codes):
            if c != prev:
                f.write(f"{i:04x} {c:02x}\n")
                prev = c


# ───────── block quantizers (torchao) ─────────
def block_input():
    g = torch.Generator().manual_seed(SEED + 1)
    R, C = 32, 64
    x = torch.empty(R, C)
    for r in range(8):
        x[r] = torch.randn(C, generator=g) * 10.0 ** float(torch.empty(1).uniform_(-3, 3, generator=g))
    x[8] = 0.0
    x[9] = torch.randn(C, generator=g) * 0.01
    x[9, 5] = 1e4
    x[9, 40] = -3e4
    for r, amax in ((10, 448.0 * 8), (11, 2.0**5), (12, float(torch.nextafter(torch.tensor(32.0), torch.tensor(64.0)))),
                    (13, float(torch.nextafter(torch.tensor(32.0), torch.tensor(0.0)))),
                    (14, 448.0 * 2**-10 * (1 + 2**-23)), (15, 6.0 * 2**20), (16, 6.0 * 2**20 * (1 + 2**-22))):
        x[r] = torch.rand(C, generator=g) * amax
        x[r, 3] = amax
        x[r, 35] = -amax
    x[17] = torch.randn(C, generator=g) * 1e-40  # fp32 subnormal elements
    x[18] = torch.randn(C, generator=g) * 1e-38
    x[18, ::7] = 0.0
    x[19] = torch.randn(C, generator=g) * 1e-30
    # ties: odd multiples of a half unit of E4M3 / E2M1 at scale 1 (amax 448 or 6 keeps scale 2^0 / 1)
    x[20] = (torch.randint(16, 32, (C,), generator=g).float() + 0.5) / 16.0
    x[20, 0] = 448.0
    x[21] = (torch.randint(0, 12, (C,), generator=g).float() + 0.5) / 2.0
    x[21, 0] = 6.0
    x[22] = torch.randn(C, generator=g) * 1e30
    x[23] = -torch.rand(C, generator=g)
    x[23, 20] = -1e6
    for r in range(24, 32):  # every 16-element block at its own scale
        sc = torch.exp2(torch.randint(-30, 30, (4,), generator=g).float()).repeat_interleave(16)
        x[r] = torch.randn(C, generator=g) * sc
    return x


def hexf(t):
    return " ".join(f"{b & 0xFFFFFFFF:08x}" for b in t.contiguous().view(torch.int32).flatten().tolist())


def fnv1a64(t):
    """FNV-1a 64 over the little-endian bytes of fp32 tensor t (the dequantized values, kept as a hash);
    every NaN counts as 0x7FC00000 (the codes keep NaN's sign; the dequantized NaN's payload is noise)."""
    t = torch.where(torch.isnan(t), torch.full_like(t, float("nan")), t)
    h = 0xCBF29CE484222325
    for b in t.contiguous().view(torch.uint8).flatten().tolist():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def hexb(t):
    return " ".join(f"{b:02x}" for b in t.contiguous().view(torch.uint8).flatten().tolist())


def block_cases(x):
    from torchao.prototype.mx_formats.constants import DTYPE_FP6_E2M3, DTYPE_FP6_E3M2
    from torchao.prototype.mx_formats.kernels import unpack_uint4
    from torchao.prototype.mx_formats.mx_tensor import ScaleCalculationMode, to_dtype, to_mx
    from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale
    from torchao.float8.float8_utils import amax_to_scale, to_fp8_saturated

    cases = []
    elems = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "e2m3": DTYPE_FP6_E2M3, "e3m2": DTYPE_FP6_E3M2,
             "e2m1": torch.float4_e2m1fn_x2}
    modes = {"FLOOR": ScaleCalculationMode.FLOOR, "CEIL": ScaleCalculationMode.CEIL, "EVEN": ScaleCalculationMode.EVEN,
             "RCEIL": ScaleCalculationMode.RCEIL}
    for en, ed in elems.items():
        for mn, md in modes.items():
            if en != "e4m3" and mn in ("CEIL", "EVEN"):
                continue
            scale, data = to_mx(x, ed, 32, md)
            deq = to_dtype(data, scale, ed, 32, torch.float32)
            codes = unpack_uint4(data.view(torch.uint8)) if en == "e2m1" else data.view(torch.uint8)
            cases.append((f"mx_{en}_{mn}", en, "E8M0", mn, 1, 32, 0, 0, x.shape[0], codes, hexb(scale), deq))
    for name, xs, two in (("nvfp4_1level", x, False), ("nvfp4_2level", x, True), ("nvfp4_2level_rows0to7", x[:8].contiguous(), True)):
        pts = per_tensor_amax_to_scale(xs.abs().max()) if two else None
        s8, packed = nvfp4_quantize(xs, 16, pts)
        codes = unpack_uint4(packed)
        from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32
        hp = s8.to(torch.float32) if pts is None else pts * s8.to(torch.float32)
        deq = (f4_unpacked_to_f32(codes).view(xs.shape[0], -1, 16) * hp.view(xs.shape[0], -1, 1)).view(xs.shape)
        cases.append((name, "e2m1", "UE4M3", "-", 1, 16, int(two), 0, xs.shape[0], codes, hexb(s8), deq))
    for name, dt, en, rowwise, pow2 in (("f8_tensorwise_e4m3", torch.float8_e4m3fn, "e4m3", False, False),
                                        ("f8_tensorwise_e5m2", torch.float8_e5m2, "e5m2", False, False),
                                        ("f8_rowwise_e4m3", torch.float8_e4m3fn, "e4m3", True, False),
                                        ("f8_rowwise_pow2_e4m3", torch.float8_e4m3fn, "e4m3", True, True)):
        amax = x.abs().amax(dim=-1, keepdim=True) if rowwise else x.abs().max()
        s = amax_to_scale(amax, dt, round_scales_to_power_of_2=pow2)
        data = to_fp8_saturated(x * s, dt)
        deq = data.to(torch.float32) / s
        inv = (1.0 / s).reshape(-1)
        cases.append((name, en, "FP32", "-", 1 if rowwise else 0, 0, 0, int(pow2), x.shape[0], data.view(torch.uint8), hexf(inv), deq))
    return cases


def special_input():
    """Blocks holding NaN and ±inf (fp8 elements only: torchao's sub-byte casts have no NaN)."""
    g = torch.Generator().manual_seed(SEED + 2)
    x = torch.randn(4, 64, generator=g)
    x[0, 3] = float("nan")
    x[1, 40] = float("inf")
    x[2, 10] = float("-inf")
    x[2, 50] = float("nan")
    x[3] *= 1e3
    return x


def write_blocks(path):
    x = block_input()
    with open(path, "w") as f:
        f.write(f"input {x.shape[0]} {x.shape[1]}\n{hexf(x)}\n")
        cases = block_cases(x)
        xs = special_input()
        special = [("nan_inf_" + c[0],) + c[1:] for c in block_cases(xs) if c[1] in ("e4m3", "e5m2") and c[2] != "UE4M3"]
        for i, case in enumerate(cases + special):
            if i == len(cases):
                f.write(f"input {xs.shape[0]} {xs.shape[1]}\n{hexf(xs)}\n")
            (name, en, sf, rule, br, bc, ts, pow2, rows, codes, scales, deq) = case
            f.write(f"case {name} {en} {sf} {rule} {br} {bc} {ts} {pow2} {rows}\n")
            f.write(f"codes {hexb(codes)}\n")
            f.write(f"scales {scales}\n")
            f.write(f"values_fnv1a64 {fnv1a64(deq):016x}\n")


def write_all(d, blocks=True):
    os.makedirs(d, exist_ok=True)
    xb = bf16_all()
    for n, c in element_codes(xb).items():
        write_rle(os.path.join(d, f"bf16_{n}.rle"), c)
    bits = fp32_cases()
    x = torch.tensor([b - (1 << 32) if b >= 1 << 31 else b for b in bits], dtype=torch.int32).view(torch.float32)
    codes = element_codes(x)
    names = ["e4m3fn", "e5m2", "e8m0fnu", "e2m3", "e3m2", "e2m1"]
    with open(os.path.join(d, "fp32_cases.txt"), "w") as f:
        f.write("# bits " + " ".join(names) + "\n")
        cols = [codes[n].tolist() for n in names]
        for i, b in enumerate(bits):
            f.write(f"{b:08x} " + " ".join(f"{c[i]:02x}" for c in cols) + "\n")
    if blocks:
        write_blocks(os.path.join(d, "blocks.txt"))


def main():
    ap = argparse.ArgumentParser()
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--out")
    g.add_argument("--check")
    a = ap.parse_args()
    missing = [n for n in ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu") if not hasattr(torch, n)]
    if missing:
        print(f"SKIP: torch {torch.__version__} at {sys.executable} has no {', '.join(missing)} "
              "(the tables come from torch >= 2.7; the C++ test still checks mpt against the committed tables)")
        return 77
    torch.manual_seed(0)
    if a.out:
        write_all(a.out)
        return 0
    ao = have_torchao()
    with tempfile.TemporaryDirectory() as tmp:
        write_all(tmp, blocks=ao)
        names = sorted(n for n in os.listdir(tmp))
        bad = [n for n in names if not filecmp.cmp(os.path.join(tmp, n), os.path.join(a.check, n), shallow=False)]
    print(f"torch {torch.__version__}: regenerated {', '.join(names)}")
    if not ao:
        print("FAILED: blocks.txt (the MX and NVFP4 block cases) not regenerated: torchao is not importable "
              f"by {sys.executable}; scripts/setup.sh installs the pinned torchao 0.18.0 "
              "(scripts/torch2-requirements.txt)")
        return 1
    if bad:
        print(f"FAILED: differ from the committed tables: {', '.join(bad)}")
        return 1
    print("OK: equal to the committed tables")
    return 0


if __name__ == "__main__":
    sys.exit(main())
