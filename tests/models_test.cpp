// core/models and core/timing: the deep sigmoid net's structure and initialisation order, its
// Linear layers, the gradient helpers, the max-abs-difference metric every experiment reports,
// and median_seconds.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "catch.hpp"
#include "core/models.hpp"
#include "core/timing.hpp"

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
