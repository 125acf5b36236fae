// Unit tests of core/parallel/reference: DistributedSampler's split (shard_of), the single-process
// replays and their helpers.
#include <vector>

#include "catch.hpp"
#include "core/parallel/reference.hpp"

using namespace mpt;

namespace {

torch::nn::Sequential tiny_net() {
  torch::manual_seed(3);
  torch::nn::Sequential net;
  net->push_back(torch::nn::Linear(4, 5));
  net->push_back(torch::nn::ReLU());
  net->push_back(torch::nn::Linear(5, 3));
  return net;
}

std::vector<int64_t> values(const torch::Tensor& t) {
  auto c = t.contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

}  // namespace

TEST_CASE("reference::shard_of: indices[rank:total:replicas] after DistributedSampler's padding rule",
          "[parallel][reference]") {
  const auto idx = torch::arange(10, torch::kLong);
  // drop_last: total = 9, the tail element 9 dropped
  CHECK((values(reference::shard_of(idx, 0, 3)) == std::vector<int64_t>{0, 3, 6}));
  CHECK((values(reference::shard_of(idx, 1, 3)) == std::vector<int64_t>{1, 4, 7}));
  CHECK((values(reference::shard_of(idx, 2, 3)) == std::vector<int64_t>{2, 5, 8}));
  // padding: total = 12, indices + indices[:2]
  CHECK((values(reference::shard_of(idx, 0, 3, false)) == std::vector<int64_t>{0, 3, 6, 9}));
  CHECK((values(reference::shard_of(idx, 1, 3, false)) == std::vector<int64_t>{1, 4, 7, 0}));
  CHECK((values(reference::shard_of(idx, 2, 3, false)) == std::vector<int64_t>{2, 5, 8, 1}));
  // padding longer than the list: (indices * ceil(pad / n))[:pad]
  const auto two = torch::tensor({7, 8}, torch::kLong);
  std::vector<int64_t> got;
  for (int64_t r = 0; r < 5; ++r) got.push_back(values(reference::shard_of(two, r, 5, false)).at(0));
  CHECK((got == std::vector<int64_t>{7, 8, 7, 8, 7}));
  CHECK(values(reference::shard_of(idx, 0, 1)) == values(idx));
  CHECK_THROWS_AS(reference::shard_of(idx, 3, 3), std::invalid_argument);
  CHECK_THROWS_AS(reference::shard_of(idx, 0, 0), std::invalid_argument);
  CHECK_THROWS_AS(reference::shard_of(idx.reshape({2, 5}), 0, 2), std::invalid_argument);
}

TEST_CASE("reference::flat and take_grads: float32 CPU vector; gradients taken out, zeros where undefined",
          "[parallel][reference]") {
  const auto a = torch::tensor({1.5, -2.0}, torch::kFloat32), b = torch::tensor({{0.25, 3.0}}, torch::kBFloat16);
  const auto f = reference::flat({a, b});
  CHECK(f.scalar_type() == torch::kFloat32);
  CHECK(torch::equal(f, torch::tensor({1.5, -2.0, 0.25, 3.0}, torch::kFloat32)));

  auto p = torch::ones({2}, torch::requires_grad()), q = torch::ones({3}, torch::requires_grad());
  (p * 2).sum().backward();
  const auto g = reference::take_grads({p, q});
  CHECK(torch::equal(g[0], torch::full({2}, 2.0)));
  CHECK(torch::equal(g[1], torch::zeros({3})));
  CHECK_FALSE(p.grad().defined());
}

TEST_CASE("reference::replay: rank by rank equals the hand-written accumulation bit for bit; DivideSum = "
          "DivideEachTerm at N = 2; WholeBatch is one backward",
          "[parallel][reference]") {
  torch::manual_seed(9);
  const std::vector<torch::Tensor> xs = {torch::randn({4, 4}), torch::randn({4, 4})};
  const std::vector<torch::Tensor> ys = {torch::randint(0, 3, {4}), torch::randint(0, 3, {4})};
  const int steps = 3, micro = 2;
  const reference::LocalBatch batch = [&](int64_t r, int64_t) {
    return std::make_pair(xs[static_cast<std::size_t>(r)], ys[static_cast<std::size_t>(r)]);
  };
  auto run = [&](reference::Mode mode, reference::Mean mean) {
    auto net = tiny_net();
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
    reference::ReplaySpec spec;
    spec.ranks = 2;
    spec.steps = steps;
    spec.micro_batches = micro;
    spec.mode = mode;
    spec.mean = mean;
    int calls = 0;
    spec.on_step = [&] { ++calls; };
    auto t = reference::replay(
        net->parameters(), opt,
        [&](const torch::Tensor& x, const torch::Tensor& y) { return torch::cross_entropy_loss(net->forward(x), y); },
        batch, spec);
    CHECK(calls == steps);
    return t;
  };
  // By hand: g = g_0/2 + g_1/2, g_r accumulated over the micro-batches (loss / M each).
  std::vector<torch::Tensor> want;
  std::vector<double> want_loss;
  {
    auto net = tiny_net();
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
    for (int s = 0; s < steps; ++s) {
      std::vector<torch::Tensor> sum;
      double loss = 0;
      for (std::size_t r = 0; r < 2; ++r) {
        for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
        auto xm = xs[r].tensor_split(micro), ym = ys[r].tensor_split(micro);
        for (int m = 0; m < micro; ++m) {
          auto l = torch::cross_entropy_loss(net->forward(xm[m]), ym[m]) / static_cast<double>(micro);
          l.backward();
          loss += l.item<double>();
        }
        const auto ps = net->parameters();
        for (std::size_t i = 0; i < ps.size(); ++i) {
          auto t = ps[i].grad() / 2.0;
          if (r == 0) sum.push_back(t); else sum[i] = sum[i] + t;
        }
      }
      const auto ps = net->parameters();
      for (std::size_t i = 0; i < ps.size(); ++i) ps[i].mutable_grad() = sum[i];
      opt.step();
      want.push_back(reference::flat(net->parameters()));
      want_loss.push_back(loss / 2);
    }
  }
  const auto each = run(reference::Mode::RankByRank, reference::Mean::DivideEachTerm);
  REQUIRE(each.params.size() == static_cast<std::size_t>(steps));
  for (int s = 0; s < steps; ++s) CHECK(torch::equal(each.params[s], want[s]));
  CHECK(each.losses == want_loss);
  // (a + b)/2 = a/2 + b/2 exactly in binary floating point (no subnormals here)
  const auto after = run(reference::Mode::RankByRank, reference::Mean::DivideSum);
  for (int s = 0; s < steps; ++s) CHECK(torch::equal(after.params[s], want[s]));

  const auto whole = run(reference::Mode::WholeBatch, reference::Mean::DivideEachTerm);
  {
    auto net = tiny_net();
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      auto l = torch::cross_entropy_loss(net->forward(torch::cat(xs)), torch::cat(ys));
      l.backward();
      CHECK(whole.losses[s] == l.item<double>());
      opt.step();
      CHECK(torch::equal(whole.params[s], reference::flat(net->parameters())));
    }
  }
  CHECK_THROWS_AS(reference::accumulate_micro_batches(xs[0], ys[0], 0, {}), std::invalid_argument);
}
