// The parts of `mpt fp8` that live in their own files (src/experiments/fp8_gpt.cpp: the tiny GPT
// under each recipe; fp8_blocks.cpp: MXFP8 saturation per block and the accumulator) and the
// helpers they share. Included by fp8*.cpp only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/io/config.hpp"
#include "core/experiment.hpp"
#include "core/numerics/quant.hpp"
#include "core/io/results.hpp"
#include "core/train/quant_train.hpp"

namespace mpt::fp8 {

/// True for the fp8 recipes (every name but "fp32" and "bf16").
bool is_fp8(const std::string& recipe);
/// Block sizes and gradient element from /blockwise, /mx and /format.
quant::RecipeOptions recipe_options(const Config& cfg);
/// The core recipe of an experiment recipe name ("delayed" is tensorwise; the caller adds
/// DelayedScaling with delayed_options).
quant::QuantRecipe core_recipe(const std::string& name, const quant::RecipeOptions& o);
/// TE DelayedScaling from /delayed.
quant::DelayedScaling delayed_options(const Config& cfg);
/// The key whose block size makes `recipe` fail on a Linear of m samples, k inputs, n outputs:
/// "/blockwise/tile" or "/blockwise/weight_block" (blockwise), "/mx/block" (mxfp8*), `other` else.
std::string block_key(const std::string& recipe, const quant::RecipeOptions& o, std::int64_t m, std::int64_t k,
                      std::int64_t n, const std::string& other);
/// "L<l+1> <in>x<out>": the name of Linear layer l (0-based) of the MLP whose widths are `w`.
std::string layer_name(std::size_t l, const std::vector<std::int64_t>& w);
/// The GEMM ledger's columns (A and B operands' amax, scale, % saturated, % flushed; rel. error).
std::vector<Column> ledger_columns();
/// One ledger row: `name`, its recipe and layer, and the GEMM's ledger entry.
json ledger_row(const std::string& name, const std::string& recipe, const json& layer, const quant::GemmLedger& g);

/// Table mx_saturation: MXFP8 per 1x/mx/block block, FLOOR against RCEIL (OCP MX v1.0, torchao),
/// on the fp32 run's captured operands `ops` (x, W, dy per layer of the MLP of widths `w`);
/// operands the block does not divide are left out; results.mx_saturated_blocks.
void mx_section(const Context& ctx, const quant::Operands& ops, const std::vector<std::int64_t>& w, Report& report);
/// Table accumulator: C = A·Bᵀ with a /accumulator/significand_bits accumulator, without and with
/// promotion every /accumulator/promote_every elements (DeepSeek-V3 §3.3.2), fp32 and E4M3
/// operands, against float64; two checks that the mean errors fall in their expected ranges.
void accumulator_section(const Context& ctx, Report& report);

/// The GPT section's keys (/gpt/...): enabled, the model (core/models/gpt_spec), the corpus, the run.
void add_gpt_spec(ConfigSpec& s);
/// The GPT section's cross-key checks (when /gpt/enabled): heads divide the width, a text file,
/// every fp8 recipe's blocks divide the GPT's GEMMs ([batch·context, C] activations, [out, in]
/// weights), the ledger step inside the run. Throws ConfigError naming the pointer.
void validate_gpt(const Config& cfg);
/// The GPT section's memory (core/runtime/memory): the model states of one recipe's run (5 x 4 bytes a
/// parameter: weights, gradients, SGD momentum, the quantized copies of W the GEMMs read) and the
/// activations of a batch (core/runtime/memory's gpt_activation_bytes with a quantized copy of each, a
/// vocabulary of at most 96 characters). An estimate of the order of magnitude.
MemoryEstimate gpt_memory(const Config& cfg);
/// Trains the tiny GPT under every recipe of /recipes; adds tables gpt_recipes, gpt_ledger,
/// gpt_loss_curve, results.gpt_history and the timings table gpt_cost. Throws RuntimeFailure when
/// the corpus is missing.
void gpt_section(const Context& ctx, Report& report);

}  // namespace mpt::fp8
