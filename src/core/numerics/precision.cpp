// Number formats and rounding. See precision.hpp.
#include "core/numerics/precision.hpp"

#include <atomic>
#include <cmath>
#include <limits>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>

#include <ATen/Parallel.h>

#include "core/numerics/quant.hpp"
#include "core/numerics/rounding_simd.hpp"

namespace mpt {

namespace {

FormatInfo make(Format f, std::string name, int bits, int ebits, int mbits, int emax, bool has_inf, double max) {
  const int bias = (1 << (ebits - 1)) - 1;
  const int emin = 1 - bias;
  FormatInfo i{f, std::move(name), bits, ebits, mbits, emin, emax, max,
               std::ldexp(1.0, emin), std::ldexp(1.0, emin - mbits), std::ldexp(1.0, -mbits), has_inf};
  return i;
}

const std::vector<FormatInfo>& table() {
  // max = (2 − 2^−m)·2^emax for IEEE-style formats; E4M3 reserves only S.1111.111 for NaN,
  // so its largest finite value is 1.75·2^8 = 448.
  static const std::vector<FormatInfo> t = {
      make(Format::FP32, "fp32", 32, 8, 23, 127, true, std::ldexp(2.0 - std::ldexp(1.0, -23), 127)),
      make(Format::FP16, "fp16", 16, 5, 10, 15, true, std::ldexp(2.0 - std::ldexp(1.0, -10), 15)),
      make(Format::BF16, "bf16", 16, 8, 7, 127, true, std::ldexp(2.0 - std::ldexp(1.0, -7), 127)),
      make(Format::FP8_E4M3, "fp8_e4m3", 8, 4, 3, 8, false, 448.0),
      make(Format::FP8_E5M2, "fp8_e5m2", 8, 5, 2, 15, true, 57344.0),
  };
  return t;
}

// fp8 through core/numerics/quant: the cast of the LibTorch 2.x fp8 dtypes, bit for bit (E4M3
// saturates, E5M2 overflows to inf), on every route (1.13 has no fp8 dtype).
quant::Element fp8_element(Format f) { return f == Format::FP8_E4M3 ? quant::Element::E4M3 : quant::Element::E5M2; }

torch::Tensor round_fp8(const torch::Tensor& x32, Format f, std::optional<quant::Overflow> overflow = std::nullopt) {
  quant::CastOptions o;
  o.overflow = overflow;
  return quant::cast(x32.cpu(), fp8_element(f), o).to(x32.device());
}

// ---------------------------------------------------------------------------------------------
// Fused rounding to fp16 / bf16 on the bits (round_element's doc comment in precision.hpp): the
// loops of core/numerics/rounding_simd at its active level (baseline, AVX2 + F16C or AVX-512; equal bit for
// bit), one pass, no branches per element.
// ---------------------------------------------------------------------------------------------
// The fused kernels apply to contiguous fp32 CPU tensors and fp16 / bf16 (CUDA, strided tensors
// and other dtypes take ATen's operators). A tensor that autograd records keeps ATen's
// differentiable casts.
bool fusable(const torch::Tensor& x, Format f) {
  return (f == Format::FP16 || f == Format::BF16) && x.defined() && x.device().is_cpu() &&
         x.scalar_type() == torch::kFloat && x.is_contiguous() &&
         !(x.requires_grad() && torch::GradMode::is_enabled());
}

constexpr int64_t kGrain = 32768;  // elements per parallel_for chunk, as core/train/amp's fused SGD

// Rounds `in` into `out` (both contiguous fp32, same numel; out undefined: count only); returns
// the underflow count when Count. The SIMD level is read once, before any parallel chunk.
template <bool Count>
int64_t round_fused(const torch::Tensor& in, float* op, Format f) {
  const float* ip = in.data_ptr<float>();
  const int64_t n = in.numel();
  const simd::Half h = f == Format::FP16 ? simd::Half::FP16 : simd::Half::BF16;
  const simd::Level level = simd::active_level();
  if (n <= kGrain) return simd::round_span(h, ip, op, n, Count, level);
  std::atomic<int64_t> under{0};
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    under += simd::round_span(h, ip + b, op ? op + b : nullptr, e - b, Count, level);
  });
  return under.load();
}

}  // namespace

float round_element(float x, Format f) {
  return f == Format::FP16 ? detail::round_fp16_element(x) : f == Format::BF16 ? detail::round_bf16_element(x) : x;
}

void round_to_(torch::Tensor& x, Format f) {
  if (x.scalar_type() != torch::kFloat)
    throw std::invalid_argument(std::string("round_to_: expected an fp32 tensor, got ") + c10::toString(x.scalar_type()));
  if (f == Format::FP32) return;
  if (fusable(x, f)) {
    round_fused<false>(x, x.data_ptr<float>(), f);
    return;
  }
  x.copy_(round_to(x, f));
}

int64_t count_underflow(const torch::Tensor& g, Format f) {
  if (f == Format::FP32) return 0;
  if (fusable(g, f)) return round_fused<true>(g, nullptr, f);
  torch::NoGradGuard ng;
  return ((g != 0) & (round_to(g, f) == 0)).sum().item<int64_t>();
}

torch::Tensor round_to_counting_underflow(const torch::Tensor& x, Format f, int64_t* underflow) {
  if (fusable(x, f)) {
    auto out = torch::empty_like(x);
    *underflow += round_fused<true>(x, out.data_ptr<float>(), f);
    return out;
  }
  *underflow += count_underflow(x, f);
  return round_to(x, f);
}

const FormatInfo& format_info(Format f) { return table().at(static_cast<std::size_t>(f)); }

Format parse_format(const std::string& name) {
  for (const auto& i : table())
    if (i.name == name) return i.format;
  throw std::invalid_argument("unknown format \"" + name + "\" (expected fp32, fp16, bf16, fp8_e4m3, fp8_e5m2)");
}

torch::ScalarType storage_dtype(Format f) {
  switch (f) {
    case Format::FP16: return torch::kHalf;
    case Format::BF16: return torch::kBFloat16;
    default: return torch::kFloat;
  }
}

torch::Tensor round_to(const torch::Tensor& x, Format f) {
  if (fusable(x, f)) {  // one pass and one allocation instead of two casts and two allocations
    auto out = torch::empty_like(x);
    round_fused<false>(x, out.data_ptr<float>(), f);
    return out;
  }
  auto x32 = x.to(torch::kFloat);
  switch (f) {
    case Format::FP32: return x32;
    case Format::FP16: return x32.to(torch::kHalf).to(torch::kFloat);
    case Format::BF16: return x32.to(torch::kBFloat16).to(torch::kFloat);
    default: return round_fp8(x32, f);
  }
}

double round_scalar(double x, Format f) {
  auto t = torch::tensor({static_cast<float>(x)}, torch::kFloat);
  return round_to(t, f).item<double>();
}

std::string classify(double stored, Format f) {
  if (std::isnan(stored)) return "nan";
  if (std::isinf(stored)) return "inf";
  if (stored == 0.0) return "zero";
  if (std::fabs(stored) < format_info(f).min_normal) return "subnormal";
  return "normal";
}

std::string classify_cast(double original, Format f) {
  const double stored = round_scalar(original, f);
  if (f == Format::FP8_E4M3 && !std::isnan(original)) {
    auto t = torch::tensor({static_cast<float>(original)}, torch::kFloat);  // ±inf saturates too
    if (!std::isfinite(round_fp8(t, f, quant::Overflow::NonSaturating).item<double>())) return "saturated";
  }
  return classify(stored, f);
}

CastStats cast_stats(const torch::Tensor& x, Format f) {
  auto x32 = x.detach().to(torch::kFloat);
  auto r = round_to(x32, f);
  CastStats s;
  s.numel = x32.numel();
  auto nz = x32 != 0;
  s.zero_before = (~nz).sum().item<int64_t>();
  s.underflow = (nz & (r == 0)).sum().item<int64_t>();
  s.subnormal = (nz & (r != 0) & (r.abs() < format_info(f).min_normal)).sum().item<int64_t>();
  // Overflow: beyond the format's range after rounding — inf where the format has it; for E4M3,
  // which saturates at ±448, the values its non-saturating cast would turn into NaN.
  const auto beyond = (f == Format::FP8_E4M3) ? round_fp8(x32, f, quant::Overflow::NonSaturating) : r;
  s.overflow = (torch::isfinite(x32) & ~torch::isfinite(beyond)).sum().item<int64_t>();
  return s;
}

double relative_error(const torch::Tensor& approx, const torch::Tensor& ref) {
  TORCH_CHECK(approx.sizes() == ref.sizes(), "relative_error: shapes ", approx.sizes(), " and ", ref.sizes(), " differ");
  auto r = ref.to(torch::kDouble);
  const double den = r.norm().item<double>();
  const double num = (approx.to(torch::kDouble) - r).norm().item<double>();
  if (den == 0) return num == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return num / den;
}

}  // namespace mpt
