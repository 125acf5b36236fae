#include "core/models/moe.hpp"

#include <cmath>
#include <stdexcept>

namespace mpt::moe {

Balance balance_from_name(const std::string& name) {
  if (name == "none") return Balance::None;
  if (name == "aux_loss") return Balance::AuxLoss;
  if (name == "aux_free") return Balance::AuxFree;
  throw std::invalid_argument("moe: unknown balancing \"" + name + "\" (expected none, aux_loss or aux_free)");
}

std::string balance_name(Balance b) {
  switch (b) {
    case Balance::None: return "none";
    case Balance::AuxLoss: return "aux_loss";
    case Balance::AuxFree: return "aux_free";
  }
  return "?";
}

void check_moe_config(const MoeConfig& m) {
  if (m.experts < 1) throw std::invalid_argument("MoeConfig: experts must be >= 1, got " + std::to_string(m.experts));
  if (m.top_k < 1 || m.top_k > m.experts)
    throw std::invalid_argument("MoeConfig: top_k must be in [1, experts = " + std::to_string(m.experts) + "], got " +
                                std::to_string(m.top_k));
  if (!std::isfinite(m.capacity_factor) || m.capacity_factor <= 0)
    throw std::invalid_argument("MoeConfig: capacity_factor must be finite and > 0, got " +
                                std::to_string(m.capacity_factor));
  if (!(m.aux_loss_coeff >= 0) || !(m.bias_update_rate >= 0))
    throw std::invalid_argument("MoeConfig: aux_loss_coeff and bias_update_rate must be >= 0");
}

int64_t capacity(int64_t tokens, const MoeConfig& m) {
  const double c = std::ceil(static_cast<double>(tokens) * static_cast<double>(m.top_k) * m.capacity_factor /
                             static_cast<double>(m.experts));
  return std::max<int64_t>(1, std::min<int64_t>(tokens, static_cast<int64_t>(c)));
}

Routing route(const torch::Tensor& logits, const torch::Tensor& bias, const MoeConfig& m, int64_t cap) {
  const int64_t N = logits.size(0), E = logits.size(1), k = m.top_k;
  TORCH_CHECK(E == m.experts, "moe::route: logits have ", E, " experts, the config ", m.experts);
  Routing r;
  r.capacity = cap;
  r.probs = torch::softmax(logits.to(torch::kFloat), /*dim=*/-1);
  {
    torch::NoGradGuard ng;
    auto scores = r.probs.detach();
    if (m.balance == Balance::AuxFree) scores = scores + bias.to(scores.dtype());
    r.expert = std::get<1>(torch::topk(scores, k, /*dim=*/-1));  // largest first
  }
  r.gate = r.probs.gather(1, r.expert);
  if (k > 1) r.gate = r.gate / r.gate.sum(-1, /*keepdim=*/true);
  torch::NoGradGuard ng;
  // Megatron-core's "position" drop policy: the routing map [N, E], each expert's running count
  // down the tokens, kept while under the capacity.
  auto map = torch::zeros({N, E}, torch::kLong).scatter_(1, r.expert, 1);
  auto position = map.cumsum(0) - 1;                               // [N, E]
  auto pos_k = position.gather(1, r.expert);                       // [N, k]
  r.slot = torch::where(pos_k < cap, pos_k, torch::full_like(pos_k, -1));
  r.counts = map.sum(0);
  r.kept = torch::clamp_max(r.counts, cap);
  if (m.balance == Balance::AuxLoss) {
    // Switch (Fedus et al. 2021, eq. 4): α·E·Σ_i f_i·P_i, f_i = counts_i/(N·k) (no gradient), P_i the mean prob.
    auto f = r.counts.to(torch::kFloat) / static_cast<double>(N * k);
    torch::AutoGradMode on(true);
    r.aux = (r.probs.mean(0) * f).sum() * (m.aux_loss_coeff * static_cast<double>(E));
  } else {
    r.aux = torch::zeros({}, torch::kFloat);
  }
  return r;
}

namespace {

// For every (token, choice): its row in the flattened [E·cap] buffer, or E·cap (a padding row)
// where it was dropped.
torch::Tensor buffer_rows(const Routing& r, int64_t E) {
  const int64_t pad = E * r.capacity;
  return torch::where(r.slot >= 0, r.expert * r.capacity + r.slot, torch::full_like(r.slot, pad));
}

}  // namespace

torch::Tensor dispatch(const torch::Tensor& h, const Routing& r) {
  const int64_t N = h.size(0), C = h.size(1), E = r.probs.size(1), cap = r.capacity;
  // src[row] = the token in that buffer row, N (a zero row appended to h) where the row is empty.
  torch::Tensor src;
  {
    torch::NoGradGuard ng;
    const auto rows = buffer_rows(r, E).reshape({-1});
    const auto tokens = torch::arange(N, torch::kLong).unsqueeze(1).expand({N, r.slot.size(1)}).reshape({-1});
    src = torch::full({E * cap + 1}, N, torch::kLong).index_put_({rows}, tokens).narrow(0, 0, E * cap);
  }
  const auto padded = torch::cat({h, torch::zeros({1, C}, h.options())}, 0);
  return padded.index_select(0, src).view({E, cap, C});
}

torch::Tensor combine(const torch::Tensor& out, const Routing& r) {
  const int64_t E = out.size(0), cap = out.size(1), C = out.size(2), N = r.slot.size(0), k = r.slot.size(1);
  const auto flat = torch::cat({out.reshape({E * cap, C}), torch::zeros({1, C}, out.options())}, 0);
  const auto rows = buffer_rows(r, E);
  auto picked = flat.index_select(0, rows.reshape({-1})).view({N, k, C});
  auto y = picked.select(1, 0) * r.gate.select(1, 0).unsqueeze(1);
  for (int64_t j = 1; j < k; ++j) y = y + picked.select(1, j) * r.gate.select(1, j).unsqueeze(1);
  return y;
}

ExpertImpl::ExpertImpl(int64_t width, int64_t hidden) {
  c_fc = register_module("c_fc", torch::nn::Linear(width, hidden));
  c_proj = register_module("c_proj", torch::nn::Linear(hidden, width));
}

torch::Tensor ExpertImpl::forward(const torch::Tensor& x) {
  return torch::linear(torch::gelu(torch::linear(x, c_fc->weight, c_fc->bias)), c_proj->weight, c_proj->bias);
}

MoeMlpImpl::MoeMlpImpl(int64_t width, int64_t hidden, int64_t n) {
  router = register_module("router", torch::nn::Linear(torch::nn::LinearOptions(width, n).bias(false)));
  auto list = register_module("experts", torch::nn::ModuleList());
  for (int64_t i = 0; i < n; ++i) {
    experts.push_back(Expert(width, hidden));
    list->push_back(experts.back());
  }
  expert_bias = register_buffer("expert_bias", torch::zeros({n}));
}

torch::Tensor apply_expert(const ExpertFn& fn, MoeMlpImpl& mlp, int64_t i, const torch::Tensor& x) {
  return fn ? fn(mlp, i, x) : mlp.experts[static_cast<std::size_t>(i)]->forward(x);
}

torch::Tensor LocalExperts::run(MoeMlpImpl& mlp, const torch::Tensor& buffers) {
  const int64_t G = buffers.size(0), E = buffers.size(1), cap = buffers.size(2), C = buffers.size(3);
  auto x = buffers.permute({1, 0, 2, 3}).reshape({E, G * cap, C});
  std::vector<torch::Tensor> ys;
  for (int64_t i = 0; i < E; ++i) ys.push_back(apply_expert(fn_, mlp, i, x[i]));
  return torch::stack(ys).view({E, G, cap, C}).permute({1, 0, 2, 3});
}

MoeBlockImpl::MoeBlockImpl(const GptConfig& c, int64_t experts) : heads(c.heads) {
  ln_1 = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})));
  c_attn = register_module("c_attn", torch::nn::Linear(c.width, 3 * c.width));
  attn_proj = register_module("attn_proj", torch::nn::Linear(c.width, c.width));
  ln_2 = register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})));
  mlp = register_module("mlp", MoeMlp(c.width, c.mlp_ratio * c.width, experts));
}

MoeGptImpl::MoeGptImpl(const GptConfig& c, const MoeConfig& m) : cfg(c), moe(m) {
  check_gpt_config(c);
  check_moe_config(m);
  wte = register_module("wte", torch::nn::Embedding(c.vocab, c.width));
  wpe = register_module("wpe", torch::nn::Embedding(c.context, c.width));
  for (int64_t i = 0; i < c.layers; ++i)
    blocks.push_back(register_module("h" + std::to_string(i), MoeBlock(c, m.experts)));
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})));
  lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(c.width, c.vocab).bias(false)));
}

std::vector<torch::Tensor> MoeGptImpl::forward(const std::vector<torch::Tensor>& idx, Experts& experts,
                                               std::vector<LayerRouting>* routing, const GptLinear& linear) {
  TORCH_CHECK(!idx.empty(), "MoeGpt: no group");
  const auto G = idx.size();
  const int64_t T = idx[0].size(1), C = cfg.width;
  TORCH_CHECK(T <= cfg.context, "MoeGpt: sequence of ", T, " tokens is longer than the context (", cfg.context, ")");
  for (const auto& x : idx) TORCH_CHECK(x.sizes() == idx[0].sizes(), "MoeGpt: groups of different shapes");
  const auto pos = torch::arange(T, torch::kLong);
  std::vector<torch::Tensor> x(G);
  for (std::size_t g = 0; g < G; ++g) {
    auto tok = wte->forward(idx[g]);  // sequenced, as Python's left-to-right wte(idx) + wpe(pos)
    x[g] = tok + wpe->forward(pos);
  }
  aux_.assign(G, {});
  if (routing) routing->clear();
  const int64_t B = idx[0].size(0), N = B * T, cap = capacity(N, moe);
  for (std::size_t l = 0; l < blocks.size(); ++l) {
    auto& block = blocks[l];
    const std::string prefix = "h" + std::to_string(l) + ".";
    std::vector<torch::Tensor> r(G), bufs(G);
    std::vector<Routing> routes(G);
    for (std::size_t g = 0; g < G; ++g) {
      r[g] = gpt_attention_residual(x[g], block->ln_1, block->c_attn, block->attn_proj, block->heads, {}, linear, prefix);
      auto h = block->ln_2->forward(r[g]).reshape({N, C});
      routes[g] = route(torch::linear(h, block->mlp->router->weight), block->mlp->expert_bias, moe, cap);
      bufs[g] = dispatch(h, routes[g]);
      aux_[g].push_back(routes[g].aux);
    }
    const auto out = experts.run(*block->mlp, torch::stack(bufs));
    for (std::size_t g = 0; g < G; ++g)
      x[g] = r[g] + combine(out[static_cast<int64_t>(g)], routes[g]).view({B, T, C});
    if (routing) {
      LayerRouting lr;
      std::vector<torch::Tensor> counts, kept;
      for (const auto& rt : routes) {
        counts.push_back(rt.counts);
        kept.push_back(rt.kept);
      }
      lr.counts = torch::stack(counts);
      lr.kept = torch::stack(kept);
      lr.capacity = cap;
      routing->push_back(lr);
    }
  }
  std::vector<torch::Tensor> logits(G);
  for (std::size_t g = 0; g < G; ++g) logits[g] = torch::linear(ln_f->forward(x[g]), lm_head->weight);
  return logits;
}

torch::Tensor MoeGptImpl::aux_loss(int64_t g, int64_t total_groups) const {
  auto s = torch::zeros({}, torch::kFloat);
  for (const auto& a : aux_.at(static_cast<std::size_t>(g))) s = s + a;
  return s / static_cast<double>(total_groups);
}

void MoeGptImpl::update_bias(const torch::Tensor& loads) {
  if (moe.balance != Balance::AuxFree) return;
  torch::NoGradGuard ng;
  for (std::size_t l = 0; l < blocks.size(); ++l) {
    const auto load = loads[static_cast<int64_t>(l)].to(torch::kFloat);
    blocks[l]->mlp->expert_bias.add_(torch::sign(load.mean() - load) * moe.bias_update_rate);
  }
}

int64_t moe_gpt_num_params(const GptConfig& c, int64_t experts) {
  const int64_t C = c.width, H = c.mlp_ratio * C;
  const int64_t block = 2 * C + C * 3 * C + 3 * C + C * C + C + 2 * C  // ln_1, c_attn, attn c_proj, ln_2
                        + experts * C                                  // router
                        + experts * (C * H + H + H * C + C);           // experts
  return c.vocab * C + c.context * C + c.layers * block + 2 * C + c.vocab * C;
}

torch::Tensor group_lm_loss(const torch::Tensor& logits, const torch::Tensor& targets, int64_t total_tokens) {
  const int64_t V = logits.size(-1);
  return torch::nn::functional::cross_entropy(
             logits.reshape({-1, V}).to(torch::kFloat), targets.reshape({-1}),
             torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)) /
         static_cast<double>(total_tokens);
}

}  // namespace mpt::moe
