// The parts of `mpt plan` in their own files: the published runs it is checked against
// (src/experiments/plan_published.cpp) and the MLP model (plan_mlp.cpp). Included by plan*.cpp only.
#pragma once

#include <string>
#include <vector>

#include "core/experiment.hpp"
#include "core/io/config.hpp"
#include "core/plan/plan.hpp"

namespace mpt::plan_published {

/// The model against published runs, each row from its paper's own configuration: the ZeRO
/// paper's Figure 1 (model states per GPU, Ψ = 7.5B, K = 12, N_d = 64; goal 2 %), on `a100` (the
/// A100 DGX system file) the ten rows of Megatron-LM's Table 1 (Narayanan et al. 2021: achieved
/// TFLOP/s per GPU, eq. 3) and BLOOM-176B (BigScience's tr11-176B-ml: 70 layers on 12 uneven
/// stages), and on `h100` (the H100 DGX file) Llama 3 405B's Table 4 at 8,192 and 16,384 GPUs (126
/// layers on 16 uneven stages; model TFLOP/s per GPU); goal 10 % each. Adds one check per row to
/// `report` (relative error against its goal). Throws std::invalid_argument when a system has no
/// fp16 (A100) or bf16 (H100) peak.
Table published_runs_table(const plan::System& a100, const plan::System& h100, Report& report);

}  // namespace mpt::plan_published

namespace mpt::plan_mlp {

/// The MLP of /model/widths (/model/style = mlp, /model/preset = custom `preset`): a sample is one
/// row, no dropout unless /model/dropout = on. Throws ConfigError naming a transformer key that is
/// set (an MLP would ignore it), a preset, fewer than 2 widths or a width below 1.
plan::ModelShape mlp_from(const Config& cfg, const std::string& preset, const std::vector<long long>& widths);

/// The model table of an MLP: its parameters and model FLOPs per sample.
Table mlp_model_table(const plan::ModelShape& m, const plan::Training& t);

/// An MLP's pipeline stages (Estimate::stages): each stage's layers, parameters and activations;
/// the memory table shows the one that needs most.
Table mlp_stages_table(const plan::Estimate& e);

}  // namespace mpt::plan_mlp
