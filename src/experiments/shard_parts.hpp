// The parts of `mpt shard` shared by its two files: the runs it trains (src/experiments/shard.cpp)
// and the tables that compare them (src/experiments/shard_tables.cpp: equivalence, reduction
// bound, loss, memory and communication against the formulas, mixed precision). Included by
// shard*.cpp only.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/dist/dist.hpp"
#include "core/experiment.hpp"
#include "core/io/results.hpp"
#include "core/parallel/reference.hpp"
#include "core/parallel/zero.hpp"
#include "core/runtime/runtime.hpp"

namespace mpt::shard {

/// Bytes per element of the dtypes a run uses (fp32 or bf16).
inline int64_t bytes_of(torch::ScalarType t) { return t == torch::kBFloat16 ? 2 : 4; }

/// The training options every run shares (/seed, /train/*, /optimizer/*).
struct Setup {
  int64_t seed = 1, global_batch = 64, micro = 1, steps = 1;
  std::vector<int64_t> hidden;
  std::string optimizer = "adam";
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0, momentum = 0;
};

/// Optimizer state bytes per parameter element: Adam's m and v (fp32), SGD's momentum buffer.
inline int64_t state_bytes(const Setup& s) { return s.optimizer == "adam" ? 8 : (s.momentum > 0 ? 4 : 0); }

/// One sharded run: its row name and its ZeRO options.
struct RunSpec {
  std::string name;
  dist::ShardOptions opts;
};

/// What one run measured (rank 0 holds the trajectory; the maxima are over the ranks).
struct RunOut {
  std::vector<double> losses;
  std::vector<torch::Tensor> params;  // rank 0: flat parameters after every step
  dist::HeldBytes held;               // the largest over the ranks, per role
  std::map<std::string, dist::CommCount> comm;  // this rank's counters over the training steps
  int64_t numel = 0, padded = 0;
  double step_s = 0;
  int64_t transient_peak = 0;  // allocator: bytes above a step's start, largest over steps >= 1 and ranks
  dist::ReductionError red;    // N > 2: every gradient reduction vs the exact sum of its terms (maxima)
};

/// The runs of a report, in order: every stage of /train/stages (stage 0 first, added when
/// absent: the DDP baseline), [main_runs, mixed_first) the other micro-batch reduction, then
/// [mixed_first, end) the mixed-precision policies at `mixed_stage`.
struct Plan {
  std::vector<RunSpec> runs;
  std::size_t main_runs = 0, mixed_first = 0;
  int mixed_stage = 3;
  bool every = false;  // /zero/reduce_every_micro_batch
  bool fp32 = true;    // /mixed/param_dtype and /mixed/reduce_dtype both fp32
  KernelProbe bf16;    // whether this LibTorch's bf16 matrix product runs here
};

/// The single-process references (rank 0): the ranks' local batches accumulated in rank order
/// (`same`), and one backward over the whole global batch (`whole`).
struct References {
  reference::Trajectory same, whole;
};

/// The data of the tables: the plan, every run's measurements, the references, N, the options.
struct Results {
  const Plan& plan;
  const std::vector<RunOut>& outs;
  const References& refs;
  const Setup& s;
  int n = 1;
  bool gpt = false;
  std::string model_desc;  // the GPT's shape, for the equivalence title (empty for the MLP)
};

/// Section 3: parameters every step vs DDP and the references, with the bitwise checks.
Table equivalence_table(Report& report, const Results& res);
/// N > 2: every gradient reduction against the float64 sum of its own terms, a row and a check per run.
Table reduction_table(Report& report, const Results& res);
/// The loss per step of the main runs and of the rank-by-rank reference.
Table loss_table(const Results& res);
/// Section 4: model-state bytes per rank against the formulas (checked), and the allocator's
/// peak per step (the second table, stored under timings).
std::pair<Table, Table> memory_tables(Report& report, const Results& res);
/// Section 5: communication per step counted by the process group against the formulas
/// (checked); `gloo` is the algorithm the shards' Gloo groups run.
Table comm_table(Report& report, const Results& res, dist::GlooAlgorithm gloo);
/// Section 6: bf16 parameters with fp32 or bf16 reduction against fp32 at plan.mixed_stage.
Table mixed_table(Report& report, const Results& res);

}  // namespace mpt::shard
