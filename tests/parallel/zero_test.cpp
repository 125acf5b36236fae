// Unit tests of core/parallel/zero: FSDP2's dim-0 split, the padded all-gather / reduce-scatter,
// and ShardedDataParallel at ZeRO stages 0-3 on a real two-rank Gloo group (two threads of
// this process meeting in the job's store as two processes would). Catch2's assertions are not
// thread-safe: the ranks only compute, the checks run on the main thread afterwards.
#include <cmath>
#include <functional>
#include <thread>

#include <fmt/format.h>

#include "catch.hpp"
#include "dist/two_ranks.hpp"
#include "core/runtime/compat.hpp"
#include "core/dist/dist.hpp"
#include "core/parallel/reference.hpp"
#include "core/parallel/zero.hpp"
#include "core/models/gpt.hpp"

using namespace mpt;
using mpt::testing::on_two_ranks;

namespace {

torch::nn::Sequential small_mlp() {
  torch::manual_seed(11);
  torch::nn::Sequential net;
  net->push_back(torch::nn::Linear(6, 5));  // 5 rows over 2 ranks: chunks of 3, rank 1 holds 2 (padding)
  net->push_back(torch::nn::ReLU());
  net->push_back(torch::nn::Linear(5, 3));
  return net;
}

std::unique_ptr<torch::optim::Optimizer> adam(std::vector<torch::Tensor> ps) {
  return std::make_unique<torch::optim::Adam>(ps, torch::optim::AdamOptions(0.01));
}

}  // namespace

TEST_CASE("dim0_split: torch.chunk's split as FSDP2 Shard(0) makes it (chunk ceil(d/N), last ranks short)",
          "[dist][shard]") {
  auto a = dist::dim0_split(10, 3, 4);  // chunks 3, 3, 3, 1
  CHECK(a.chunk == 3);
  CHECK(a.offset == 9);
  CHECK(a.rows == 1);
  auto b = dist::dim0_split(5, 3, 4);  // chunks 2, 2, 1, 0: the last rank holds nothing, sends padding
  CHECK(b.chunk == 2);
  CHECK(b.rows == 0);
  CHECK(b.offset == 5);
  CHECK(dist::dim0_split(5, 2, 4).rows == 1);
  CHECK(dist::dim0_split(8, 1, 2).rows == 4);
  CHECK_THROWS_AS(dist::dim0_split(0, 0, 2), std::invalid_argument);
  CHECK_THROWS_AS(dist::dim0_split(4, 2, 2), std::invalid_argument);
}

TEST_CASE("all_gather_dim0 and reduce_scatter_dim0 on two Gloo ranks, uneven rows (padding)", "[dist][shard]") {
  const auto full = torch::arange(15, torch::kFloat32).view({5, 3});
  std::vector<torch::Tensor> gathered(2), reduced(2), acc(2);
  std::vector<std::map<std::string, dist::CommCount>> counts(2);
  const auto errors = on_two_ranks("shard_collectives/", [&](std::shared_ptr<dist::Group> g, int r) {
    const auto i = static_cast<std::size_t>(r);
    gathered[i] = torch::empty({5, 3});
    dist::all_gather_dim0(*g, dist::shard_dim0(full, r, 2), gathered[i]);
    // Rank r holds (r + 1) * full; the sum over ranks / 2 is 1.5 * full; rank r keeps its rows.
    reduced[i] = torch::empty({r == 0 ? 3 : 2, 3});
    dist::reduce_scatter_dim0(*g, full * (r + 1.0), reduced[i], torch::kFloat32, 2.0, /*accumulate=*/false);
    acc[i] = torch::ones({r == 0 ? 3 : 2, 3});
    // bf16 reduction (LibTorch 1.13's Gloo has none: fp32 there, the same exact integers).
    dist::reduce_scatter_dim0(*g, full * (r + 1.0), acc[i], compat::kTorch2 ? torch::kBFloat16 : torch::kFloat32, 1.0,
                              /*accumulate=*/true);
    counts[i] = g->comm_counts();
  });
  REQUIRE(errors == std::vector<std::string>{"", ""});
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    const auto i = static_cast<std::size_t>(r);
    CHECK(torch::equal(gathered[i], full));
    CHECK(torch::equal(reduced[i], dist::shard_dim0(full * 1.5, r, 2)));
    // bf16 reduction: 3 * full in bf16 (integers < 256 are exact), added to ones.
    CHECK(torch::equal(acc[i], dist::shard_dim0(full * 3.0 + 1.0, r, 2)));
    // The counters: one all-gather of the padded 6x3 fp32 output (72 bytes, half of it sent),
    // two reduce-scatters of 6x3 (fp32 72 bytes, bf16 36 bytes), (N-1)/N sent.
    const auto& c = counts[i];
    REQUIRE(c.count("all_gather") == 1);
    CHECK(c.at("all_gather").calls == 1);
    CHECK(c.at("all_gather").payload_bytes == 72);
    CHECK(c.at("all_gather").sent_bytes == 36.0);
    REQUIRE(c.count("reduce_scatter") == 1);
    CHECK(c.at("reduce_scatter").calls == 2);
    const double rs = compat::kTorch2 ? 72 + 36 : 72 + 72;
    CHECK(c.at("reduce_scatter").payload_bytes == rs);
    CHECK(c.at("reduce_scatter").sent_bytes == rs / 2);  // the ring's (N-1)/N on both routes
  }
}

TEST_CASE("FlatShardGroup: reused buffers give reduce_scatter_dim0's and all_gather_dim0's values bit for bit, "
          "padding stays zero", "[dist][shard]") {
  // Two tensors of 5 and 3 rows (chunks 3 and 2: rank 1 holds 2 and 1 rows) and rows of 3 and 2.
  torch::manual_seed(3);
  const std::vector<std::vector<torch::Tensor>> calls = {{torch::randn({5, 3}), torch::randn({3, 2})},
                                                         {torch::randn({5, 3}), torch::randn({3, 2})},
                                                         {torch::randn({5, 3}), torch::randn({3, 2})}};
  std::vector<std::vector<torch::Tensor>> flat_out(2), free_out(2), gathered(2), terms(2);
  const auto errors = on_two_ranks("flat_group/", [&](std::shared_ptr<dist::Group> g, int r) {
    const auto i = static_cast<std::size_t>(r);
    dist::FlatShardGroup fg({{5, 3}, {3, 2}}, r, 2);
    fg.keep_terms(true);
    for (const auto& c : calls) {  // the same group three times: buffers reused, values must not leak
      const std::vector<torch::Tensor> fulls = {c[0] * (r + 1.0), c[1] * (r + 1.0)};
      std::vector<torch::Tensor> a = {torch::empty({r == 0 ? 3 : 2, 3}), torch::empty({r == 0 ? 2 : 1, 2})};
      std::vector<torch::Tensor> b = {torch::empty_like(a[0]), torch::empty_like(a[1])};
      fg.reduce_scatter(*g, fulls, a, torch::kFloat32, 3.0, /*accumulate=*/false);
      dist::reduce_scatter_dim0(*g, fulls, b, torch::kFloat32, 3.0, /*accumulate=*/false);
      terms[i].push_back(fg.kept_terms().clone());
      std::vector<torch::Tensor> full = {torch::empty({5, 3}), torch::empty({3, 2})};
      fg.all_gather(*g, {dist::shard_dim0(c[0], r, 2), dist::shard_dim0(c[1], r, 2)}, full);
      for (auto& t : a) flat_out[i].push_back(t);
      for (auto& t : b) free_out[i].push_back(t);
      for (auto& t : full) gathered[i].push_back(t);
    }
  });
  REQUIRE(errors == std::vector<std::string>{"", ""});
  for (std::size_t i = 0; i < 2; ++i) {
    INFO("rank " << i);
    for (std::size_t k = 0; k < flat_out[i].size(); ++k) CHECK(torch::equal(flat_out[i][k], free_out[i][k]));
    for (std::size_t c = 0; c < calls.size(); ++c) {
      CHECK(torch::equal(gathered[i][2 * c], calls[c][0]));
      CHECK(torch::equal(gathered[i][2 * c + 1], calls[c][1]));
      // [N, C] = [2, 3*3 + 2*2]: block 1 holds rows 3-4 of the first tensor (row 5 of the chunk:
      // padding) and row 2 of the second (its second row: padding), all zero after three calls.
      const auto blocks = terms[i][c].view({2, 13});
      CHECK(torch::equal(blocks[1].narrow(0, 6, 3), torch::zeros({3})));
      CHECK(torch::equal(blocks[1].narrow(0, 11, 2), torch::zeros({2})));
      CHECK(torch::equal(blocks[0].narrow(0, 0, 9), (calls[c][0] * (i + 1.0) / 3.0).narrow(0, 0, 3).reshape({-1})));
    }
  }
}

TEST_CASE("reduction_error: a reduction equal to the exact sum passes, one missing a rank's terms exceeds the bound",
          "[dist][shard]") {
  std::vector<std::vector<dist::ReductionError>> got(2);
  const auto errors = on_two_ranks("reduction_error/", [&](std::shared_ptr<dist::Group> g, int r) {
    const auto i = static_cast<std::size_t>(r);
    // terms: rank r sends [r + 1, 0.5, -1, 0] (all-reduce); the exact sums are [3, 1, -2, 0].
    const auto t = torch::tensor({r + 1.0f, 0.5f, -1.0f, 0.0f});
    got[i].push_back(dist::reduction_error(*g, {{t, torch::tensor({3.0f, 1.0f, -2.0f, 0.0f}), false}}));
    // A reduce-scatter that dropped rank 1's terms: rank 0 keeps block 0 = [1, 0.5] instead of [3, 1].
    got[i].push_back(dist::reduction_error(*g, {{t, r == 0 ? torch::tensor({1.0f, 0.5f}) : torch::tensor({-2.0f, 0.0f}),
                                                 true}}));
  });
  REQUIRE(errors == std::vector<std::string>{"", ""});
  for (std::size_t i = 0; i < 2; ++i) {
    CHECK(got[i][0].max_abs_diff == 0.0);
    CHECK(got[i][0].max_ratio == 0.0);
    // The bound of the largest element: (g_1 + g64_1) * (|1| + |2|) with g_1 = u / (1 - u).
    const double u = std::ldexp(1.0, -24), u64 = std::ldexp(1.0, -53);
    CHECK(got[i][0].max_bound == Approx(3.0 * (u / (1 - u) + u64 / (1 - u64))).epsilon(1e-12));
    CHECK(got[i][1].max_abs_diff == 2.0);  // the maxima over both ranks
    CHECK(got[i][1].max_ratio > 1.0);
  }
}

TEST_CASE("ShardedDataParallel: stages 0-3 on two Gloo ranks equal one process's torch::optim::Adam bit for bit",
          "[dist][shard]") {
  torch::manual_seed(5);
  const std::vector<torch::Tensor> xs = {torch::randn({4, 6}), torch::randn({4, 6})};  // rank r's local batch
  const std::vector<torch::Tensor> ys = {torch::randint(0, 3, {4}), torch::randint(0, 3, {4})};
  const int steps = 3, micro = 2;
  // The reference: one process, LibTorch's modules and Adam; the gradient of a step is
  // g_0/2 + g_1/2, g_r accumulated over rank r's two micro-batches (reference::replay, RankByRank).
  std::vector<torch::Tensor> want;
  {
    auto net = small_mlp();
    auto opt = adam(net->parameters());
    reference::ReplaySpec spec;
    spec.ranks = 2;
    spec.steps = steps;
    spec.micro_batches = micro;
    spec.every_step = false;
    reference::replay(
        net->parameters(), *opt,
        [&](const torch::Tensor& x, const torch::Tensor& y) { return torch::cross_entropy_loss(net->forward(x), y); },
        [&](int64_t r, int64_t) { return std::make_pair(xs[static_cast<std::size_t>(r)], ys[static_cast<std::size_t>(r)]); },
        spec);
    for (const auto& p : net->parameters()) want.push_back(p.detach().clone());
  }
  for (int stage = 0; stage <= 3; ++stage) {
    for (const bool every : {false, true}) {
      if (every && stage < 2) continue;
      std::vector<std::vector<torch::Tensor>> got(2);
      std::vector<dist::HeldBytes> held(2);
      std::vector<std::map<std::string, dist::CommCount>> counts(2);
      // Built here, not on the rank threads: torch::manual_seed and the initialisers share one
      // generator, which two threads drawing at once would interleave.
      const std::vector<torch::nn::Sequential> nets = {small_mlp(), small_mlp()};
      const auto errors = on_two_ranks(fmt::format("sdp_{}_{}/", stage, every), [&](std::shared_ptr<dist::Group> g, int r) {
        const auto i = static_cast<std::size_t>(r);
        dist::ShardOptions o;
        o.stage = stage;
        o.reduce_every_micro_batch = every;
        dist::ShardedDataParallel model(nets[i], g, o, adam);
        g->reset_comm_counts();
        for (int s = 0; s < steps; ++s) {
          auto xm = xs[i].tensor_split(micro), ym = ys[i].tensor_split(micro);
          for (int m = 0; m < micro; ++m)
            model.backward(torch::cross_entropy_loss(model.forward(xm[m]), ym[m]) / static_cast<double>(micro),
                           m + 1 == micro);
          model.step();
        }
        counts[i] = g->comm_counts();
        held[i] = model.held_peak();
        got[i] = model.full_parameters();
      });
      INFO("stage " << stage << ", reduce every micro-batch " << every);
      REQUIRE(errors == std::vector<std::string>{"", ""});
      for (std::size_t r = 0; r < 2; ++r)
        for (std::size_t p = 0; p < want.size(); ++p) {
          INFO("rank " << r << ", parameter " << p);
          // Reducing every micro-batch sums the 4 terms in another order: not bitwise (the experiment
          // reports that case without a check); here only that the path runs and stays close.
          if (every)
            CHECK(torch::allclose(got[r][p], want[p], /*rtol=*/0, /*atol=*/1e-5));
          else
            CHECK(torch::equal(got[r][p], want[p]));
        }
      // Ψ = 6*5 + 5 + 5*3 + 3 = 53; padded rows: 5 -> 6 (weight 5x6 -> 6x6, bias 5 -> 6), 3 -> 4.
      const auto& c = counts[0];
      if (stage == 0) {
        CHECK(c.at("all_reduce").calls == steps);
        CHECK(c.at("all_reduce").payload_bytes == steps * 53 * 4);
        CHECK(held[0].params == 53 * 4);
        CHECK(held[0].optimizer == 2 * 53 * 4);  // m, v
      } else {
        const int64_t padded = 36 + 6 + 4 * 5 + 4;
        // One reduce-scatter per step (stage 3: per layer), one all-gather (stage 3: per layer,
        // forward and backward of every micro-batch).
        const int layers = stage == 3 ? 2 : 1;
        CHECK(c.at("reduce_scatter").calls == steps * layers * ((stage >= 2 && every) ? micro : 1));
        CHECK(c.at("all_gather").calls == steps * layers * (stage == 3 ? 2 * micro : 1));
        CHECK(c.at("all_gather").payload_bytes == steps * padded * 4 * (stage == 3 ? 2 * micro : 1));
        // Rank 0 holds 3 of the 5 rows of the first layer and 2 of the 3 of the second:
        const int64_t shard = 3 * 6 + 3 + 2 * 5 + 2;
        if (stage == 3) CHECK(held[0].params == shard * 4);
        else CHECK(held[0].params == 53 * 4);
        CHECK(held[0].optimizer == (stage == 3 ? 2 : 3) * shard * 4);  // m, v (+ the fp32 master shard)
        CHECK(held[0].grads == (stage == 1 ? 53 * 4 : 0) + shard * 4);
      }
    }
  }
}

TEST_CASE("ShardedDataParallel refuses a stage outside 0..3 and, at stage 3, a parameter with fewer rows than ranks",
          "[dist][shard]") {
  auto solo = dist::Group::create(dist::connect_store(dist::LaunchInfo{}, std::chrono::milliseconds(5000)), 0, 1,
                                  "sdp_solo/", std::chrono::milliseconds(5000));
  dist::ShardOptions o;
  o.stage = 4;
  CHECK_THROWS_AS(dist::ShardedDataParallel(small_mlp(), solo, o, adam), std::invalid_argument);
  std::vector<std::string> msg(2);
  const auto errors = on_two_ranks("sdp_tiny/", [&](std::shared_ptr<dist::Group> g, int r) {
    torch::nn::Sequential net;
    net->push_back(torch::nn::Linear(4, 1));  // 1 row over 2 ranks
    dist::ShardOptions s3;
    s3.stage = 3;
    try {
      dist::ShardedDataParallel model(net, g, s3, adam);
    } catch (const std::invalid_argument& e) {
      msg[static_cast<std::size_t>(r)] = e.what();
    }
  });
  REQUIRE(errors == std::vector<std::string>{"", ""});
  CHECK_THAT(msg[0], Catch::Contains("stage 3 shards") && Catch::Contains("at least one row per rank"));
}

namespace {

// A GPT small enough for a unit test: vocabulary 7 (4 rows per rank, rank 1 holds 3: padding),
// width 4, context 4, one block of 2 heads.
TinyGpt small_gpt() {
  torch::manual_seed(13);
  GptConfig c;
  c.vocab = 7;
  c.context = 4;
  c.width = 4;
  c.heads = 2;
  c.layers = 1;
  return TinyGpt(c);
}

}  // namespace

TEST_CASE("ShardedDataParallel of a whole module (the tiny GPT): stages 0-3 on two Gloo ranks equal one process "
          "bit for bit, stage 3 gathers once per forward and backward",
          "[dist][shard]") {
  torch::manual_seed(6);
  const std::vector<torch::Tensor> xs = {torch::randint(0, 7, {4, 4}), torch::randint(0, 7, {4, 4})};
  const std::vector<torch::Tensor> ys = {torch::randint(0, 7, {4, 4}), torch::randint(0, 7, {4, 4})};
  const int steps = 3, micro = 2;
  std::vector<torch::Tensor> want;  // one process: g_0/2 + g_1/2, each accumulated over 2 micro-batches
  int64_t psi = 0;
  {
    auto net = small_gpt();
    auto opt = adam(net->parameters());
    for (int s = 0; s < steps; ++s) {
      std::vector<torch::Tensor> sum;
      for (std::size_t r = 0; r < 2; ++r) {
        for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
        auto xm = xs[r].tensor_split(micro), ym = ys[r].tensor_split(micro);
        for (int m = 0; m < micro; ++m) (gpt_loss(net->forward(xm[m]), ym[m]) / static_cast<double>(micro)).backward();
        const auto ps = net->parameters();
        for (std::size_t i = 0; i < ps.size(); ++i) {
          auto t = ps[i].grad() / 2.0;
          if (r == 0) sum.push_back(t); else sum[i] = sum[i] + t;
        }
      }
      const auto ps = net->parameters();
      for (std::size_t i = 0; i < ps.size(); ++i) ps[i].mutable_grad() = sum[i];
      opt->step();
    }
    for (const auto& p : net->parameters()) {
      want.push_back(p.detach().clone());
      psi += p.numel();
    }
    REQUIRE(psi == gpt_num_params(net->cfg));
  }
  for (int stage = 0; stage <= 3; ++stage) {
    std::vector<std::vector<torch::Tensor>> got(2);
    std::vector<std::map<std::string, dist::CommCount>> counts(2);
    std::vector<int64_t> numel(2);
    const std::vector<TinyGpt> nets = {small_gpt(), small_gpt()};  // built on this thread (one generator)
    const auto errors = on_two_ranks(fmt::format("sdp_gpt_{}/", stage), [&](std::shared_ptr<dist::Group> g, int r) {
      const auto i = static_cast<std::size_t>(r);
      dist::ShardOptions o;
      o.stage = stage;
      TinyGpt gpt = nets[i];
      dist::ShardedDataParallel model(gpt.ptr(), [gpt](const torch::Tensor& x) mutable { return gpt->forward(x); }, g,
                                      o, adam);
      g->reset_comm_counts();
      for (int s = 0; s < steps; ++s) {
        auto xm = xs[i].tensor_split(micro), ym = ys[i].tensor_split(micro);
        for (int m = 0; m < micro; ++m)
          model.backward(gpt_loss(model.forward(xm[m]), ym[m]) / static_cast<double>(micro), m + 1 == micro);
        model.step();
      }
      counts[i] = g->comm_counts();
      numel[i] = model.numel();
      got[i] = model.full_parameters();
    });
    INFO("stage " << stage);
    REQUIRE(errors == std::vector<std::string>{"", ""});
    CHECK(numel[0] == psi);
    for (std::size_t r = 0; r < 2; ++r)
      for (std::size_t p = 0; p < want.size(); ++p) {
        INFO("rank " << r << ", parameter " << p);
        CHECK(torch::equal(got[r][p], want[p]));
      }
    const auto& c = counts[0];
    if (stage == 0) {
      CHECK(c.at("all_reduce").calls == steps);
    } else {
      CHECK(c.at("reduce_scatter").calls == steps);
      CHECK(c.at("all_gather").calls == steps * (stage == 3 ? 2 * micro : 1));  // the root's one group
    }
  }
}

TEST_CASE("ShardedDataParallel of a whole module refuses, at stage 3, a parameter with fewer rows than ranks, by name",
          "[dist][shard]") {
  std::vector<std::string> msg(2);
  const auto errors = on_two_ranks("sdp_gpt_tiny/", [&](std::shared_ptr<dist::Group> g, int r) {
    GptConfig c;
    c.vocab = 1;  // wte and lm_head: 1 row over 2 ranks
    c.context = 2;
    c.width = 2;
    c.heads = 1;
    c.layers = 1;
    TinyGpt gpt(c);
    dist::ShardOptions s3;
    s3.stage = 3;
    try {
      dist::ShardedDataParallel model(gpt.ptr(), [gpt](const torch::Tensor& x) mutable { return gpt->forward(x); },
                                      g, s3, adam);
    } catch (const std::invalid_argument& e) {
      msg[static_cast<std::size_t>(r)] = e.what();
    }
  });
  REQUIRE(errors == std::vector<std::string>{"", ""});
  CHECK_THAT(msg[0], Catch::Contains("parameter wte.weight") && Catch::Contains("at least one row per rank"));
}
