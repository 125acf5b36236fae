// core/parallel/tp_gpt: the tiny GPT (core/models/gpt) under Megatron-LM's tensor parallelism —
// the same GptBlock with its Linears column- and row-parallel (heads split across the ranks),
// a vocab-parallel embedding, lm_head and cross-entropy — and the same model as pipeline stages.
// The per-operation checks against the one-process model run after the forward, on the tensors
// it recorded (TpGpt::loss_checked). The operators and layers are core/parallel/tp.hpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "core/dist/group.hpp"
#include "core/models/gpt.hpp"
#include "core/parallel/tp.hpp"
#include "core/pipeline/stage.hpp"

namespace mpt::tp {

/// Which GPT parameter a sharded tensor comes from and how to put the shards back.
struct ShardedParam {
  std::string name;   ///< the full model's parameter name (named_parameters of TinyGpt)
  torch::Tensor local;  ///< this rank's leaf tensor
  int dim = -1;         ///< split dim of the full tensor, -1 replicated
  torch::Tensor index;  ///< indices along `dim` of the full tensor held here (undefined when replicated)
  bool sequence_parallel = false;  ///< replicated, but its gradient is a partial sum under SP
};

/// One forward operation of the TP model compared with the one-process model's operation on
/// the same input (TpGpt::loss with checks): the TP output against the full module applied to
/// the all-gathered input, one row per site and layer.
struct SiteCheck {
  std::string site;        ///< e.g. "h0.c_attn" (column-parallel), "h0.attn_proj" (row-parallel)
  bool reduced = false;    ///< checked against a bound (GEMMs, cross-entropy), else bitwise
  double max_diff = 0;     ///< max |TP − one process| over the elements of this rank
  double max_bound = 0;    ///< largest elementwise bound (0 where bitwise equality is required)
  double worst_ratio = 0;  ///< max |diff| / bound over the elements (≤ 1 passes; 0 for bitwise sites)
};

/// The tiny GPT (core/models/gpt) on a TP group: attention heads split across ranks (c_attn column-
/// parallel by whole heads of q, k and v; attn c_proj row-parallel), MLP c_fc column / c_proj row,
/// wte a VocabParallelEmbedding and lm_head column-parallel over the padded vocabulary, the loss
/// _VocabParallelCrossEntropy. With sequence_parallel the LayerNorms and residual stream hold
/// [B, T/t, C]: gather before each column-parallel GEMM, reduce-scatter after each row-parallel
/// one; the LayerNorm weights and row-parallel biases then get partial gradients, summed by
/// allreduce_sequence_parallel_grads (Megatron's finalize_model_grads).
/// Throws std::invalid_argument when t does not divide heads, the MLP width or (with SP) T.
class TpGpt {
 public:
  TpGpt(const TinyGpt& full, std::shared_ptr<dist::Group> group, int64_t vocab_divisible_by = 1,
        bool sequence_parallel = false);
  /// Mean next-token cross-entropy of idx [B, T] against targets [B, T] (the same on every rank).
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets);
  /// Bytes the autograd graph of one block keeps alive after its forward, per block (measured
  /// with core/runtime/memory's counting allocator: live bytes after the block minus before; the
  /// allocator must be installed before the model is built). Fills `out` with one entry per
  /// block and returns the loss.
  torch::Tensor loss_measuring(const torch::Tensor& idx, const torch::Tensor& targets,
                               std::vector<int64_t>& block_bytes);
  /// loss() that also compares every operation with the one-process module it was sliced from,
  /// fed the same (all-gathered) input: LayerNorms, embedding and attention must be bitwise
  /// equal; row-parallel GEMMs within reorder_bound (t partial sums), column-parallel GEMMs too
  /// (the same dot products, but a CPU GEMM may order K differently for a narrower output; they
  /// are bitwise wherever it does not); the cross-entropy within ce_reorder_bound. Appends one SiteCheck per site. Costs extra all-gathers (not for timing).
  torch::Tensor loss_checked(const torch::Tensor& idx, const torch::Tensor& targets,
                             std::vector<SiteCheck>& checks);
  /// Sums the gradients of the sequence-parallel parameters (LayerNorms, row-parallel biases)
  /// over the group; a no-op without sequence parallelism.
  void allreduce_sequence_parallel_grads() const;
  /// Every local parameter with where it sits in the full model.
  const std::vector<ShardedParam>& params() const { return params_; }

  /// Context parallelism for the pipeline pieces below (the mesh's cp axis): every sequence this
  /// rank sees holds the positions `positions` [T/c] int64 of the whole sequence (cp::positions),
  /// embed() takes their position embeddings, and every block's attention core is `attention`
  /// (cp::Attention::hook() over the CP group, which must outlive this model's graphs). The loss
  /// of loss_of_logits is then this rank's tokens' mean; the caller averages the gradients over
  /// the CP group, as over DP. Not for loss()/loss_checked() (std::logic_error there once set).
  void set_context_parallel(GptAttention attention, torch::Tensor positions);

  // The forward in pieces, for a pipeline stage holding blocks [begin, end) (TpGptStages): the
  // same operations as loss() without sequence parallelism (std::logic_error with SP on).
  /// wte (vocab-parallel) + wpe: idx [B, T] int64 → x [B, T, C] (replicated over the group);
  /// under context parallelism idx is [B, T/c] at the positions set.
  torch::Tensor embed(const torch::Tensor& idx);
  /// Blocks [begin, end): x [B, T, C] → [B, T, C]. Throws std::out_of_range for a bad range.
  torch::Tensor blocks(const torch::Tensor& x, int64_t begin, int64_t end);
  /// ln_f and lm_head: x [B, T, C] → this rank's logits [B, T, V'/t].
  torch::Tensor logits(const torch::Tensor& x);
  /// Mean vocab-parallel cross-entropy of local logits [B, T, V'/t] against targets [B, T].
  torch::Tensor loss_of_logits(const torch::Tensor& logits, const torch::Tensor& targets);
  int64_t padded_vocab() const { return padded_vocab_; }
  /// The model width C.
  int64_t width() const { return cfg_.width; }
  /// The number of transformer blocks L.
  int64_t layers() const { return cfg_.layers; }

 private:
  // One block: nanoGPT's GptBlock (core/models/gpt) with this model's own LayerNorms, run with
  // its four Linears replaced by the column- and row-parallel ones through its GptLinear hook.
  struct Block {
    GptBlock module{nullptr};  // LayerNorms used; its full-size Linears are not (GptLinear)
    std::unique_ptr<ColumnParallelLinear> c_attn, c_fc;
    std::unique_ptr<RowParallelLinear> attn_proj, mlp_proj;
  };
  // The tensors of one block's forward that the site checks compare (tp_gpt_checks).
  struct BlockTrace {
    torch::Tensor x, h, qkv, y, o, r, m_in, m_pre, m_h, m;
  };
  torch::Tensor forward_loss(const torch::Tensor& idx, const torch::Tensor& targets,
                             std::vector<int64_t>* block_bytes, std::vector<SiteCheck>* checks);
  torch::Tensor block_forward(std::size_t i, const torch::Tensor& x, BlockTrace* trace);
  void check_block(std::size_t i, const BlockTrace& tr, std::vector<SiteCheck>& checks);
  void check_head(const torch::Tensor& xf, const torch::Tensor& logits, const torch::Tensor& per_token,
                  const torch::Tensor& targets, std::vector<SiteCheck>& checks);

  TinyGpt full_;  // the one-process model the shards were sliced from (site checks)
  GptConfig cfg_;
  std::shared_ptr<dist::Group> group_;
  bool sp_;
  int64_t t_, padded_vocab_, local_heads_;
  std::unique_ptr<VocabParallelEmbedding> wte_;
  torch::Tensor wpe_;
  std::vector<Block> blocks_;
  torch::nn::LayerNorm ln_f_{nullptr};
  std::unique_ptr<ColumnParallelLinear> lm_head_;
  std::vector<ShardedParam> params_;
  GptAttention cp_attention_;  // empty: the block's own attention (no context parallelism)
  torch::Tensor cp_positions_;
};

/// The tiny GPT on a TP group cut into `stages` pipeline chunks of equal block counts (chunk c:
/// blocks [c·L/p, (c+1)·L/p); chunk 0 also the embeddings, the last chunk ln_f, lm_head and the
/// vocab-parallel cross-entropy) as a PipelineStage for the executor (core/pipeline): each chunk's
/// Linears TP-sharded, its messages [mb, T, C] (activations are replicated over the TP group
/// outside SP regions, so every TP rank sends its own copy, as Megatron does without its
/// scatter-gather optimisation). Holds `model` (not owned; it must outlive this). Throws
/// std::invalid_argument when stages < 1 or does not divide the layers.
class TpGptStages : public PipelineStage {
 public:
  TpGptStages(TpGpt& model, int stages);
  int chunks() const override { return stages_; }
  torch::Tensor forward(int chunk, const torch::Tensor& x, ChunkSaved* saved = nullptr) const override;
  /// Chunk c's local leaves in the order of TpGpt::params().
  std::vector<torch::Tensor> parameters(int chunk) const override;
  torch::Tensor loss(const torch::Tensor& y, const torch::Tensor& target) const override;
  /// [rows, T, C] for a microbatch [rows, T].
  std::vector<int64_t> output_shape(int chunk, const std::vector<int64_t>& microbatch_shape) const override;
  /// The chunk TpGpt::params()[i] belongs to.
  int chunk_of(std::size_t i) const { return chunk_of_[i]; }

 private:
  TpGpt* model_;
  int stages_;
  int64_t per_;
  std::vector<int> chunk_of_;
};

}  // namespace mpt::tp
