// Unit tests of core/models/moe: capacity, routing (top-k, gates, position drops, counts, the
// aux-free bias in the choice), dispatch and combine, the Switch auxiliary loss and DeepSeek-V3's
// bias step.
#include <cmath>
#include <vector>

#include "catch.hpp"
#include "core/models/moe.hpp"
#include "models/moe_testing.hpp"

using namespace mpt;
using mpt::testing::int_values;
using mpt::testing::moe_config;

TEST_CASE("moe capacity: ceil(N k cf / E), at least 1, at most N", "[moe]") {
  CHECK(moe::capacity(128, moe_config(8, 2, 1.25)) == 40);  // Megatron-core's get_capacity(128·2, 8, 1.25)
  CHECK(moe::capacity(10, moe_config(4, 1, 1.0)) == 3);     // ⌈2.5⌉
  CHECK(moe::capacity(10, moe_config(4, 1, 100.0)) == 10);  // no expert can get more than N
  CHECK(moe::capacity(10, moe_config(4, 1, 1e-6)) == 1);
  CHECK_THROWS_AS(moe::check_moe_config(moe_config(4, 5, 1.0)), std::invalid_argument);
  CHECK_THROWS_AS(moe::check_moe_config(moe_config(4, 2, 0.0)), std::invalid_argument);
  CHECK_THROWS_AS(moe::balance_from_name("switch"), std::invalid_argument);
}

TEST_CASE("moe route: top-k, gates, position drops, counts", "[moe]") {
  // 5 tokens, 2 experts, top-1: tokens 0, 1 and 3 prefer expert 0, tokens 2 and 4 expert 1.
  const auto logits = torch::tensor({{2.0f, 0.0f}, {1.0f, 0.0f}, {0.0f, 3.0f}, {4.0f, 0.0f}, {0.0f, 1.0f}});
  const auto bias = torch::zeros({2});
  auto r = moe::route(logits, bias, moe_config(2, 1, 1.0), /*capacity=*/2);
  CHECK(int_values(r.expert.reshape({-1})) == std::vector<int64_t>{0, 0, 1, 0, 1});
  CHECK(int_values(r.slot.reshape({-1})) == std::vector<int64_t>{0, 1, 0, -1, 1});  // token 3: third for expert 0
  CHECK(int_values(r.counts) == std::vector<int64_t>{3, 2});
  CHECK(int_values(r.kept) == std::vector<int64_t>{2, 2});
  // k = 1: the gate is the raw probability (Switch), so the router gets a gradient.
  CHECK(r.gate.reshape({-1}).equal(torch::softmax(logits, -1).gather(1, r.expert).reshape({-1})));
  // k = 2 of 2: every token takes both experts; the gates sum to 1; capacity 5 drops nothing.
  auto r2 = moe::route(logits, bias, moe_config(2, 2, 1.0), 5);
  CHECK(torch::allclose(r2.gate.sum(1), torch::ones({5}), 0, 1e-6));
  CHECK(int_values(r2.counts) == std::vector<int64_t>{5, 5});
  CHECK((r2.slot >= 0).all().item<bool>());
  // aux_free: a bias large enough moves every choice of top-1 to expert 1; the gates stay the probs.
  auto m = moe_config(2, 1, 1.0, moe::Balance::AuxFree);
  auto rb = moe::route(logits, torch::tensor({0.0f, 1.0f}), m, 5);
  CHECK(int_values(rb.expert.reshape({-1})) == std::vector<int64_t>{1, 1, 1, 1, 1});
  CHECK(rb.gate.reshape({-1}).equal(torch::softmax(logits, -1).select(1, 1)));
}

TEST_CASE("moe aux loss: alpha E sum f_i P_i; the aux-free bias step", "[moe]") {
  // Uniform probabilities: P_i = 1/E, so the loss is α·E·Σ f_i/E = α whatever the loads.
  auto m = moe_config(4, 2, 1.0, moe::Balance::AuxLoss);
  m.aux_loss_coeff = 0.01;
  auto r = moe::route(torch::zeros({6, 4}), torch::zeros({4}), m, 6);
  CHECK(r.aux.item<double>() == Approx(0.01).epsilon(1e-6));
  // All tokens on expert 0 with prob p: f = (1, 0, ...), loss α·E·P_0.
  auto m1 = moe_config(4, 1, 1.0, moe::Balance::AuxLoss);
  m1.aux_loss_coeff = 0.01;
  const auto logits = torch::tensor({{2.0f, 0.0f, 0.0f, 0.0f}, {2.0f, 0.0f, 0.0f, 0.0f}});
  auto r1 = moe::route(logits, torch::zeros({4}), m1, 2);
  const double p0 = torch::softmax(logits, -1)[0][0].item<double>();
  CHECK(r1.aux.item<double>() == Approx(0.01 * 4 * p0).epsilon(1e-6));
  // DeepSeek-V3's step: b_i += γ·sign(mean − load_i).
  GptConfig gc;
  gc.vocab = 8;
  gc.context = 4;
  gc.width = 8;
  gc.heads = 2;
  gc.layers = 1;
  gc.mlp_ratio = 1;
  auto mf = moe_config(4, 1, 1.0, moe::Balance::AuxFree);
  mf.bias_update_rate = 0.5;
  moe::MoeGpt model(gc, mf);
  model->update_bias(torch::tensor({{5, 1, 2, 0}}, torch::kLong));  // mean 2
  CHECK(model->blocks[0]->mlp->expert_bias.equal(torch::tensor({-0.5f, 0.5f, 0.0f, 0.5f})));
}

TEST_CASE("moe dispatch and combine: buffers padded to the capacity, dropped tokens get nothing", "[moe]") {
  const auto logits = torch::tensor({{2.0f, 0.0f}, {1.0f, 0.0f}, {0.0f, 3.0f}, {4.0f, 0.0f}, {0.0f, 1.0f}});
  auto r = moe::route(logits, torch::zeros({2}), moe_config(2, 1, 1.0), 2);
  const auto h = torch::arange(1, 16, torch::kFloat).view({5, 3});
  const auto buf = moe::dispatch(h, r);
  REQUIRE(buf.sizes() == torch::IntArrayRef({2, 2, 3}));
  CHECK(buf[0][0].equal(h[0]));
  CHECK(buf[0][1].equal(h[1]));
  CHECK(buf[1][0].equal(h[2]));
  CHECK(buf[1][1].equal(h[4]));
  // Identity experts: each kept token comes back times its gate; token 3 (dropped) gets zeros.
  const auto y = moe::combine(buf, r);
  const auto gate = r.gate.reshape({-1});
  for (int64_t t : {0, 1, 2, 4}) CHECK(y[t].equal(h[t] * gate[t]));
  CHECK(y[3].equal(torch::zeros({3})));
}
