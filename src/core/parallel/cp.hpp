// core/parallel/cp: context parallelism — the sequence of a causal transformer split over the c
// ranks of a group, every rank holding the queries, keys and values of its own positions, and
// three ways to let its queries see the keys of the whole sequence:
//
//   Ring       K/V blocks passed around the ring with send/recv, c steps; each step's partial
//              attention merged by the online softmax of flash-attention (Liu et al. 2023, "Ring
//              Attention with Blockwise Transformers"; Dao 2023, FlashAttention-2, Algorithm 1 and 2;
//              Transformer Engine's and torchtitan's CP). The backward passes K/V around again and
//              the dK/dV partials travel with their block back to its owner.
//   AllGather  K and V all-gathered before the attention, dK and dV reduce-scattered after (what
//              Llama 3's paper describes for its CP; Megatron-core's "a2a+p2p"/"all_gather" cp_comm_type).
//   Ulysses    an all-to-all from sequence-sharded to head-sharded q, k, v, the whole sequence's
//              attention for nh/c heads, and an all-to-all back (Jacobs et al. 2023, DeepSpeed-Ulysses).
//
// The split: contiguous (rank r holds positions [r·T/c, (r+1)·T/c)), or balanced for causal
// attention — the sequence cut into 2c chunks, rank r holding chunks r and 2c−1−r (Megatron-core's
// and Transformer Engine's load balancing; torchtitan's "head-tail"): with a causal mask the
// contiguous split gives the last rank about 2c−1 times the first rank's unmasked scores.
// docs/contextparallel.md tells the lesson; the experiment is src/experiments/contextparallel.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "core/dist/group.hpp"
#include "core/models/gpt.hpp"

namespace mpt::cp {

/// How the sequence is split over the ranks (see the file comment).
enum class Split { Contiguous, Balanced };
/// "contiguous" | "balanced" → the value; throws std::invalid_argument naming both.
Split split_from_name(const std::string& name);
std::string split_name(Split s);

/// How a rank's queries reach the other ranks' keys and values (see the file comment).
enum class Variant { Ring, AllGather, Ulysses };
/// "ring" | "all_gather" | "ulysses" → the value; throws std::invalid_argument naming them.
Variant variant_from_name(const std::string& name);
std::string variant_name(Variant v);

/// Throws std::invalid_argument unless c ≥ 1 divides T (Contiguous) or 2c divides T (Balanced).
void check_split(int64_t T, int64_t c, Split s);
/// The positions rank r of c holds of a sequence of T tokens, ascending: int64 [T/c]. Balanced:
/// chunks r and 2c−1−r of length T/(2c). Throws as check_split, std::out_of_range for r ∉ [0, c).
torch::Tensor positions(int64_t T, int64_t c, int64_t r, Split s);
/// The unmasked (i, j ≤ i) query-key pairs of rank r's queries under the causal mask: the
/// attention work that is useful (the FLOPs of its two GEMMs are 4·hd·nh·B per pair).
int64_t causal_pairs(int64_t T, int64_t c, int64_t r, Split s);
/// The (i, j) pairs rank r's ring attention computes per pass, Tl = T/c: contiguous, the whole
/// blocks of ranks 0 .. r, (r + 1)·Tl² (later blocks are wholly in the future and skipped);
/// balanced, three quarters of the own block and half of each other one, 3Tl²/4 + (c − 1)·Tl²/2
/// (Transformer Engine's load-balanced ring). The masked part of a diagonal chunk pair is computed
/// and masked, as there.
int64_t ring_computed_pairs(int64_t T, int64_t c, int64_t r, Split s);

/// What one rank's context-parallel attention did (Ring: per step; the others: per call),
/// summed over calls, forward and backward: seconds spent computing and waiting for messages
/// (steady clock), K/V blocks computed (in part or whole) or skipped (wholly masked), and the
/// score pairs computed.
struct Stats {
  double compute_s = 0;
  double wait_s = 0;
  int64_t blocks_computed = 0;
  int64_t blocks_skipped = 0;
  int64_t pairs_computed = 0;  ///< query-key score pairs computed (rows x columns of the parts run)
};

/// Bytes one rank sends per attention layer and step (forward + backward) under `v`, counted as
/// dist::CommCount's sent_bytes count them (ring algorithm for the collectives), for a local
/// q/k/v block of `block_bytes` = B·Tl·C·element bytes (Tl = T/c, C = nh·hd):
///   Ring       forward (c−1)·2·blk (K, V); backward (c−1)·2·blk (K, V) + c·2·blk (dK, dV: the
///              partials travel c hops, the last one home)                       → (4c − 4 + 2c)·blk
///   AllGather  all-gather K, V: (c−1)/c of 2·c·blk; reduce-scatter dK, dV the same → 4(c−1)·blk
///   Ulysses    all-to-all q, k, v and back y: (c−1)/c·4·blk; backward the same → 8(c−1)/c·blk
/// c = 1: nothing.
double bytes_per_layer(Variant v, int64_t c, double block_bytes);

struct AttentionAccess;  // cp.cpp: what its autograd functions read of an Attention

/// Bytes one block of the tiny GPT (core/models/gpt: fp32, no dropout) keeps for its backward on
/// one rank of c, B sequences of T positions, width h, a heads; T/c = s_l positions per rank.
/// Korthikanti et al. 2022's per-layer count in fp32 without the scores, 64·s_l·B·h, plus what
/// this implementation keeps besides (the counting allocator finds each): LayerNorm's mean and
/// rstd 16·s_l·B; then
///   one process (c = 1, the written-out attention): the softmax output 4·a·T²·B, the causal mask T²
///   Ring       the log-sum-exp 4·a·s_l·B (FlashAttention-2's saved L; no scores)
///   AllGather  the gathered K and V 8·T·B·h, instead of the copies of the local ones 8·s_l·B·h
///              where matmul copies (B > 1 and a > 1: it cannot fold [B, a] of a view of qkv; else
///              the q view keeps all of qkv), the probabilities of s_l queries against T keys
///              4·a·s_l·T·B, their mask s_l·T
///   Ulysses    the probabilities of a/c heads 4·a·s_l·T·B, the causal mask T²
/// and, with the balanced split, the permutation into natural order autograd keeps for
/// index_select (all-gather: one, 8T; Ulysses: it and its inverse, 16T).
double block_activation_bytes(Variant v, Split split, int64_t T, int64_t c, int64_t B, int64_t h, int64_t a);
/// The same for one process on the whole sequence (GptBlockImpl's own attention).
double block_activation_bytes_one_process(int64_t T, int64_t B, int64_t h, int64_t a);

/// Live CPU bytes (core/runtime/memory's counting allocator) once `group`'s worker has let go of
/// every earlier collective's tensors (dist::settle with `token`, which the caller keeps alive
/// across its readings).
int64_t settled_bytes(dist::Group& group, torch::Tensor& token);

/// The context-parallel attention core for GptBlock (GptAttention): causal attention of this
/// rank's q, k, v [B, nh, Tl, hd] (its positions under `split` of T = Tl·c) against the whole
/// sequence, → y [B, nh, Tl, hd], differentiable (custom autograd functions that communicate in
/// their backward too). Every rank of `group` must call it in the same order. Ulysses needs c | nh.
/// Throws std::invalid_argument for shapes that do not fit, RuntimeFailure when a peer fails.
class Attention {
 public:
  Attention(std::shared_ptr<dist::Group> group, Variant variant, Split split);
  torch::Tensor operator()(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v);
  /// As a GptAttention for GptBlockImpl::forward (captures this; it must outlive the graph).
  GptAttention hook();
  const Stats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }
  Variant variant() const { return variant_; }
  Split split() const { return split_; }

 private:
  friend struct AttentionAccess;
  std::shared_ptr<dist::Group> group_;
  Variant variant_;
  Split split_;
  Stats stats_;
  int64_t calls_ = 0;  // p2p tags of the ring: one range per call, alike on every rank
};

/// The tiny GPT's written-out causal attention (GptBlockImpl's): q, k, v [B, nh, T, hd] → [B, nh, T, hd].
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v);

/// Mean next-token cross-entropy of the whole sequence, on this rank's share of it: idx and
/// targets [B, Tl] int64 at `positions` [Tl] of the sequence; `model`'s weights (every rank a
/// replica, as under data parallelism), its blocks' attention done by `attention`. The sum of
/// this rank's token losses divided by B·T and all-reduced (an autograd all-reduce: identity
/// backward), so every rank gets the same loss and each token's logit gradient is one
/// process's (1/(B·T)·(softmax − onehot)). `logits` (if not null) receives this rank's [B, Tl, V].
/// `block_bytes` (if not null) receives, per block, the bytes its autograd graph keeps alive after
/// its forward (core/runtime/memory's counting allocator: live bytes after minus before; it must
/// be installed before the model is built).
torch::Tensor gpt_loss(TinyGptImpl& model, const torch::Tensor& idx, const torch::Tensor& targets,
                       const torch::Tensor& positions, Attention& attention, torch::Tensor* logits = nullptr,
                       std::vector<int64_t>* block_bytes = nullptr);
/// Sums every parameter gradient of `model` over the group (all-reduce), after gpt_loss's backward:
/// each rank's gradient is the part from its own tokens.
void allreduce_grads(TinyGptImpl& model, dist::Group& group);

/// Elementwise bounds on |computed − exact| of causal attention's output and gradients, where
/// "exact" is the same function in float64 of the same fp32 q, k, v [B, nh, T, hd] and output
/// gradient dy (natural order, T = whole sequence). `blocks`: partial softmaxes merged per query
/// row (ring: c, else 1); `grad_terms`: partial sums a dK/dV element is accumulated from (ring
/// and all-gather: c, else 1). Derived in docs/contextparallel.md ("The bound"): first order in
/// u = 2⁻²⁴ with γ_n = nu/(1−nu) for every sum and dot product in any order (Higham, Thm 3.1),
/// exp and log within 1 ulp (2u), and the score error of a q·k of hd products, then times
/// (1 + 2ε) for higher orders. Returns {y, dq, dk, dv} bounds and the float64 exact values.
struct AttentionBounds {
  torch::Tensor y, dq, dk, dv;              ///< bounds, float64, shapes of q
  torch::Tensor y_ref, dq_ref, dk_ref, dv_ref;  ///< exact (float64)
};
AttentionBounds attention_bounds(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                 const torch::Tensor& dy, int64_t blocks, int64_t grad_terms);

}  // namespace mpt::cp
