// Training an MLP whose Linear layers run quantized GEMMs (core/numerics/quant), shared by `mpt fp8` and
// `mpt fp4`: the Fashion-MNIST classifier of core/models/mlp' mlp() (Linear, ReLU, ..., Linear) with
// one QuantRecipe per layer, plain SGD on fp32 master weights, the batches of a fixed permutation
// per epoch (core/io/data's shuffled_indices, as `lossscale` draws them).
//
// And the tiny GPT of core/models/gpt with the four Linears of every block (c_attn, attn_proj, c_fc,
// mlp_proj) on quantized GEMMs, plugged in through TinyGpt::forward's GptLinear: the Linears
// Transformer Engine's fp8_autocast runs in fp8 (te.Linear inside the autocast region), while
// lm_head, the embeddings, LayerNorm, softmax and attention's two batched matmuls stay fp32.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "core/io/config.hpp"
#include "core/io/data.hpp"
#include "core/models/gpt.hpp"
#include "core/numerics/quant.hpp"

namespace mpt::quant {

/// The MLP as parameter leaves W1, b1, W2, b2, ... (fp32 master weights) and one QuantLinear per
/// layer holding that layer's recipe, ledger and fp8 meta (its own weight is unused: the forward
/// calls quantized_linear on the leaves).
struct QuantMlp {
  std::vector<torch::Tensor> params;
  std::vector<QuantLinear> layers;
};

/// Copies `init` (W1, b1, ... as from mlp()'s Linear layers, W [out, in]) into leaves and gives
/// layer l the recipe recipes[l]. Throws std::invalid_argument when the sizes do not match.
QuantMlp make_quant_mlp(const std::vector<torch::Tensor>& init, const std::vector<QuantRecipe>& recipes);

/// Logits [batch, out] of images [batch, ...] (flattened to [batch, in]): quantized Linear, ReLU,
/// ..., quantized Linear. `outputs`, if given, receives every layer's pre-activation [batch, width].
torch::Tensor forward(QuantMlp& net, const torch::Tensor& images, std::vector<torch::Tensor>* outputs = nullptr);

/// Mean cross-entropy and argmax accuracy over a data set, in chunks of `chunk` samples (each
/// chunk's tensors quantized on their own), in eval mode (delayed scaling records no amax).
struct Evaluation {
  double loss = 0, accuracy = 0;
};
Evaluation evaluate(QuantMlp& net, const Dataset& d, std::int64_t chunk = 1000);

/// What train() does. Batch b of step t is the slice t mod (N / batch) of the permutation
/// shuffled_indices(N, seed + 1000003·(epoch + 1)).
struct TrainPlan {
  std::int64_t steps = 0;
  std::int64_t batch = 128;
  double lr = 0.1;
  std::uint64_t seed = 0;
  std::vector<std::int64_t> ledger_steps;  ///< steps whose GEMMs the layers' ledgers record
  std::int64_t outlier_step = -1;          ///< the step whose inputs are multiplied by outlier_factor
  double outlier_factor = 1;
  bool skip_outlier_update = false;        ///< run that step's forward and backward, skip its SGD update
  std::int64_t capture_step = -1;          ///< the step whose fp32 operands x, W, dy are captured
  bool evaluate = true;                    ///< evaluate the test set at the end
};

/// The fp32 operands every layer saw at TrainPlan::capture_step: x [batch, in], W [out, in], dy [batch, out].
struct Operands {
  std::vector<torch::Tensor> x, w, dy;
};

/// What a run produced.
struct TrainRun {
  std::vector<double> loss;                        ///< training loss of every step
  Evaluation test;                                 ///< the final weights on the test set
  std::vector<std::vector<GemmLedger>> ledger;     ///< per layer: the GEMMs of the ledger steps
  Operands captured;                               ///< filled at capture_step
  double step_s = 0;                               ///< mean wall time of a step (run-dependent)
};

/// Whether `r` diverged: a training loss or its test loss is NaN or ±inf (evaluated or not).
bool diverged(const TrainRun& r);

/// Trains `net` with SGD (p ← p − lr·g, torch.optim.SGD's unfused update) and cross-entropy, and
/// calls update_scales() on every layer after each step (delayed scaling). `progress_label`: the
/// stderr progress line, shown when `tty`.
TrainRun train(QuantMlp& net, const Dataset& train_set, const Dataset& test_set, const TrainPlan& plan, bool tty,
               const std::string& progress_label);

/// The entry of `ledger` for `step` and `gemm` ("out", "dgrad", "wgrad"), or nullptr.
const GemmLedger* find_gemm(const std::vector<GemmLedger>& ledger, std::int64_t step, const std::string& gemm);

// ───────────────────────────── the tiny GPT ─────────────────────────────

/// One Linear of a GPT block: its GptLinear name ("h0.c_attn") and its GEMM sizes, W [out, in].
struct GptLinearShape {
  std::string name;
  std::int64_t in = 0, out = 0;
};
/// The block Linears of `c` in module order: per block c_attn C→3C, attn_proj C→C, c_fc C→rC,
/// mlp_proj rC→C (r = mlp_ratio).
std::vector<GptLinearShape> gpt_linear_shapes(const GptConfig& c);

/// One QuantLinear (recipe, ledger, fp8 meta; its own weight unused) per block Linear of a GPT,
/// by GptLinear name. The module's weights stay in the TinyGpt: gpt_linear() multiplies them.
struct QuantGptLinears {
  std::vector<std::string> names;            ///< gpt_linear_shapes' order
  std::map<std::string, QuantLinear> layers;
};
/// Every block Linear of `c` under recipe `r`; with `delayed`, TE's DelayedScaling on each
/// (throws std::invalid_argument unless `r` is per tensor with fp32 scales: set_delayed_scaling).
QuantGptLinears make_quant_gpt_linears(const GptConfig& c, const QuantRecipe& r, const DelayedScaling* delayed = nullptr);
/// Every block Linear of `c` under its own recipe: recipes[i] for gpt_linear_shapes(c)[i] (the
/// per-layer recipes of an ablation that keeps some Linears in bf16, as mpt fp4's GPT section).
/// Throws std::invalid_argument when recipes.size() differs from the number of block Linears.
QuantGptLinears make_quant_gpt_linears(const GptConfig& c, const std::vector<QuantRecipe>& recipes);
/// The GptLinear that runs each named Linear through quantized_linear with its QuantLinear
/// (three quantized GEMMs, fp32 bias). `q` must outlive every forward and backward that uses it.
/// Throws std::out_of_range for a name `q` does not hold.
GptLinear gpt_linear(QuantGptLinears& q);

/// What train_gpt() does: nanoGPT's loop with torch.optim.SGD(momentum) (core/train/amp's SgdMomentum)
/// on the fp32 weights. The batch of step t is the t-th text_batch of a CPU generator seeded with
/// `seed` (train split); validation: `eval_batches` batches of a generator seeded with seed + 1
/// (validation split), the recipe's forward in eval mode (delayed scaling records no amax).
struct GptTrainPlan {
  std::int64_t steps = 0;
  std::int64_t batch = 16;
  double lr = 0.3, momentum = 0.9;
  std::uint64_t seed = 0;
  std::int64_t ledger_step = -1;  ///< the step whose GEMMs the QuantLinears' ledgers record (-1: none)
  std::int64_t eval_batches = 4;
};
/// The plan the keys under `prefix` describe: /steps, /batch, /ledger_step and the training keys of
/// core/models/gpt_spec's add_gpt_training_keys (/lr, /momentum, /eval_batches), with `seed`. The keys
/// must be in the experiment's spec (Config throws otherwise).
GptTrainPlan gpt_train_plan_at(const Config& cfg, const std::string& prefix, std::uint64_t seed);
/// What a GPT run produced.
struct GptTrainRun {
  std::vector<double> loss;                                ///< training loss of every step
  double val_loss = 0;                                     ///< mean over the validation batches
  std::map<std::string, std::vector<GemmLedger>> ledger;   ///< per Linear name: the ledger step's GEMMs
  double step_s = 0;                                       ///< mean wall time of a step (run-dependent)
};
/// Trains `model` (already seeded and built) on `corpus` per `plan`, its block Linears through
/// gpt_linear(q), lm_head and the rest in fp32, cross-entropy (gpt_loss). Calls update_scales()
/// on every QuantLinear after each step (delayed scaling). Throws std::invalid_argument (from
/// text_batch) when a split is not longer than the context.
GptTrainRun train_gpt(TinyGpt& model, QuantGptLinears& q, const TextCorpus& corpus, const GptTrainPlan& plan, bool tty,
                      const std::string& progress_label);

}  // namespace mpt::quant
