// core/parallel/ep: expert parallelism — the E experts of every mixture-of-experts layer
// (core/models/moe) sharded over the e ranks of a group, E/e each (rank r: experts r·E/e ..
// (r+1)·E/e − 1), every rank routing its own tokens (its group of the batch, as data parallelism
// gives it) and exchanging them with two all-to-alls per layer:
//
//   dispatch   the rank's expert buffers [E, cap, C] (padded to the capacity, core/models/moe's
//              dispatch) are e chunks of E/e experts; chunk j goes to rank j, which receives
//              [e, E/e, cap, C]: for each of its experts, every rank's tokens in rank order
//   experts    each local expert runs once on its [e·cap, C] rows
//   combine    the outputs go back by the inverse all-to-all, to be weighted by the gates where
//              the tokens live (Megatron-core's MoEAlltoAllTokenDispatcher; GShard's
//              dispatch/combine; torchtitan's expert parallelism)
//
// The backward runs the same two all-to-alls on the gradients, in reverse. With capacity-padded
// buffers the splits are equal and no token counts need to travel first (Megatron-core's dropless
// path exchanges them); the bytes are fixed by the shapes: bytes_per_layer.
// docs/expertparallel.md tells the lesson; the experiment is src/experiments/expertparallel.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include <torch/torch.h>

#include "core/dist/group.hpp"
#include "core/models/moe.hpp"
#include "core/parallel/tp.hpp"

namespace mpt::ep {

/// The experts rank r of e holds: [first, first + E/e). Throws std::invalid_argument unless e ≥ 1
/// divides E, std::out_of_range for r ∉ [0, e).
std::pair<int64_t, int64_t> local_experts(int64_t E, int64_t e, int64_t r);

/// Bytes one rank sends per MoE layer and step (forward + backward), counted as dist::CommCount
/// counts an all-to-all ((e−1)/e of its payload): four all-to-alls (dispatch, combine, and their
/// gradients) of the [E, cap, C] buffer of `element_bytes` per value → 4·(e−1)/e·E·cap·C·bytes.
/// e = 1: nothing.
double bytes_per_layer(int64_t e, int64_t E, int64_t cap, int64_t C, double element_bytes = 4);
/// The payload handed to the process group per layer and step: 4·E·cap·C·bytes (the input of each
/// all-to-all, as `mpt plan`'s communication table counts it), whatever e (e = 1: the exchange is
/// a local copy, still handed to the group).
double payload_per_layer(int64_t e, int64_t E, int64_t cap, int64_t C, double element_bytes = 4);

/// The experts of a layer run over the ranks of `group` (moe::Experts): buffers [1, E, cap, C] of
/// this rank's group → the outputs [1, E, cap, C] for its tokens, through the all-to-alls (autograd:
/// the backward's all-to-alls are the same exchange on the gradients). Every rank of the group
/// must call it in the same order. Only the experts this rank holds are touched. The group must
/// outlive the autograd graphs built through it (their backward exchanges on it). Throws
/// std::invalid_argument for e not dividing E or more than one group, RuntimeFailure when a peer fails.
class ExpertParallel : public moe::Experts {
 public:
  /// `fn` applies an expert (moe::ExpertFn; empty: the module's own weights).
  explicit ExpertParallel(std::shared_ptr<dist::Group> group, moe::ExpertFn fn = {});
  torch::Tensor run(moe::MoeMlpImpl& mlp, const torch::Tensor& buffers) override;
  dist::Group& group() { return *group_; }

 private:
  std::shared_ptr<dist::Group> group_;
  moe::ExpertFn fn_;
};

/// Releases the storage of the experts `model`'s rank does not hold (their parameters become
/// empty tensors and get no gradient), as an expert-parallel rank keeps only E/e experts' weights.
/// Returns the bytes released. Call after building the full model from the shared seed.
int64_t drop_remote_experts(moe::MoeGptImpl& model, int64_t e, int64_t r);

/// After the backward of every rank's loss (each rank's sum of token losses over the whole batch's
/// token count): the gradients every rank holds a part of — all but the experts' — summed over
/// the group (all-reduce). The experts' gradients are complete on their owner already: the
/// combine's backward brought every rank's tokens. `abs_sum` (if not null) receives, per
/// parameter name, Σ_ranks |part| (an all-reduce of the parts' magnitudes, for the bound of a
/// reordered sum: two sums of the same e parts differ by at most 2·γ_{e−1}·Σ|part|, Higham Thm 3.1).
void allreduce_dense_grads(moe::MoeGptImpl& model, dist::Group& group,
                           std::map<std::string, torch::Tensor>* abs_sum = nullptr);

/// Whether parameter `name` of the MoE GPT belongs to an expert ("….mlp.experts.<i>.…").
bool is_expert_param(const std::string& name);

/// One local tensor of the MoE GPT on a TP group, and where it sits in the full model.
struct TpLeaf {
  std::string name;     ///< the full model's parameter name
  torch::Tensor local;  ///< the leaf this rank updates
  int dim = -1;         ///< split dim of the full tensor (-1: replicated over the TP group)
  torch::Tensor index;  ///< indices along `dim` held here (undefined when replicated)
  bool expert = false;  ///< an expert's (complete on its EP owner; not summed over the EP group)
};

/// The MoE GPT under tensor parallelism (Megatron-LM's, core/parallel/tp) on `tp`, with expert
/// tensor parallelism equal to it (Megatron-core's default expert_tensor_parallel_size): each
/// block's c_attn column-parallel by whole heads, attn_proj row-parallel; each held expert's c_fc
/// column-parallel and c_proj row-parallel (the partial outputs all-reduced over `tp`); the
/// embeddings, LayerNorms, router and lm_head replicated (every TP rank routes the same tokens).
/// The shards are sliced from `full` (which must outlive this): its replicated modules are used
/// as they are. Holds the experts [first, first + count) (expert parallelism: local_experts; one
/// process: all). Throws std::invalid_argument when t does not divide the heads or the expert width.
class TpMoeShards {
 public:
  TpMoeShards(moe::MoeGptImpl& full, std::shared_ptr<dist::Group> tp, int64_t first, int64_t count);
  /// The attention Linears for MoeGptImpl::forward (names "h<i>.c_attn", "h<i>.attn_proj").
  GptLinear linear() const;
  /// The held experts' shards for LocalExperts / ExpertParallel (std::out_of_range for another expert).
  moe::ExpertFn expert_fn() const;
  /// Every leaf this rank updates, in the full model's parameter order: the replicated parameters
  /// of `full` as they are, the attention's Linears and the held experts as their shards (the
  /// experts this rank does not hold are left out).
  const std::vector<TpLeaf>& leaves() const { return leaves_; }

 private:
  struct ExpertShards {
    std::unique_ptr<tp::ColumnParallelLinear> c_fc;
    std::unique_ptr<tp::RowParallelLinear> c_proj;
  };
  moe::MoeGptImpl* full_;
  std::map<std::string, std::unique_ptr<tp::ColumnParallelLinear>> columns_;  // "h<i>.c_attn"
  std::map<std::string, std::unique_ptr<tp::RowParallelLinear>> rows_;        // "h<i>.attn_proj"
  std::map<std::pair<const moe::MoeMlpImpl*, int64_t>, ExpertShards> experts_;
  std::vector<TpLeaf> leaves_;
};

}  // namespace mpt::ep
