#include "core/models/gpt.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace mpt {

namespace {

torch::Tensor at_site(const GptHook& hook, const torch::Tensor& x, const char* site) {
  return hook ? hook(x, site) : x;
}

// ATen's linear, as Python's nn.Linear calls it. The C++ frontend's LinearImpl::forward does not:
// for an input of more than two dimensions it computes matmul and then `+= bias`, where ATen
// folds the input to 2-D and adds the bias inside the GEMM (addmm) — other roundings, so a model
// of [B, T, C] activations would not match its Python twin bit for bit.
torch::Tensor linear(const torch::nn::Linear& l, const torch::Tensor& x) {
  return torch::linear(x, l->weight, l->bias);
}

// A block's Linear: through the experiment's GptLinear when one is given.
torch::Tensor linear(const torch::nn::Linear& l, const torch::Tensor& x, const GptLinear& f, const std::string& name) {
  return f ? f(x, l->weight, l->bias, name) : linear(l, x);
}

}  // namespace

void check_gpt_config(const GptConfig& c) {
  const std::pair<const char*, int64_t> sizes[] = {{"vocab", c.vocab},   {"context", c.context},
                                                   {"width", c.width},   {"heads", c.heads},
                                                   {"layers", c.layers}, {"mlp_ratio", c.mlp_ratio}};
  for (const auto& [name, v] : sizes)
    if (v < 1) throw std::invalid_argument(std::string("GptConfig: ") + name + " must be >= 1, got " + std::to_string(v));
  if (c.width % c.heads != 0)
    throw std::invalid_argument("GptConfig: heads (" + std::to_string(c.heads) + ") must divide width (" +
                                std::to_string(c.width) + ")");
}

int64_t gpt_num_params(const GptConfig& c) {
  const int64_t C = c.width, H = c.mlp_ratio * C;
  const int64_t block = 2 * C                 // ln_1
                        + C * 3 * C + 3 * C   // c_attn
                        + C * C + C           // attn c_proj
                        + 2 * C               // ln_2
                        + C * H + H           // c_fc
                        + H * C + C;          // mlp c_proj
  return c.vocab * C + c.context * C + c.layers * block + 2 * C + c.vocab * C;
}

GptBlockImpl::GptBlockImpl(const GptConfig& c) : heads(c.heads) {
  ln_1 = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})));
  c_attn = register_module("c_attn", torch::nn::Linear(c.width, 3 * c.width));
  attn_proj = register_module("attn_proj", torch::nn::Linear(c.width, c.width));
  ln_2 = register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})));
  c_fc = register_module("c_fc", torch::nn::Linear(c.width, c.mlp_ratio * c.width));
  mlp_proj = register_module("mlp_proj", torch::nn::Linear(c.mlp_ratio * c.width, c.width));
}

torch::Tensor gpt_attention_residual(const torch::Tensor& x, torch::nn::LayerNorm& ln_1, torch::nn::Linear& c_attn,
                                     torch::nn::Linear& attn_proj, int64_t heads, const GptHook& hook,
                                     const GptLinear& lin, const std::string& prefix, const GptAttention& attention) {
  const int64_t B = x.size(0), hd = x.size(2) / heads;
  // Attention: nanoGPT's CausalSelfAttention with the "slow" path written out.
  auto h = at_site(hook, ln_1->forward(x), "ln");
  auto qkv = at_site(hook, linear(c_attn, h, lin, prefix + "c_attn"), "qkv");
  // Sequence, width and head count are qkv's: a tensor-parallel GptLinear (core/parallel/tp_gpt)
  // returns this rank's heads [B, T, 3C/t] (of the whole sequence, also under sequence
  // parallelism, where x is [B, T/t, C]); for the plain block T = x.size(1), C = width, nh = heads.
  const int64_t T = qkv.size(1), C = qkv.size(2) / 3, nh = C / hd;
  auto parts = qkv.split(C, /*dim=*/2);
  auto q = parts[0].view({B, T, nh, hd}).transpose(1, 2);  // [B, nh, T, hd]
  auto k = parts[1].view({B, T, nh, hd}).transpose(1, 2);
  auto v = parts[2].view({B, T, nh, hd}).transpose(1, 2);
  torch::Tensor y;
  if (attention) {
    y = attention(q, k, v);
  } else {
    auto att = at_site(hook, torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd))),
                       "scores");
    auto mask = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).tril();
    att = att.masked_fill(mask.logical_not(), -std::numeric_limits<float>::infinity());
    att = at_site(hook, torch::softmax(att, /*dim=*/-1), "probs");
    y = torch::matmul(att, v);
  }
  y = y.transpose(1, 2).contiguous().view({B, T, C});
  y = at_site(hook, linear(attn_proj, y, lin, prefix + "attn_proj"), "attn_out");
  return at_site(hook, x + y, "residual");
}

torch::Tensor GptBlockImpl::forward(const torch::Tensor& x, const GptHook& hook, const GptLinear& lin,
                                    const std::string& prefix, const GptAttention& attention) {
  auto r = gpt_attention_residual(x, ln_1, c_attn, attn_proj, heads, hook, lin, prefix, attention);
  // MLP.
  auto m = at_site(hook, ln_2->forward(r), "ln");
  m = at_site(hook, torch::gelu(linear(c_fc, m, lin, prefix + "c_fc")), "mlp_hidden");
  m = at_site(hook, linear(mlp_proj, m, lin, prefix + "mlp_proj"), "mlp_out");
  return at_site(hook, r + m, "residual");
}

TinyGptImpl::TinyGptImpl(const GptConfig& c) : cfg(c) {
  check_gpt_config(c);
  wte = register_module("wte", torch::nn::Embedding(c.vocab, c.width));
  wpe = register_module("wpe", torch::nn::Embedding(c.context, c.width));
  for (int64_t i = 0; i < c.layers; ++i) blocks.push_back(register_module("h" + std::to_string(i), GptBlock(c)));
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})));
  lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(c.width, c.vocab).bias(false)));
}

torch::Tensor TinyGptImpl::forward(const torch::Tensor& idx, const GptHook& hook, const GptLinear& lin) {
  const int64_t T = idx.size(1);
  TORCH_CHECK(T <= cfg.context, "TinyGpt: sequence of ", T, " tokens is longer than the context (", cfg.context, ")");
  auto pos = torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(idx.device()));
  auto x = at_site(hook, wte->forward(idx) + wpe->forward(pos), "embed");
  for (std::size_t i = 0; i < blocks.size(); ++i) x = blocks[i]->forward(x, hook, lin, "h" + std::to_string(i) + ".");
  x = at_site(hook, ln_f->forward(x), "ln");
  return at_site(hook, linear(lm_head, x), "logits");
}

void scale_qk_init(TinyGptImpl& model, double s) {
  if (!std::isfinite(s) || s <= 0)
    throw std::invalid_argument("scale_qk_init: expected a finite scale > 0, got " + std::to_string(s));
  if (s == 1.0) return;
  torch::NoGradGuard ng;
  const int64_t C = model.cfg.width;
  for (auto& b : model.blocks) b->c_attn->weight.narrow(0, 0, 2 * C).mul_(s);
}

torch::Tensor gpt_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  const int64_t V = logits.size(-1);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, V}).to(torch::kFloat), targets.reshape({-1}));
}

}  // namespace mpt
