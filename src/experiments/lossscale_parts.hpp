// The parts of `mpt lossscale` that live in their own files (src/experiments/lossscale_sweep.cpp:
// section 1, the static loss-scale sweep; lossscale_ceiling.cpp: section 2's GEMM ceilings;
// lossscale_gpt.cpp: section 3, the tiny GPT under per-operation precision policies). Included
// by lossscale*.cpp only.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/train/amp.hpp"
#include "core/io/config.hpp"
#include "core/experiment.hpp"
#include "core/io/results.hpp"
#include "core/numerics/precision.hpp"

namespace mpt {

/// GradScaler's options from /train/scaler (shared by sections 2 and 3).
GradScaler::Options scaler_options(const Config& cfg);

/// Section 1: the deep sigmoid net's gradients of S·loss for each static scale of /sweep/scales
/// (ascending); adds table sweep, the check that power-of-two scaling is exact in fp32,
/// results.safe_window and results.sweep_compute. Throws RuntimeFailure naming /sweep/compute
/// when the device cannot compute in fp16 as asked.
void sweep_section(const Context& ctx, Report& report);

/// Section 3's keys (/gpt/...) with their defaults.
void add_gpt_spec(ConfigSpec& s);
/// Section 3's cross-key checks (policies, heads dividing the width, ...); throws ConfigError.
void validate_gpt(const Config& cfg);
/// Section 3's memory (core/runtime/memory): parameter-sized tensors and the activations autograd keeps.
MemoryEstimate gpt_memory(const Config& cfg);
/// Section 3: trains the tiny GPT under each policy; adds tables gpt_policies and gpt_sites and
/// results.gpt_history. Throws RuntimeFailure when the text corpus is missing.
void gpt_section(const Context& ctx, Report& report);

/// Section 2's /train/gemm_ceiling = n > 0: times an n x n x n torch::mm in fp32 and in each
/// format of `recipes` that has native kernels (timings.gemm_ceiling), then notes on `cost` (the
/// recipes' cost table, rows with name, step_ms, gflops, why) the ceilings and, per narrow format,
/// whether storing it narrow made the step faster than fp32's (`fp32_step`, seconds; NaN when no
/// fp32 recipe ran) and why not. `best_rate`: the highest GEMM rate (GFLOP/s) a recipe of each
/// format reached.
void add_gemm_ceilings(const Context& ctx, int64_t n, const std::vector<std::string>& recipes,
                       const std::map<Format, double>& best_rate, double fp32_step, Table& cost, Report& report);

}  // namespace mpt
