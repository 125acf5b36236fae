// Unit tests of core/parallel/cp: the sequence splits and their pair counts, the byte formulas,
// and the three context-parallel attentions on real Gloo groups of 2 and 3 ranks (threads of
// this process meeting in the job's store) against the one-process attention and the derived
// bound — including a wrong merge that the bound must reject. Catch2's assertions are not
// thread-safe: the ranks compute, the checks run on the main thread afterwards.
#include <cmath>
#include <vector>

#include "catch.hpp"
#include "dist/two_ranks.hpp"
#include "core/dist/dist.hpp"
#include "core/parallel/cp.hpp"

using namespace mpt;
using mpt::testing::on_ranks;

namespace {

std::vector<int64_t> as_vector(const torch::Tensor& t) {
  auto c = t.contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// max |got − want| / bound over the elements (bound 0 must match exactly).
double worst_ratio(const torch::Tensor& got, const torch::Tensor& want, const torch::Tensor& bound) {
  auto d = (got.to(torch::kDouble) - want).abs();
  return torch::where(bound > 0, d / bound, d * INFINITY).max().item<double>();
}

struct Attn {
  torch::Tensor y, dq, dk, dv;  // whole sequence, natural order
};

// Causal attention of q, k, v [B, nh, T, hd] with output gradient dy on n ranks of `variant` and
// `split`: each rank runs its positions, the results are put back in natural order.
Attn run_cp(int n, cp::Variant variant, cp::Split split, const torch::Tensor& q, const torch::Tensor& k,
            const torch::Tensor& v, const torch::Tensor& dy, const std::string& prefix) {
  const int64_t T = q.size(2);
  std::vector<std::vector<torch::Tensor>> per_rank(static_cast<std::size_t>(n));
  const auto errors = on_ranks(n, prefix, [&](std::shared_ptr<dist::Group> g, int r) {
    const auto pos = cp::positions(T, n, r, split);
    auto ql = q.index_select(2, pos).requires_grad_(true), kl = k.index_select(2, pos).requires_grad_(true),
         vl = v.index_select(2, pos).requires_grad_(true);
    cp::Attention attn(g, variant, split);
    auto y = attn(ql, kl, vl);
    y.backward(dy.index_select(2, pos));
    per_rank[static_cast<std::size_t>(r)] = {y.detach(), ql.grad(), kl.grad(), vl.grad()};
  });
  for (const auto& e : errors) REQUIRE(e.empty());
  std::vector<torch::Tensor> full;
  for (int i = 0; i < 4; ++i) {
    auto t = torch::empty_like(q);
    for (int r = 0; r < n; ++r)
      t.index_copy_(2, cp::positions(T, n, r, split), per_rank[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)]);
    full.push_back(t);
  }
  return {full[0], full[1], full[2], full[3]};
}

}  // namespace

TEST_CASE("cp splits: contiguous ranges, balanced chunks r and 2c-1-r, pair counts", "[cp]") {
  CHECK(as_vector(cp::positions(8, 2, 1, cp::Split::Contiguous)) == std::vector<int64_t>{4, 5, 6, 7});
  CHECK(as_vector(cp::positions(8, 2, 0, cp::Split::Balanced)) == std::vector<int64_t>{0, 1, 6, 7});
  CHECK(as_vector(cp::positions(8, 2, 1, cp::Split::Balanced)) == std::vector<int64_t>{2, 3, 4, 5});
  CHECK_THROWS_AS(cp::positions(6, 2, 0, cp::Split::Balanced), std::invalid_argument);  // 2c = 4 does not divide 6
  CHECK_THROWS_AS(cp::positions(8, 2, 2, cp::Split::Contiguous), std::out_of_range);
  CHECK_THROWS_AS(cp::split_from_name("zigzag"), std::invalid_argument);
  // Every (i, j <= i) pair once over the ranks; balanced: the same count on every rank.
  for (const int64_t c : {1, 2, 3, 4}) {
    const int64_t T = 24;
    int64_t contiguous = 0;
    for (int64_t r = 0; r < c; ++r) {
      contiguous += cp::causal_pairs(T, c, r, cp::Split::Contiguous);
      CHECK(cp::causal_pairs(T, c, r, cp::Split::Balanced) == T * (T + 1) / 2 / c);
    }
    CHECK(contiguous == T * (T + 1) / 2);
  }
  // The ring's computed pairs: (r+1) whole blocks contiguous; 3/4 + (c-1)/2 blocks balanced.
  CHECK(cp::ring_computed_pairs(16, 2, 1, cp::Split::Contiguous) == 2 * 64);
  CHECK(cp::ring_computed_pairs(16, 4, 3, cp::Split::Balanced) == 3 * 16 / 4 + 3 * 16 / 2);
  CHECK(cp::bytes_per_layer(cp::Variant::Ring, 1, 100) == 0);
  CHECK(cp::bytes_per_layer(cp::Variant::Ring, 4, 1) == 6 + 6 + 8);
  CHECK(cp::bytes_per_layer(cp::Variant::Ulysses, 4, 1) == 6);
}

TEST_CASE("cp attention: ring, all-gather and Ulysses on 2 and 3 ranks match one process within the bound",
          "[cp]") {
  torch::manual_seed(3);
  const int64_t B = 2, nh = 6, T = 24, hd = 8;
  const auto q = torch::randn({B, nh, T, hd}), k = torch::randn({B, nh, T, hd}), v = torch::randn({B, nh, T, hd}),
             dy = torch::randn({B, nh, T, hd});
  auto q1 = q.clone().requires_grad_(true), k1 = k.clone().requires_grad_(true), v1 = v.clone().requires_grad_(true);
  auto y1 = cp::causal_attention(q1, k1, v1);
  y1.backward(dy);
  const auto one = cp::attention_bounds(q, k, v, dy, 1, 1);
  CHECK(worst_ratio(y1.detach(), one.y_ref, one.y) <= 1);
  CHECK(worst_ratio(k1.grad(), one.dk_ref, one.dk) <= 1);
  for (const int n : {2, 3})
    for (const auto split : {cp::Split::Contiguous, cp::Split::Balanced})
      for (const auto variant : {cp::Variant::Ring, cp::Variant::AllGather, cp::Variant::Ulysses}) {
        INFO("c = " << n << ", " << cp::variant_name(variant) << ", " << cp::split_name(split));
        const auto got = run_cp(n, variant, split, q, k, v, dy,
                                "cp_" + std::to_string(n) + cp::variant_name(variant) + cp::split_name(split) + "/");
        const int64_t blocks = variant == cp::Variant::Ring ? n : 1, terms = variant == cp::Variant::Ulysses ? 1 : n;
        const auto b = cp::attention_bounds(q, k, v, dy, blocks, terms);
        CHECK(worst_ratio(got.y, b.y_ref, b.y) <= 1);
        CHECK(worst_ratio(got.dq, b.dq_ref, b.dq) <= 1);
        CHECK(worst_ratio(got.dk, b.dk_ref, b.dk) <= 1);
        CHECK(worst_ratio(got.dv, b.dv_ref, b.dv) <= 1);
        if (variant == cp::Variant::Ulysses) {  // one process's per-head attention: the same bits
          CHECK(torch::equal(got.y, y1.detach()));
          CHECK(torch::equal(got.dk, k1.grad()));
        }
        // The bound is far below the values: an error of 1e-4 relative (a wrong merge makes far
        // larger ones, next test case) lands outside it.
        CHECK(b.y.max().item<double>() < 1e-4 * y1.abs().max().item<double>());
      }
}

TEST_CASE("cp attention bound rejects a merge that drops the rescaling of earlier blocks", "[cp]") {
  torch::manual_seed(5);
  const int64_t B = 1, nh = 2, T = 16, hd = 4;
  const auto q = torch::randn({B, nh, T, hd}) * 2, k = torch::randn({B, nh, T, hd}), v = torch::randn({B, nh, T, hd}),
             dy = torch::randn({B, nh, T, hd});
  // Two key blocks merged without rescaling the first by exp(m_old - m_new): what a ring without
  // flash-attention's correction computes.
  auto s = torch::matmul(q, k.transpose(-2, -1)) / 2.0;
  s = s.masked_fill(torch::ones({T, T}, torch::kBool).tril().logical_not(), -INFINITY);
  auto s0 = s.narrow(3, 0, T / 2), s1 = s.narrow(3, T / 2, T / 2);
  auto m0 = std::get<0>(s0.max(-1, true)), m1 = std::get<0>(s1.max(-1, true));
  m1 = torch::where(torch::isinf(m1), torch::zeros_like(m1), m1);
  auto p0 = torch::exp(s0 - m0), p1 = torch::exp(s1 - m1);
  auto wrong = (torch::matmul(p0, v.narrow(2, 0, T / 2)) + torch::matmul(p1, v.narrow(2, T / 2, T / 2))) /
               (p0.sum(-1, true) + p1.sum(-1, true));
  const auto b = cp::attention_bounds(q, k, v, dy, 2, 2);
  CHECK(worst_ratio(wrong, b.y_ref, b.y) > 1e3);
}
