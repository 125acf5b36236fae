// Models shared by the experiments. Each is built in the same module order as its
// PyTorch-Python nn.Sequential twin, so the same torch.manual_seed gives the same
// weights bit for bit (LibTorch's C++ and Python frontends share RNG and initialisers:
// nn.Linear draws kaiming_uniform_(a=√5) for the weight, then U(−1/√fan_in, 1/√fan_in)
// for the bias).
#pragma once

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <stdexcept>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "core/pipeline/stage.hpp"

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

/// Largest |a − b| with the subtraction in float64 (max_abs_diff subtracts in the tensors' type):
/// for comparisons against float64 references, where an fp32 difference is exact. 0 for empty
/// tensors; NaN when any element's difference is.
inline double max_abs_diff64(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.numel() == 0) return 0.0;
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
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

/// Dropout exactly as torch::dropout(input, p, train) (nn.Dropout, F.dropout; inverted dropout of
/// Srivastava et al. 2014: each element kept with probability 1 − p and scaled by 1/(1 − p)): the
/// same output bit for bit, the same autograd graph (input * noise, one MulBackward0) and the same
/// draws from the default CPU generator, so a run's numbers stay those of its PyTorch twin.
/// ATen's CPU path is empty_like(input).bernoulli_(1 − p).div_(1 − p), then input * noise; its
/// bernoulli_ calls the generator once per element through a serial loop (about 40 % of `mpt
/// checkpoint`'s step on LibTorch 2.15). For a contiguous fp32 CPU input in training, mpt draws the
/// same numbers from the generator's mt19937 state in one loop (dropout_noise) and writes the
/// scaled noise at once, where dropout_kernel(p) says that loop equals ATen's on this LibTorch;
/// everything else (other dtypes, devices, layouts, nested tensors, p = 0 or 1, eval) goes to
/// torch::dropout. The first call in a process runs dropout_kernel's check, which borrows the
/// default CPU generator: call dropout_kernel(p) first where other threads may draw. Shapes: any;
/// returns input's shape. Throws c10::Error for p outside [0, 1], as torch::dropout does.
torch::Tensor dropout(const torch::Tensor& input, double p, bool train);

/// Fills out[0 .. n) with what empty({n}).bernoulli_(keep, gen).div_(keep) would hold (fp32:
/// 1.0f / float(keep) where kept, else 0.0f / float(keep): +0, NaN at keep = 0), advancing `gen`
/// (a CPU generator; default: the global one) exactly as that bernoulli_ does: two mt19937 outputs
/// per element, (first << 32 | second) masked to 53 bits times 2^-53
/// (CPUGeneratorImpl::random64, at::uniform_real_distribution<double>), kept when below keep
/// (at::bernoulli_distribution). The mt19937 refill and tempering are re-implemented here (SSE2
/// tempering), the engine's state copied out and back. Holds the generator's mutex while it draws.
/// Throws std::invalid_argument unless 0 <= keep <= 1 and n >= 0, or for a generator state the
/// engine cannot be in; c10::Error for a generator that is not a CPU one. The equality with ATen's
/// kernel is dropout_kernel()'s check and the unit tests', not an assumption.
void dropout_noise(float* out, int64_t n, double keep, std::optional<at::Generator> gen = std::nullopt);

/// Which kernel mpt::dropout uses for a contiguous fp32 CPU input at dropout probability p, for
/// env: "mpt (...)" when (a) torch::dropout equals dropout_noise's noise times the input, values
/// and the default generator's state after (checked once per process at five p on 3 001 elements;
/// it borrows the default CPU generator and puts it back: call it before other threads draw from
/// it), and (b) dropout_noise equals bernoulli_ + div_ at this p on a private generator (once per
/// p); else "aten (...why...)". p outside (0, 1): "aten (...)", ATen's own cases.
std::string dropout_kernel(double p);

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

// ----------------------------------------------------------------------------
// Models cut into pipeline stages (the stage functions of core/pipeline)
// ----------------------------------------------------------------------------

/// The Linear layers of an MLP with layer widths `widths` (w0 → w1 → … → wL), built in
/// order, as nn.Sequential(Linear(w0,w1), ReLU(), …, Linear(w_{L−1}, w_L)) is in Python,
/// so the same seed gives the same weights. A ReLU follows every layer but the last.
/// Throws std::invalid_argument for fewer than 2 widths or a width < 1.
std::vector<torch::nn::Linear> mlp_layers(const std::vector<int64_t>& widths);

/// Half-open layer ranges [begin, end) of the stages given by `cuts` (a cut c puts
/// layers < c and layers >= c in different stages). Cuts must be strictly increasing
/// and within 1 .. layers−1. Throws std::invalid_argument naming the bad cut.
std::vector<std::pair<int, int>> stage_ranges(int layers, const std::vector<int64_t>& cuts);

/// Cuts that split `layers` layers into `stages` stages as evenly as possible (earlier
/// stages get the extra layer). Throws std::invalid_argument when stages > layers or < 1.
std::vector<int64_t> balanced_cuts(int layers, int stages);

/// Runs layers [begin, end) on x: Linear, then ReLU unless the layer is the model's
/// last (index `total_layers` − 1). x: [batch, w_begin] → [batch, w_end].
/// When `kept` is given, every tensor produced is appended (for activation accounting).
torch::Tensor stage_forward(const std::vector<torch::nn::Linear>& layers, int begin, int end, torch::Tensor x,
                            std::vector<torch::Tensor>* kept = nullptr);

/// The gradient of every parameter of `layers`, in layer order (weight, then bias), detached
/// and cloned. Throws (LibTorch) when a parameter has no gradient yet.
std::vector<torch::Tensor> param_grads(const std::vector<torch::nn::Linear>& layers);

/// Removes every parameter's gradient (.grad = undefined, as zero_grad(set_to_none=True)).
void reset_grads(const std::vector<torch::nn::Linear>& layers);

/// The MLP of `mpt pipeline` as a pipeline stage function (core/pipeline/stage.hpp): `layers`
/// (mlp_layers) cut into the chunks `ranges` (stage_ranges; half-open layer ranges, in order,
/// covering every layer), chunk c running stage_forward(layers, ranges[c]), the loss
/// torch::mse_loss(y, target) (mean over the microbatch). Split backward: each Linear's output
/// (pre-activation) is a weight-gradient root with its weight and bias, so W runs the
/// AddmmBackward node of the forward for its mat2 and bias outputs only — the weight-gradient
/// kernels of the fused backward on the same numbers, hence bitwise its gradients.
/// Activations counted: each Linear's output and each ReLU's output (stage_forward's `kept`).
/// Holds the layers by handle (the modules are shared). Throws std::invalid_argument when
/// `ranges` is empty, not contiguous from layer 0 to the last, or a range is empty.
class MlpStage : public PipelineStage {
 public:
  MlpStage(std::vector<torch::nn::Linear> layers, std::vector<std::pair<int, int>> ranges);
  int chunks() const override { return static_cast<int>(ranges_.size()); }
  /// x: [rows, w_begin] → [rows, w_end] through layers ranges[chunk].
  torch::Tensor forward(int chunk, const torch::Tensor& x, ChunkSaved* saved = nullptr) const override;
  /// Weight, then bias, of each layer of the chunk, in layer order.
  std::vector<torch::Tensor> parameters(int chunk) const override;
  torch::Tensor loss(const torch::Tensor& y, const torch::Tensor& target) const override;
  /// [rows, out features of the chunk's last layer].
  std::vector<int64_t> output_shape(int chunk, const std::vector<int64_t>& microbatch_shape) const override;
  /// The chunk's number of Linear layers.
  int cost_units(int chunk) const override;
  const std::vector<torch::nn::Linear>& layers() const { return layers_; }
  const std::vector<std::pair<int, int>>& ranges() const { return ranges_; }

 private:
  std::vector<torch::nn::Linear> layers_;
  std::vector<std::pair<int, int>> ranges_;
};

}  // namespace mpt
