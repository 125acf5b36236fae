// The single-process references of the parallel experiments: one process trains the same model
// on the same global batches as the parallel run (a replay), so that the run's trajectory can be
// compared with it step by step; plus what such comparisons share: the ranks' shares of the data
// (shard_of, DistributedSampler's split), flattening parameters, taking the gradients out of a
// model, accumulating a local batch's micro-batches.
//
// A replay computes the parallel run's arithmetic in one process, in one of two ways:
//   - RankByRank: rank r's local batch, its micro-batches accumulated in .grad as the rank does
//     (loss ÷ M each), taken out; the N gradients combined in rank order into the data-parallel
//     mean, either each ÷ N then summed (DDP's and ZeRO's divide-before-reduce) or summed then
//     ÷ N (an all-reduce SUM, then the mean: tensor parallelism's DP groups). With N ≤ 2 that sum
//     is one addition, so a parallel run that reduces the same terms equals the replay bit for bit.
//   - WholeBatch: one forward and backward over the concatenation of the ranks' local batches
//     (other GEMM blocking than the ranks': the comparison is reported, not bitwise).
// The model is the caller's: its parameters, its optimizer (any torch::optim, or none: then the
// caller steps, as a replay that only wants gradients), and a LossFn that runs forward + loss, so
// the MLP, the GPT and a tensor-parallel model replay through the same code (docs/architecture.md).
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include <torch/torch.h>

namespace mpt::reference {

/// Forward and loss of one batch: inputs x and targets y → the scalar loss (mean over the batch).
using LossFn = std::function<torch::Tensor(const torch::Tensor& x, const torch::Tensor& y)>;

/// Rank `rank`'s local batch of step `step` of the parallel run: (inputs, targets), rows first.
using LocalBatch = std::function<std::pair<torch::Tensor, torch::Tensor>(int64_t rank, int64_t step)>;

/// Rank `rank`'s share of `indices` (1-D) among `replicas` ranks, as
/// torch.utils.data.DistributedSampler over a fixed permutation: first its padding rule —
/// drop_last: the tail past the largest multiple of `replicas` is dropped (every rank gets
/// ⌊n/replicas⌋); otherwise the list is padded with its own first elements, repeated as needed,
/// to ⌈n/replicas⌉·replicas — then indices[rank : total : replicas]. The data-parallel runs and
/// their replays use drop_last = true: a step needs a full local batch on every rank. Throws
/// std::invalid_argument for replicas < 1, a rank outside [0, replicas) or indices not 1-D.
torch::Tensor shard_of(const torch::Tensor& indices, int64_t rank, int64_t replicas, bool drop_last = true);

/// The parameters of `ts` (any dtypes and devices) as one float32 CPU vector, in order:
/// detach, reshape(−1), to float32 on the CPU, cat. Values are unchanged for fp32 parameters
/// and exact for bf16 (a widening), so two runs compare element for element.
torch::Tensor flat(const std::vector<torch::Tensor>& ts);

/// The gradients of `params` taken out of the model: a clone of each .grad (zeros of the
/// parameter's shape where .grad is undefined: the parameter took no part), then each .grad is
/// reset to undefined (zero_grad(set_to_none=True)), ready for the next accumulation.
std::vector<torch::Tensor> take_grads(const std::vector<torch::Tensor>& params);

/// Accumulates one local batch in .grad as a rank with gradient accumulation does: x and y split
/// into `micro_batches` row chunks (torch.tensor_split), each loss ÷ micro_batches, backward per
/// chunk in order. Returns the sum of the divided losses (the local batch's mean loss for equal
/// chunks). Throws std::invalid_argument for micro_batches < 1.
double accumulate_micro_batches(const torch::Tensor& x, const torch::Tensor& y, int64_t micro_batches,
                                const LossFn& loss);

/// How a replay forms a step's gradient (the header comment).
enum class Mode { RankByRank, WholeBatch };
/// RankByRank: Σ_r (g_r ÷ N) in rank order (DDP, ZeRO: divide before the reduction) or
/// (Σ_r g_r) ÷ N (a SUM all-reduce, then the mean). N = 1 is g_0 itself either way.
enum class Mean { DivideEachTerm, DivideSum };

/// What a replay runs: N ranks' local batches for `steps` steps.
struct ReplaySpec {
  int64_t ranks = 1;          ///< N, the data-parallel ranks whose local batches make a global batch
  int64_t steps = 0;          ///< optimizer steps
  int64_t micro_batches = 1;  ///< M, per rank and step (RankByRank only)
  Mode mode = Mode::RankByRank;
  Mean mean = Mean::DivideEachTerm;
  bool every_step = true;              ///< keep the flat parameters after every step, else after the last only
  std::function<void()> on_step;       ///< called before each step (e.g. World::note_progress), may be empty
};

/// A replay's trajectory: flat parameters (reference::flat) after every step (every_step) or the
/// final ones only (one entry, also for 0 steps: the initial parameters), and the loss of every
/// step before its update (RankByRank: the mean over the ranks of each rank's accumulated loss).
struct Trajectory {
  std::vector<torch::Tensor> params;
  std::vector<double> losses;
};

/// Trains `params` for spec.steps steps on the local batches of `batch` and returns the
/// trajectory. Each step: the gradient by spec.mode / spec.mean set as the parameters' .grad,
/// then opt.step(). WholeBatch: opt.zero_grad(), one backward of loss(cat x, cat y) over the N
/// local batches in rank order. Throws std::invalid_argument for ranks or micro_batches < 1;
/// what `loss`, `batch` or the optimizer throw.
Trajectory replay(const std::vector<torch::Tensor>& params, torch::optim::Optimizer& opt, const LossFn& loss,
                  const LocalBatch& batch, const ReplaySpec& spec);

/// One step's data-parallel gradient, RankByRank, without an optimizer: the N local batches of
/// `step` accumulated one after the other (accumulate_micro_batches, take_grads) and combined
/// by `mean`; .grad is left undefined. Returns the gradients (in `params` order) and the mean
/// over the ranks of their accumulated losses. For replays whose caller updates the parameters
/// itself (e.g. a plain SGD over tensor-parallel shards).
std::pair<std::vector<torch::Tensor>, double> rank_mean_gradient(const std::vector<torch::Tensor>& params,
                                                                 const LossFn& loss, const LocalBatch& batch,
                                                                 int64_t step, int64_t ranks, int64_t micro_batches,
                                                                 Mean mean);

}  // namespace mpt::reference
