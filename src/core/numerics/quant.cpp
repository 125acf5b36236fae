// Low-precision quantizers — element formats and casts, the block quantizer (tensorwise,
// rowwise, blockwise, MX, NVFP4 scales), the random Hadamard transform and the GEMM with a
// limited-precision accumulator: see quant.hpp and docs/fp8.md. The recipes and the quantized
// linear layer: quant_recipe.cpp.
#include "core/numerics/quant.hpp"

#include "core/runtime/compat.hpp"
#include "core/runtime/memory.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

namespace mpt::quant {

namespace {

// ═════════════════════════════ bits and random numbers ═════════════════════════════

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

using detail::splitmix64;
std::uint64_t random_bits(std::uint64_t seed, std::uint64_t index) { return splitmix64(splitmix64(seed) + index); }

// ═════════════════════════════ element formats ═════════════════════════════

struct Codes {
  std::uint32_t max_code;  ///< code of the largest finite magnitude
  std::uint32_t inf_code;  ///< E5M2 only
  std::uint32_t nan_code;  ///< E4M3, E5M2
};

const std::vector<ElementInfo>& infos() {
  // max = 2^emax · (2 − 2^−m) for IEEE-like formats; E4M3 gives up S.1111.111 to NaN, so
  // 2^8 · 1.75 = 448; E2M3 / E3M2 / E2M1 use every code for a finite value.
  static const std::vector<ElementInfo> v = {
      {Element::FP32, "fp32", 32, 8, 23, -126, 3.4028234663852886e38, std::ldexp(1.0, -149), true, true},
      {Element::E4M3, "e4m3", 8, 4, 3, -6, 448.0, std::ldexp(1.0, -9), false, true},
      {Element::E5M2, "e5m2", 8, 5, 2, -14, 57344.0, std::ldexp(1.0, -16), true, true},
      {Element::E2M3, "e2m3", 6, 2, 3, 0, 7.5, 0.125, false, false},
      {Element::E3M2, "e3m2", 6, 3, 2, -2, 28.0, 0.0625, false, false},
      {Element::E2M1, "e2m1", 4, 2, 1, 0, 6.0, 0.5, false, false},
      {Element::E8M0, "e8m0", 8, 8, 0, -127, std::ldexp(1.0, 127), std::ldexp(1.0, -127), false, true},
      {Element::BF16, "bf16", 16, 8, 7, -126, 3.3895313892515355e38, std::ldexp(1.0, -133), true, true},
  };
  return v;
}

Codes codes_of(Element e) {
  switch (e) {
    case Element::E4M3: return {0x7E, 0, 0x7F};
    case Element::E5M2: return {0x7B, 0x7C, 0x7F};
    case Element::E2M3: return {0x1F, 0, 0};
    case Element::E3M2: return {0x1F, 0, 0};
    case Element::E2M1: return {0x7, 0, 0};
    default: return {0, 0, 0};
  }
}

Overflow overflow_of(Element e, const CastOptions& opt) {
  if (!opt.overflow) return default_overflow(e);
  const Overflow o = *opt.overflow;
  if (o == Overflow::NonSaturating && !element_info(e).has_inf && !element_info(e).has_nan)
    throw std::invalid_argument(fmt::format("overflow: {} has neither inf nor NaN, so only Saturate is possible "
                                            "(expected Overflow::Saturate or the default)", element_info(e).name));
  return o;
}

/// torch's fp32 → float8_e8m0fnu cast (c10 Float8_e8m0fnu.h): the fp32 exponent, rounded up
/// when the mantissa is above one half (guard bit set and round or sticky set) or exactly one
/// half with an implied leading one (normal input: ties to even on the implied bit); inf/NaN → 0xFF.
/// The sign is ignored.
std::uint8_t encode_e8m0(float x) {
  const std::uint32_t u = bits_of(x);
  std::uint32_t exponent = (u >> 23) & 0xFF;
  if (exponent == 0xFF) return 0xFF;
  const bool g = (u & 0x400000) != 0, r = (u & 0x200000) != 0, s = (u & 0x1FFFFF) != 0;
  const bool lsb = exponent > 0;
  if (g && (r || s || lsb)) ++exponent;
  return static_cast<std::uint8_t>(exponent);
}

std::uint8_t encode_impl(float x, Element e, Overflow ovf, bool stochastic, std::uint64_t rnd) {
  const ElementInfo& fi = element_info(e);
  const Codes cc = codes_of(e);
  const std::uint32_t u = bits_of(x);
  const std::uint32_t sign = (u >> 31) << (fi.bits - 1);
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) {  // NaN; E2M3 / E3M2 / E2M1 have none: mpt gives the signed max code
    return static_cast<std::uint8_t>((fi.has_nan ? cc.nan_code : cc.max_code) | sign);
  }
  if (a == 0x7F800000u) {  // ±inf
    if (fi.has_inf) return static_cast<std::uint8_t>(cc.inf_code | sign);
    return static_cast<std::uint8_t>((ovf == Overflow::Saturate ? cc.max_code : cc.nan_code) | sign);
  }
  // x = sig · 2^L exactly; E = floor(log2 |x|) (any value below emin for fp32 subnormals).
  const int be = static_cast<int>(a >> 23);
  const std::uint64_t sig = be ? ((a & 0x7FFFFFu) | 0x800000u) : (a & 0x7FFFFFu);
  const int L = (be ? be : 1) - 150;
  const int E = be ? be - 127 : -127;
  const int ee = std::max(E, fi.emin);        // exponent of the target binade (subnormals: emin)
  const int shift = ee - fi.mantissa_bits - L; // bits of sig below the target's last place (>= 1)
  std::uint64_t n;
  if (stochastic) {
    // Add `shift` uniform random bits and truncate: rounds away from zero with probability rem / 2^shift.
    n = shift >= 64 ? 0 : (sig + (rnd >> (64 - shift))) >> shift;
  } else if (shift >= 26) {
    n = 0;  // sig < 2^24 <= half a unit
  } else {
    n = sig >> shift;
    const std::uint64_t rem = sig & ((std::uint64_t{1} << shift) - 1), half = std::uint64_t{1} << (shift - 1);
    if (rem > half || (rem == half && (n & 1))) ++n;
  }
  // Code = biased exponent · 2^m + fraction; a carry out of the fraction lands in the exponent.
  const std::int64_t code = static_cast<std::int64_t>(n) + (static_cast<std::int64_t>(ee - fi.emin) << fi.mantissa_bits);
  if (code > static_cast<std::int64_t>(cc.max_code)) {
    if (ovf == Overflow::Saturate) return static_cast<std::uint8_t>(cc.max_code | sign);
    return static_cast<std::uint8_t>((fi.has_inf ? cc.inf_code : cc.nan_code) | sign);
  }
  return static_cast<std::uint8_t>(static_cast<std::uint32_t>(code) | sign);
}

/// Clamp that keeps NaN (torch.clamp's rule).
float clampf(float v, float lo, float hi) {
  if (v < lo) return lo;
  if (v > hi) return hi;
  return v;
}

/// Exact ceil(log2 d) for d > 0 finite (fp32 bits: the exponent, plus one if the value is not a
/// power of two), for d below 2^−126 only whether d exceeds 2^−127 matters after the clamp to −127.
int ceil_log2(float d) {
  const std::uint32_t u = bits_of(d);
  const int be = static_cast<int>(u >> 23);
  if (be == 0) return u > 0x00400000u ? -126 : -127;
  return be - 127 + ((u & 0x7FFFFFu) != 0);
}

}  // namespace

const ElementInfo& element_info(Element e) { return infos().at(static_cast<std::size_t>(e)); }

Element parse_element(const std::string& name) {
  for (const auto& i : infos())
    if (i.name == name) return i.element;
  throw std::invalid_argument("unknown element format \"" + name + "\" (expected fp32, e4m3, e5m2, e2m3, e3m2, e2m1, e8m0, bf16)");
}

Overflow default_overflow(Element e) { return e == Element::E5M2 ? Overflow::NonSaturating : Overflow::Saturate; }

std::uint8_t encode_value(float x, Element e, const CastOptions& opt, std::uint64_t rnd) {
  if (e == Element::BF16) throw std::invalid_argument("encode: bf16 has no 8-bit code (expected e4m3, e5m2, e2m3, e3m2, e2m1, e8m0)");
  if (e == Element::FP32) throw std::invalid_argument("encode: fp32 has no 8-bit code (expected e4m3, e5m2, e2m3, e3m2, e2m1, e8m0)");
  if (e == Element::E8M0) return encode_e8m0(x);
  return encode_impl(x, e, overflow_of(e, opt), opt.rounding == Rounding::Stochastic, rnd);
}

float decode_value(std::uint8_t c, Element e) {
  if (e == Element::E8M0) return c == 0xFF ? std::numeric_limits<float>::quiet_NaN() : std::ldexp(1.0f, static_cast<int>(c) - 127);
  if (e == Element::FP32 || e == Element::BF16) throw std::invalid_argument("decode: fp32 and bf16 have no 8-bit code");
  const ElementInfo& fi = element_info(e);
  const Codes cc = codes_of(e);
  const std::uint32_t mag = c & ((1u << (fi.bits - 1)) - 1);
  const bool neg = (c >> (fi.bits - 1)) & 1;
  float v;
  if (fi.has_nan && (mag == cc.nan_code || (fi.has_inf && mag > cc.inf_code))) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (fi.has_inf && mag == cc.inf_code) {
    v = std::numeric_limits<float>::infinity();
  } else {
    const int ef = static_cast<int>(mag >> fi.mantissa_bits);
    const int m = static_cast<int>(mag & ((1u << fi.mantissa_bits) - 1));
    v = ef == 0 ? std::ldexp(static_cast<float>(m), fi.emin - fi.mantissa_bits)
                : std::ldexp(static_cast<float>(m + (1 << fi.mantissa_bits)), ef - 1 + fi.emin - fi.mantissa_bits);
  }
  return neg ? -v : v;
}

torch::Tensor encode(const torch::Tensor& x, Element e, const CastOptions& opt) {
  auto xf = x.detach().to(torch::kCPU, torch::kFloat).contiguous();
  auto out = torch::empty(xf.sizes(), torch::TensorOptions().dtype(torch::kUInt8));
  const float* p = xf.data_ptr<float>();
  std::uint8_t* q = out.data_ptr<std::uint8_t>();
  const auto n = xf.numel();
  if (e == Element::BF16) throw std::invalid_argument("encode: bf16 has no 8-bit code (expected e4m3, e5m2, e2m3, e3m2, e2m1, e8m0)");
  if (e == Element::FP32) throw std::invalid_argument("encode: fp32 has no 8-bit code (expected e4m3, e5m2, e2m3, e3m2, e2m1, e8m0)");
  if (e == Element::E8M0) {
    for (std::int64_t i = 0; i < n; ++i) q[i] = encode_e8m0(p[i]);
    return out;
  }
  const Overflow ovf = overflow_of(e, opt);
  const bool sr = opt.rounding == Rounding::Stochastic;
  for (std::int64_t i = 0; i < n; ++i)
    q[i] = encode_impl(p[i], e, ovf, sr, sr ? random_bits(opt.seed, static_cast<std::uint64_t>(i)) : 0);
  return out;
}

torch::Tensor decode(const torch::Tensor& codes, Element e) {
  auto c = codes.to(torch::kCPU, torch::kUInt8).contiguous();
  auto out = torch::empty(c.sizes(), torch::TensorOptions().dtype(torch::kFloat));
  const std::uint8_t* p = c.data_ptr<std::uint8_t>();
  float* q = out.data_ptr<float>();
  for (std::int64_t i = 0; i < c.numel(); ++i) q[i] = decode_value(p[i], e);
  return out;
}

torch::Tensor cast(const torch::Tensor& x, Element e, const CastOptions& opt) {
  if (e == Element::FP32) return x.detach().to(torch::kFloat);
  if (e == Element::BF16)
    return opt.rounding == Rounding::Stochastic ? round_bf16_stochastic(x, opt.seed)
                                                : x.detach().to(torch::kBFloat16).to(torch::kFloat);
  auto xf = x.detach().to(torch::kFloat);
  auto v = decode(encode(xf, e, opt), e).to(x.device());
  // E2M3 / E3M2 / E2M1 have no NaN: the emulation carries a NaN input through as NaN.
  if (!element_info(e).has_nan) v = torch::where(torch::isnan(xf), xf, v);
  return v;
}

torch::Tensor round_bf16_stochastic(const torch::Tensor& x, std::uint64_t seed) {
  auto xf = x.detach().to(torch::kCPU, torch::kFloat).contiguous().clone();
  auto* p = reinterpret_cast<std::uint32_t*>(xf.data_ptr<float>());
  const auto n = xf.numel();
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t b = p[i];
    if ((b & 0x7F800000u) == 0x7F800000u) continue;  // inf / NaN: unchanged
    const auto r = static_cast<std::uint32_t>(random_bits(seed, static_cast<std::uint64_t>(i)) & 0xFFFFu);
    p[i] = (b + r) & 0xFFFF0000u;  // a carry into the exponent is the next bf16 up (inf past the max)
  }
  return xf.to(x.device());
}

std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t stream) { return splitmix64(seed ^ splitmix64(stream)); }

// ═════════════════════════════ block scaling ═════════════════════════════

std::string block_name(BlockShape b) {
  if (b.rows == 0 && b.cols == 0) return "tensor";
  if (b.rows == 1 && b.cols == 0) return "row";
  return fmt::format("{}x{}", b.rows == 0 ? std::string("all") : std::to_string(b.rows),
                     b.cols == 0 ? std::string("all") : std::to_string(b.cols));
}

Quantized quantize(const torch::Tensor& x, const QuantSpec& spec) {
  if (x.dim() < 1) throw std::invalid_argument("quantize: expected a tensor with at least one dimension, got a 0-d tensor");
  Quantized out;
  out.numel = x.numel();
  const std::int64_t C = x.size(-1);
  const std::int64_t R = C == 0 ? 0 : x.numel() / C;
  const std::int64_t br = spec.block.rows ? spec.block.rows : std::max<std::int64_t>(R, 1);
  const std::int64_t bc = spec.block.cols ? spec.block.cols : std::max<std::int64_t>(C, 1);
  if (br < 0 || bc < 0 || R % br != 0 || C % bc != 0)
    throw std::invalid_argument(fmt::format(
        "quantize: block {}x{} does not divide the tensor viewed as [{} rows, {} cols] (expected rows a multiple of {} "
        "and the last dimension a multiple of {})", spec.block.rows, spec.block.cols, R, C, br, bc));
  out.blocks = (R / br) * (C / bc);
  if (spec.element == Element::FP32 || spec.element == Element::BF16) {
    auto xf = x.scalar_type() == torch::kFloat ? x.detach() : x.detach().to(torch::kFloat);
    out.scale = torch::ones({R / br, C / bc});
    if (spec.element == Element::FP32) {
      out.values = xf;
      out.amax = out.numel ? xf.abs().max().item<double>() : 0.0;
      return out;
    }
    out.values = xf.to(torch::kBFloat16).to(torch::kFloat);
    // amax (NaN wins, as torch.amax), overflow to inf and flush to zero in one pass.
    auto xc = xf.to(torch::kCPU).contiguous(), vc = out.values.to(torch::kCPU).contiguous();
    const float* px = xc.data_ptr<float>();
    const float* pv = vc.data_ptr<float>();
    float am = 0.0f;
    for (std::int64_t i = 0; i < out.numel; ++i) {
      const float ax = std::fabs(px[i]);
      if (std::isnan(ax) || ax > am) am = std::isnan(am) ? am : ax;
      out.saturated += std::isfinite(px[i]) && std::isinf(pv[i]);
      out.flushed += px[i] != 0.0f && pv[i] == 0.0f;
    }
    out.amax = am;
    out.saturated_blocks = out.saturated > 0;  // bf16 has no blocks: the tensor is one
    return out;
  }
  if (spec.static_scale < 0 || std::isnan(spec.static_scale) ||
      (spec.static_scale > 0 && spec.scale != ScaleFormat::FP32))
    throw std::invalid_argument(fmt::format("quantize: static scale {} (expected 0, or > 0 with fp32 scales)", spec.static_scale));
  if (spec.element == Element::E8M0) throw std::invalid_argument("quantize: e8m0 is a scale format (expected e4m3, e5m2, e2m3, e3m2 or e2m1 elements)");
  const ElementInfo& fi = element_info(spec.element);
  const float emax = static_cast<float>(fi.max);
  auto xf = x.detach().to(torch::kCPU, torch::kFloat).contiguous();
  const float* p = xf.data_ptr<float>();
  const std::int64_t nbr = R / br, nbc = C / bc;
  // Block of element i = r·C + c: (r / br)·nbc + c / bc, with c / bc from a table (no division per element).
  std::vector<std::int64_t> col_block(static_cast<std::size_t>(C));
  for (std::int64_t c = 0; c < C; ++c) col_block[static_cast<std::size_t>(c)] = c / bc;
  auto for_each = [&](auto&& f) {
    for (std::int64_t r = 0, i = 0; r < R; ++r) {
      const std::int64_t base = (r / br) * nbc;
      for (std::int64_t c = 0; c < C; ++c, ++i) f(i, static_cast<std::size_t>(base + col_block[static_cast<std::size_t>(c)]));
    }
  };

  // Block amax (NaN if any element of the block is NaN, as torch.amax).
  std::vector<float> amax(static_cast<std::size_t>(nbr * nbc), 0.0f);
  float tmax = 0.0f;
  for_each([&](std::int64_t i, std::size_t b) {
    float& m = amax[b];
    const float v = std::fabs(p[i]);
    if (std::isnan(v) || v > m) m = std::isnan(m) ? m : v;
  });
  for (float m : amax)
    if (std::isnan(m) || m > tmax) tmax = std::isnan(tmax) ? tmax : m;
  out.amax = tmax;

  // Per block: `mul` multiplies x before the element cast; `deq` (and `deq_div` for FP32 scales)
  // turns the element back into x's units.
  std::vector<float> mul(amax.size()), deq(amax.size());
  auto scale_codes = torch::zeros({nbr, nbc}, torch::TensorOptions().dtype(torch::kUInt8));
  std::uint8_t* sc = scale_codes.data_ptr<std::uint8_t>();
  const bool fp32_scale = spec.scale == ScaleFormat::FP32;
  if (spec.scale == ScaleFormat::FP32) {
    for (std::size_t b = 0; b < amax.size(); ++b) {
      // torchao amax_to_scale: float64 max / clamp(amax, 1e-12), stored as fp32.
      const double am = static_cast<double>(amax[b]);
      float s = static_cast<float>(fi.max / (std::isnan(am) ? am : std::max(am, 1e-12)));
      // torchao _round_scale_down_to_power_of_2: exp2(floor(log2 s)) with an fp32 log2, which rounds up
      // to 2^k for s just below 2^k (then the block max clips at elem_max), as torchao's eager path does.
      if (spec.pow2_scale) s = std::exp2(std::floor(std::log2(s)));
      if (spec.static_scale > 0) s = static_cast<float>(spec.static_scale);  // delayed scaling
      mul[b] = s;
      deq[b] = s;  // divided by (torchao: data / scale)
    }
  } else if (spec.scale == ScaleFormat::E8M0) {
    const int target_pow2 = std::ilogb(fi.max);  // floor(log2 elem_max): 8, 15, 2, 4, 2
    for (std::size_t b = 0; b < amax.size(); ++b) {
      const float am = amax[b];
      std::uint32_t e;
      if (spec.rule == E8M0Rule::RCEIL || spec.rule == E8M0Rule::RCEIL_EXACT) {
        const float descale = am / emax;
        if (std::isnan(descale)) e = 255;
        else if (std::isinf(descale)) e = 254;
        else if (descale == 0) e = 0;
        else if (spec.rule == E8M0Rule::RCEIL_EXACT) e = static_cast<std::uint32_t>(std::clamp(ceil_log2(descale), -127, 127) + 127);
        else e = static_cast<std::uint32_t>(std::clamp(std::ceil(std::log2(descale)), -127.0f, 127.0f) + 127.0f);
        // torchao _to_mx_rceil: the reciprocal scale, with 1.0 for exponent 0 (amax = 0 guard).
        mul[b] = e == 255 ? descale : e == 254 ? std::ldexp(1.0f, -127) : e == 0 ? 1.0f : std::ldexp(1.0f, 127 - static_cast<int>(e));
      } else {
        std::uint32_t ab = bits_of(am);
        if (spec.rule == E8M0Rule::EVEN && !std::isnan(am))
          ab = (ab + (1u << (23 - fi.mantissa_bits - 1))) & (0x1FFu << 23);
        int pow2 = static_cast<int>((ab >> 23) & 0xFF) - 127;
        if (spec.rule == E8M0Rule::CEIL) pow2 += (ab & 0x7FFFFFu) != 0;
        e = std::isnan(am) ? 255u : static_cast<std::uint32_t>(std::clamp(pow2 - target_pow2, -127, 128) + 127);
        // torchao to_mx: scale 2^(e−127) as fp32 bits, clamped below at 2^−126; data / scale.
        const float s = std::max(float_of(e << 23), std::ldexp(1.0f, -126));
        mul[b] = 1.0f / s;  // exact: s is a power of two (or inf for e = 255, giving 0)
      }
      sc[b] = static_cast<std::uint8_t>(e);
      deq[b] = e == 255 ? std::numeric_limits<float>::quiet_NaN() : std::ldexp(1.0f, static_cast<int>(e) - 127);
    }
  } else {  // UE4M3 (NVFP4)
    float pts = 1.0f;
    if (spec.tensor_scale) {
      // torchao per_tensor_amax_to_scale: amax / (448 · elem_max). amax = 0 would give 0/0 = NaN
      // block scales in torchao; mpt uses a tensor scale of 1 there (then every block scale is 2^−6).
      pts = tmax / static_cast<float>(448.0 * fi.max);
      if (tmax == 0.0f) pts = 1.0f;
      out.tensor_scale = pts;
    }
    const CastOptions sat{Rounding::NearestEven, Overflow::Saturate, 0};
    for (std::size_t b = 0; b < amax.size(); ++b) {
      float s = amax[b] / emax;
      if (spec.tensor_scale) s = s / pts;
      s = clampf(s, std::ldexp(1.0f, -6), 448.0f);  // torch.finfo(float8_e4m3fn).tiny, max
      const std::uint8_t code = encode_value(s, Element::E4M3, sat);
      const float sf = decode_value(code, Element::E4M3);
      sc[b] = code;
      mul[b] = spec.tensor_scale ? (1.0f / pts) / sf : 1.0f / sf;
      deq[b] = spec.tensor_scale ? pts * sf : sf;
    }
  }

  // Elements: scale, count and clamp at ±elem_max (every reference clamps before the cast), cast.
  auto codes = torch::empty(xf.sizes(), torch::TensorOptions().dtype(torch::kUInt8));
  auto values = torch::empty(xf.sizes(), torch::TensorOptions().dtype(torch::kFloat));
  std::uint8_t* q = codes.data_ptr<std::uint8_t>();
  float* v = values.data_ptr<float>();
  const bool sr = spec.rounding == Rounding::Stochastic;
  std::vector<char> block_saturated(amax.size(), 0);
  // Decoding through a table of the format's codes (bits <= 8) instead of decode_value per element.
  std::array<float, 256> table{};
  for (int c = 0; c < (1 << fi.bits); ++c) table[static_cast<std::size_t>(c)] = decode_value(static_cast<std::uint8_t>(c), spec.element);
  for_each([&](std::int64_t i, std::size_t b) {
    float t = p[i] * mul[b];
    if (std::fabs(t) > emax) {
      ++out.saturated;
      block_saturated[b] = 1;
    }
    t = clampf(t, -emax, emax);
    q[i] = encode_impl(t, spec.element, Overflow::Saturate, sr, sr ? random_bits(spec.seed, static_cast<std::uint64_t>(i)) : 0);
    const float d = table[q[i]];
    v[i] = std::isnan(t) ? t : fp32_scale ? d / deq[b] : d * deq[b];
    if (p[i] != 0.0f && v[i] == 0.0f) ++out.flushed;
  });
  out.values = values.view(x.sizes()).to(x.device());
  out.codes = codes.view(x.sizes());
  out.scale = torch::empty({nbr, nbc});
  float* sp = out.scale.data_ptr<float>();
  for (std::size_t b = 0; b < amax.size(); ++b) sp[b] = fp32_scale ? 1.0f / deq[b] : deq[b];
  if (!fp32_scale) out.scale_codes = scale_codes;
  for (char c : block_saturated) out.saturated_blocks += c;
  return out;
}

torch::Tensor rht16_matrix(std::uint64_t seed) {
  auto t = torch::empty({16, 16});
  auto a = t.accessor<float, 2>();
  for (int j = 0; j < 16; ++j) {
    const float s = (random_bits(seed, static_cast<std::uint64_t>(j)) >> 63) ? -0.25f : 0.25f;
    for (int i = 0; i < 16; ++i) a[i][j] = (__builtin_popcount(static_cast<unsigned>(i & j)) & 1) ? -s : s;
  }
  return t;
}

torch::Tensor rht16(const torch::Tensor& x, std::uint64_t seed) {
  if (x.dim() < 1 || x.size(-1) % 16 != 0)
    throw std::invalid_argument(fmt::format("rht16: expected the last dimension to be a multiple of 16, got {}",
                                            x.dim() < 1 ? std::string("a 0-d tensor") : std::to_string(x.size(-1))));
  auto xf = x.to(torch::kFloat);
  std::vector<std::int64_t> shape(xf.sizes().begin(), xf.sizes().end());
  shape.back() /= 16;
  shape.push_back(16);
  return xf.reshape(shape).matmul(rht16_matrix(seed).t()).reshape(xf.sizes());
}

// ═════════════════════════════ GEMM and accumulation ═════════════════════════════

torch::Tensor truncate_significand(const torch::Tensor& x, int bits) {
  if (bits < 1 || bits > 24) throw std::invalid_argument(fmt::format("truncate_significand: expected 1..24 bits, got {}", bits));
  if (bits == 24) return x;
  const std::int32_t mask = static_cast<std::int32_t>(~((1u << (24 - bits)) - 1u));
  auto xf = x.to(torch::kFloat).contiguous();
  auto t = xf.view(torch::kInt).bitwise_and(mask).view(torch::kFloat);
  return torch::where(torch::isnan(xf), xf, t);  // masking a NaN's payload could leave inf
}

torch::Tensor gemm(const torch::Tensor& a, const torch::Tensor& bt, const Accumulator& acc) {
  if (a.dim() != 2 || bt.dim() != 2 || a.size(1) != bt.size(1))
    throw std::invalid_argument(fmt::format("gemm: expected A [m,k] and Bt [n,k] with the same k, got [{}] and [{}]",
                                            fmt::join(a.sizes(), ","), fmt::join(bt.sizes(), ",")));
  if (acc.significand_bits == 0) return a.mm(bt.t());
  if (acc.significand_bits < 1 || acc.significand_bits > 24 || acc.chunk < 1 || acc.promote_every < 0 ||
      (acc.promote_every > 0 && acc.promote_every % acc.chunk != 0))
    throw std::invalid_argument(fmt::format("gemm: accumulator with {} significand bits, chunk {}, promotion every {}: expected "
                                            "1..24 bits, chunk >= 1 and promotion 0 or a multiple of the chunk",
                                            acc.significand_bits, acc.chunk, acc.promote_every));
  const std::int64_t k = a.size(1);
  auto part = torch::zeros({a.size(0), bt.size(0)});
  auto total = torch::zeros_like(part);
  for (std::int64_t k0 = 0; k0 < k; k0 += acc.chunk) {
    const std::int64_t len = std::min<std::int64_t>(acc.chunk, k - k0);
    part = truncate_significand(part + a.narrow(1, k0, len).mm(bt.narrow(1, k0, len).t()), acc.significand_bits);
    if (acc.promote_every > 0 && (k0 + len) % acc.promote_every == 0) {
      total = total + part;
      part.zero_();
    }
  }
  return acc.promote_every > 0 ? total + part : part;
}

}  // namespace mpt::quant
