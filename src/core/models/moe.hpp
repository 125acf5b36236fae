// core/models/moe: the tiny GPT (core/models/gpt) with every block's MLP replaced by a mixture of
// experts — a router, E expert MLPs, top-k routing with a fixed capacity per expert, tokens over
// capacity dropped, and the two load-balancing methods of current training:
//
//   routing     probs = softmax(h·W_rᵀ) over E experts (router in fp32, no bias: Switch, Megatron-core);
//               each token picks the k experts of largest probs (+ bias_i, aux-free); its gates are
//               the picked probs, renormalised over the k when k > 1 (Mixtral; Megatron-core's
//               softmax after top-k), the raw prob when k = 1 (Switch: the router then still gets
//               a gradient from the loss). Fedus et al. 2021 (Switch), Lepikhin et al. 2020 (GShard).
//   capacity    per group of N tokens (a rank's share of the batch: GShard's groups, Switch's cores),
//               each expert takes at most capacity = min(N, ⌈N·k·cf/E⌉) tokens (Megatron-core's
//               get_capacity with num_tokens = N·k); the rest are dropped in token order (its
//               "position" drop policy: the first tokens keep their place) and pass through the
//               block's residual only. Expert buffers are padded to the capacity, so the all-to-all
//               of expert parallelism has equal splits.
//   aux_loss    Switch's auxiliary loss α·E·Σ_i f_i·P_i per group (f_i the fraction of the N·k
//               choices given to expert i before drops, P_i its mean prob), added to the loss
//               averaged over the groups.
//   aux_free    DeepSeek-V3's auxiliary-loss-free balancing (DeepSeek-AI 2024, §2.1.2): a bias b_i
//               added to the scores for the choice only, b_i += γ·sign(mean load − load_i) after each
//               step, with the loads counted over the whole batch.
//
// The model runs on a list of groups: each group's dense part (embeddings, attention, LayerNorms,
// router, lm_head) runs on that group's tensors alone, and the experts see every group's
// dispatched tokens at once (Experts). One process passes all groups and its LocalExperts; a rank
// of expert parallelism (core/parallel/ep) passes its own group and experts that exchange the
// tokens by all-to-all. The shapes of every operation are then the same in both, which is what
// makes `mpt expertparallel`'s comparison bitwise (docs/expertparallel.md).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "core/models/gpt.hpp"

namespace mpt::moe {

/// How the router's load is balanced (see the file comment).
enum class Balance { None, AuxLoss, AuxFree };
/// "none" | "aux_loss" | "aux_free" → the value; throws std::invalid_argument naming them.
Balance balance_from_name(const std::string& name);
std::string balance_name(Balance b);

/// A mixture-of-experts layer's settings.
struct MoeConfig {
  int64_t experts = 8;            ///< E
  int64_t top_k = 2;              ///< k experts per token, 1 ≤ k ≤ E
  double capacity_factor = 1.25;  ///< cf > 0: capacity = min(N, ⌈N·k·cf/E⌉) tokens per expert and group
  Balance balance = Balance::AuxLoss;
  double aux_loss_coeff = 0.01;    ///< α of the Switch loss (Fedus et al.: 10⁻²)
  double bias_update_rate = 1e-3;  ///< γ of the aux-free bias (DeepSeek-V3: 0.001)
};

/// Throws std::invalid_argument naming the field for E < 1, k ∉ [1, E], cf ≤ 0 or not finite, α or γ < 0.
void check_moe_config(const MoeConfig& m);

/// Tokens one expert takes from a group of `tokens`: min(tokens, ⌈tokens·k·cf/E⌉), at least 1
/// (Megatron-core's get_capacity of tokens·k choices; more than `tokens` cannot come, a token
/// picking an expert once). The ceiling is taken of the float64 product.
int64_t capacity(int64_t tokens, const MoeConfig& m);

/// One group's routing in one layer.
struct Routing {
  torch::Tensor probs;   ///< [N, E] softmax of the router logits (autograd)
  torch::Tensor expert;  ///< [N, k] int64 the chosen experts, largest score first
  torch::Tensor gate;    ///< [N, k] the gates (autograd)
  torch::Tensor slot;    ///< [N, k] int64 the place in the expert's buffer, −1 where dropped
  torch::Tensor counts;  ///< [E] int64 tokens that chose each expert (before drops)
  torch::Tensor kept;    ///< [E] int64 tokens each expert took (min(counts, capacity))
  torch::Tensor aux;     ///< scalar, the Switch loss α·E·Σ f_i·P_i of this group (autograd); 0 unless AuxLoss
  int64_t capacity = 0;
};

/// Routes one group: logits [N, E] (fp32) → Routing, choices by probs + `bias` ([E]; not
/// differentiated, zeros unless AuxFree), drops by token position beyond `capacity`. Ties in
/// top-k go as torch::topk breaks them (identical wherever the same code runs on the same bits).
Routing route(const torch::Tensor& logits, const torch::Tensor& bias, const MoeConfig& m, int64_t capacity);

/// The tokens h [N, C] in their experts' buffers: [E, capacity, C], padding rows zero
/// (differentiable in h; a token's gradient sums its k slots).
torch::Tensor dispatch(const torch::Tensor& h, const Routing& r);
/// The experts' outputs back at their tokens: out [E, capacity, C] → y [N, C], y_t = Σ_j gate_tj ·
/// out[expert_tj, slot_tj] over the kept choices j in order (dropped: nothing added).
torch::Tensor combine(const torch::Tensor& out, const Routing& r);

/// One expert: GELU MLP, c_fc [H, C] then c_proj [C, H], as the dense block's MLP.
struct ExpertImpl : torch::nn::Module {
  ExpertImpl(int64_t width, int64_t hidden);
  /// x [M, C] → [M, C] (torch::linear, as gpt.cpp's Linears).
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear c_fc{nullptr}, c_proj{nullptr};
};
TORCH_MODULE(Expert);

/// A block's mixture of experts: router [E, C] (no bias), experts 0 .. E−1, and the aux-free
/// bias [E] (a buffer "expert_bias", zeros; only AuxFree moves it).
struct MoeMlpImpl : torch::nn::Module {
  MoeMlpImpl(int64_t width, int64_t hidden, int64_t experts);
  torch::nn::Linear router{nullptr};
  std::vector<Expert> experts;
  torch::Tensor expert_bias;
};
TORCH_MODULE(MoeMlp);

/// How one expert is applied: expert `i` of `mlp` to its rows x [M, C] → [M, C]. Empty means the
/// module itself (ExpertImpl::forward); tensor parallelism (core/parallel/ep's TpMoeShards) passes
/// its column- and row-parallel shards of the expert.
using ExpertFn = std::function<torch::Tensor(MoeMlpImpl& mlp, int64_t i, const torch::Tensor& x)>;

/// Expert i of `mlp` on x through `fn` (empty: the module).
torch::Tensor apply_expert(const ExpertFn& fn, MoeMlpImpl& mlp, int64_t i, const torch::Tensor& x);

/// Who runs the experts of a layer: the dispatched buffers of G groups [G, E, cap, C] → the
/// experts' outputs in the same layout (autograd through both).
class Experts {
 public:
  virtual ~Experts() = default;
  virtual torch::Tensor run(MoeMlpImpl& mlp, const torch::Tensor& buffers) = 0;
};

/// One process holding every expert: expert i runs once on [G·cap, C], the groups' buffers
/// concatenated in group order — the rows its expert-parallel owner receives from the ranks.
class LocalExperts : public Experts {
 public:
  explicit LocalExperts(ExpertFn fn = {}) : fn_(std::move(fn)) {}
  torch::Tensor run(MoeMlpImpl& mlp, const torch::Tensor& buffers) override;

 private:
  ExpertFn fn_;
};

/// A pre-LayerNorm block whose MLP is a mixture of experts.
struct MoeBlockImpl : torch::nn::Module {
  MoeBlockImpl(const GptConfig& c, int64_t experts);
  int64_t heads;
  torch::nn::LayerNorm ln_1{nullptr};
  torch::nn::Linear c_attn{nullptr}, attn_proj{nullptr};
  torch::nn::LayerNorm ln_2{nullptr};
  MoeMlp mlp{nullptr};
};
TORCH_MODULE(MoeBlock);

/// What a forward's layers routed, per layer: counts and kept [G, E] int64 (per group), the capacity.
struct LayerRouting {
  torch::Tensor counts, kept;
  int64_t capacity = 0;
};

/// The MoE GPT. Construction order (the random draws of PyTorch's default initialisation, as
/// tests/parity/expertparallel_ref.py builds it): wte, wpe, then per block ln_1, attn.c_attn,
/// attn.c_proj, ln_2, mlp.router, mlp.experts[0].c_fc, [0].c_proj, [1].c_fc, ..., then ln_f, lm_head.
/// Expert hidden width mlp_ratio·C, as the dense MLP's.
struct MoeGptImpl : torch::nn::Module {
  /// Throws std::invalid_argument for a bad GptConfig (check_gpt_config) or MoeConfig.
  MoeGptImpl(const GptConfig& c, const MoeConfig& m);
  /// idx: one [B_g, T] int64 tensor per group (all of one shape, T ≤ context) → logits [B_g, T, V]
  /// per group; the experts run by `experts`. `routing` (if not null) receives each layer's.
  /// `linear` replaces the attention's Linear GEMMs (GptLinear, names "h<i>.c_attn" and
  /// "h<i>.attn_proj"; empty: torch::linear), as tensor parallelism needs.
  std::vector<torch::Tensor> forward(const std::vector<torch::Tensor>& idx, Experts& experts,
                                     std::vector<LayerRouting>* routing = nullptr, const GptLinear& linear = {});
  /// Group `g`'s Switch losses of the last forward summed over the layers (in layer order) and
  /// divided by `total_groups` (every group of the batch, on every rank): a group's share of the
  /// mean over the groups. 0 unless AuxLoss. Throws std::out_of_range for a group not in that forward.
  torch::Tensor aux_loss(int64_t g, int64_t total_groups) const;
  /// DeepSeek-V3's bias step for every layer: b_i += γ·sign(mean − load_i), where `loads` is [L,
  /// E] tokens that chose expert i over the whole batch (every group, every rank). No-op unless AuxFree.
  void update_bias(const torch::Tensor& loads);
  GptConfig cfg;
  MoeConfig moe;
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  std::vector<MoeBlock> blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear lm_head{nullptr};

 private:
  std::vector<std::vector<torch::Tensor>> aux_;  // [group][layer], from the last forward
};
TORCH_MODULE(MoeGpt);

/// Parameters of the MoE GPT: the dense GPT's without the MLPs, plus per block E·C (router) and
/// E·(2·C·H + H + C) (experts, H = mlp_ratio·C).
int64_t moe_gpt_num_params(const GptConfig& c, int64_t experts);

/// The loss of one group: Σ_tokens cross-entropy(logits, targets) / `total_tokens` (fp32), so that
/// the groups' losses add up to the mean over the whole batch. logits [B_g, T, V], targets [B_g, T].
torch::Tensor group_lm_loss(const torch::Tensor& logits, const torch::Tensor& targets, int64_t total_tokens);

}  // namespace mpt::moe
