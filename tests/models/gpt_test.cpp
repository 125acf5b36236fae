// core/models/gpt: the tiny GPT's shapes, parameter count, module order, causality and the hook sites.
#include <set>
#include <stdexcept>
#include <string>

#include "catch.hpp"
#include "core/models/gpt.hpp"

using namespace mpt;

namespace {
GptConfig small() {
  GptConfig c;
  c.vocab = 11;
  c.context = 8;
  c.width = 16;
  c.heads = 4;
  c.layers = 2;
  return c;
}
}  // namespace

TEST_CASE("TinyGpt: logits [B, T, vocab], parameter count equals gpt_num_params", "[gpt]") {
  torch::manual_seed(0);
  TinyGpt m(small());
  auto idx = torch::randint(11, {3, 5}, torch::kLong);
  auto logits = m->forward(idx);
  CHECK(logits.sizes() == torch::IntArrayRef({3, 5, 11}));
  int64_t n = 0;
  for (const auto& p : m->parameters()) n += p.numel();
  CHECK(n == gpt_num_params(small()));
  // 11·16 + 8·16 + 2·(12·256 + 13·16) + 2·16 + 11·16, by the header's formula written out.
  CHECK(gpt_num_params(small()) == 176 + 128 + 2 * (3072 + 208) + 32 + 176);
  auto loss = gpt_loss(logits, torch::randint(11, {3, 5}, torch::kLong));
  CHECK(loss.dim() == 0);
  CHECK_THROWS(m->forward(torch::zeros({1, 9}, torch::kLong)));  // longer than the context
}

TEST_CASE("TinyGpt draws its weights in module order: wte, wpe, blocks, lm_head", "[gpt]") {
  torch::manual_seed(3);
  TinyGpt m(small());
  torch::manual_seed(3);
  torch::nn::Embedding wte(11, 16), wpe(8, 16);
  torch::nn::Linear c_attn(16, 48);
  CHECK(torch::equal(m->wte->weight, wte->weight));
  CHECK(torch::equal(m->wpe->weight, wpe->weight));
  CHECK(torch::equal(m->blocks[0]->c_attn->weight, c_attn->weight));
  CHECK_FALSE(torch::equal(m->blocks[1]->c_attn->weight.slice(0, 0, 16), m->blocks[0]->c_attn->weight.slice(0, 0, 16)));
}

TEST_CASE("TinyGpt is causal: logits at t do not depend on tokens after t", "[gpt]") {
  torch::manual_seed(1);
  TinyGpt m(small());
  auto a = torch::randint(11, {2, 8}, torch::kLong);
  auto b = a.clone();
  b.index_put_({torch::indexing::Slice(), torch::indexing::Slice(5)}, (a.slice(1, 5) + 1) % 11);
  auto la = m->forward(a), lb = m->forward(b);
  CHECK(torch::equal(la.slice(1, 0, 5), lb.slice(1, 0, 5)));
  CHECK_FALSE(torch::equal(la.slice(1, 5), lb.slice(1, 5)));
}

TEST_CASE("TinyGpt calls the hook at every site, and what it returns is used", "[gpt]") {
  torch::manual_seed(2);
  TinyGpt m(small());
  std::multiset<std::string> seen;
  auto idx = torch::randint(11, {1, 4}, torch::kLong);
  auto plain = m->forward(idx);
  auto same = m->forward(idx, [&](const torch::Tensor& x, const std::string& site) {
    seen.insert(site);
    return x;
  });
  CHECK(torch::equal(plain, same));
  CHECK(seen.count("embed") == 1);
  CHECK(seen.count("ln") == 2 * 2 + 1);
  for (const char* s : {"qkv", "scores", "probs", "attn_out", "mlp_hidden", "mlp_out"}) CHECK(seen.count(s) == 2);
  CHECK(seen.count("residual") == 2 * 2);
  CHECK(seen.count("logits") == 1);
  auto zero = m->forward(idx, [](const torch::Tensor& x, const std::string& site) {
    return site == "logits" ? torch::zeros_like(x) : x;
  });
  CHECK(zero.abs().max().item<float>() == 0.0f);
}

TEST_CASE("GptConfig: sizes below 1 and heads not dividing width are refused by name", "[gpt]") {
  auto c = small();
  c.heads = 3;
  CHECK_THROWS_WITH(TinyGpt(c), Catch::Matchers::Contains("heads (3) must divide width (16)"));
  c = small();
  c.layers = 0;
  CHECK_THROWS_WITH(check_gpt_config(c), Catch::Matchers::Contains("layers must be >= 1"));
}
