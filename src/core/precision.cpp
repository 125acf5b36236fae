// Number formats and rounding. See precision.hpp.
#include "core/precision.hpp"

#include <cmath>
#include <optional>
#include <stdexcept>

#include "core/quant.hpp"

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

// fp8 through core/quant: the cast of the LibTorch 2.x fp8 dtypes, bit for bit (E4M3
// saturates, E5M2 overflows to inf), on every route (1.13 has no fp8 dtype).
quant::Element fp8_element(Format f) { return f == Format::FP8_E4M3 ? quant::Element::E4M3 : quant::Element::E5M2; }

torch::Tensor round_fp8(const torch::Tensor& x32, Format f, std::optional<quant::Overflow> overflow = std::nullopt) {
  quant::CastOptions o;
  o.overflow = overflow;
  return quant::cast(x32.cpu(), fp8_element(f), o).to(x32.device());
}

}  // namespace

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

}  // namespace mpt
