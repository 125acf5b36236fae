// Floating-point error bounds (bounds.hpp): unit roundoff, γ_n, the reordering bound.
#include "core/numerics/bounds.hpp"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace mpt::bounds {

double unit_roundoff(const std::string& format) {
  if (format == "fp64") return std::ldexp(1.0, -53);
  if (format == "fp32") return std::ldexp(1.0, -24);
  if (format == "tf32") return std::ldexp(1.0, -11);
  if (format == "fp16") return std::ldexp(1.0, -11);
  if (format == "bf16") return std::ldexp(1.0, -8);
  throw std::invalid_argument(fmt::format("unknown format \"{}\" (expected fp64, fp32, tf32, fp16 or bf16)", format));
}

double unit_roundoff(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat64: return std::ldexp(1.0, -53);
    case torch::kFloat32: return std::ldexp(1.0, -24);
    case torch::kFloat16: return std::ldexp(1.0, -11);
    case torch::kBFloat16: return std::ldexp(1.0, -8);
    default: throw std::invalid_argument(fmt::format("unit_roundoff: {} is not a floating dtype", c10::toString(dtype)));
  }
}

double gamma(int64_t n, double u) {
  const double nu = static_cast<double>(n) * u;
  if (nu >= 1.0) throw std::invalid_argument(fmt::format("gamma: n·u = {}·{} >= 1 (no bound)", n, u));
  return nu / (1.0 - nu);
}

double reorder(int64_t n, double abs_sum, double u) { return n <= 1 ? 0.0 : 2.0 * gamma(n - 1, u) * abs_sum; }

}  // namespace mpt::bounds
