// Models shared by the experiments. Each is built in the same module order as its
// PyTorch-Python nn.Sequential twin, so the same torch.manual_seed gives the same
// weights bit for bit (LibTorch's C++ and Python frontends share RNG and initialisers:
// nn.Linear draws kaiming_uniform_(a=√5) for the weight, then U(−1/√fan_in, 1/√fan_in)
// for the bias).
#pragma once

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include <torch/torch.h>

namespace mpt {

/// The deep sigmoid network of the underflow lesson:
/// `depth` blocks of Linear(in→width)+Sigmoid (in = in_dim for the first), then Linear(width→1).
/// Python twin: nn.Sequential(*[nn.Linear(d, width), nn.Sigmoid()]*depth, nn.Linear(width, 1)).
/// Input [batch, in_dim] → output [batch, 1]. Throws std::invalid_argument for sizes < 1.
torch::nn::Sequential deep_sigmoid_net(int64_t in_dim, int64_t width, int64_t depth);

/// The Fashion-MNIST classifier MLP of the mixed-precision and parallelism lessons:
/// Flatten, then for each width in `hidden` Linear(d→width) [+ BatchNorm1d(width)] + ReLU, then
/// Linear(d→out_dim). Python twin: nn.Sequential(nn.Flatten(), nn.Linear(784, h), nn.ReLU(), …,
/// nn.Linear(h, 10)), modules constructed in that order (so one torch.manual_seed gives the same
/// weights). Input [batch, 1, 28, 28] or [batch, in_dim] → logits [batch, out_dim].
/// Throws std::invalid_argument for a size < 1.
torch::nn::Sequential mlp(int64_t in_dim, const std::vector<int64_t>& hidden, int64_t out_dim,
                          bool batchnorm = false);

/// Largest |a − b| over all elements (a, b of one shape), as a double: the equivalence
/// metric every experiment reports (0.0 means bitwise equal values).
inline double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

/// Largest |a[i] − b[i]| over paired tensor lists (e.g. two models' gradients, same order); NaN
/// as soon as one pair's difference is NaN, so that a check on it fails (std::max would drop it).
inline double max_abs_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = max_abs_diff(a[i], b[i]);
    if (std::isnan(x)) return x;
    d = std::max(d, x);
  }
  return d;
}

/// max(a, b) that keeps a NaN: NaN when either is NaN. std::max(0.0, NaN) is 0.0, so a running
/// maximum of differences built with std::max hides the NaN of a diverged run and its check passes.
inline double nan_max(double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b); }

/// Largest |a[i] − b[i]| of two series of one length (e.g. two runs' loss per step); NaN when a
/// pair's difference is NaN — a NaN on either side, or inf − inf — so that a check on it fails and
/// a table prints nan, not the finite maximum of the other steps. Throws std::invalid_argument
/// when the lengths differ.
inline double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) throw std::invalid_argument("max_abs_diff: series of different lengths");
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = nan_max(d, std::abs(a[i] - b[i]));
  return d;
}

/// The Linear layers of a Sequential, in order (for per-layer statistics).
std::vector<torch::nn::Linear> linear_layers(const torch::nn::Sequential& net);

// Gradient helpers (the three forms of torch.optim.Optimizer.zero_grad, and a snapshot).

/// Zeroes every parameter's gradient in place, allocating zeros where there is none yet, so
/// that every gradient exists before the next backward (zero_grad(set_to_none=False) plus the
/// allocation: a training step after the first, for memory measurements).
void zero_grads(const std::vector<torch::Tensor>& params);
/// Drops every gradient (zero_grad(set_to_none=True)): the next backward allocates fresh ones.
void clear_grads(const std::vector<torch::Tensor>& params);
/// Detached copies of the parameters' gradients, in order, each the shape of its parameter.
/// Every gradient must be defined (throws c10::Error otherwise).
std::vector<torch::Tensor> clone_grads(const std::vector<torch::Tensor>& params);

}  // namespace mpt
