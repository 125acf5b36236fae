// The parts of `mpt plan` in their own files: the published runs it is checked against
// (src/experiments/plan_published.cpp), the MLP model (plan_mlp.cpp) and the calibration
// (plan_calibrate.cpp). Included by plan*.cpp only.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

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

namespace mpt::plan_calibrate {

/// The collectives result /calibrate/collectives names: its ranks and its link (busbw and latency
/// per collective, as a system file's intra_node). Read by validate (so --print-config refuses what
/// a run refuses) and by the run, before anything is measured. Throws ConfigError naming
/// /calibrate/collectives and the file.
std::pair<int64_t, nlohmann::json> calibration_link(const Config& cfg);

/// The host overheads of a training step on `device`, an alpha-beta model of small kernels (as
/// LogP's overhead o, Culler et al. 1993): tiny MLPs of 2 and 8 Linear(16, 16), batch 16, forward
/// and backward timed (medians of 400), less their GEMMs at `sys`'s rates (System::gemm_seconds);
/// the difference over the difference of their operators (plan::mlp_operators) is the cost of an
/// operator, and what the 2-layer step has left the cost of a pass (autograd's graph task, the loss
/// read back). Never below 0; measured again (up to 3 times) while the deeper step is not slower.
struct Overheads {
  double operator_s = 0, pass_s = 0;  ///< seconds per operator, per forward and backward
  double step_s[2] = {0, 0}, ops[2] = {0, 0};  ///< the two steps' median time and operators
  int tries = 0;            ///< measurements made: again while the deeper step was not slower, up to 3
  bool consistent = false;  ///< the deeper step was slower (else operator_s is 0 and unreliable)
};
Overheads operator_overhead(const plan::System& sys, torch::Device device);

/// Seconds of one tensor operator outside autograd on `device`: zero_, clone and slice of a 16 × 16
/// tensor (median of 1000) / 3. A step's bookkeeping around its forward and backward (zeroing or
/// cloning gradients, slicing a batch) costs this per operator, not operator_overhead's.
double bare_operator_seconds(torch::Device device);

/// `mpt plan --calibrate`: this machine measured into a system file (under timings.system): GEMM
/// peaks and rates by size per format, the operator overhead, the memory bandwidth and per rank,
/// LibTorch's resident reserve, and the collectives of /calibrate/collectives' result.
/// Throws ConfigError as calibration_link does.
Report calibrate(const Context& ctx);

}  // namespace mpt::plan_calibrate

