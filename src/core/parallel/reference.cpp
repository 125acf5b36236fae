// The single-process references of the parallel experiments (reference.hpp).
#include "core/parallel/reference.hpp"

#include <stdexcept>
#include <string>

namespace mpt::reference {

torch::Tensor shard_of(const torch::Tensor& indices, int64_t rank, int64_t replicas, bool drop_last) {
  if (replicas < 1 || rank < 0 || rank >= replicas)
    throw std::invalid_argument("shard_of: expected 0 <= rank < replicas, got rank " + std::to_string(rank) + " of " +
                                std::to_string(replicas));
  if (indices.dim() != 1)
    throw std::invalid_argument("shard_of: expected 1-D indices, got " + std::to_string(indices.dim()) + " dimensions");
  const int64_t n = indices.size(0);
  torch::Tensor all = indices;
  if (drop_last) {
    all = indices.narrow(0, 0, n / replicas * replicas);
  } else if (n > 0 && n % replicas != 0) {
    // indices += (indices * ceil(pad / n))[:pad]: the first elements again, as often as needed
    const int64_t pad = (n + replicas - 1) / replicas * replicas - n;
    all = torch::cat({indices, indices.repeat({(pad + n - 1) / n}).narrow(0, 0, pad)});
  }
  return all.index({torch::indexing::Slice(rank, torch::indexing::None, replicas)});
}

torch::Tensor flat(const std::vector<torch::Tensor>& ts) {
  std::vector<torch::Tensor> v;
  v.reserve(ts.size());
  for (const auto& t : ts) v.push_back(t.detach().reshape({-1}).to(torch::kCPU, torch::kFloat32));
  return torch::cat(v);
}

std::vector<torch::Tensor> take_grads(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> g;
  g.reserve(params.size());
  for (const auto& p : params) {
    g.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
    p.mutable_grad() = torch::Tensor();
  }
  return g;
}

double accumulate_micro_batches(const torch::Tensor& x, const torch::Tensor& y, int64_t micro_batches,
                                const LossFn& loss) {
  if (micro_batches < 1)
    throw std::invalid_argument("accumulate_micro_batches: expected micro_batches >= 1, got " +
                                std::to_string(micro_batches));
  const auto xs = x.tensor_split(micro_batches), ys = y.tensor_split(micro_batches);
  double total = 0;
  for (int64_t m = 0; m < micro_batches; ++m) {
    auto l = loss(xs[static_cast<std::size_t>(m)], ys[static_cast<std::size_t>(m)]) / static_cast<double>(micro_batches);
    l.backward();
    total += l.item<double>();
  }
  return total;
}

std::pair<std::vector<torch::Tensor>, double> rank_mean_gradient(const std::vector<torch::Tensor>& params,
                                                                 const LossFn& loss, const LocalBatch& batch,
                                                                 int64_t step, int64_t ranks, int64_t micro_batches,
                                                                 Mean mean) {
  if (ranks < 1) throw std::invalid_argument("rank_mean_gradient: expected ranks >= 1, got " + std::to_string(ranks));
  const double n = static_cast<double>(ranks);
  std::vector<torch::Tensor> sum;
  double loss_sum = 0;
  for (int64_t r = 0; r < ranks; ++r) {
    for (const auto& p : params) p.mutable_grad() = torch::Tensor();  // each rank starts from no gradient
    auto [x, y] = batch(r, step);
    loss_sum += accumulate_micro_batches(x, y, micro_batches, loss);
    auto g = take_grads(params);
    for (std::size_t i = 0; i < g.size(); ++i) {
      // In rank order, as a two-term all-reduce adds (and any N when the run adds in this order).
      const torch::Tensor term = mean == Mean::DivideEachTerm && ranks > 1 ? g[i] / n : g[i];
      if (r == 0)
        sum.push_back(term);
      else
        sum[i] = sum[i] + term;
    }
  }
  if (mean == Mean::DivideSum && ranks > 1)
    for (auto& s : sum) s = s / n;
  return {std::move(sum), loss_sum / n};
}

namespace {

/// WholeBatch: one backward over the ranks' local batches of `step`, concatenated in rank order;
/// returns the loss.
double whole_batch_step(torch::optim::Optimizer& opt, const LossFn& loss, const LocalBatch& batch, int64_t step,
                        int64_t ranks) {
  std::vector<torch::Tensor> xs, ys;
  for (int64_t r = 0; r < ranks; ++r) {
    auto [x, y] = batch(r, step);
    xs.push_back(x);
    ys.push_back(y);
  }
  opt.zero_grad();
  auto l = loss(torch::cat(xs), torch::cat(ys));
  l.backward();
  return l.item<double>();
}

}  // namespace

Trajectory replay(const std::vector<torch::Tensor>& params, torch::optim::Optimizer& opt, const LossFn& loss,
                  const LocalBatch& batch, const ReplaySpec& spec) {
  if (spec.ranks < 1 || spec.micro_batches < 1)
    throw std::invalid_argument("replay: expected ranks and micro_batches >= 1, got " + std::to_string(spec.ranks) +
                                " and " + std::to_string(spec.micro_batches));
  Trajectory t;
  for (int64_t step = 0; step < spec.steps; ++step) {
    if (spec.on_step) spec.on_step();
    if (spec.mode == Mode::WholeBatch) {
      t.losses.push_back(whole_batch_step(opt, loss, batch, step, spec.ranks));
    } else {
      auto [grads, l] = rank_mean_gradient(params, loss, batch, step, spec.ranks, spec.micro_batches, spec.mean);
      for (std::size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grads[i];
      t.losses.push_back(l);
    }
    opt.step();
    if (spec.every_step) t.params.push_back(flat(params));
  }
  if (!spec.every_step) t.params.push_back(flat(params));
  return t;
}

}  // namespace mpt::reference
