// core/train/quant_train's tiny-GPT path: the GptLinear hook of core/models/gpt and the quantized Linears
// plugged into it (the fp8 experiment's GPT section).
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "catch.hpp"
#include "core/models/gpt.hpp"
#include "core/numerics/quant.hpp"
#include "core/train/quant_train.hpp"

using namespace mpt;

namespace {

GptConfig small() {
  GptConfig c;
  c.vocab = 13;
  c.context = 8;
  c.width = 32;
  c.heads = 4;
  c.layers = 2;
  return c;
}

/// Loss and every parameter's gradient of one forward/backward of a model built from `seed`.
struct LossGrads {
  torch::Tensor loss;
  std::vector<torch::Tensor> grads;
};
LossGrads loss_grads(std::uint64_t seed, const torch::Tensor& x, const torch::Tensor& y, const GptLinear& lin) {
  torch::manual_seed(seed);
  TinyGpt m(small());
  auto loss = gpt_loss(m->forward(x, {}, lin), y);
  loss.backward();
  LossGrads r{loss.detach(), {}};
  for (const auto& p : m->parameters()) r.grads.push_back(p.grad().clone());
  return r;
}

bool bitwise_equal(const LossGrads& a, const LossGrads& b) {
  if (!torch::equal(a.loss, b.loss) || a.grads.size() != b.grads.size()) return false;
  for (std::size_t i = 0; i < a.grads.size(); ++i)
    if (!torch::equal(a.grads[i], b.grads[i])) return false;
  return true;
}

}  // namespace

TEST_CASE("GptLinear: the identity callback and the fp32 recipe give the plain GPT's loss and gradients bit for bit",
          "[quant][gpt]") {
  torch::manual_seed(7);
  auto x = torch::randint(13, {4, 8}, torch::kLong), y = torch::randint(13, {4, 8}, torch::kLong);
  const LossGrads plain = loss_grads(5, x, y, {});

  std::vector<std::string> called;
  const GptLinear identity = [&called](const torch::Tensor& in, const torch::Tensor& w, const torch::Tensor& b,
                                       const std::string& name) {
    called.push_back(name);
    return torch::linear(in, w, b);
  };
  CHECK(bitwise_equal(plain, loss_grads(5, x, y, identity)));
  // The hook sees exactly the four Linears of every block, in module order; lm_head never.
  CHECK(called == std::vector<std::string>{"h0.c_attn", "h0.attn_proj", "h0.c_fc", "h0.mlp_proj", "h1.c_attn", "h1.attn_proj",
                                           "h1.c_fc", "h1.mlp_proj"});

  // core/numerics/quant's fp32 recipe through quant_train's gpt_linear: the same bits.
  quant::QuantGptLinears fp32 = quant::make_quant_gpt_linears(small(), quant::recipe("fp32"));
  CHECK(fp32.names == std::vector<std::string>(called.begin(), called.end()));
  CHECK(bitwise_equal(plain, loss_grads(5, x, y, quant::gpt_linear(fp32))));

  // The comparison can fail: an fp8 recipe (E4M3 x and W, E5M2 dy) changes the loss and the gradients.
  quant::QuantGptLinears tw = quant::make_quant_gpt_linears(small(), quant::recipe("tensorwise"));
  const LossGrads fp8 = loss_grads(5, x, y, quant::gpt_linear(tw));
  CHECK_FALSE(bitwise_equal(plain, fp8));
  // ...by about E4M3's precision: the relative rounding error of a value is at most 2^-4 (3 mantissa bits).
  CHECK(std::abs(fp8.loss.item<double>() - plain.loss.item<double>()) < 0.0625 * plain.loss.item<double>());
}

TEST_CASE("gpt_linear_shapes: C->3C, C->C, C->rC, rC->C per block, and shape errors name the Linear's GEMM", "[quant][gpt]") {
  GptConfig c = small();
  const auto v = quant::gpt_linear_shapes(c);
  REQUIRE(v.size() == 8);
  CHECK(v[0].name == "h0.c_attn");
  CHECK((v[0].in == 32 && v[0].out == 96));
  CHECK((v[1].in == 32 && v[1].out == 32));
  CHECK((v[2].in == 32 && v[2].out == 128));
  CHECK((v[3].in == 128 && v[3].out == 32));
  CHECK(v[7].name == "h1.mlp_proj");
  // MX 1x32 blocks divide 32, 96, 128 and 4·8 = 32 tokens; 1x64 blocks do not divide the width 32.
  quant::RecipeOptions o;
  CHECK(quant::shape_error(quant::recipe("mxfp8", o), 32, v[0].in, v[0].out).empty());
  o.mx_block = 64;
  CHECK_FALSE(quant::shape_error(quant::recipe("mxfp8", o), 32, v[0].in, v[0].out).empty());
  // delayed scaling on every Linear, and only for a per-tensor recipe
  quant::DelayedScaling d;
  d.amax_history_len = 4;
  auto q = quant::make_quant_gpt_linears(c, quant::recipe("tensorwise"), &d);
  CHECK(q.layers.at("h1.c_fc")->amax_.size() == 3);
  CHECK_THROWS_AS(quant::make_quant_gpt_linears(c, quant::recipe("rowwise"), &d), std::invalid_argument);
  CHECK_THROWS_AS(quant::gpt_linear(q)(torch::zeros({1, 32}), torch::zeros({32, 32}), torch::Tensor(), "lm_head"),
                  std::out_of_range);
}
