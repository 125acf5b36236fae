// core/parallel/tp: Megatron-LM's tensor (intra-layer) model parallelism (Shoeybi et al.
// 2019, "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model
// Parallelism") and its sequence parallelism (Korthikanti et al. 2022, "Reducing Activation
// Recomputation in Large Transformer Models"), on a dist::Group of t ranks.
//
// The pieces mirror megatron/core/tensor_parallel/:
//   mappings.py   the conjugate operators as autograd functions —
//                 f = copy_to_tensor_model_parallel_region      identity fwd / all-reduce bwd
//                 g = reduce_from_tensor_model_parallel_region  all-reduce fwd / identity bwd
//                 gather_from_tensor_model_parallel_region      all-gather last dim fwd / split bwd
//                 scatter_to_sequence_parallel_region           split seq fwd / all-gather bwd
//                 gather_from_sequence_parallel_region          all-gather seq fwd / reduce-scatter bwd
//                 reduce_scatter_to_sequence_parallel_region    reduce-scatter seq fwd / all-gather bwd
//   layers.py     ColumnParallelLinear (W [out, in] split on dim 0), RowParallelLinear (split on
//                 dim 1, bias added once after the reduction), VocabParallelEmbedding
//   cross_entropy.py  _VocabParallelCrossEntropy (max, target logit and sum-exp all-reduced)
//
// Every sharded module is built by *slicing the weights of a full, seeded module* (the
// one-process model), so each rank holds exactly the single-process numbers and the TP model
// computes the same function with some sums split into t partial sums.
//
// The sequence dimension is dim 1 ([B, T, C], nanoGPT's layout; Megatron uses [s, b, h]).
//
// This header: the operators and layers (tp.cpp), the reordering bounds and activation-memory
// formulas (tp_formulas.cpp); the tiny GPT on TP is core/parallel/tp_gpt.hpp, the DP x TP x PP
// rank layout core/parallel/mesh.hpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "core/dist/group.hpp"

namespace mpt::tp {

// ----------------------------------------------------------------------------
// Conjugate operators (megatron/core/tensor_parallel/mappings.py)
// ----------------------------------------------------------------------------
// `g` must outlive the autograd graph built through these functions (the backward calls it).
// All of them throw what dist::Group's collectives throw (RuntimeFailure when a peer fails).

/// f: identity forward, all-reduce (sum) of the gradient backward. Any shape.
torch::Tensor copy_to_tensor_model_parallel_region(const torch::Tensor& x, dist::Group& g);
/// g: all-reduce (sum) forward, identity backward. Any shape.
torch::Tensor reduce_from_tensor_model_parallel_region(const torch::Tensor& x, dist::Group& g);
/// All-gather along the last dim forward ([..., n] → [..., t·n], rank order), backward keeps
/// this rank's chunk of the gradient (ColumnParallelLinear's gather_output).
torch::Tensor gather_from_tensor_model_parallel_region(const torch::Tensor& x, dist::Group& g);
/// Keeps this rank's chunk of dim `dim` forward ([.., T, ..] → [.., T/t, ..]; t must divide T),
/// all-gathers the gradient backward. Throws std::invalid_argument when t does not divide it.
torch::Tensor scatter_to_sequence_parallel_region(const torch::Tensor& x, dist::Group& g, int64_t dim = 1);
/// All-gather along `dim` forward ([.., T/t, ..] → [.., T, ..]), reduce-scatter backward.
torch::Tensor gather_from_sequence_parallel_region(const torch::Tensor& x, dist::Group& g, int64_t dim = 1);
/// Reduce-scatter (sum) along `dim` forward ([.., T, ..] → [.., T/t, ..]), all-gather backward.
/// Throws std::invalid_argument when t does not divide that dim.
torch::Tensor reduce_scatter_to_sequence_parallel_region(const torch::Tensor& x, dist::Group& g, int64_t dim = 1);

// ----------------------------------------------------------------------------
// Shard index sets
// ----------------------------------------------------------------------------

/// Rows [r·n/t, (r+1)·n/t) as an int64 index tensor (Megatron's divide(n, t) split). Throws
/// std::invalid_argument when t does not divide n.
torch::Tensor contiguous_shard(int64_t n, int64_t t, int64_t r);
/// The rows of nanoGPT's packed c_attn weight [3C, C] ([q; k; v] along dim 0) that rank r of t
/// owns: heads [r·a/t, (r+1)·a/t) of each of q, k and v, in the order q-rows, k-rows, v-rows, so
/// that the local output splits into local q, k, v as the full one does. Throws
/// std::invalid_argument when t does not divide `heads` or heads does not divide `width`.
torch::Tensor qkv_shard(int64_t width, int64_t heads, int64_t t, int64_t r);

// ----------------------------------------------------------------------------
// Layers (megatron/core/tensor_parallel/layers.py)
// ----------------------------------------------------------------------------

/// ColumnParallelLinear: Y = X Aᵀ + b with A [out, in] split along dim 0 (the output
/// features): this rank holds A[rows] [out/t, in] and b[rows]. Input X [.., in] is replicated
/// (f before the GEMM) or, with sequence_parallel, this rank's sequence chunk [B, T/t, in]
/// (all-gathered before the GEMM, reduce-scattered in backward). Output [.., out/t], or the
/// full [.., out] with gather_output.
struct ColumnParallelLinear {
  /// Slices the full weight [out, in] and bias [out] (undefined: none) at `rows` (int64 indices
  /// into dim 0); the shards are new leaves that require grad.
  ColumnParallelLinear(const torch::Tensor& full_weight, const torch::Tensor& full_bias, torch::Tensor rows,
                       std::shared_ptr<dist::Group> group, bool gather_output = false, bool sequence_parallel = false);
  /// x [.., in] (SP: [B, T/t, in]) → [.., out/t] ([.., out] with gather_output). With `pre`, also
  /// stores the local GEMM output there (before any gather).
  torch::Tensor forward(const torch::Tensor& x, torch::Tensor* pre = nullptr) const;
  torch::Tensor weight, bias;  ///< leaves: [out/t, in], [out/t] (undefined without bias)
  torch::Tensor rows;          ///< the rows of the full weight this rank holds
  std::shared_ptr<dist::Group> group;
  bool gather_output = false, sequence_parallel = false;
};

/// RowParallelLinear: Y = X Aᵀ + b with A [out, in] split along dim 1 (the input features):
/// this rank holds A[:, cols] [out, in/t]; input X [.., in/t] is already this rank's part
/// (input_is_parallel). The partial products X_r A_rᵀ are summed over the ranks by g
/// (all-reduce) or, with sequence_parallel, reduce-scattered along the sequence; b (full,
/// replicated) is added once after the sum, as Megatron does.
struct RowParallelLinear {
  /// Slices the full weight [out, in] at `cols` (indices into dim 1); the bias [out] is copied whole.
  RowParallelLinear(const torch::Tensor& full_weight, const torch::Tensor& full_bias, torch::Tensor cols,
                    std::shared_ptr<dist::Group> group, bool sequence_parallel = false);
  /// x [.., in/t] → [.., out] (SP: [B, T/t, out]).
  torch::Tensor forward(const torch::Tensor& x) const;
  torch::Tensor weight, bias;  ///< leaves: [out, in/t], [out]
  torch::Tensor cols;
  std::shared_ptr<dist::Group> group;
  bool sequence_parallel = false;
};

/// VocabParallelEmbedding: the embedding table [V', C] (V' = the vocabulary padded to a multiple
/// of t) split along the vocabulary: rank r owns ids [r·V'/t, (r+1)·V'/t). Ids outside the range
/// are looked up as row 0 and their output zeroed; the partial outputs are all-reduced (g).
/// Padded rows (ids ≥ V) are zeros and never looked up.
struct VocabParallelEmbedding {
  /// full_weight [V, C]; padded_vocab V' ≥ V, a multiple of the group size.
  VocabParallelEmbedding(const torch::Tensor& full_weight, int64_t padded_vocab, std::shared_ptr<dist::Group> group);
  /// ids [B, T] int64 in [0, V) → [B, T, C].
  torch::Tensor forward(const torch::Tensor& ids) const;
  torch::Tensor weight;  ///< leaf [V'/t, C]
  int64_t vocab_start = 0, vocab_end = 0;
  std::shared_ptr<dist::Group> group;
};

/// Megatron's make_vocab_size_divisible_by: V rounded up to a multiple of divisible_by·t.
int64_t padded_vocab_size(int64_t vocab, int64_t divisible_by, int64_t t);

/// _VocabParallelCrossEntropy: per-token cross-entropy of logits split along the vocabulary.
/// logits [N, V'/t] (this rank's columns [vocab_start, vocab_start + V'/t) of the padded
/// vocabulary), targets [N] int64 in [0, V) → loss [N] (fp32), identical on every rank:
///   m = max_v l (all-reduce MAX), S = Σ_v exp(l − m) (all-reduce SUM),
///   l_y − m (all-reduce SUM: only the owner rank contributes), loss = log S − (l_y − m).
/// Throws std::invalid_argument for mismatched shapes.
/// Columns ≥ `vocab` (padding) are masked to −inf, so they add exp(−inf) = 0 to S.
/// Backward: (softmax − onehot(y)) · grad, local to each rank.
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                           int64_t vocab_start, int64_t vocab, dist::Group& g);

// ----------------------------------------------------------------------------
// Models
// ----------------------------------------------------------------------------

/// A two-layer MLP on TP: ColumnParallelLinear (fc1, gathered outputs not needed) → GELU →
/// RowParallelLinear (fc2) — Megatron's ParallelMLP, built from full Linear layers.
struct TpMlp {
  /// fc1 [hidden, in], fc2 [out, hidden]; t must divide hidden (std::invalid_argument).
  TpMlp(const torch::nn::Linear& fc1, const torch::nn::Linear& fc2, std::shared_ptr<dist::Group> group);
  /// x [N, in] replicated → [N, out] replicated. With `pre`, stores fc1's local output [N, hidden/t].
  torch::Tensor forward(const torch::Tensor& x, torch::Tensor* pre = nullptr) const;
  ColumnParallelLinear fc1;
  RowParallelLinear fc2;
};

/// Every rank's `local` (same shape on every rank), in rank order (an all-gather of the flat
/// tensor). Throws what dist::Group::all_gather throws.
std::vector<torch::Tensor> all_gather_shards(const torch::Tensor& local, dist::Group& g);

/// Puts the gathered shards of one parameter back in the full layout: `shards[r]` is rank r's
/// tensor (gradient or value) and `index[r]` its indices along `dim` (ShardedParam). Pads rows
/// beyond `full_size` (vocabulary padding) are dropped. Returns the full tensor.
torch::Tensor unshard(const std::vector<torch::Tensor>& shards, const std::vector<torch::Tensor>& index, int dim,
                      int64_t full_size);

// ----------------------------------------------------------------------------
// Bounds
// ----------------------------------------------------------------------------

// γ_n below is bounds::gamma (core/numerics/bounds.hpp), fp32's unit roundoff.

/// The elementwise bound on |Y_tp − Y_1| for Y = X Aᵀ + b computed two ways (one length-K dot
/// product plus the bias, or t partial dot products summed across ranks plus the bias): any
/// summation order of the K products and the bias has error ≤ γ_{K+1} (Σ_i |x_i a_i| + |b|)
/// (Higham Thm 3.1 / eq. 3.5; FMA and blocked GEMMs satisfy it), so the two results differ by
/// at most twice that. x [N, K], a [M, K], b [M] or undefined → bound [N, M].
torch::Tensor reorder_bound(const torch::Tensor& x, const torch::Tensor& a, const torch::Tensor& b);

/// Elementwise bound on |CE_tp − CE_1| for per-token cross-entropy computed as
/// log Σ_v exp(l_v − m) − (l_y − m) two ways (t partial sums of exp across ranks, or ATen's
/// log_softmax): each computed S = Σ exp has relative error ≤ δ = γ_{V−1} + 2u·(1 + γ_{V−1})
/// (V positive terms summed in any order, each exp within 1 ulp ≈ 2u relative: the stated
/// assumption on the exp kernels), so |log Ŝ − log S| ≤ −log(1 − δ); the final log, the
/// subtraction of m and of l_y add ≤ 2u(|log S| + |l_y − m|) each way. Both computations
/// are within that of the exact value, the bound is twice it.
/// logits [N, V] (the unpadded, gathered logits), targets [N] → bound [N] (float64).
torch::Tensor ce_reorder_bound(const torch::Tensor& logits, const torch::Tensor& targets);

/// The elementwise bound on two sums of the same n = x.size(dim) terms in different orders
/// (e.g. a bias gradient Σ_rows dY reduced over fewer columns at once, where ATen's vectorised
/// reduction may pick another order): each is within γ_{n−1} Σ|x_i| of the exact sum (Higham
/// eq. 3.5), so they differ by at most 2γ_{n−1} Σ|x_i|. x any shape → bound with `dim` removed
/// (float64).
torch::Tensor sum_reorder_bound(const torch::Tensor& x, int64_t dim);

// ----------------------------------------------------------------------------
// Activation memory (Korthikanti et al. 2022, §4)
// ----------------------------------------------------------------------------

/// Korthikanti's activation bytes per transformer layer for fp16 activations with 1-byte dropout
/// masks: s = sequence, b = micro-batch, h = width, a = heads, t = TP degree.
///   no TP  sbh(34 + 5as/h);  TP  sbh(10 + 24/t + 5as/(ht));  TP + SP  (sbh/t)(34 + 5as/h)
double korthikanti_bytes(int64_t s, int64_t b, int64_t h, int64_t a, int64_t t, bool sp);

/// The same count for the tiny GPT as it runs here: fp32 activations (4 bytes), no dropout (no
/// masks, no dropout outputs), nanoGPT's MLP of 4h. Saved per layer: LayerNorm inputs 2·4sbh,
/// QKV-GEMM input 4sbh, q, k 8sbh/t, v 4sbh/t, softmax output 4as²b/t, out-projection input
/// 4sbh/t, MLP input 4sbh, GELU input 16sbh/t, GELU output 16sbh/t:
///   no TP  sbh(64 + 4as/h);  TP  sbh(16 + 48/t + 4as/(ht));
///   TP + SP here sbh(8/t + 8 + 48/t + 4as/(ht)): the LayerNorm inputs are sharded, but the
///   column-parallel GEMMs save their all-gathered input (autograd keeps it; Megatron re-gathers
///   it in backward and saves the shard, giving Korthikanti's (sbh/t)(64 + 4as/h)).
double fp32_activation_bytes(int64_t s, int64_t b, int64_t h, int64_t a, int64_t t, bool sp);

}  // namespace mpt::tp
