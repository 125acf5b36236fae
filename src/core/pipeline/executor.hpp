// Pipeline parallelism: the executor. A model cut into chunks (a stage function,
// PipelineStage: core/pipeline/stage.hpp) runs a schedule (core/pipeline/schedule.hpp) for
// real, with one thread per stage (run_pipeline) or one process per stage
// (run_pipeline_process), activations and gradients moving through a StageTransport
// (core/pipeline/transport.hpp), measuring when each stage computes and when it waits.
//
//  core/pipeline/schedule   schedules as data: PipeOp programs (F, B, W), their explicit form
//                           with send/recv (torch.distributed.pipelining's _Action), the bubble
//                           theory, the replay (simulate_schedule)
//  core/pipeline/transport  StageTransport: QueueTransport (threads), ProcessGroupTransport (c10d)
//  core/pipeline/stage.hpp  the stage function the executor calls (forward of a chunk, its
//                           parameters, the loss of the last chunk, weight-gradient roots)
//  core/pipeline/executor   the executor: run_stage (one stage's program), run_pipeline,
//                           run_pipeline_process
//  core/pipeline/stage_threads  the threads executor's threads, kept between steps, bound to CPUs
//  core/pipeline/timeline   a run read back: measured_bubble and the Gantt chart
//  core/models/mlp          the stage functions themselves (MlpStage) and the splitting
//                           (mlp_layers, stage_ranges, balanced_cuts, stage_forward)
//
// Both executors run the same per-stage code (run_stage). A synthetic cost per unit of work
// (sleep or spin, in microseconds per layer) makes compute times stable on a shared machine,
// so the measured bubble can be compared with the theory (p − 1)/(m + p − 1).
//
// A new kind of stage plugs in by implementing PipelineStage (forward of a chunk, parameters,
// loss, output_shape; optionally weight-gradient roots): nothing in the executor changes.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "core/pipeline/schedule.hpp"
#include "core/pipeline/stage.hpp"
#include "core/pipeline/transport.hpp"

namespace mpt {

/// Synthetic compute cost added per unit of work (PipelineStage::cost_units: the MLP's Linear
/// layers), so that timings are stable.
struct SyntheticCost {
  double forward_us = 0;        ///< per layer per microbatch forward, microseconds
  double backward_factor = 2;   ///< whole backward (B + W) cost = factor × forward cost
  /// The weight-gradient part of the backward: W = weight_factor × forward cost and, when
  /// the backward is split, B = (backward_factor − weight_factor) × forward cost. 1 with
  /// backward_factor 2: F = B = W, the paper's assumption (Qi et al. 2023, §3).
  double weight_factor = 1;
  std::vector<double> stage_factor;  ///< per-stage multiplier (empty: all 1)
  bool spin = false;            ///< busy-wait instead of sleeping
};

/// What one stage did in one step (the part of a PipelineRun one stage knows).
struct StageRun {
  std::vector<PipeEvent> events;  ///< the stage's operations in program order, seconds since the caller's t0
  std::vector<double> losses;     ///< last stage only: loss_j / m of every microbatch j (others: empty)
  int peak_held = 0;              ///< most (microbatch, chunk) pairs held at once
  int64_t peak_bytes = 0;         ///< most activation bytes held at once (measured), bytes
};

/// Runs stage `stage`'s program `ops` of one training step of `model` (its chunks c =
/// virtual_stage(stage, k, stages, placement) for the program's chunks k: loop k·stages + stage,
/// V stage and 2p − 1 − stage; model.chunks() = stages·v, 2·stages under V). For F(j, k), the
/// input (microbatch j of `xs` for c = 0, else received from the stage of c − 1 and made a leaf
/// that requires grad) through model.forward(c), the output sent to the stage of c + 1 (last
/// chunk: model.loss(out, ys[j]) / m, on whichever rank holds it: p − 1 loop, 0 under V); for
/// B(j, k), the gradient received from the stage of c + 1 (last: from the loss) back through
/// the chunk, the input's gradient sent to the stage of c − 1. A neighbour virtual stage on
/// this rank (V's turn, p − 1 → p) gets the tensor handed over locally, not through the
/// transport (torch.distributed.pipelining has no SEND/RECV there). Parameter gradients accumulate in .grad. When the program has W ops
/// (splits_backward), B(j, k) computes only the gradients w.r.t. the chunk's input and its
/// weight-gradient roots (ChunkSaved::weight_roots; none named: the chunk output) with
/// torch::autograd::grad(retain_graph = true) and keeps the latter; W(j, k) then runs, per
/// root, autograd::grad of the root w.r.t. its parameters with the kept gradient and
/// accumulates the results into .grad as AccumulateGrad does (what is bitwise and why:
/// core/pipeline/stage.hpp). Activation bytes held: the boundary input, the chunk's
/// ChunkSaved::activations and, split, the kept root gradients. Times are seconds since `t0`
/// (steady clock). `after_op`, when set, is called with the number of operations done after
/// each one (fault injection in tests). Throws what the transport throws (RuntimeFailure),
/// what the model throws, and std::logic_error for a chunk outside the model, a B before its
/// F, a W before its B, a local hand-over consumed before it was produced, or V with
/// model.chunks() ≠ 2·stages.
StageRun run_stage(int stage, int stages, const PipelineStage& model, const std::vector<PipeOp>& ops, int microbatches,
                   const std::vector<torch::Tensor>& xs, const std::vector<torch::Tensor>& ys,
                   const SyntheticCost& cost, StageTransport& transport, std::chrono::steady_clock::time_point t0,
                   const std::function<void(int)>& after_op = {}, Placement placement = Placement::Loop);

/// Runs one training step (forward + backward, no optimizer step) of `model` with `schedule`
/// (p = schedule.size() stages; model.chunks() = p·v for v chunks per stage), one thread per
/// stage. x: the batch's inputs [batch, ...], y: its targets [batch, ...]; the batch is split
/// into m = microbatches equal chunks (dim 0) and each microbatch's loss is divided by m, so
/// the gradients equal the full-batch mean loss's. Gradients are reset first (.grad undefined);
/// PipelineRun::grads holds every chunk's parameters' gradients, chunk by chunk. Throws
/// std::invalid_argument when batch % m != 0 or model.chunks() is not a multiple of p (under
/// `placement` V: not 2p), RuntimeFailure when a stage fails (the others are woken and stop).
/// `placement`: where the chunks sit (schedule_placement of the schedule's kind: V for ZB-V).
/// `workers`: 0 (or >= p) runs one thread per stage; W in 1 .. p − 1 runs W threads, thread w
/// the contiguous stages w·p/W … (w+1)·p/W − 1, each time the next op of one of them whose input message is
/// there (round robin; `transport` must then be a QueueTransport, else std::invalid_argument):
/// each stage's program still runs in order, so losses and gradients are those of one thread
/// per stage, bit for bit; an op's PipeEvent::wait_s is then the time since the stage's
/// previous op ended (waiting for its input or for its thread). For stages that share C < p
/// cores: no more threads compute than cores, and a stage that waits costs no context switch
/// (a synthetic sleep, though, holds its thread: the other stages of that thread wait).
PipelineRun run_pipeline(const PipelineStage& model, const std::vector<std::vector<PipeOp>>& schedule,
                         int microbatches, const torch::Tensor& x, const torch::Tensor& y, const SyntheticCost& cost,
                         StageTransport& transport, Placement placement = Placement::Loop, int workers = 0);

/// The CPUs run_pipeline binds its `threads` threads to, thread i to the i-th: the first
/// `threads` CPUs of this process's affinity (sched_getaffinity) when it has at least that many
/// and more than one; else none (empty: the threads float). The threads are kept from one step
/// to the next. Why bind: threads that wait poll with sched_yield, and two left on one CPU take
/// turns on it while another idles (measured: docs/pipeline.md). OMP_PROC_BIND=close's rule.
/// Until another process is seen busy on one of them (stage_threads_binding).
std::vector<int> stage_thread_cpus(int threads);

/// How run_pipeline's threads sat in its last step: "bound to CPUs 0,1"; "not bound: unbound
/// after step N of this process: thread i had S % of CPU c over T ms (it waited: for a message, a
/// synthetic sleep or another process on that CPU)" once a
/// bound thread's CPU time fell below 75 % of its wall time over a step (binding then stays off
/// for the process: a bound thread cannot leave a CPU another process is busy on); "not bound
/// (more threads than usable CPUs, or one CPU)"; "no step run".
std::string stage_threads_binding();

/// Options of the multi-process executor.
struct ProcessPipelineOptions {
  /// Called on this rank after each operation of the step with the number done so far (the
  /// experiment's fault-injection point, World::fault_point, in tests of failure handling).
  std::function<void(int)> after_op;
  /// A second group of the same ranks that carries the gradients (null: the main group
  /// carries both directions). Needed with NCCL: see ProcessGroupTransport.
  std::shared_ptr<dist::Group> backward_group;
  /// Where the model chunks sit (schedule_placement: V for ZB-V, loop otherwise).
  Placement placement = Placement::Loop;
  /// This rank's clock against rank 0's, microseconds to add to this rank's steady clock
  /// (trace::ClockSync::offset_us, from Job::clock_exchanges): every stage's events are put on
  /// rank 0's clock before the step's span is taken. 0 (no measurement) leaves each rank's
  /// step at its own exit from the step's barrier, which skews the span by how far apart the
  /// ranks leave it (milliseconds on a loaded machine).
  double clock_offset_us = 0;
  /// The job's rank of each stage of the group (ProcessGroupTransport::set_job_ranks: the
  /// timeline's flows between stages are keyed by them). Empty: the stage numbers, right where
  /// the pipeline is the whole job (`mpt pipeline`); a DP x TP x PP mesh sets them.
  std::vector<int> job_ranks;
};

/// The same training step as run_pipeline, with one process per stage: this process is
/// stage group->rank() of group->size() stages (its chunks' parameters, x and y on the
/// group's device: CPU with Gloo, this rank's GPU with NCCL) and runs only its own
/// program schedule[rank] (make_schedule, as the threaded run), exchanging tensors with
/// its neighbours through a ProcessGroupTransport (boundary b's shape: model.output_shape(b,
/// the shape of one microbatch of x); float32). Every rank builds the same `model`, x, y
/// (same seed) and calls this together. The step starts after a barrier; the events of
/// every stage are on rank 0's clock (opts.clock_offset_us), the first operation at 0, as the
/// threaded run's; at the end the per-stage events, peaks, losses and parameter gradients are combined on
/// every rank by two all-reduces (sums in which every value has one non-zero contributor,
/// hence exact), so the returned PipelineRun has the same content as run_pipeline's.
/// Gradients are reset first. Throws std::invalid_argument when batch % m != 0 or the
/// group size differs from the stage count; RuntimeFailure "stage S (rank S of P) failed:
/// ..." when this stage fails, a peer dies or a message does not come within the timeout.
PipelineRun run_pipeline_process(const std::shared_ptr<dist::Group>& group, const PipelineStage& model,
                                 const std::vector<std::vector<PipeOp>>& schedule, int microbatches,
                                 const torch::Tensor& x, const torch::Tensor& y, const SyntheticCost& cost,
                                 const ProcessPipelineOptions& opts = {});

/// Measured bubble fraction: mean over stages of 1 − busy/step.
double measured_bubble(const PipelineRun& run);

/// Text Gantt chart: one row per stage; an op is drawn as F, B or W (f, b, w for odd model
/// chunks), its microbatch (0-9, then a-z) and '-' (F), '=' (B), '~' (W) filling its duration; idle time as '.'. At most
/// `width` columns; one column = step_s / width.
std::string render_gantt(const PipelineRun& run, int stages, int width = 100);

}  // namespace mpt
