// Gradient checkpointing (core/train/checkpoint): gradients equal to the plain ones bit for
// bit, parameters reached without an input that requires grad, RNG restoration,
// segment splitting as torch.utils.checkpoint.checkpoint_sequential, and less memory.
#include "catch.hpp"
#include "core/train/checkpoint.hpp"
#include "core/runtime/memory.hpp"
#include "core/numerics/precision.hpp"

using namespace mpt;

namespace {

// `depth` blocks of Linear(width, width) + ReLU + Dropout(p): 3·depth modules.
torch::nn::Sequential block_net(int64_t depth, int64_t width, double p) {
  torch::manual_seed(7);
  torch::nn::Sequential net;
  for (int64_t i = 0; i < depth; ++i) {
    net->push_back(torch::nn::Linear(width, width));
    net->push_back(torch::nn::ReLU());
    net->push_back(torch::nn::Dropout(p));
  }
  return net;
}

struct Grads {
  std::vector<torch::Tensor> params;
  torch::Tensor input;
  double loss = 0;
  double next_random = 0;  // first draw from the generator after the backward pass
};

// One forward+backward from the same seed; segments == 0: no checkpointing.
Grads run(torch::nn::Sequential& net, int64_t segments, bool input_grad, bool preserve_rng = true) {
  for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
  torch::manual_seed(11);
  auto x = torch::randn({16, net[0]->as<torch::nn::Linear>()->options.in_features()});
  if (input_grad) x.requires_grad_(true);
  auto y = segments == 0 ? net->forward(x) : checkpoint_sequential(net, segments, x, {preserve_rng});
  auto loss = y.pow(2).mean();
  loss.backward();
  Grads g;
  for (auto& p : net->parameters()) g.params.push_back(p.grad().clone());
  if (input_grad) g.input = x.grad().clone();
  g.loss = loss.item<double>();
  g.next_random = torch::rand({1}).item<double>();
  return g;
}

bool all_equal(const Grads& a, const Grads& b) {
  if (a.params.size() != b.params.size()) return false;
  for (std::size_t i = 0; i < a.params.size(); ++i)
    if (!a.params[i].defined() || !b.params[i].defined() || !torch::equal(a.params[i], b.params[i])) return false;
  if (a.input.defined() != b.input.defined()) return false;
  return !a.input.defined() || torch::equal(a.input, b.input);
}

}  // namespace

TEST_CASE("checkpointed gradients equal the plain ones bit for bit, with dropout", "[checkpoint]") {
  auto net = block_net(/*depth=*/6, /*width=*/32, /*p=*/0.3);
  net->train();
  Grads plain = run(net, 0, /*input_grad=*/true);
  for (int64_t s : {2, 3, 6, 18}) {
    INFO("segments " << s);
    Grads ck = run(net, s, true);
    CHECK(ck.loss == plain.loss);
    CHECK(all_equal(ck, plain));
    // Recomputation does not move the generator: the next draw is the plain run's.
    CHECK(ck.next_random == plain.next_random);
  }
}

TEST_CASE("parameters get gradients when the segment input does not require grad", "[checkpoint]") {
  auto net = block_net(4, 16, 0.2);
  Grads plain = run(net, 0, /*input_grad=*/false);
  Grads ck = run(net, 4, false);
  REQUIRE(ck.params.size() == plain.params.size());
  for (auto& g : ck.params) REQUIRE(g.defined());
  CHECK(all_equal(ck, plain));
  // The first parameter lives in the first, checkpointed segment whose input is a leaf
  // without requires_grad: the case naive reentrant checkpointing gets wrong.
  CHECK(ck.params[0].abs().sum().item<double>() > 0);
}

TEST_CASE("without RNG restoration dropout draws other masks on recomputation", "[checkpoint]") {
  auto net = block_net(4, 32, 0.5);
  Grads plain = run(net, 0, true);
  Grads bad = run(net, 4, true, /*preserve_rng=*/false);
  CHECK(bad.loss == plain.loss);  // the forward pass itself is unchanged
  CHECK_FALSE(all_equal(bad, plain));
  double diff = 0;
  for (std::size_t i = 0; i < plain.params.size(); ++i)
    diff = std::max(diff, (bad.params[i] - plain.params[i]).abs().max().item<double>());
  CHECK(diff > 1e-3);
  // Without dropout it does not matter.
  auto det = block_net(4, 32, 0.0);
  CHECK(all_equal(run(det, 4, true, false), run(det, 0, true)));
}

TEST_CASE("checkpoint of one segment: input gradient, no-grad mode, bad arguments", "[checkpoint]") {
  torch::manual_seed(3);
  torch::nn::Linear lin(8, 8);
  auto f = [&](const torch::Tensor& x) { return torch::tanh(lin->forward(x)) * 2; };
  auto x = torch::randn({5, 8}, torch::requires_grad());
  auto y1 = f(x).sum();
  auto g_plain = torch::autograd::grad({y1}, {x, lin->weight, lin->bias});
  auto y2 = checkpoint(f, x, lin->parameters()).sum();
  auto g_ck = torch::autograd::grad({y2}, {x, lin->weight, lin->bias});
  for (int i = 0; i < 3; ++i) CHECK(torch::equal(g_plain[i], g_ck[i]));
  {
    torch::NoGradGuard ng;
    auto y = checkpoint(f, x, lin->parameters());
    CHECK_FALSE(y.requires_grad());
  }
  CHECK_THROWS_AS(checkpoint(SegmentFn{}, x, {}), std::invalid_argument);
  CHECK_THROWS_AS(checkpoint(f, torch::Tensor(), {}), std::invalid_argument);
}

TEST_CASE("checkpoint with emulated fp16 rounding inside the segment", "[checkpoint]") {
  torch::manual_seed(5);
  torch::nn::Linear a(16, 16), b(16, 16);
  std::vector<torch::Tensor> params = a->parameters();
  for (auto& p : b->parameters()) params.push_back(p);
  // Emulated fp16 compute: every stored activation rounded to fp16.
  auto f = [&](const torch::Tensor& x) {
    auto h = round_to(torch::relu(a->forward(round_to(x, Format::FP16))), Format::FP16);
    return round_to(b->forward(h), Format::FP16);
  };
  auto x = torch::randn({4, 16}, torch::requires_grad());
  auto g_plain = torch::autograd::grad({f(x).pow(2).sum()}, {x, a->weight, b->weight});
  auto g_ck = torch::autograd::grad({checkpoint(f, x, params).pow(2).sum()}, {x, a->weight, b->weight});
  for (int i = 0; i < 3; ++i) CHECK(torch::equal(g_plain[i], g_ck[i]));
}

TEST_CASE("segments split as torch.utils.checkpoint.checkpoint_sequential", "[checkpoint]") {
  using R = std::vector<std::pair<int64_t, int64_t>>;
  CHECK(sequential_segments(10, 1) == R{{0, 10}});
  CHECK(sequential_segments(10, 3) == R{{0, 3}, {3, 6}, {6, 10}});
  CHECK(sequential_segments(4, 4) == R{{0, 1}, {1, 2}, {2, 3}, {3, 4}});
  CHECK(recomputed_modules(10, 3) == 6);
  CHECK(recomputed_modules(10, 1) == 0);
  CHECK(recomputed_modules(32, 32) == 31);
  CHECK_THROWS_AS(sequential_segments(10, 0), std::invalid_argument);
  CHECK_THROWS_AS(sequential_segments(10, 11), std::invalid_argument);
  auto net = block_net(2, 4, 0.0);
  CHECK_THROWS_AS(checkpoint_sequential(net, 7, torch::randn({1, 4})), std::invalid_argument);
}

TEST_CASE("checkpointing lowers the peak bytes of forward+backward", "[checkpoint][memory]") {
  install_counting_allocator();
  auto net = block_net(/*depth=*/16, /*width=*/64, /*p=*/0.1);
  auto peak = [&](int64_t segments) {
    for (auto& p : net->parameters()) p.mutable_grad() = torch::zeros_like(p);  // grads live before
    torch::manual_seed(1);
    auto x = torch::randn({256, 64});
    PeakScope scope(torch::kCPU);
    auto y = segments == 0 ? net->forward(x) : checkpoint_sequential(net, segments, x);
    y.pow(2).mean().backward();
    return scope.peak_bytes();
  };
  const int64_t none = peak(0), s4 = peak(4), s2 = peak(2);
  INFO("none " << none << ", 2 segments " << s2 << ", 4 segments " << s4);
  CHECK(s2 < none);
  CHECK(s4 < s2);
  CHECK(peak(0) == none);  // deterministic on CPU
}
