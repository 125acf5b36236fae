#include "core/parallel/ep.hpp"

#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/runtime/trace.hpp"

namespace mpt::ep {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::pair<int64_t, int64_t> local_experts(int64_t E, int64_t e, int64_t r) {
  if (e < 1 || E % e != 0)
    throw std::invalid_argument("ep: the EP degree " + std::to_string(e) + " must divide the experts (" +
                                std::to_string(E) + ")");
  if (r < 0 || r >= e) throw std::out_of_range("ep: rank " + std::to_string(r) + " of " + std::to_string(e));
  return {r * (E / e), E / e};
}

double bytes_per_layer(int64_t e, int64_t E, int64_t cap, int64_t C, double element_bytes) {
  if (e <= 1) return 0;
  return 4.0 * static_cast<double>(e - 1) / static_cast<double>(e) * static_cast<double>(E * cap * C) * element_bytes;
}

double payload_per_layer(int64_t /*e*/, int64_t E, int64_t cap, int64_t C, double element_bytes) {
  return 4.0 * static_cast<double>(E * cap * C) * element_bytes;
}

namespace {

// The all-to-all of equal chunks along dimension 0 as an autograd function: chunk j to rank j; its
// gradient goes back by the same exchange (chunk i of the output's gradient came from rank i).
struct AllToAll : torch::autograd::Function<AllToAll> {
  static torch::Tensor exchange(const torch::Tensor& x, dist::Group& g) {
    auto in = x.contiguous();
    auto out = torch::empty_like(in);
    g.all_to_all(in, out);
    return out;
  }
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t group_addr) {
    ctx->saved_data["g"] = group_addr;
    return exchange(x, *reinterpret_cast<dist::Group*>(static_cast<std::intptr_t>(group_addr)));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {exchange(grad[0], *reinterpret_cast<dist::Group*>(static_cast<std::intptr_t>(ctx->saved_data["g"].toInt()))), torch::Tensor()};
  }
};

torch::Tensor all_to_all(const torch::Tensor& x, dist::Group& g) {
  return AllToAll::apply(x, static_cast<int64_t>(reinterpret_cast<std::intptr_t>(&g)));
}

}  // namespace

ExpertParallel::ExpertParallel(std::shared_ptr<dist::Group> group) : group_(std::move(group)) {}

torch::Tensor ExpertParallel::run(moe::MoeMlpImpl& mlp, const torch::Tensor& buffers) {
  if (buffers.size(0) != 1) throw std::invalid_argument("ExpertParallel: one group per rank");
  const int64_t e = group_->size(), E = buffers.size(1), cap = buffers.size(2), C = buffers.size(3);
  const auto [first, El] = local_experts(E, e, group_->rank());
  // dispatch: [E, cap, C] = e chunks of El experts → [e (source rank), El, cap, C]
  auto recv = all_to_all(buffers[0], *group_).view({e, El, cap, C});
  auto x = recv.permute({1, 0, 2, 3}).reshape({El, e * cap, C});  // each expert: every rank's rows in rank order
  std::vector<torch::Tensor> ys;
  {
    trace::Scope sc(trace::Track::Compute, "experts");
    for (int64_t i = 0; i < El; ++i) ys.push_back(mlp.experts[static_cast<std::size_t>(first + i)]->forward(x[i]));
  }
  // combine: [El, e, cap, C] → e chunks (destination rank) of [El, cap, C] → back: chunk i holds
  // rank i's experts' outputs for this rank's tokens, i.e. [E, cap, C] in expert order.
  auto y = torch::stack(ys).view({El, e, cap, C}).permute({1, 0, 2, 3});
  return all_to_all(y, *group_).view({1, E, cap, C});
}

bool is_expert_param(const std::string& name) { return name.find(".mlp.experts.") != std::string::npos; }

int64_t drop_remote_experts(moe::MoeGptImpl& model, int64_t e, int64_t r) {
  int64_t released = 0;
  torch::NoGradGuard ng;
  for (auto& b : model.blocks) {
    const int64_t E = static_cast<int64_t>(b->mlp->experts.size());
    const auto [first, El] = local_experts(E, e, r);
    for (int64_t i = 0; i < E; ++i) {
      if (i >= first && i < first + El) continue;
      for (auto& p : b->mlp->experts[static_cast<std::size_t>(i)]->parameters()) {
        released += p.numel() * static_cast<int64_t>(p.element_size());
        p.set_data(torch::empty({0}, p.options()));
      }
    }
  }
  return released;
}

void allreduce_dense_grads(moe::MoeGptImpl& model, dist::Group& group, std::map<std::string, torch::Tensor>* abs_sum) {
  for (auto& kv : model.named_parameters()) {
    if (is_expert_param(kv.key())) continue;
    auto g = kv.value().grad();
    if (!g.defined()) continue;
    if (abs_sum) {
      auto a = g.abs();
      group.allreduce(a);
      (*abs_sum)[kv.key()] = a;
    }
    group.allreduce(g);
  }
}

}  // namespace mpt::ep
