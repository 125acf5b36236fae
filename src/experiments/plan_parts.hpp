// The parts of `mpt plan` in their own files: the published runs it is checked against
// (src/experiments/plan_published.cpp). Included by plan*.cpp only.
#pragma once

#include "core/experiment.hpp"
#include "core/plan/plan.hpp"

namespace mpt::plan_published {

/// The model against published runs, each row from its paper's own configuration on `a100` (the
/// A100 DGX system file): the ZeRO paper's Figure 1 (model states per GPU, Ψ = 7.5B, K = 12,
/// N_d = 64; goal 2 %) and the ten rows of Megatron-LM's Table 1 (Narayanan et al. 2021: achieved
/// TFLOP/s per GPU, eq. 3; goal 10 %). Adds one check per row to `report` (relative error against
/// its goal). Throws std::invalid_argument when `a100` has no fp16 peak.
Table published_runs_table(const plan::System& a100, Report& report);

}  // namespace mpt::plan_published
