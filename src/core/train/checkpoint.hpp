// Gradient checkpointing (activation recomputation) for LibTorch's C++ API, which has
// none of its own. Mirrors torch.utils.checkpoint.checkpoint / checkpoint_sequential
// (PyTorch 1.13, reentrant variant with preserve_rng_state=True) and the method of
// Chen, Xu, Zhang, Guestrin, "Training Deep Nets with Sublinear Memory Cost" (2016).
//
//   forward : the segment runs under NoGradGuard: its intermediate activations are
//             freed as soon as they are used; only the segment's input is kept
//             (plus the RNG state at entry).
//   backward: the segment is run again with grad enabled from the saved input (and the
//             saved RNG state, so dropout draws the same masks), then autograd.grad of
//             the recomputed output w.r.t. the input and the segment's parameters.
//
// The segment's parameters are passed to the autograd Function as inputs. That is what
// lets gradients reach them when the segment's input does not require grad (a known
// failure of naive reentrant checkpointing: PyTorch's reentrant version then returns
// no gradients for the parameters and warns; its non-reentrant version, built on
// saved-tensor hooks that LibTorch's C++ API does not offer, does not have the problem).
//
//   auto y = mpt::checkpoint([&](const torch::Tensor& x) { return block->forward(x); },
//                            x, block->parameters());
//   auto z = mpt::checkpoint_sequential(net, /*segments=*/4, x);
#pragma once

#include <functional>
#include <vector>

#include <torch/torch.h>

namespace mpt {

/// A segment: one tensor in, one tensor out. It may read parameters and draw random
/// numbers (dropout); it must not depend on anything else that changes between the
/// forward and the backward pass.
using SegmentFn = std::function<torch::Tensor(const torch::Tensor&)>;

/// Options of checkpoint().
struct CheckpointOptions {
  /// Save the default generator's state of the input's device (and the CPU one) before
  /// the forward and restore it around the recomputation, as PyTorch's
  /// preserve_rng_state=True. false shows why it exists: dropout draws other masks on
  /// recomputation and the gradients no longer equal the plain ones.
  bool preserve_rng_state = true;
};

/// Runs `fn(input)` without keeping its intermediate activations and recomputes them in
/// the backward pass. `params`: the tensors `fn` reads that need gradients (e.g. the
/// segment's module->parameters()); each gets exactly the gradient it would get without
/// checkpointing, also when `input` does not require grad.
/// Shapes: whatever `fn` accepts and returns (one tensor each).
/// When grad mode is off (NoGradGuard), or nothing requires grad, it simply returns fn(input).
/// The RNG state after the backward pass is the one before it (recomputation does not
/// advance the generator), as PyTorch's torch.random.fork_rng does.
/// Throws std::invalid_argument for an undefined input or an empty fn.
torch::Tensor checkpoint(const SegmentFn& fn, const torch::Tensor& input, const std::vector<torch::Tensor>& params,
                         const CheckpointOptions& opts = {});

/// How checkpoint_sequential() splits `n` modules into `segments` segments, as
/// torch.utils.checkpoint.checkpoint_sequential does: segment size floor(n/segments); the
/// first segments−1 segments are checkpointed, the last one (the rest, at least one
/// segment's worth of modules) runs normally, since its activations would be recomputed
/// immediately anyway. Returns the [begin, end) module ranges, in order.
/// Throws std::invalid_argument unless 1 <= segments <= n.
std::vector<std::pair<int64_t, int64_t>> sequential_segments(int64_t n, int64_t segments);

/// Number of modules whose forward is run twice by checkpoint_sequential(n, segments):
/// (segments − 1) · floor(n / segments).
int64_t recomputed_modules(int64_t n, int64_t segments);

/// torch.utils.checkpoint.checkpoint_sequential for a torch::nn::Sequential: splits its
/// modules as sequential_segments() says, checkpoints every segment but the last, and
/// returns the output. segments == 1 runs the whole net without checkpointing.
/// Throws std::invalid_argument unless 1 <= segments <= net->size().
torch::Tensor checkpoint_sequential(const torch::nn::Sequential& net, int64_t segments, const torch::Tensor& input,
                                    const CheckpointOptions& opts = {});

}  // namespace mpt
