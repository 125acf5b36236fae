// A tiny GPT (part of core/models/mlp): pre-LayerNorm transformer decoder, causal multi-head
// self-attention, GELU MLP, character-level — the model of the fp8/fp4, sharding and tensor
// parallel lessons when an MLP is too small to show what attention and logits do.
//
// The architecture is GPT-2's as nanoGPT writes it (Radford et al. 2019; Karpathy's nanoGPT
// model.py), without dropout and without weight tying, so that one module order fixes every
// random draw: wte, wpe, then per block ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc,
// mlp.c_proj, then ln_f and lm_head. Every module keeps PyTorch's default initialisation
// (Embedding N(0, 1); Linear kaiming_uniform_(a=√5) and U(±1/√fan_in) biases; LayerNorm 1/0),
// so tests/parity/gpt_parity.py builds the same weights from the same torch.manual_seed and
// the same logits, loss and gradients bit for bit in fp32 on the CPU.
//
// Every Linear is applied through ATen's linear (torch::linear), as Python's nn.Linear does; the
// C++ frontend's Linear module rounds differently on [B, T, C] inputs (see gpt.cpp).
//
// Attention is written out (q·kᵀ/√d, causal mask, softmax, ·v) instead of calling a fused
// kernel: LibTorch 1.13 has no scaled_dot_product_attention, and each intermediate is a
// "site" where an experiment can store the tensor in a low-precision format (GptHook) — the
// per-operation precision policy of the mixed-precision lessons (softmax, LayerNorm and logits
// kept in fp32 or not).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace mpt {

/// Shape of a tiny GPT.
struct GptConfig {
  int64_t vocab = 96;    ///< tokens (characters of the corpus)
  int64_t context = 64;  ///< longest sequence T (positions of wpe)
  int64_t width = 128;   ///< model width C (n_embd)
  int64_t heads = 4;     ///< attention heads; must divide width
  int64_t layers = 2;    ///< transformer blocks
  int64_t mlp_ratio = 4; ///< MLP hidden width / width
};

/// Throws std::invalid_argument naming the field when a size is < 1 or heads does not divide width.
void check_gpt_config(const GptConfig& c);

/// Number of parameters of a GptConfig (weights and biases; wte and lm_head counted separately,
/// as they are not tied): V·C + T·C + L·(12C² + 13C) + 2C + V·C.
int64_t gpt_num_params(const GptConfig& c);

/// Where a forward pass may store an intermediate in another format. `site` is one of
/// "embed" (wte + wpe), "ln" (every LayerNorm output), "qkv", "scores" (q·kᵀ/√d before the mask),
/// "probs" (softmax output), "attn_out", "mlp_hidden" (after GELU), "mlp_out", "residual" (each
/// block's two residual sums), "logits".
/// The hook returns the tensor to use from there on (same shape); identity by default.
using GptHook = std::function<torch::Tensor(const torch::Tensor& x, const std::string& site)>;

/// How a block's Linear layers multiply: y = x·Wᵀ + b for x [B, T, in], weight [out, in], bias
/// [out] → y [B, T, out]. `name` is the module's path: "h<i>.c_attn", "h<i>.attn_proj",
/// "h<i>.c_fc", "h<i>.mlp_proj". Empty (the default) means torch::linear, so the plain forward is
/// unchanged; an fp8 experiment passes quantized GEMMs here (core/train/quant_train's gpt_linear),
/// the way Transformer Engine's fp8_autocast swaps only the Linear GEMMs. lm_head, the
/// embeddings, LayerNorm, softmax and attention's two batched matmuls never go through it.
using GptLinear = std::function<torch::Tensor(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                                              const std::string& name)>;

/// The attention core of a block: q, k, v [B, nh, T, hd] (already split into heads) → y [B, nh,
/// T, hd], causal. Empty (the default) means the block's own written-out softmax(q·kᵀ/√d)·v with
/// its "scores" and "probs" hook sites; context parallelism (core/parallel/cp) passes one whose
/// T is this rank's share of the sequence and which exchanges keys and values with the other
/// ranks (the hook sites of the core are then not called).
using GptAttention = std::function<torch::Tensor(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v)>;

/// The attention half of a pre-LayerNorm block: x + attn_proj(attention(c_attn(ln_1(x)))) for x [B,
/// T, C] → [B, T, C], with the hook sites, GptLinear names (`prefix` + "c_attn", "attn_proj") and
/// GptAttention of GptBlockImpl::forward, which calls it; the mixture-of-experts block
/// (core/models/moe) shares it, so both blocks attend with the same operations.
torch::Tensor gpt_attention_residual(const torch::Tensor& x, torch::nn::LayerNorm& ln_1, torch::nn::Linear& c_attn,
                                     torch::nn::Linear& attn_proj, int64_t heads, const GptHook& hook,
                                     const GptLinear& linear = {}, const std::string& prefix = "",
                                     const GptAttention& attention = {});

/// One pre-LayerNorm block: x + attn(ln_1(x)), then x + mlp(ln_2(x)).
struct GptBlockImpl : torch::nn::Module {
  GptBlockImpl(const GptConfig& c);
  /// x [B, T, C] → [B, T, C]; `hook` as GptHook (may be empty); `linear` as GptLinear (empty:
  /// torch::linear), called with names `prefix` + "c_attn", ... (TinyGpt passes "h<i>."). The
  /// attention's sequence length, width and head count are read from c_attn's output, so that
  /// tensor parallelism (core/parallel/tp_gpt) runs this block with its Linears replaced by
  /// column/row-parallel ones returning this rank's heads. `attention` replaces the attention
  /// core (GptAttention; empty: the written-out one).
  torch::Tensor forward(const torch::Tensor& x, const GptHook& hook, const GptLinear& linear = {},
                        const std::string& prefix = "", const GptAttention& attention = {});
  int64_t heads;
  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  torch::nn::Linear c_attn{nullptr}, attn_proj{nullptr}, c_fc{nullptr}, mlp_proj{nullptr};
};
TORCH_MODULE(GptBlock);

/// The tiny GPT: token and position embeddings, `layers` blocks, a final LayerNorm, lm_head.
struct TinyGptImpl : torch::nn::Module {
  /// Builds the modules in the order of the header comment. Throws std::invalid_argument for a
  /// bad config (check_gpt_config).
  explicit TinyGptImpl(const GptConfig& c);
  /// idx [B, T] int64 token ids in [0, vocab), T ≤ context → logits [B, T, vocab] (float32
  /// unless a hook changes it). `linear` replaces the blocks' Linear GEMMs (GptLinear; empty:
  /// torch::linear). Throws c10::Error for T > context or an id out of range.
  torch::Tensor forward(const torch::Tensor& idx, const GptHook& hook = {}, const GptLinear& linear = {});
  GptConfig cfg;
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  std::vector<GptBlock> blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear lm_head{nullptr};
};
TORCH_MODULE(TinyGpt);

/// Multiplies the query and key rows of every block's c_attn weight (rows [0, 2C) of [3C, C];
/// the value rows and the biases are left alone) by `s`, in place, so that the attention scores
/// q·kᵀ/√d of the initial model grow by about s² — a "sharp" attention whose scores leave fp16's
/// range (65504) while fp32 and bf16 hold them. s = 1 changes nothing (no operation is applied).
/// Used by lossscale's /gpt/model/qk_init_scale. Throws std::invalid_argument for s not finite or ≤ 0.
void scale_qk_init(TinyGptImpl& model, double s);

/// Mean cross-entropy of next-token prediction: logits [B, T, V], targets [B, T] int64 → scalar
/// (F.cross_entropy(logits.view(-1, V), targets.view(-1)), computed in fp32).
torch::Tensor gpt_loss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace mpt
