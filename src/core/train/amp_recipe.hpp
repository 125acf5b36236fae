// The mixed-precision recipe engine (core/train/amp's layer above GradScaler and store_as): an MLP
// trained on a classification dataset under one precision recipe — which format holds the
// weights, activations and gradients, whether fp32 master weights take the update, how the loss
// is scaled, and how an update reaches weights stored without a master copy (round to nearest,
// stochastic rounding, Kahan summation). Micikevicius et al. 2017 ("Mixed Precision Training")
// for the master weights and loss scaling; Zamirai et al. 2020 ("Revisiting BFloat16 Training")
// for the pure-bf16 updates. `mpt lossscale` trains its recipes with it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "core/train/amp.hpp"
#include "core/io/data.hpp"
#include "core/numerics/precision.hpp"

namespace mpt {

/// How the loss is scaled before backward: not at all, by a fixed S, or by GradScaler.
enum class LossScaling { None, Static, Dynamic };
/// How the SGD update reaches weights stored without a master copy: round to nearest (what a
/// bf16 tensor's add_ does), stochastic rounding (sgd_update_stochastic), or Kahan-compensated
/// summation (sgd_update_kahan).
enum class UpdateRounding { Nearest, Stochastic, Kahan };

/// One precision recipe, named "<format>[+master][+static|+dynamic][+sr|+kahan]" as in
/// lossscale's /train/recipes: e.g. "fp16+master+dynamic", "bf16+kahan".
struct PrecisionRecipe {
  std::string name;
  Format format = Format::FP32;   ///< storage format of weights, activations and gradients
  bool master = false;            ///< fp32 master weights (the update is applied to them)
  LossScaling scaling = LossScaling::None;
  UpdateRounding update = UpdateRounding::Nearest;
};

/// Parses a recipe name (the config's enum list has already checked it): the format is the
/// prefix ("bf16…", "fp16…", otherwise fp32), the modifiers are looked up as substrings.
PrecisionRecipe parse_precision_recipe(const std::string& name);

/// The parameters of the MLP 784 → width × depth → 10 (W1, b1, W2, b2, …, as nn.Linear builds
/// them, in order, so a seed fixes them; fp32, CPU, detached).
std::vector<torch::Tensor> init_recipe_mlp(int64_t depth, int64_t width);

/// The training run of a recipe (every field but the recipe's own choices).
struct RecipeTraining {
  int64_t steps = 400;            ///< SGD steps
  int64_t batch = 64;             ///< samples per step (capped at the dataset size)
  float lr = 0.01f;               ///< SGD learning rate
  bool loss_in_low_precision = false;  ///< log-softmax and the loss in the recipe's format (else fp32, as autocast)
  std::uint64_t seed = 0;         ///< data order (shuffled_indices(N, seed + 1000003·(epoch + 1))) and SR
  float static_scale = 1024.0f;   ///< S of a LossScaling::Static recipe
  GradScaler::Options scaler;     ///< a LossScaling::Dynamic recipe's GradScaler
  std::string activation = "relu";  ///< hidden activation (activation_as: relu, sigmoid, tanh)
  torch::Device device = torch::kCPU;
  bool progress = false;          ///< a progress line on stderr (core Progress; the harness's Context::tty)
  std::string progress_label = "recipe";  ///< its prefix, e.g. the experiment's name
};

/// Counts of parameter gradients that underflow: nonzero in fp32 math, 0 once stored.
struct GradCounter {
  long long underflow = 0, total = 0;
};

/// What one recipe's training produced.
struct RecipeRun {
  std::vector<double> loss, scale;    ///< per step: the batch loss before the step, the loss scale used
  double final_loss = 0, accuracy = 0, final_scale = 1;  ///< train loss and test accuracy with the final weights
  long long skipped = 0, lost = 0, updates = 0;          ///< skipped steps (inf/NaN), lost and intended updates
  GradCounter grads;
  double step_s = 0;       ///< mean seconds per step (run-dependent)
  int64_t peak_bytes = 0;  ///< the allocator's peak during training, bytes (run-dependent)
};

/// Trains the MLP whose initial parameters are `init` (init_recipe_mlp) on `train` with plain
/// SGD under recipe `r` and compute mode `c` (native kernels or emulated storage: store_as), then
/// evaluates the train loss and the test accuracy in the recipe's format. Every stored tensor is
/// in the format: the working copy of each parameter, each layer's output and activation in
/// forward, the gradient entering each of them in backward; pure recipes update with
/// sgd_update_counting_lost / sgd_update_stochastic / sgd_update_kahan, master recipes update fp32.
/// Static scaling unscales as GradScaler does (reciprocal in double) and skips inf/NaN steps.
/// Throws RuntimeFailure "recipe R at step N: ..." when GradScaler's floor is hit
/// (LossScaleError), and what LibTorch throws.
RecipeRun train_recipe(const PrecisionRecipe& r, Compute c, const std::vector<torch::Tensor>& init,
                       const Dataset& train, const Dataset& test, const RecipeTraining& opt);

}  // namespace mpt
