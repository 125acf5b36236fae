// Unit tests of core/parallel/tp: shard index sets, the conjugate operators' forward and
// backward on a real two-rank Gloo group (two threads of this process meeting in the job's
// store), the vocab-parallel cross-entropy over a padded vocabulary, and TpGpt's per-operation
// checks against the one-process tiny GPT. Catch2's assertions are not thread-safe: the ranks
// compute, the checks run on the main thread afterwards.
#include <cmath>
#include <functional>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "dist/two_ranks.hpp"
#include "core/dist/dist.hpp"
#include "core/models/gpt.hpp"
#include "core/numerics/bounds.hpp"
#include "core/parallel/tp.hpp"
#include "core/parallel/tp_gpt.hpp"

using namespace mpt;
using mpt::testing::on_two_ranks;

namespace {

double max_abs(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

}  // namespace

TEST_CASE("qkv_shard keeps whole heads of q, k and v, contiguous_shard and padded_vocab_size split as Megatron",
          "[tp]") {
  // width 8, 4 heads of 2 columns, t = 2: rank 1 owns heads 2, 3 = rows 4..7 of each of q, k, v.
  const auto r1 = tp::qkv_shard(8, 4, 2, 1);
  REQUIRE(r1.numel() == 12);
  CHECK(r1[0].item<int64_t>() == 4);
  CHECK(r1[4].item<int64_t>() == 12);
  CHECK(r1[8].item<int64_t>() == 20);
  CHECK(r1[11].item<int64_t>() == 23);
  CHECK_THROWS_AS(tp::qkv_shard(8, 3, 2, 0), std::invalid_argument);  // 3 heads do not divide 8
  CHECK_THROWS_AS(tp::qkv_shard(12, 3, 2, 0), std::invalid_argument);  // t = 2 does not divide 3 heads
  CHECK(tp::contiguous_shard(6, 3, 2)[0].item<int64_t>() == 4);
  CHECK_THROWS_AS(tp::contiguous_shard(7, 2, 0), std::invalid_argument);
  CHECK(tp::padded_vocab_size(65, 1, 2) == 66);
  CHECK(tp::padded_vocab_size(65, 128, 2) == 256);
  CHECK(tp::padded_vocab_size(64, 1, 2) == 64);
  CHECK(bounds::gamma(1) == Approx(std::ldexp(1.0, -24)).epsilon(1e-6));
}

TEST_CASE("f, g and the sequence-parallel pair on two Gloo ranks: forward and backward as Megatron's mappings",
          "[tp][dist]") {
  // Rank r's input x_r = (r + 1) * base; with loss = sum(y * w_r) the gradients are known in closed form.
  struct Out {
    torch::Tensor f_fwd, f_grad, g_fwd, g_grad, sp_gather, sp_gather_grad, sp_rs, sp_rs_grad, scatter, scatter_grad;
  };
  std::vector<Out> out(2);
  const auto base = torch::arange(8, torch::kFloat).view({1, 4, 2});  // [B = 1, T = 4, C = 2]
  auto errors = on_two_ranks("tp_ops/", [&](std::shared_ptr<dist::Group> g, int r) {
    auto& o = out[static_cast<std::size_t>(r)];
    const double k = r + 1;
    {
      auto x = (base * k).set_requires_grad(true);
      auto y = tp::copy_to_tensor_model_parallel_region(x, *g);
      (y * k).sum().backward();
      o.f_fwd = y.detach();
      o.f_grad = x.grad();  // sum over ranks of k = 3
    }
    {
      auto x = (base * k).set_requires_grad(true);
      auto y = tp::reduce_from_tensor_model_parallel_region(x, *g);
      (y * k).sum().backward();
      o.g_fwd = y.detach();  // 3 * base
      o.g_grad = x.grad();   // k
    }
    {
      auto x = (base.narrow(1, 2 * r, 2) * 1.0).set_requires_grad(true);  // this rank's half of the sequence
      auto y = tp::gather_from_sequence_parallel_region(x, *g, 1);
      (y * k).sum().backward();
      o.sp_gather = y.detach();  // base
      o.sp_gather_grad = x.grad();  // reduce-scatter of k: 3
    }
    {
      auto x = (base * k).set_requires_grad(true);
      auto y = tp::reduce_scatter_to_sequence_parallel_region(x, *g, 1);
      (y * k).sum().backward();
      o.sp_rs = y.detach();         // 3 * base[:, 2r:2r+2]
      o.sp_rs_grad = x.grad();      // all-gather of k: [1, 1, 2, 2] along T
    }
    {
      auto x = base.clone().set_requires_grad(true);
      auto y = tp::scatter_to_sequence_parallel_region(x, *g, 1);
      (y * k).sum().backward();
      o.scatter = y.detach();
      o.scatter_grad = x.grad();
    }
  });
  REQUIRE(errors[0].empty());
  REQUIRE(errors[1].empty());
  for (int r = 0; r < 2; ++r) {
    const auto& o = out[static_cast<std::size_t>(r)];
    const double k = r + 1;
    CHECK(max_abs(o.f_fwd, base * k) == 0);
    CHECK(max_abs(o.f_grad, torch::full_like(base, 3.0)) == 0);
    CHECK(max_abs(o.g_fwd, base * 3) == 0);
    CHECK(max_abs(o.g_grad, torch::full_like(base, k)) == 0);
    CHECK(max_abs(o.sp_gather, base) == 0);
    CHECK(max_abs(o.sp_gather_grad, torch::full({1, 2, 2}, 3.0)) == 0);
    CHECK(max_abs(o.sp_rs, base.narrow(1, 2 * r, 2) * 3) == 0);
    auto want = torch::cat({torch::full({1, 2, 2}, 1.0), torch::full({1, 2, 2}, 2.0)}, 1);
    CHECK(max_abs(o.sp_rs_grad, want) == 0);
    CHECK(max_abs(o.scatter, base.narrow(1, 2 * r, 2)) == 0);
    CHECK(max_abs(o.scatter_grad, want) == 0);
  }
}

TEST_CASE("vocab_parallel_cross_entropy over an odd vocabulary (padded) equals F.cross_entropy within the bound",
          "[tp][dist]") {
  torch::manual_seed(3);
  const int64_t V = 7, N = 5, Vp = tp::padded_vocab_size(V, 1, 2);  // 8: rank 1's last column is padding
  auto logits = torch::randn({N, V}) * 3;
  auto targets = torch::tensor({0, 3, 4, 6, 2}, torch::kLong);
  auto padded = torch::cat({logits, torch::full({N, Vp - V}, 100.0)}, 1);  // a huge padded logit must be ignored
  auto one = torch::nn::functional::cross_entropy(logits, targets,
                                                  torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  auto bound = tp::ce_reorder_bound(logits, targets);
  std::vector<torch::Tensor> loss(2), grad(2);
  auto errors = on_two_ranks("tp_ce/", [&](std::shared_ptr<dist::Group> g, int r) {
    auto local = padded.narrow(1, r * Vp / 2, Vp / 2).clone().set_requires_grad(true);
    auto l = tp::vocab_parallel_cross_entropy(local, targets, r * Vp / 2, V, *g);
    l.sum().backward();
    loss[static_cast<std::size_t>(r)] = l.detach();
    grad[static_cast<std::size_t>(r)] = local.grad();
  });
  REQUIRE(errors[0].empty());
  REQUIRE(errors[1].empty());
  CHECK(max_abs(loss[0], loss[1]) == 0);  // the same all-reduced numbers on every rank
  auto d = (loss[0].to(torch::kDouble) - one.to(torch::kDouble)).abs();
  CHECK((d <= bound).all().item<bool>());
  // Gradient: softmax − onehot; the padded column gets exactly 0, and rows sum to ~0.
  CHECK(grad[1].select(1, Vp / 2 - 1).abs().max().item<double>() == 0);
  auto g = torch::cat({grad[0], grad[1].narrow(1, 0, V - Vp / 2)}, 1);
  auto x = logits.clone().set_requires_grad(true);
  torch::nn::functional::cross_entropy(x, targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
      .backward();
  // Each softmax entry is computed from the same logits with the same max shift: exp(l − m)/S differs
  // only through S (relative error ≤ the δ of ce_reorder_bound, twice) and the final rounding: ≤ 4δ + 2u.
  const double u = std::ldexp(1.0, -24), gam = bounds::gamma(V - 1), delta = gam + 2 * u * (1 + gam);
  CHECK(max_abs(g, x.grad()) <= 4 * delta + 2 * u);
}

TEST_CASE("TpGpt on two ranks: every operation equals the one-process tiny GPT (bitwise, or within the derived bound)",
          "[tp][dist][gpt]") {
  GptConfig c;
  c.vocab = 11;  // odd: padded to 12
  c.context = 8;
  c.width = 16;
  c.heads = 4;
  c.layers = 2;
  torch::manual_seed(5);
  TinyGpt full(c);
  auto idx = torch::randint(c.vocab, {2, 8}, torch::kLong);
  auto tgt = torch::randint(c.vocab, {2, 8}, torch::kLong);
  for (bool sp : {false, true}) {
    std::vector<std::vector<tp::SiteCheck>> sites(2);
    std::vector<double> losses(2);
    std::vector<torch::Tensor> ln_grad(2);
    auto errors = on_two_ranks(sp ? "tp_gpt_sp/" : "tp_gpt/", [&](std::shared_ptr<dist::Group> g, int r) {
      tp::TpGpt m(full, g, 1, sp);
      auto l = m.loss_checked(idx, tgt, sites[static_cast<std::size_t>(r)]);
      l.backward();
      m.allreduce_sequence_parallel_grads();
      losses[static_cast<std::size_t>(r)] = l.item<double>();
      for (const auto& p : m.params())
        if (p.name == "h1.ln_2.weight") ln_grad[static_cast<std::size_t>(r)] = p.local.grad().clone();
    });
    REQUIRE(errors[0].empty());
    REQUIRE(errors[1].empty());
    CHECK(losses[0] == losses[1]);
    CHECK(max_abs(ln_grad[0], ln_grad[1]) == 0);
    for (const auto& rank_sites : sites) {
      REQUIRE(rank_sites.size() == 2 * 7 + 3);  // 7 per block; wte, lm_head, cross-entropy
      for (const auto& s : rank_sites) {
        INFO(s.site << (sp ? " (SP)" : ""));
        if (s.reduced)
          CHECK(s.worst_ratio <= 1.0);
        else
          CHECK(s.max_diff == 0);
      }
    }
  }
}

TEST_CASE("korthikanti_bytes and fp32_activation_bytes: the per-layer counts of Korthikanti et al. 2022 §4", "[tensor_parallel]") {
  // The paper's Table 2 terms written out per tensor (fp16 values 2 bytes, dropout masks 1 byte), at
  // s = 32, b = 4, h = 64, a = 4 (docs/tensorparallel.md's figures: 360448, 221184, 180224 bytes).
  const int64_t s = 32, b = 4, h = 64, a = 4, sbh = s * b * h;
  // attention: QKV input 2sbh, QK^T 4sbh, softmax 2as²b, its dropout mask as²b, the dropout output
  // with V 2as²b + 2sbh, the projection input 2sbh, its dropout mask sbh: 11sbh + 5as²b;
  // MLP: 2sbh + 8sbh + 8sbh + sbh = 19sbh; the two LayerNorms 4sbh: 34sbh + 5as²b in all.
  CHECK(tp::korthikanti_bytes(s, b, h, a, 1, false) == double(34 * sbh + 5 * a * s * s * b));
  CHECK(tp::korthikanti_bytes(s, b, h, a, 1, false) == 360448.0);
  for (int64_t t : {2, 4}) {
    INFO("t = " << t);
    // TP: the LayerNorms (4sbh), the QKV and MLP inputs (2sbh + 2sbh) and the two dropout masks
    // (2sbh) stay whole: 10sbh; the rest is split over t: 24sbh/t + 5as²b/t.
    CHECK(tp::korthikanti_bytes(s, b, h, a, t, false) == double(10 * sbh + 24 * sbh / t + 5 * a * s * s * b / t));
    CHECK(tp::korthikanti_bytes(s, b, h, a, t, true) == double((34 * sbh + 5 * a * s * s * b) / t));
    // fp32 here (4 bytes, no dropout): LayerNorm inputs 8sbh, QKV and MLP inputs 4sbh each, q k v
    // 12sbh/t, softmax output 4as²b/t, projection input 4sbh/t, GELU input and output 32sbh/t.
    CHECK(tp::fp32_activation_bytes(s, b, h, a, t, false) == double(16 * sbh + 48 * sbh / t + 4 * a * s * s * b / t));
    CHECK(tp::fp32_activation_bytes(s, b, h, a, t, true) ==
          double(8 * sbh / t + 8 * sbh + 48 * sbh / t + 4 * a * s * s * b / t));
  }
  CHECK(tp::korthikanti_bytes(s, b, h, a, 2, false) == 221184.0);
  CHECK(tp::korthikanti_bytes(s, b, h, a, 2, true) == 180224.0);
  CHECK(tp::fp32_activation_bytes(s, b, h, a, 1, false) == double(64 * sbh + 4 * a * s * s * b));
  CHECK(tp::fp32_activation_bytes(s, b, h, a, 2, false) == 360448.0);
  CHECK(tp::fp32_activation_bytes(s, b, h, a, 2, true) == 327680.0);
}
