// The parts of `mpt tensorparallel` shared by its files: tensorparallel.cpp (sections 1-3, TP and
// SP against one process), tensorparallel_costs.cpp (sections 4-5: activation memory, step time,
// communication) and tensorparallel_mesh.cpp (section 6, the DP x TP x PP mesh).
// Included by tensorparallel*.cpp only.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "core/dist/group.hpp"
#include "core/dist/world.hpp"
#include "core/experiment.hpp"
#include "core/io/config.hpp"
#include "core/models/gpt.hpp"

namespace mpt {

/// The GPT's shape from /model/*.
GptConfig gpt_of(const Config& cfg);
/// The largest value of x over the ranks (a check is the worst rank's). Collective: every rank calls it.
double max_over_ranks(World& w, double x);
/// The GPT of sections 2-5 and its one-process reference: the model and batch from /seed, the
/// loss and every gradient of one process.
struct GptCase {
  GptConfig gc;
  int64_t B = 0, T = 0, div = 1, vpad = 0;
  bool sp = false;
  int t = 1;  // the TP degree
  TinyGpt full{nullptr};
  torch::Tensor idx, tgt;
  double loss1 = 0;
  std::map<std::string, torch::Tensor> grads1;
};

/// The GPT case from the config (/model, /data, /sp, /seed) on a TP degree t: the model, the batch,
/// one process's loss and gradients.
GptCase gpt_case(const Config& cfg, int t);
/// Section 4: activation bytes per layer kept for backward — the formulas (fp32 here,
/// Korthikanti's fp16) and the counting allocator's measurement (run-dependent, second).
std::pair<Table, Table> activation_tables(const Config& cfg, World& w, const std::shared_ptr<dist::Group>& g,
                                          const GptCase& c);
/// Section 5: forward + backward of one process, TP and TP + SP (median, run-dependent).
Table step_time_table(const Config& cfg, World& w, const std::shared_ptr<dist::Group>& g, const GptCase& c);
/// Section 5: communication of one step and rank on the TP group against the formulas (a check).
Table comm_table(const std::shared_ptr<dist::Group>& g, const GptCase& c, Report& report);
/// Section 6 (/mesh/steps > 0): the GPT trained on the DP x TP x PP mesh against its references.
Report run_mesh(const Context& ctx);
/// Section 6's cross-key checks (ConfigError naming the keys), before any worker starts.
void validate_mesh(const Config& cfg, int world_size);

}  // namespace mpt
