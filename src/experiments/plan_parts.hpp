// The parts of `mpt plan` in their own files: the published runs it is checked against
// (src/experiments/plan_published.cpp). Included by plan*.cpp only.
#pragma once

#include "core/experiment.hpp"
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
