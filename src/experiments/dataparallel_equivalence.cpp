// `mpt dataparallel`'s sections in one process (dataparallel_parts.hpp): the whole-batch
// gradient against the average of shard gradients, even and uneven, and fp16's overflow when
// gradients are summed before the division by N.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/models/mlp.hpp"
#include "core/runtime/runtime.hpp"
#include "experiments/dataparallel_parts.hpp"

namespace mpt::dataparallel {

namespace {

/// Linear(in_dim, hidden)-ReLU-Linear(hidden, 1), drawn from the global generator in module order.
torch::nn::Sequential small_net(int64_t in_dim, int64_t hidden) {
  // push_back one by one: the arguments of one call may be evaluated in any order (GCC: right
  // to left), which would draw the second layer's weights first.
  torch::nn::Sequential net;
  net->push_back(torch::nn::Linear(in_dim, hidden));
  net->push_back(torch::nn::ReLU());
  net->push_back(torch::nn::Linear(hidden, 1));
  return net;
}

/// Gradients of mean-MSE of `net` on (x, y), by parameter name, on a fresh copy of `net`.
std::vector<std::pair<std::string, torch::Tensor>> grads_on_copy(const torch::nn::Sequential& net,
                                                                 const torch::Tensor& x, const torch::Tensor& y) {
  auto copy = torch::nn::Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(net->clone()));
  auto loss = torch::mse_loss(copy->forward(x), y);
  loss.backward();
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& kv : copy->named_parameters()) out.emplace_back(kv.key(), kv.value().grad().detach().clone());
  return out;
}

/// The whole batch's gradients by parameter name, and per parameter the naive (1/K) Σ g_k and the
/// sample-weighted Σ (n_k/N) g_k averages of the K shards' gradients; the shard sizes.
struct ShardGrads {
  std::vector<std::pair<std::string, torch::Tensor>> whole;
  std::vector<torch::Tensor> naive, weighted;  // per parameter
  std::vector<int64_t> sizes;
};

/// Seeds with `seed`, builds small_net, draws x [n, in_dim] then y [n, 1] (tests/parity/
/// dataparallel_ref.py's order) and computes ShardGrads over torch.tensor_split(n, shards).
ShardGrads shard_grads(int64_t seed, int64_t in_dim, int64_t hidden, int64_t n, int64_t shards) {
  seed_all(static_cast<std::uint64_t>(seed));
  auto net = small_net(in_dim, hidden);
  auto x = torch::randn({n, in_dim});
  auto y = torch::randn({n, 1});
  ShardGrads r;
  r.whole = grads_on_copy(net, x, y);
  auto xs = x.tensor_split(shards), ys = y.tensor_split(shards);
  std::vector<std::vector<std::pair<std::string, torch::Tensor>>> per;
  for (std::size_t k = 0; k < xs.size(); ++k) {
    per.push_back(grads_on_copy(net, xs[k], ys[k]));
    r.sizes.push_back(xs[k].size(0));
  }
  // Sums in shard order, as tests/parity/dataparallel_ref.py does.
  for (std::size_t p = 0; p < r.whole.size(); ++p) {
    auto naive = per[0][p].second.clone();
    auto weighted = per[0][p].second * static_cast<double>(r.sizes[0]);
    for (std::size_t k = 1; k < per.size(); ++k) {
      naive += per[k][p].second;
      weighted += per[k][p].second * static_cast<double>(r.sizes[k]);
    }
    r.naive.push_back(naive / static_cast<double>(per.size()));
    r.weighted.push_back(weighted / static_cast<double>(n));
  }
  return r;
}

}  // namespace

Table equivalence_table(const Config& cfg, Report& report) {
  const int64_t n = cfg.integer("/equivalence/batch"), k = cfg.integer("/equivalence/shards");  // k <= n: validate
  ShardGrads g = shard_grads(cfg.integer("/seed"), cfg.integer("/equivalence/in_dim"),
                             cfg.integer("/equivalence/hidden"), n, k);
  Table t{"equivalence",
          fmt::format("Equivalence: whole-batch gradient vs average of {} shard gradients (batch {}, MSE)", k, n),
          {text_col("name", "parameter"), text_col("shape", "shape"), sci_col("max_abs_grad", "max|g|"),
           sci_col("max_abs_diff", "max|g - avg|")}};
  double worst = 0;
  for (std::size_t p = 0; p < g.whole.size(); ++p) {
    const auto& w = g.whole[p].second;
    const double d = max_abs_diff(w, g.naive[p]);
    worst = std::max(worst, d);
    std::string shape = w.dim() == 2 ? fmt::format("{}x{}", w.size(0), w.size(1)) : fmt::format("{}", w.size(0));
    t.rows.push_back({{"name", g.whole[p].first}, {"shape", shape}, {"max_abs_grad", w.abs().max().item<double>()},
                      {"max_abs_diff", d}});
  }
  t.notes.push_back("every shard holds b = B/K samples, so the mean of shard means is the whole-batch mean: "
                    "the difference is fp32 roundoff, not a discrepancy");
  report.check("even shards: max |whole-batch grad - shard average|", worst, 1e-6);
  return t;
}

Table uneven_table(const Config& cfg, Report& report) {
  const int64_t n = cfg.integer("/equivalence/uneven_samples"), k = cfg.integer("/equivalence/uneven_shards");
  ShardGrads g = shard_grads(cfg.integer("/seed"), cfg.integer("/equivalence/in_dim"),
                             cfg.integer("/equivalence/hidden"), n, k);
  std::string sizes;
  for (auto s : g.sizes) sizes += (sizes.empty() ? "" : ", ") + std::to_string(s);
  Table t{"uneven",
          fmt::format("Uneven shards: {} samples in {} shards ({}): naive vs sample-weighted average", n, k, sizes),
          {text_col("name", "parameter"), sci_col("max_abs_grad", "max|g|"), sci_col("naive_diff", "naive diff"),
           sci_col("weighted_diff", "weighted diff")}};
  double worst_naive = 0, worst_weighted = 0;
  for (std::size_t p = 0; p < g.whole.size(); ++p) {
    const auto& w = g.whole[p].second;
    const double dn = max_abs_diff(w, g.naive[p]), dw = max_abs_diff(w, g.weighted[p]);
    worst_naive = std::max(worst_naive, dn);
    worst_weighted = std::max(worst_weighted, dw);
    t.rows.push_back({{"name", g.whole[p].first}, {"max_abs_grad", w.abs().max().item<double>()},
                      {"naive_diff", dn}, {"weighted_diff", dw}});
  }
  t.notes.push_back("naive = (1/K) sum_k g_k, what DDP computes: it divides the summed gradients by the world size, "
                    "so a rank with fewer samples weighs as much as a full one and the gradient is biased");
  t.notes.push_back("weighted = sum_k (n_k/N) g_k restores the whole-batch gradient; in DDP: equal shards "
                    "(drop_last / padding in DistributedSampler), or scale each rank's loss by n_k*K/N before backward");
  report.results["uneven_shard_sizes"] = g.sizes;
  report.check("uneven shards: max |whole-batch grad - weighted average|", worst_weighted, 1e-6);
  // The naive average must be measurably biased when shards differ (else the lesson shows nothing).
  bool differ = false;
  for (std::size_t i = 1; i < g.sizes.size(); ++i) differ |= g.sizes[i] != g.sizes[0];
  if (differ) report.check("uneven shards: naive average is biased (1 = not biased beyond 1e-6)",
                           worst_naive > 1e-6 ? 0.0 : 1.0, 0.0);
  return t;
}

Table fp16_table(const Config& cfg) {
  Table fp16{"fp16", "fp16 gradients: sum then divide by N vs divide then sum",
             {text_col("name", "case"), int_col("ranks", "ranks"), float_col("grad", "grad per rank"),
              float_col("sum_then_divide", "sum/N"), float_col("divide_then_sum", "sum(g/N)")}};
  const int64_t k = cfg.integer("/fp16/ranks");
  auto h = torch::full({1}, cfg.number("/fp16/grad"), torch::kFloat16);
  auto sum = h.clone(), sum_div = h / static_cast<double>(k);
  for (int64_t i = 1; i < k; ++i) {
    sum = sum + h;  // fp16 + fp16 rounds to fp16: overflows to inf past 65504
    sum_div = sum_div + h / static_cast<double>(k);
  }
  sum = sum / static_cast<double>(k);
  fp16.rows.push_back({{"name", fmt::format("in_process_{}_ranks", k)}, {"ranks", k}, {"grad", h.item<double>()},
                       {"sum_then_divide", sum.item<double>()}, {"divide_then_sum", sum_div.item<double>()}});
  return fp16;
}

}  // namespace mpt::dataparallel
