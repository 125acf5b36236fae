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

ExpertParallel::ExpertParallel(std::shared_ptr<dist::Group> group, moe::ExpertFn fn)
    : group_(std::move(group)), fn_(std::move(fn)) {}

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
    for (int64_t i = 0; i < El; ++i) ys.push_back(moe::apply_expert(fn_, mlp, first + i, x[i]));
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

TpMoeShards::TpMoeShards(moe::MoeGptImpl& full, std::shared_ptr<dist::Group> tpg, int64_t first, int64_t count)
    : full_(&full) {
  const int64_t t = tpg->size(), r = tpg->rank(), C = full.cfg.width, H = full.cfg.mlp_ratio * C;
  if (full.cfg.heads % t != 0 || H % t != 0)
    throw std::invalid_argument("TpMoeShards: t = " + std::to_string(t) + " must divide the heads (" +
                                std::to_string(full.cfg.heads) + ") and the expert width (" + std::to_string(H) + ")");
  const auto hidden = tp::contiguous_shard(H, t, r), cols_c = tp::contiguous_shard(C, t, r);
  const auto qkv = tp::qkv_shard(C, full.cfg.heads, t, r);
  std::map<std::string, TpLeaf> sharded;  // by the full parameter's name
  for (std::size_t l = 0; l < full.blocks.size(); ++l) {
    auto& b = *full.blocks[l];
    const std::string h = "h" + std::to_string(l) + ".";
    auto col = std::make_unique<tp::ColumnParallelLinear>(b.c_attn->weight, b.c_attn->bias, qkv, tpg);
    auto row = std::make_unique<tp::RowParallelLinear>(b.attn_proj->weight, b.attn_proj->bias, cols_c, tpg);
    sharded[h + "c_attn.weight"] = {h + "c_attn.weight", col->weight, 0, qkv, false};
    sharded[h + "c_attn.bias"] = {h + "c_attn.bias", col->bias, 0, qkv, false};
    sharded[h + "attn_proj.weight"] = {h + "attn_proj.weight", row->weight, 1, cols_c, false};
    sharded[h + "attn_proj.bias"] = {h + "attn_proj.bias", row->bias, -1, {}, false};
    columns_[h + "c_attn"] = std::move(col);
    rows_[h + "attn_proj"] = std::move(row);
    for (int64_t i = first; i < first + count; ++i) {
      auto& ex = *b.mlp->experts[static_cast<std::size_t>(i)];
      const std::string n = h + "mlp.experts." + std::to_string(i) + ".";
      ExpertShards s;
      s.c_fc = std::make_unique<tp::ColumnParallelLinear>(ex.c_fc->weight, ex.c_fc->bias, hidden, tpg);
      s.c_proj = std::make_unique<tp::RowParallelLinear>(ex.c_proj->weight, ex.c_proj->bias, hidden, tpg);
      sharded[n + "c_fc.weight"] = {n + "c_fc.weight", s.c_fc->weight, 0, hidden, true};
      sharded[n + "c_fc.bias"] = {n + "c_fc.bias", s.c_fc->bias, 0, hidden, true};
      sharded[n + "c_proj.weight"] = {n + "c_proj.weight", s.c_proj->weight, 1, hidden, true};
      sharded[n + "c_proj.bias"] = {n + "c_proj.bias", s.c_proj->bias, -1, {}, true};
      experts_[{b.mlp.get(), i}] = std::move(s);
    }
  }
  for (const auto& kv : full.named_parameters()) {
    const auto it = sharded.find(kv.key());
    if (it != sharded.end())
      leaves_.push_back(it->second);
    else if (!is_expert_param(kv.key()) && kv.key().find(".c_attn.") == std::string::npos &&
             kv.key().find(".attn_proj.") == std::string::npos)
      leaves_.push_back({kv.key(), kv.value(), -1, {}, false});
  }
}

GptLinear TpMoeShards::linear() const {
  return [this](const torch::Tensor& x, const torch::Tensor&, const torch::Tensor&, const std::string& name) {
    const auto c = columns_.find(name);
    if (c != columns_.end()) return c->second->forward(x);
    return rows_.at(name)->forward(x);
  };
}

moe::ExpertFn TpMoeShards::expert_fn() const {
  return [this](moe::MoeMlpImpl& mlp, int64_t i, const torch::Tensor& x) {
    const auto& s = experts_.at({&mlp, i});
    return s.c_proj->forward(torch::gelu(s.c_fc->forward(x)));
  };
}

}  // namespace mpt::ep
