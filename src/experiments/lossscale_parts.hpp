// The parts of `mpt lossscale` that live in their own file (src/experiments/lossscale_gpt.cpp:
// section 3, the tiny GPT under per-operation precision policies). Included by lossscale*.cpp only.
#pragma once

#include "core/train/amp.hpp"
#include "core/io/config.hpp"
#include "core/experiment.hpp"
#include "core/io/results.hpp"

namespace mpt {

/// GradScaler's options from /train/scaler (shared by sections 2 and 3).
GradScaler::Options scaler_options(const Config& cfg);

/// Section 3's keys (/gpt/...) with their defaults.
void add_gpt_spec(ConfigSpec& s);
/// Section 3's cross-key checks (policies, heads dividing the width, ...); throws ConfigError.
void validate_gpt(const Config& cfg);
/// Section 3's memory (core/runtime/memory): parameter-sized tensors and the activations autograd keeps.
MemoryEstimate gpt_memory(const Config& cfg);
/// Section 3: trains the tiny GPT under each policy; adds tables gpt_policies and gpt_sites and
/// results.gpt_history. Throws RuntimeFailure when the text corpus is missing.
void gpt_section(const Context& ctx, Report& report);

}  // namespace mpt
