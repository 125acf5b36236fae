// The stage function of a pipeline (part of core/pipeline): what the executor (core/pipeline/executor.hpp)
// calls to run one model chunk, so that any model cut into chunks runs on it — the MLP of
// `mpt pipeline` (MlpStage, core/models/mlp.hpp), a transformer cut between blocks (the tiny GPT in
// tests/pipeline/pipeline_test.cpp), a tensor-parallel stage. torch.distributed.pipelining's
// PipelineStage wraps a submodule and a loss function the same way.
//
// A model cut into p·v chunks (virtual stages; v = 1 but for interleaved schedules) runs on p
// stages, stage s owning chunks s, s + p, ... The executor calls, for microbatch j:
//   F:  y = forward(c, x)   x: microbatch j of the batch (c = 0) or, else, the previous chunk's
//                           output as a fresh leaf that requires grad (the boundary);
//                           last chunk: loss(y, target_j) / m.
//   B:  fused (no W in the program): y.backward(dy), the parameters' .grad accumulate; the
//       input's .grad goes to the previous chunk.
//       split (ZB-H1): autograd::grad(y, {x} ∪ roots, dy, retain_graph = true): the input
//       gradient, and the gradient of each weight-gradient root, kept for W.
//   W:  per root r: autograd::grad(r.output, r.params, kept gradient of r), accumulated into
//       .grad as AccumulateGrad does (the first gradient taken, later ones added).
// A chunk that names no roots has one: its output, with all its parameters (the generic path:
// W runs the chunk's whole backward again from the kept output gradient, so B's input-gradient
// kernels run twice). Roots nearer the parameters (the MLP: each Linear's output) make W run
// only the weight-gradient kernels, as torch.distributed.pipelining's stage_backward_weight
// does with its parameter groups' intermediates.
//
// What is bitwise: with deterministic kernels (the CPU's), F, B and W run on the same numbers
// the same kernels as the unpipelined model's backward — a root's gradient is the sum autograd
// would form at that tensor, and W's autograd::grad evaluates the same nodes from it — so the
// weight gradients of each microbatch are those of the fused backward, bit for bit, and so are
// the accumulated .grad when W's run in microbatch order (every schedule here does). A cut
// changes no arithmetic: the boundary leaf's .grad is the sum the unpipelined graph forms at
// that tensor (two uses — the residual stream — add commutatively, hence exactly).
#pragma once

#include <cstdint>
#include <vector>

#include <torch/torch.h>

namespace mpt {

/// A weight-gradient root of a chunk (B/W split): a tensor `output` of the chunk's forward
/// through which every path from the chunk's output to `params` passes, and which no other
/// root's parameters depend on through it. B computes the gradient at `output`; W the
/// gradient of `output` w.r.t. `params` from it.
struct WeightRoot {
  torch::Tensor output;               ///< e.g. a Linear's pre-activation z = x·Wᵀ + b
  std::vector<torch::Tensor> params;  ///< e.g. {W, b}
};

/// What a chunk's forward reports besides its output.
struct ChunkSaved {
  /// Tensors the forward produced that autograd keeps for the backward (activations): their
  /// bytes are counted as the stage's activation memory (PipelineRun::peak_bytes). Optional.
  std::vector<torch::Tensor> activations;
  /// Weight-gradient roots for the split backward (empty: the generic one, see above).
  std::vector<WeightRoot> weight_roots;
};

/// The stage function: the model cut into chunks (virtual stages), their forward, their
/// parameters and the loss. Called concurrently for different chunks by the threaded executor
/// (one thread per stage), so chunks must not share mutable state; every call is const.
class PipelineStage {
 public:
  virtual ~PipelineStage() = default;
  /// p·v: how many chunks (virtual stages) the model is cut into.
  virtual int chunks() const = 0;
  /// Forward of chunk `chunk` (0 .. chunks() − 1) on one microbatch x: the batch's rows for
  /// chunk 0 (any dtype, e.g. token ids), else the previous chunk's output (float32, a leaf
  /// that requires grad). Returns the output (the last chunk's goes to loss()). When `saved`
  /// is given, fills it (activations, weight roots). Throws what the model throws.
  virtual torch::Tensor forward(int chunk, const torch::Tensor& x, ChunkSaved* saved = nullptr) const = 0;
  /// The parameters of chunk `chunk`, in a fixed order; PipelineRun::grads lists every chunk's
  /// gradients in chunk order.
  virtual std::vector<torch::Tensor> parameters(int chunk) const = 0;
  /// The loss of one microbatch: the last chunk's output y and the microbatch's targets → a
  /// scalar (the executor divides it by m, so the gradients sum to the full batch's mean loss).
  virtual torch::Tensor loss(const torch::Tensor& y, const torch::Tensor& target) const = 0;
  /// The shape of chunk `chunk`'s output for a microbatch of the model's input of shape
  /// `microbatch_shape` (e.g. [rows, in] → [rows, width at the cut]): the fixed message shape
  /// of the process executor (Megatron's tensor_shape). Chunks before the last only.
  virtual std::vector<int64_t> output_shape(int chunk, const std::vector<int64_t>& microbatch_shape) const = 0;
  /// The chunk's work in units of SyntheticCost (its layers). Default 1.
  virtual int cost_units(int /*chunk*/) const { return 1; }
};

}  // namespace mpt
