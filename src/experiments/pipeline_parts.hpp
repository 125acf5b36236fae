// The parts of `mpt pipeline` that live in their own file (src/experiments/pipeline_sweep.cpp:
// the sweep of schedules run for real, the step-end barrier, the processes' check against the
// threads) and what both files share. Included by pipeline*.cpp only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/experiment.hpp"
#include "core/pipeline/executor.hpp"

namespace mpt::pipe {

/// Layer ranges [begin, end) of the virtual stages, in virtual-stage order.
using Ranges = std::vector<std::pair<int, int>>;

/// Whether /pipeline/schedules asks for `name`.
bool wants(const Config& cfg, const std::string& name);
/// Config lists are long long; LibTorch sizes are int64_t (long on Linux).
std::vector<int64_t> i64(const std::vector<long long>& v);

/// The sweep's bench: the executor (threads, or this process as stage `rank` of p), the pipelined
/// MLP of /pipeline/widths with its batch and full-batch gradient, the synthetic cost. Made by
/// open_bench and build_model; `step` runs one training step on it.
struct Bench {
  const Config* cfg = nullptr;
  int p = 1;           ///< stages (ranks)
  int layers_n = 1;    ///< layers of the pipelined MLP
  int v = 2;           ///< /pipeline/chunks: model chunks per stage of interleaved-1f1b
  int n_steps = 1;     ///< timed steps per run
  int gantt_m = 8;     ///< the m whose runs get a Gantt chart (and the step-end barrier's)
  int heavy = -1;      ///< /cost/heavy_stage
  double timeout_s = 30;
  bool processes = false;  ///< one process per stage (else one thread per stage)
  bool lead = true;        ///< rank 0: reports
  World* world = nullptr;
  torch::Device device = torch::kCPU;
  std::shared_ptr<dist::Group> group;  ///< processes: the stages' group (activations)
  ProcessPipelineOptions popts;        ///< processes: gradients' group, clock offset, placement, fault point
  int workers_cfg = 0;  ///< /pipeline/workers
  int workers = 0;      ///< threads that run the p stages (0 with processes)
  std::vector<torch::nn::Linear> layers;
  torch::Tensor x, y;               ///< the batch
  std::vector<torch::Tensor> full;  ///< the full-batch gradient (the whole model, one graph)
  SyntheticCost cost;
  int step_index = 0;  ///< steps run so far (0 = the warm-up): /fault/step counts them
  std::map<int, Ranges> cut;  ///< the model cut into p·chunks virtual stages, per chunks

  /// The layer ranges of p·chunks balanced virtual stages (chunks 1: the p stages).
  const Ranges& ranges(int chunks);
  /// One training step of program `sched` (m microbatches) on the virtual stages `step_ranges`
  /// placed as `placement`, batch xx, yy, with the chosen executor.
  PipelineRun step(const std::vector<std::vector<PipeOp>>& sched, int m, const Ranges& step_ranges,
                   const torch::Tensor& xx, const torch::Tensor& yy, Placement placement);
};

/// The stages' executor from /executor: device, groups and clock offset for processes (throws
/// ConfigError for schedules that need batched send/recv on NCCL), the threads' count;
/// env.pipeline_device and env.pipeline_transport.
Bench open_bench(const Context& ctx, Report& report);
/// The pipelined MLP (seeded), its batch, the full-batch gradient (results.full_batch_loss), the cost.
void build_model(Bench& bench, Report& report);
/// One untimed warm-up step (thread or process start-up, first allocations); --trace's sweep metadata.
void warm_up(Bench& bench);
/// env.pipeline_workers: the threads executor's threads and how they sat in the last step.
void note_workers(const Bench& bench, Report& report);

/// A processes run's gradients, for the check against the threads executor.
struct ProcessGrads {
  std::string name;
  ScheduleKind kind;
  int m;
  std::vector<torch::Tensor> grads;
};

/// What the sweep fills: the tables (sweep in results; measured, zero_bubble_measured in
/// timings), Gantt charts, every event (timings.events), and what later sections need.
struct SweepTables {
  Table sweep, measured, zero_bubble, zero_bubble_measured;
  std::vector<TextBlock> charts;
  json events = json::object();
  std::map<int, std::vector<torch::Tensor>> reference_grads;  ///< gpipe's, per m
  std::vector<ProcessGrads> process_grads;                    ///< processes: every run's, on each rank
  std::vector<long long> skipped_m;                           ///< m that interleaved-1f1b cannot run
};

/// Section 3: every schedule of /pipeline/schedules at every m, run for real (median of
/// /pipeline/steps), gradients checked against the full batch and gpipe, peaks against the
/// schedule's, the time model and the measured bubble.
SweepTables run_sweep(Bench& bench, Report& report);
/// Section 4: two steps with and without a step-end barrier, time model (step_sync) and
/// measured (step_sync_measured), for the schedules whose row says so; notes into `measured`.
std::pair<Table, Table> step_sync_tables(Bench& bench, const std::vector<std::string>& kinds, Table& measured);
/// Processes: every run's gradients against the same step with one thread per stage (bitwise).
void check_processes_against_threads(Bench& bench, const std::vector<ProcessGrads>& runs, Report& report);
/// The sweep's notes every rank adds (skipped m, zb-v's and interleaved's cuts).
void add_sweep_notes(const Bench& bench, SweepTables& st);
/// Rank 0: the remaining notes, then the tables into `report` in their order.
void add_sweep_report(const Bench& bench, SweepTables& st, std::pair<Table, Table>& sync, Report& report);

}  // namespace mpt::pipe
