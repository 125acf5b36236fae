// core/models and core/runtime/timing: the deep sigmoid net's structure and initialisation order, its
// Linear layers, the gradient helpers, the max-abs-difference metric every experiment reports,
// median_seconds, and mpt::dropout against torch::dropout.
#include <algorithm>
#include <cmath>
#include <mutex>
#include <stdexcept>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>

#include "catch.hpp"
#include "core/models/mlp.hpp"
#include "core/runtime/runtime.hpp"
#include "core/runtime/timing.hpp"

using namespace mpt;

TEST_CASE("deep_sigmoid_net: depth x (Linear + Sigmoid), then Linear(width, 1)", "[models]") {
  auto net = deep_sigmoid_net(/*in_dim=*/5, /*width=*/7, /*depth=*/3);
  REQUIRE(net->size() == 7);  // 3 x 2 + 1
  const auto layers = linear_layers(net);
  REQUIRE(layers.size() == 4);
  CHECK(layers[0]->weight.sizes() == torch::IntArrayRef({7, 5}));
  CHECK(layers[1]->weight.sizes() == torch::IntArrayRef({7, 7}));
  CHECK(layers[2]->weight.sizes() == torch::IntArrayRef({7, 7}));
  CHECK(layers[3]->weight.sizes() == torch::IntArrayRef({1, 7}));
  auto y = net->forward(torch::randn({4, 5}));
  CHECK(y.sizes() == torch::IntArrayRef({4, 1}));
  CHECK_THROWS_AS(deep_sigmoid_net(0, 7, 3), std::invalid_argument);
  CHECK_THROWS_AS(deep_sigmoid_net(5, 0, 3), std::invalid_argument);
  CHECK_THROWS_AS(deep_sigmoid_net(5, 7, 0), std::invalid_argument);
}

TEST_CASE("mlp: Flatten, (Linear [+ BatchNorm1d] + ReLU) per hidden width, Linear, weights in module order", "[models]") {
  torch::manual_seed(7);
  auto net = mlp(/*in_dim=*/784, /*hidden=*/{16, 8}, /*out_dim=*/10);
  REQUIRE(net->size() == 6);  // Flatten, Linear, ReLU, Linear, ReLU, Linear
  const auto layers = linear_layers(net);
  REQUIRE(layers.size() == 3);
  CHECK(layers[0]->weight.sizes() == torch::IntArrayRef({16, 784}));
  CHECK(layers[1]->weight.sizes() == torch::IntArrayRef({8, 16}));
  CHECK(layers[2]->weight.sizes() == torch::IntArrayRef({10, 8}));
  CHECK(net->forward(torch::randn({3, 1, 28, 28})).sizes() == torch::IntArrayRef({3, 10}));
  // The same draws as Linear layers constructed one after the other from the same seed.
  torch::manual_seed(7);
  torch::nn::Linear a(784, 16), b(16, 8), c(8, 10);
  CHECK(torch::equal(layers[0]->weight, a->weight));
  CHECK(torch::equal(layers[1]->bias, b->bias));
  CHECK(torch::equal(layers[2]->weight, c->weight));
  CHECK(mlp(784, {16}, 10, /*batchnorm=*/true)->size() == 5);
  CHECK_THROWS_AS(mlp(784, {0}, 10), std::invalid_argument);
  CHECK_THROWS_AS(mlp(0, {4}, 10), std::invalid_argument);
}

TEST_CASE("deep_sigmoid_net draws its weights in module order, as nn.Sequential does", "[models]") {
  // The same seed gives the same net; the first layer's weight is the first draw after the seed,
  // so building nn.Linear(5, 7) alone from that seed gives the same tensor (the Python twin's order).
  torch::manual_seed(11);
  auto a = deep_sigmoid_net(5, 7, 2);
  torch::manual_seed(11);
  auto b = deep_sigmoid_net(5, 7, 2);
  torch::manual_seed(11);
  torch::nn::Linear first(5, 7);
  const auto la = linear_layers(a), lb = linear_layers(b);
  for (std::size_t i = 0; i < la.size(); ++i) {
    CHECK(torch::equal(la[i]->weight, lb[i]->weight));
    CHECK(torch::equal(la[i]->bias, lb[i]->bias));
  }
  CHECK(torch::equal(la[0]->weight, first->weight));
  CHECK(torch::equal(la[0]->bias, first->bias));
}

TEST_CASE("linear_layers skips the activations and keeps the order", "[models]") {
  torch::nn::Sequential net(torch::nn::Linear(3, 4), torch::nn::ReLU(), torch::nn::Linear(4, 2));
  const auto layers = linear_layers(net);
  REQUIRE(layers.size() == 2);
  CHECK(layers[0]->weight.size(1) == 3);
  CHECK(layers[1]->weight.size(0) == 2);
}

TEST_CASE("max_abs_diff: the largest elementwise |a - b|, over one tensor or paired lists", "[models]") {
  auto a = torch::tensor({1.0f, -2.0f, 3.0f});
  auto b = torch::tensor({1.5f, -2.0f, 0.0f});
  CHECK(max_abs_diff(a, b) == 3.0);
  CHECK(max_abs_diff(a, a) == 0.0);
  std::vector<torch::Tensor> xs = {a, torch::zeros({2})}, ys = {a, torch::tensor({0.0f, -0.25f})};
  CHECK(max_abs_diff(xs, ys) == 0.25);
  CHECK(std::isnan(max_abs_diff(torch::tensor({NAN}), torch::tensor({0.0f}))));  // NaN is never hidden
  // ... nor in a list, wherever it stands (std::max(d, NaN) would have returned d)
  std::vector<torch::Tensor> xn = {torch::tensor({NAN}), a}, yn = {torch::tensor({0.0f}), b};
  CHECK(std::isnan(max_abs_diff(xn, yn)));
  std::vector<torch::Tensor> xl = {a, torch::tensor({NAN})}, yl = {b, torch::tensor({0.0f})};
  CHECK(std::isnan(max_abs_diff(xl, yl)));
}

TEST_CASE("nan_max and max_abs_diff of two series keep a NaN (std::max drops it)", "[models]") {
  CHECK(std::max(0.0, double(NAN)) == 0.0);  // the trap: a running std::max forgets the NaN
  CHECK(std::isnan(nan_max(0.0, NAN)));
  CHECK(std::isnan(nan_max(NAN, 1.0)));
  CHECK(nan_max(1.0, 2.0) == 2.0);
  CHECK(nan_max(1.0, INFINITY) == INFINITY);
  CHECK(max_abs_diff(std::vector<double>{1, 2, 3}, std::vector<double>{1, 2.5, 2}) == 1.0);
  // a NaN on one side at any step, wherever the finite steps' maximum is: NaN
  CHECK(std::isnan(max_abs_diff(std::vector<double>{5, NAN}, std::vector<double>{1, 1})));
  CHECK(std::isnan(max_abs_diff(std::vector<double>{1, 2}, std::vector<double>{NAN, 2})));
  // two runs that both reached inf are not "equal": inf - inf is NaN
  CHECK(std::isnan(max_abs_diff(std::vector<double>{INFINITY}, std::vector<double>{INFINITY})));
  CHECK_THROWS_AS(max_abs_diff(std::vector<double>{1}, std::vector<double>{1, 2}), std::invalid_argument);
}

TEST_CASE("zero_grads allocates or zeroes, clear_grads drops, clone_grads snapshots", "[models]") {
  torch::nn::Linear lin(3, 2);
  const auto params = lin->parameters();
  zero_grads(params);  // none yet: allocated as zeros
  for (const auto& p : params) {
    REQUIRE(p.grad().defined());
    CHECK(p.grad().abs().sum().item<double>() == 0.0);
  }
  lin->forward(torch::ones({4, 3})).sum().backward();
  const auto snap = clone_grads(params);
  REQUIRE(snap.size() == 2);
  CHECK(snap[1].sizes() == torch::IntArrayRef({2}));
  CHECK(snap[1][0].item<double>() == 4.0);  // d(sum)/d(bias) = batch
  zero_grads(params);                         // in place: the snapshot keeps its values
  CHECK(params[1].grad()[0].item<double>() == 0.0);
  CHECK(snap[1][0].item<double>() == 4.0);
  clear_grads(params);
  for (const auto& p : params) CHECK_FALSE(p.grad().defined());
}

TEST_CASE("median_seconds: warm-up calls untimed, the median of the timed ones", "[models]") {
  int calls = 0;
  const double t = median_seconds([&] { ++calls; }, /*repeats=*/5, /*warmup=*/2);
  CHECK(calls == 7);
  CHECK(t >= 0.0);
  CHECK(t < 0.5);
  CHECK_THROWS_AS(median_seconds([] {}, 0), std::invalid_argument);
}

namespace {

// The bits of a float tensor (contiguous copy), for comparisons that tell +0 from -0 and NaNs apart.
torch::Tensor bits(const torch::Tensor& t) { return t.contiguous().view(torch::kInt32).clone(); }

torch::Tensor cpu_state() { return generator_state(at::detail::getDefaultCPUGenerator()); }

void set_cpu_state(const torch::Tensor& state) { set_generator_state(at::detail::getDefaultCPUGenerator(), state); }

}  // namespace

TEST_CASE("dropout_noise draws what ATen's bernoulli_ + div_ draws, and leaves the generator where it does",
          "[models][dropout]") {
  // Private generators from one seed; words skipped first so that draws start at even and odd
  // positions of the mt19937 state (an odd start makes a draw straddle a refill of the 624 words).
  for (const int skip : {0, 1, 2, 623, 624, 625, 1247}) {
    for (const double keep : {0.9, 0.5, 0.05, 1.0 / 3.0, 0.95, 0.0, 1.0}) {
      for (const int64_t n : {0, 1, 2, 311, 312, 313, 624, 625, 1000, 5000}) {
        auto g_ref = at::make_generator<at::CPUGeneratorImpl>(1234 + skip);
        auto g_mpt = at::make_generator<at::CPUGeneratorImpl>(1234 + skip);
        for (int i = 0; i < skip; ++i) {
          g_ref.get<at::CPUGeneratorImpl>()->random();
          g_mpt.get<at::CPUGeneratorImpl>()->random();
        }
        const torch::Tensor ref = torch::empty({n}).bernoulli_(keep, g_ref).div_(keep);
        torch::Tensor mine = torch::full({n}, -7.0f);
        dropout_noise(mine.data_ptr<float>(), n, keep, g_mpt);
        INFO("skip " << skip << ", keep " << keep << ", n " << n);
        REQUIRE(torch::equal(bits(ref), bits(mine)));
        REQUIRE(torch::equal(g_ref.get_state(), g_mpt.get_state()));
        // and the next draws agree: the state is the same, not only its serialisation
        CHECK(g_ref.get<at::CPUGeneratorImpl>()->random64() == g_mpt.get<at::CPUGeneratorImpl>()->random64());
      }
    }
  }
  float x = 0;
  // A state no seeding or draw can make (set_engine takes any): reading it would run past the words.
  auto bad = at::make_generator<at::CPUGeneratorImpl>(1);
  at::mt19937 engine(1);
  at::mt19937_data_pod pod = engine.data();
  pod.next_ = 600;
  pod.left_ = 100;
  engine.set_data(pod);
  bad.get<at::CPUGeneratorImpl>()->set_engine(engine);
  CHECK_THROWS_AS(dropout_noise(&x, 1, 0.5, bad), std::invalid_argument);
  CHECK_THROWS_AS(dropout_noise(&x, 1, 1.5), std::invalid_argument);
  CHECK_THROWS_AS(dropout_noise(&x, 1, std::nan("")), std::invalid_argument);
  CHECK_THROWS_AS(dropout_noise(&x, -1, 0.5), std::invalid_argument);
}

TEST_CASE("mpt::dropout equals torch::dropout: output, gradient and the global generator after", "[models][dropout]") {
  // LibTorch's two shipped routes (2.x wheel, Debian 1.13) both draw with the serial bernoulli_ loop
  // that mpt's loop reproduces; another LibTorch may not, and then dropout() falls back to ATen.
  for (const double p : {0.1, 0.5, 0.95, 0.3}) {
    INFO(dropout_kernel(p));
    CHECK(dropout_kernel(p).rfind("mpt", 0) == 0);
    for (const auto& shape : std::vector<std::vector<int64_t>>{{256, 32}, {7}, {3, 5, 11}, {0, 4}}) {
      torch::manual_seed(99);
      torch::Tensor x0 = torch::randn(shape);
      if (x0.numel() > 2) {  // specials keep their bits: x * 0 is NaN for inf and NaN, -0 for negatives
        x0.view({-1})[0] = INFINITY;
        x0.view({-1})[1] = NAN;
      }
      const torch::Tensor start = cpu_state();
      auto xa = x0.clone().requires_grad_(true);
      auto ya = torch::dropout(xa, p, true);
      ya.backward(torch::ones_like(ya) * 3.0);
      const torch::Tensor after_aten = cpu_state();
      set_cpu_state(start);
      auto xb = x0.clone().requires_grad_(true);
      auto yb = mpt::dropout(xb, p, true);
      yb.backward(torch::ones_like(yb) * 3.0);
      INFO("p " << p << ", numel " << x0.numel());
      CHECK(torch::equal(bits(ya), bits(yb)));
      // The same graph: one multiplication by the noise (an empty input comes back as it is).
      REQUIRE((ya.grad_fn() == nullptr) == (yb.grad_fn() == nullptr));
      if (x0.numel() > 0) {
        REQUIRE(yb.grad_fn());
        CHECK(yb.grad_fn()->name() == ya.grad_fn()->name());
        CHECK(yb.grad_fn()->name() == "MulBackward0");
      }
      CHECK(torch::equal(bits(xa.grad()), bits(xb.grad())));
      CHECK(torch::equal(after_aten, cpu_state()));
    }
  }
}

TEST_CASE("dropout_kernel's checks draw nothing from the default generator", "[models][dropout]") {
  torch::manual_seed(11);
  const torch::Tensor start = cpu_state();
  for (const double p : {0.37, 0.1, 0.999})  // a new p each time the test binary runs this case first
    CHECK(dropout_kernel(p).rfind("mpt", 0) == 0);
  CHECK(dropout_kernel(0.0).rfind("aten", 0) == 0);
  CHECK(dropout_kernel(1.0).rfind("aten", 0) == 0);
  CHECK(torch::equal(start, cpu_state()));
}

TEST_CASE("mpt::dropout hands what its loop does not cover to torch::dropout", "[models][dropout]") {
  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({16, 8});
  auto same = [](const torch::Tensor& in, double p, bool train) {
    const torch::Tensor start = cpu_state();
    const torch::Tensor a = torch::dropout(in, p, train);
    set_cpu_state(start);
    const torch::Tensor b = mpt::dropout(in, p, train);
    return torch::equal(a, b) && a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes();
  };
  CHECK(same(x, 0.5, false));                        // eval: the input itself
  CHECK(mpt::dropout(x, 0.5, false).is_same(x));
  CHECK(same(x, 0.0, true));                         // p = 0
  CHECK(same(x, 1.0, true));                         // p = 1: all zeros
  CHECK(same(x.t(), 0.5, true));                     // not contiguous
  CHECK(same(x.to(torch::kDouble), 0.5, true));      // other dtypes
  CHECK(same(x.to(torch::kBFloat16), 0.5, true));
  CHECK_THROWS(mpt::dropout(x, 1.5, true));         // as torch::dropout: p outside [0, 1]
  CHECK_THROWS(mpt::dropout(x, -0.1, true));
}
