// Pipeline parallelism: a model cut into stages, microbatch schedules (naive, GPipe,
// 1F1B / PipeDream-flush) and an executor that runs a schedule for real with one
// thread per stage, measuring when each stage computes and when it waits.
//
//  - Schedules are per-stage lists of operations F(j) / B(j) (forward / backward of
//    microbatch j), and W(j) when the backward is split (zero-bubble schedules: B is the
//    gradient w.r.t. the stage input only, W the weight gradients, run later). GPipe (Huang et al. 2019): all forwards, then all backwards.
//    1F1B (PipeDream-flush, Narayanan et al. 2021; Megatron-LM's non-interleaved
//    schedule): stage s runs min(p − s − 1, m) warm-up forwards, then alternates one
//    forward and one backward, then drains the remaining backwards (cool-down).
//    ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", §3.1): 1F1B with B and W
//    apart, stage s postponing its W's by s microbatches so that W fills the cool-down
//    bubble; peak memory that of 1F1B's first stage (p microbatches).
//  - The executor moves activations forward and gradients backward through a
//    StageTransport. In one process that is a mailbox (QueueTransport, one thread per
//    stage: run_pipeline); across processes it is c10d point-to-point send/recv over a
//    Gloo (CPU) or NCCL (CUDA) process group (ProcessGroupTransport, one process per
//    stage: run_pipeline_process), as torch.distributed.pipelining and Megatron-LM's
//    p2p_communication do. Both executors run the same per-stage code (run_stage).
//  - A synthetic per-layer cost (sleep or spin, in microseconds) makes compute times
//    stable on a shared machine, so the measured bubble can be compared with the
//    theory (p − 1)/(m + p − 1).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/torch.h>

namespace mpt {

namespace dist {
class Group;
class Work;
}  // namespace dist

// ----------------------------------------------------------------------------
// Schedules
// ----------------------------------------------------------------------------

/// One unit of work of a stage: forward ('F'), backward ('B') or weight gradient ('W') of
/// one microbatch through one of the stage's model chunks (interleaved 1F1B; otherwise
/// always chunk 0). In a program without W ops, B is the whole backward (input and weight
/// gradients); with W ops (zero-bubble schedules, torch.distributed.pipelining's
/// BACKWARD_INPUT / BACKWARD_WEIGHT), B computes only the gradient w.r.t. the stage input
/// and W(j) the weight gradients of microbatch j later.
struct PipeOp {
  char kind = 'F';     ///< 'F' forward, 'B' backward (input gradient when split), 'W' weight gradient
  int microbatch = 0;  ///< 0-based microbatch index
  int chunk = 0;       ///< the stage's model chunk k: virtual stage k·p + s (0 unless interleaved)
  bool operator==(const PipeOp& o) const {
    return kind == o.kind && microbatch == o.microbatch && chunk == o.chunk;
  }
};

/// The schedules mpt knows. Naive = the whole batch as one microbatch (GPipe with m = 1).
/// Interleaved1F1B: Megatron-LM's interleaved schedule (Narayanan et al. 2021, §2.2), v
/// model chunks per stage. ZBH1: the zero-bubble schedule ZB-H1 (Qi et al. 2023), B and W split.
enum class ScheduleKind { Naive, GPipe, OneFOneB, Interleaved1F1B, ZBH1 };

/// "naive", "gpipe", "1f1b", "interleaved-1f1b", "zb-h1" -> ScheduleKind; throws
/// std::invalid_argument otherwise.
ScheduleKind parse_schedule(const std::string& name);
/// The config name of a schedule ("naive", "gpipe", "1f1b", "interleaved-1f1b", "zb-h1").
std::string schedule_name(ScheduleKind k);

/// Per-stage operation lists for `stages` stages and `microbatches` microbatches
/// (Naive ignores `microbatches` and uses 1). Result[s] is stage s's program, in order.
/// Interleaved1F1B with v = `chunks` model chunks per stage (the model cut into p·v
/// virtual stages, stage s owning s, s + p, …): Megatron-LM's
/// forward_backward_pipelining_with_interleaving — forward k runs chunk (k mod pv) / p
/// of microbatch ⌊k / pv⌋·p + k mod p, backwards take the chunks in reverse; stage s
/// warms up with min(2(p − s − 1) + (v − 1)p, mv) forwards (all of them when m = p), then
/// alternates one forward and one backward, then drains the backwards.
/// ZBH1 (ZB-H1, Qi et al. 2023 §3.1 and Fig. 3; the construction of torch.distributed.pipelining's
/// _get_1f1b_rank_ops(enable_zero_bubble=True) with one stage per rank): 1F1B's warm-up of
/// min(p − s − 1, m) forwards, then 1F1B with B = input gradient only; after the i-th B
/// (0-based) stage s runs the next pending W once i ≥ s, and the W's still pending at the
/// end. Stage s thus postpones its W's by s microbatches: at most p microbatches are held
/// (forward done, W not) on every stage, 1F1B's peak (stage 0).
/// Throws std::invalid_argument for stages < 1, microbatches < 1, chunks ≠ 1 for the other
/// schedules, and for Interleaved1F1B chunks < 2 or microbatches not a multiple of stages
/// (Megatron's requirement: microbatches go through the chunks in groups of p).
std::vector<std::vector<PipeOp>> make_schedule(ScheduleKind kind, int stages, int microbatches, int chunks = 1);

/// The programs of `steps` training steps run back to back with no barrier between them: stage
/// s runs its program of step t right after its own step t − 1 (its optimizer step needs only its
/// own gradients), microbatch j of step t renamed j + t·microbatches. That is what a stage may do
/// when nothing global sits between steps; a gradient-norm clip or a GradScaler inf-check is an
/// all-reduce over the stages before the optimizer step, a barrier: every stage then starts step t
/// only after every stage ended step t − 1 (Qi et al. 2023, §4 "bypassing optimizer
/// synchronizations"). Throws std::invalid_argument for steps < 1 or microbatches < 1.
std::vector<std::vector<PipeOp>> repeat_steps(const std::vector<std::vector<PipeOp>>& schedule, int steps,
                                              int microbatches);

/// Per stage: the largest number of (microbatch, chunk) pairs whose forward has run and
/// whose backward has not (the activations the stage must hold at once; with one chunk
/// per stage, microbatches). In a program with W ops a microbatch is held until its W
/// (W needs the layer inputs and the kept output gradients).
std::vector<int> peak_in_flight(const std::vector<std::vector<PipeOp>>& schedule);

/// Whether a program splits the backward (has a W op): then its B computes only the input gradient.
bool splits_backward(const std::vector<PipeOp>& ops);

/// A stage's program as text, e.g. "F0 F1 B0 F2 B1 B2" (split: "F0 B0 W0 …"); with chunks "F0.0 F1.0 F0.1 …"
/// (microbatch.chunk).
std::string schedule_string(const std::vector<PipeOp>& ops);

/// Bubble fraction of a balanced pipeline: (p − 1)/(m + p − 1) (GPipe paper, §2.2); with v
/// model chunks per stage (interleaved 1F1B) (p − 1)/(v·m + p − 1): the fill and drain
/// take p − 1 chunk times instead of p − 1 stage times (Narayanan et al. 2021, §2.2).
double bubble_theory(int stages, int microbatches, int chunks = 1);

/// Idle time per stage of a balanced pipeline with m microbatches whose F, B (input
/// gradient) and W (weight gradient) take `f`, `b`, `w` (any time unit), from Qi et al. 2023
/// (§2 and §3.1): 1F1B (B and W fused) (p − 1)(F + B + W); ZB-H1 (p − 1)(F + B − W) for
/// m ≥ p, and (p − 1)(F + B) − (m − 1)W for m < p (only m − 1 W's are there to fill the
/// cool-down; derived from the replay, simulate_schedule, and checked against it exactly in
/// tests). Other schedules: the fused formula (p − 1)(F + B + W) (GPipe, naive) or
/// (p − 1)(F + B + W)/v (interleaved). Throws std::invalid_argument for ZB-H1 with
/// W > F + B (the formula assumes W fits the gap).
double bubble_time_theory(ScheduleKind kind, int stages, int microbatches, double f, double b, double w,
                          int chunks = 1);


// ----------------------------------------------------------------------------
// Models cut into stages
// ----------------------------------------------------------------------------

/// The Linear layers of an MLP with layer widths `widths` (w0 → w1 → … → wL), built in
/// order, as nn.Sequential(Linear(w0,w1), ReLU(), …, Linear(w_{L−1}, w_L)) is in Python,
/// so the same seed gives the same weights. A ReLU follows every layer but the last.
/// Throws std::invalid_argument for fewer than 2 widths or a width < 1.
std::vector<torch::nn::Linear> mlp_layers(const std::vector<int64_t>& widths);

/// Half-open layer ranges [begin, end) of the stages given by `cuts` (a cut c puts
/// layers < c and layers >= c in different stages). Cuts must be strictly increasing
/// and within 1 .. layers−1. Throws std::invalid_argument naming the bad cut.
std::vector<std::pair<int, int>> stage_ranges(int layers, const std::vector<int64_t>& cuts);

/// Cuts that split `layers` layers into `stages` stages as evenly as possible (earlier
/// stages get the extra layer). Throws std::invalid_argument when stages > layers or < 1.
std::vector<int64_t> balanced_cuts(int layers, int stages);

/// Runs layers [begin, end) on x: Linear, then ReLU unless the layer is the model's
/// last (index `total_layers` − 1). x: [batch, w_begin] → [batch, w_end].
/// When `kept` is given, every tensor produced is appended (for activation accounting).
torch::Tensor stage_forward(const std::vector<torch::nn::Linear>& layers, int begin, int end, torch::Tensor x,
                            std::vector<torch::Tensor>* kept = nullptr);

/// The gradient of every parameter of `layers`, in layer order (weight, then bias), detached
/// and cloned. Throws (LibTorch) when a parameter has no gradient yet.
std::vector<torch::Tensor> param_grads(const std::vector<torch::nn::Linear>& layers);

/// Removes every parameter's gradient (.grad = undefined, as zero_grad(set_to_none=True)).
void reset_grads(const std::vector<torch::nn::Linear>& layers);

// ----------------------------------------------------------------------------
// Transport between stages
// ----------------------------------------------------------------------------

/// Point-to-point messages between stages: activations forward, gradients backward.
/// A message is named by (kind, microbatch, boundary) — 'F' for an activation, 'B' for a
/// gradient; `boundary` b is the cut between virtual stages b and b + 1 it crosses (−1:
/// min(src, dst), the only boundary between two stages when each has one chunk).
/// Implementations: QueueTransport (threads in one process); ProcessGroupTransport (one
/// process per stage, c10d send/recv).
class StageTransport {
 public:
  virtual ~StageTransport() = default;
  /// Sends `t` from stage `src` to stage `dst`. Must not block indefinitely.
  virtual void send(int src, int dst, char kind, int microbatch, const torch::Tensor& t, int boundary = -1) = 0;
  /// Receives the message (src → dst, kind, microbatch, boundary); blocks until it arrives.
  /// Throws RuntimeFailure after the timeout or when the transport was aborted.
  virtual torch::Tensor recv(int src, int dst, char kind, int microbatch, int boundary = -1) = 0;
  /// Makes every pending and future recv throw RuntimeFailure with `why` (a stage failed).
  virtual void abort(const std::string& why) = 0;
};

/// In-process mailbox: send stores the tensor, recv waits (condition variable) for it.
class QueueTransport : public StageTransport {
 public:
  explicit QueueTransport(double timeout_s) : timeout_s_(timeout_s) {}
  void send(int src, int dst, char kind, int microbatch, const torch::Tensor& t, int boundary = -1) override;
  torch::Tensor recv(int src, int dst, char kind, int microbatch, int boundary = -1) override;
  void abort(const std::string& why) override;

 private:
  using Key = std::tuple<int, int, char, int, int>;
  double timeout_s_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<Key, torch::Tensor> box_;
  std::string aborted_;
};

/// Stage-to-stage messages between processes over c10d process groups (Gloo on CPU, NCCL on CUDA):
/// stage s is rank s of `group`, and each process is one stage. An activation goes forward
/// with ProcessGroupGloo::send/recv, a gradient comes back the same way, as
/// torch.distributed.pipelining (PipelineStage's isend/irecv) and Megatron-LM
/// (core/pipeline_parallel/p2p_communication.py) move them.
///
///  - Tag = 2·microbatch + (kind == 'B') + 2^20·⌊b / p⌋ for boundary b: forward and backward
///    messages of every microbatch are told apart between the same two ranks, and so are the
///    laps of an interleaved schedule (boundaries b and b + p join the same two stages). A
///    step ends with flush() and a collective, so tags can be reused by the next step.
///  - Shapes are known from the model, not sent (Megatron's fixed tensor_shape): the tensor
///    crossing boundary b (virtual stage b → b+1 forward, b+1 → b backward) has shape
///    `boundary_shapes[b]` ([microbatch rows, width at the cut]) and dtype float32. With v
///    chunks per stage there are p·v − 1 boundaries and stage p − 1 sends forward to stage 0.
///  - send() posts the send and returns (Gloo moves the data once the receiver posts its
///    recv): a blocking send would deadlock 1F1B, where both neighbours send before they
///    receive. flush() waits for every posted send.
///  - Every recv and flush is bounded by the group's timeout. A peer process that dies
///    closes its connections, and the pending recv fails at once with a RuntimeFailure
///    naming the peer stage (= rank); a silent peer fails it after the timeout.
class ProcessGroupTransport : public StageTransport {
 public:
  /// `group`: the stages' process group (size = stages, this process = stage group->rank());
  /// it carries the activations. `boundary_shapes[b]`: shape of the message across boundary
  /// b, b = 0 .. stages − 2. `backward_group` (same ranks; null: `group`) carries the
  /// gradients. With NCCL it must be a second group: ProcessGroupNCCL runs the send and the
  /// recv between two ranks on one stream in posting order, so in 1F1B's steady state (each
  /// neighbour sends before it receives) one group would deadlock; with a group per
  /// direction each stream carries one direction only (torch.distributed.pipelining batches
  /// the send with the next recv instead, batch_isend_irecv). Tensors live on the group's
  /// device (CPU for Gloo, the rank's GPU for NCCL). Throws std::invalid_argument when there
  /// are not p·v − 1 shapes for some v ≥ 1 or the two groups differ in ranks or device.
  ProcessGroupTransport(std::shared_ptr<dist::Group> group, std::vector<std::vector<int64_t>> boundary_shapes,
                        std::shared_ptr<dist::Group> backward_group = nullptr);
  /// Aborts sends still in flight (after a failure) so that nothing waits on them.
  ~ProcessGroupTransport() override;

  /// Posts a send of `t` (float32 on the group's device, the crossed boundary's shape) from this
  /// process's stage `src` to its neighbour `dst` = src ± 1 (mod p with chunks) and returns
  /// without waiting. Throws std::invalid_argument when src is not this rank, dst is no
  /// neighbour of it, the boundary does not join them, or the shape differs from the
  /// boundary's; RuntimeFailure when the backend cannot post the send.
  void send(int src, int dst, char kind, int microbatch, const torch::Tensor& t, int boundary = -1) override;
  /// Receives the activation ('F', from src = dst − 1) or gradient ('B', from src = dst + 1)
  /// of `microbatch` into a new float32 tensor of the boundary's shape on the group's device.
  /// Returns once the data is there (on CUDA: after synchronising the device, so that the
  /// caller's wait time is the real one). Blocks at most the group's timeout (NCCL: its
  /// watchdog). Throws RuntimeFailure "stage D: no activation|gradient for microbatch
  /// J from stage S (rank S): ..." when the peer died, timed out or abort() was called.
  torch::Tensor recv(int src, int dst, char kind, int microbatch, int boundary = -1) override;
  /// Makes the pending and every later recv throw RuntimeFailure with `why`.
  void abort(const std::string& why) override;
  /// Waits until every posted send has been received. Throws RuntimeFailure naming the
  /// receiving stage when one fails (the peer died) or the group's timeout passes.
  void flush();

  /// The tag of a message: 2·microbatch + (kind == 'B') + 2^20·lap, lap = ⌊boundary / p⌋
  /// (0 with one chunk per stage).
  static int tag(char kind, int microbatch, int lap = 0) {
    return (lap << 20) + 2 * microbatch + (kind == 'B' ? 1 : 0);
  }

 private:
  struct Pending {
    std::shared_ptr<dist::Work> work;  // keeps the tensor alive until received
    int dst = 0;
    char kind = 'F';
    int microbatch = 0;
  };
  std::shared_ptr<dist::Group> group_;           // activations (and rank, size, device)
  std::shared_ptr<dist::Group> backward_group_;  // gradients (may be group_)
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<Pending> sends_;
  std::mutex mu_;                               // guards recv_ and aborted_ (abort may come from another thread)
  std::shared_ptr<dist::Work> recv_;            // the recv being waited on, for abort()
  std::string aborted_;
  /// The boundary a message crosses (resolving −1) and its lap; checks that it joins src and dst.
  std::pair<int, int> boundary_of(int src, int dst, int boundary) const;
};

// ----------------------------------------------------------------------------
// Executor
// ----------------------------------------------------------------------------

/// Synthetic compute cost added per Linear layer, so that timings are stable.
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

/// One executed operation, times in seconds since the step began.
struct PipeEvent {
  int stage = 0;
  PipeOp op;
  double start_s = 0;  ///< compute began (after the input message arrived)
  double end_s = 0;    ///< compute and send finished
  double wait_s = 0;   ///< time blocked in recv before this op
};

/// What one stage did in one step (the part of a PipelineRun one stage knows).
struct StageRun {
  std::vector<PipeEvent> events;  ///< the stage's operations in program order, seconds since the caller's t0
  std::vector<double> losses;     ///< last stage only: loss_j / m of every microbatch j (others: empty)
  int peak_held = 0;              ///< most (microbatch, chunk) pairs held at once
  int64_t peak_bytes = 0;         ///< most activation bytes held at once (measured), bytes
};

/// Runs stage `stage`'s program `ops` of one training step. `ranges` are the layer ranges
/// of the virtual stages: `stages` of them, or stages·v with v model chunks per stage
/// (chunk k of stage s is virtual stage c = k·stages + s). For F(j, k), the input (microbatch
/// j of `xs` for c = 0, else received from the stage of c − 1) through layers ranges[c], the
/// output sent to the stage of c + 1 (last virtual stage: the loss mse(out, ys[j]) / m); for
/// B(j, k), the gradient received from the stage of c + 1 (last: from the loss) back through
/// the chunk, the input's gradient sent to the stage of c − 1. Parameter gradients accumulate in the layers'
/// .grad. When the program has W ops (splits_backward), B(j, k) computes only the gradients
/// w.r.t. the chunk's input and w.r.t. each Linear's output (pre-activation), with
/// torch::autograd::grad(retain_graph = true), and keeps the latter; W(j, k) then runs, per
/// Linear, autograd::grad of its output w.r.t. its weight and bias with the kept output
/// gradient (the same AddmmBackward node as the fused backward, hence the same kernels)
/// and accumulates the results into .grad as AccumulateGrad does: the gradients are
/// bitwise those of the fused backward when W's run in B's order. Times are seconds since `t0` (steady clock). `after_op`, when set, is called with
/// the number of operations done after each one (fault injection in tests). Throws what
/// the transport throws (RuntimeFailure) and std::logic_error for a B before its F or a W
/// before its B.
StageRun run_stage(int stage, int stages, const std::vector<torch::nn::Linear>& layers,
                   const std::vector<std::pair<int, int>>& ranges, const std::vector<PipeOp>& ops, int microbatches,
                   const std::vector<torch::Tensor>& xs, const std::vector<torch::Tensor>& ys,
                   const SyntheticCost& cost, StageTransport& transport, std::chrono::steady_clock::time_point t0,
                   const std::function<void(int)>& after_op = {});

/// What one pipelined training step produced.
struct PipelineRun {
  std::vector<PipeEvent> events;       ///< every F and B of every stage, stage-major, in program order
  std::vector<torch::Tensor> grads;    ///< gradient of every parameter (layer order, weight then bias)
  double loss = 0;                     ///< Σ_j loss_j / m (the full-batch mean loss)
  double step_s = 0;                   ///< first start to last end, seconds
  std::vector<double> busy_s;          ///< per stage: time spent computing
  std::vector<int> peak_held;          ///< per stage: most (microbatch, chunk) pairs held at once (measured)
  std::vector<int64_t> peak_bytes;     ///< per stage: most activation bytes held at once (measured), bytes
};

/// Runs one training step (forward + backward, no optimizer step) of the virtual stages
/// `ranges` of `layers` with `schedule` (p = schedule.size() stages; ranges.size() = p·v
/// for v chunks per stage), one thread per stage. x: [batch, w0],
/// y: [batch, wL]; the batch is split into m = microbatches equal chunks and each
/// microbatch's MSE loss is divided by m, so the gradients equal the full-batch ones.
/// Gradients are reset first. Throws std::invalid_argument when batch % m != 0,
/// RuntimeFailure when a stage fails (the others are woken and stop).
PipelineRun run_pipeline(const std::vector<torch::nn::Linear>& layers, const std::vector<std::pair<int, int>>& ranges,
                         const std::vector<std::vector<PipeOp>>& schedule, int microbatches, const torch::Tensor& x,
                         const torch::Tensor& y, const SyntheticCost& cost, StageTransport& transport);

/// Start and end times of every op of `schedule` when F, B and W of virtual stage c take
/// f[c], b[c], w[c] (p·v values each; a fused backward, in a program without W, takes
/// b[c] + w[c]), communication is
/// free and each stage runs its program in order, starting an op as soon as its input is
/// there (F(j, c) after F(j, c − 1) ends on the previous stage, B(j, c) after B(j, c + 1);
/// B also after its own F, W after the stage's own B). The deterministic time model of the executor. Returns
/// per-stage events (times in the unit of f, b, w) in a PipelineRun (grads empty, loss 0).
/// Throws std::logic_error when the programs deadlock (an op waits on one never run),
/// std::invalid_argument when a cost vector is not p·v long.
PipelineRun simulate_schedule(const std::vector<std::vector<PipeOp>>& schedule, const std::vector<double>& f,
                              const std::vector<double>& b, const std::vector<double>& w);

/// Options of the multi-process executor.
struct ProcessPipelineOptions {
  /// Called on this rank after each operation of the step with the number done so far (the
  /// experiment's fault-injection point, World::fault_point, in tests of failure handling).
  std::function<void(int)> after_op;
  /// A second group of the same ranks that carries the gradients (null: the main group
  /// carries both directions). Needed with NCCL: see ProcessGroupTransport.
  std::shared_ptr<dist::Group> backward_group;
};

/// The same training step as run_pipeline, with one process per stage: this process is
/// stage group->rank() of group->size() = ranges.size() stages (its layers, x and y on the
/// group's device: CPU with Gloo, this rank's GPU with NCCL) and runs only its own
/// program schedule[rank] (make_schedule, as the threaded run), exchanging tensors with
/// its neighbours through a ProcessGroupTransport. Every rank builds the same `layers`,
/// x, y (same seed) and calls this together. The step starts after a barrier (each rank's
/// clock starts when it leaves it: the skew is the barrier's, microseconds on one host);
/// at the end the per-stage events, peaks, losses and parameter gradients are combined on
/// every rank by two all-reduces (sums in which every value has one non-zero contributor,
/// hence exact), so the returned PipelineRun has the same content as run_pipeline's.
/// Gradients are reset first. Throws std::invalid_argument when batch % m != 0 or the
/// group size differs from the stage count; RuntimeFailure "stage S (rank S of P) failed:
/// ..." when this stage fails, a peer dies or a message does not come within the timeout.
PipelineRun run_pipeline_process(const std::shared_ptr<dist::Group>& group,
                                 const std::vector<torch::nn::Linear>& layers,
                                 const std::vector<std::pair<int, int>>& ranges,
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
