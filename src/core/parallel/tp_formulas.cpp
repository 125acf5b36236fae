// core/parallel/tp_formulas: the formulas of tensor parallelism — the reordering bounds its checks
// compare against (Higham) and the activation memory per layer (Korthikanti et al. 2022). See tp.hpp.
#include <algorithm>
#include <cmath>

#include "core/numerics/bounds.hpp"
#include "core/parallel/tp.hpp"

namespace mpt::tp {

// ----------------------------------------------------------------------------
// Bounds
// ----------------------------------------------------------------------------

torch::Tensor reorder_bound(const torch::Tensor& x, const torch::Tensor& a, const torch::Tensor& b) {
  const int64_t k = x.size(-1);
  auto s = torch::matmul(x.detach().to(torch::kDouble).abs(), a.detach().to(torch::kDouble).abs().t());
  if (b.defined()) s = s + b.detach().to(torch::kDouble).abs();
  return 2.0 * bounds::gamma(k + (b.defined() ? 1 : 0)) * s;
}

torch::Tensor sum_reorder_bound(const torch::Tensor& x, int64_t dim) {
  return 2.0 * bounds::gamma(std::max<int64_t>(x.size(dim) - 1, 1)) * x.detach().to(torch::kDouble).abs().sum(dim);
}

torch::Tensor ce_reorder_bound(const torch::Tensor& logits, const torch::Tensor& targets) {
  const double u = bounds::kFp32UnitRoundoff;
  const int64_t v = logits.size(1);
  const double g = bounds::gamma(std::max<int64_t>(v - 1, 1)), delta = g + 2 * u * (1 + g);
  auto l = logits.detach().to(torch::kDouble);
  auto m = std::get<0>(l.max(1));
  auto log_s = (l - m.unsqueeze(1)).exp().sum(1).log();
  auto ly = l.gather(1, targets.view({-1, 1})).squeeze(1) - m;
  return 2.0 * (-std::log1p(-delta) + 2 * u * (log_s.abs() + ly.abs()));
}

// ----------------------------------------------------------------------------
// Activation memory
// ----------------------------------------------------------------------------

double korthikanti_bytes(int64_t s, int64_t b, int64_t h, int64_t a, int64_t t, bool sp) {
  const double sbh = static_cast<double>(s) * b * h, as_h = static_cast<double>(a) * s / h, td = static_cast<double>(t);
  if (sp) return sbh / td * (34 + 5 * as_h);
  return sbh * (10 + 24 / td + 5 * as_h / td);
}

double fp32_activation_bytes(int64_t s, int64_t b, int64_t h, int64_t a, int64_t t, bool sp) {
  const double sbh = static_cast<double>(s) * b * h, as_h = static_cast<double>(a) * s / h, td = static_cast<double>(t);
  if (sp) return sbh * (8 / td + 8 + 48 / td + 4 * as_h / td);
  return sbh * (16 + 48 / td + 4 * as_h / td);
}

}  // namespace mpt::tp
