// Pipeline schedules as data (part of core/pipeline): per-stage programs of microbatch
// operations, the bubble theory, and a deterministic replay of the programs (the time model).
//
//  - A schedule is one program per stage (rank): a list of PipeOp F(j) / B(j) (forward /
//    backward of microbatch j through one of the stage's model chunks), and W(j) when the
//    backward is split (zero-bubble schedules: B is the gradient w.r.t. the stage input only,
//    W the weight gradients, run later). GPipe (Huang et al. 2019): all forwards, then all
//    backwards. 1F1B (PipeDream-flush, Narayanan et al. 2021; Megatron-LM's non-interleaved
//    schedule): stage s runs min(p − s − 1, m) warm-up forwards, then alternates one
//    forward and one backward, then drains the remaining backwards (cool-down).
//    ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", §3.1): 1F1B with B and W
//    apart, stage s postponing its W's by s microbatches so that W fills the cool-down
//    bubble; peak memory that of 1F1B's first stage (p microbatches).
//    ZB-V (Qi et al. 2023, §6; torch.distributed.pipelining's ScheduleZBVZeroBubble): two
//    model chunks per rank placed in a V, chunk 0 of rank s = virtual stage s, chunk 1 =
//    virtual stage 2p − 1 − s; the turn (p − 1 → p) stays on rank p − 1 and the loss is on
//    rank 0. With F = B = W no bubble; peak memory 1F1B's (2p chunk activations = p stages').
//
//        virtual stage   0   1  ..  p−1 | p  ..  2p−2  2p−1
//        rank (V)        0   1  ..  p−1 | p−1 ..  1     0        (loop: c mod p)
//  - torch.distributed.pipelining (schedules.py) writes the same programs as lists of
//    _Action(stage_index, computation_type, microbatch_index). PipeOp is its compute-only
//    form; to_actions() lowers a schedule to _Action's explicit form (PipeAction), the
//    send/recv the executor performs around each op made explicit:
//
//        PipeOp on rank s, chunk k     _Action (stage_index = virtual stage c = virtual_stage(s, k))
//        F(j)                          RECV_F (c > 0), FORWARD, SEND_F (c < p·v − 1)
//        B(j), program without W       RECV_B (c < p·v − 1), FULL_BACKWARD, SEND_B (c > 0)
//        B(j), program with W          RECV_B, BACKWARD_INPUT, SEND_B   (as above)
//        W(j)                          BACKWARD_WEIGHT (no communication)
//
//    (torch's _add_send_recv places each SEND right after its compute and each RECV right
//    before the compute that needs it, which is where the executor puts them; a hop between
//    two virtual stages of one rank, V's turn, has no SEND/RECV: torch's _has_comms is false
//    there and the executor hands the tensor over locally.) The executor
//    runs the compute-only form; tests check that the messages it sends and receives are, in
//    order, those of the lowered form.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace mpt {

/// One unit of work of a stage: forward ('F'), backward ('B') or weight gradient ('W') of
/// one microbatch through one of the stage's model chunks (interleaved 1F1B; otherwise
/// always chunk 0). In a program without W ops, B is the whole backward (input and weight
/// gradients: torch.distributed.pipelining's FULL_BACKWARD); with W ops (zero-bubble
/// schedules: BACKWARD_INPUT / BACKWARD_WEIGHT), B computes only the gradient w.r.t. the
/// stage input and W(j) the weight gradients of microbatch j later.
struct PipeOp {
  char kind = 'F';     ///< 'F' forward, 'B' backward (input gradient when split), 'W' weight gradient
  int microbatch = 0;  ///< 0-based microbatch index
  int chunk = 0;       ///< the stage's model chunk k: virtual stage virtual_stage(s, k) (0 unless interleaved / ZB-V)
  bool operator==(const PipeOp& o) const {
    return kind == o.kind && microbatch == o.microbatch && chunk == o.chunk;
  }
};

/// torch.distributed.pipelining's _ComputationType, the kinds of action a schedule's explicit
/// form holds (UNSHARD / RESHARD, FSDP's, are not used here).
enum class ComputationType {
  FORWARD,          ///< "F"
  FULL_BACKWARD,    ///< "B": input and weight gradients
  BACKWARD_INPUT,   ///< "I": input gradient only
  BACKWARD_WEIGHT,  ///< "W": weight gradients only
  SEND_F,           ///< send an activation to the next virtual stage
  RECV_F,           ///< receive an activation from the previous virtual stage
  SEND_B,           ///< send an input gradient to the previous virtual stage
  RECV_B            ///< receive an output gradient from the next virtual stage
};

/// torch.distributed.pipelining's _Action: virtual stage `stage` (virtual_stage(s, k) for chunk
/// k of rank s), the computation, the microbatch.
struct PipeAction {
  int stage = 0;
  ComputationType type = ComputationType::FORWARD;
  int microbatch = 0;
  bool operator==(const PipeAction& o) const {
    return stage == o.stage && type == o.type && microbatch == o.microbatch;
  }
};

/// Where the model chunks sit: virtual stage c of p·v on which rank. Loop (interleaved 1F1B,
/// Megatron-LM; torch's generate_stage_to_rank_mapping style "loop"): chunk k of rank s is
/// virtual stage k·p + s. V (ZB-V, Qi et al. 2023 §6; torch's style "v", two chunks): chunk 0
/// of rank s is virtual stage s, chunk 1 is 2p − 1 − s.
enum class Placement { Loop, V };

/// The virtual stage of chunk `chunk` of rank `rank` of `stages` ranks under `placement`.
/// Throws std::invalid_argument for a V chunk other than 0 and 1.
int virtual_stage(int rank, int chunk, int stages, Placement placement = Placement::Loop);

/// The rank holding virtual stage `c` of `stages` ranks: c mod p (Loop); c for c < p, else
/// 2p − 1 − c (V; throws std::invalid_argument for c outside 0 .. 2p − 1).
int stage_rank(int c, int stages, Placement placement = Placement::Loop);

/// The explicit form of `schedule` (p = schedule.size() ranks, `chunks` model chunks each:
/// p·chunks virtual stages): per rank, each op's actions as in the table of the file comment
/// (RECV before the compute, SEND after it; none between two virtual stages of one rank, as
/// torch's _has_comms). Throws std::invalid_argument for an op whose chunk is outside
/// 0 .. chunks − 1 or an unknown kind.
std::vector<std::vector<PipeAction>> to_actions(const std::vector<std::vector<PipeOp>>& schedule, int chunks = 1,
                                                Placement placement = Placement::Loop);

/// An action as torch.distributed.pipelining prints it: "<stage><type><microbatch>", type
/// F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B (e.g. "1SEND_F0", "0I3").
std::string action_string(const PipeAction& a);

/// The schedules mpt knows. Naive = the whole batch as one microbatch (GPipe with m = 1).
/// Interleaved1F1B: Megatron-LM's interleaved schedule (Narayanan et al. 2021, §2.2), v
/// model chunks per stage. ZBH1: the zero-bubble schedule ZB-H1 (Qi et al. 2023), B and W split.
/// ZBV: ZB-V (Qi et al. 2023 §6), two chunks per rank in a V (Placement::V), B and W split.
enum class ScheduleKind { Naive, GPipe, OneFOneB, Interleaved1F1B, ZBH1, ZBV };
/// "naive", "gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v" -> ScheduleKind; throws
/// std::invalid_argument otherwise.
ScheduleKind parse_schedule(const std::string& name);
/// The config name of a schedule ("naive", "gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v").
std::string schedule_name(ScheduleKind k);
/// The chunk placement a schedule runs with: V for ZBV, Loop otherwise.
Placement schedule_placement(ScheduleKind k);

/// One schedule as data: a row of the schedule table (schedule_table), in the spirit of
/// torch.distributed.pipelining, where each schedule is a class whose attributes carry its traits
/// and which is looked up by name. parse_schedule, schedule_name, make_schedule,
/// bubble_time_theory and the pipeline experiment read only this row, so adding a schedule is a
/// ScheduleKind, one row and its program builder (docs/pipeline.md).
struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::GPipe;
  const char* name = "";   ///< the config name ("1f1b", "zb-v", ...)
  int chunks = 1;          ///< model chunks per stage; 0: the caller's v (interleaved 1F1B, v >= 2)
  Placement placement = Placement::Loop;  ///< where the chunks sit (V: ZB-V)
  bool splits_w = false;   ///< B and W apart (zero-bubble schedules): B is the input gradient only
  bool one_microbatch = false;      ///< the whole batch as one microbatch (naive): make_schedule uses m = 1
  bool microbatches_in_groups = false;  ///< m must be a multiple of p (Megatron's interleaved schedule)
  bool gradient_reference = false;  ///< its gradients are the ones the others are checked against (GPipe)
  bool matches_reference = false;   ///< gradients bitwise the reference's at the same m (same accumulation order)
  bool zero_bubble_table = false;   ///< compared in the experiment's zero_bubble table (zero-bubble and 1F1B)
  bool step_sync = false;           ///< the experiment times its step-end barrier (step_sync)
  bool formula_needs_equal_fbw = false;  ///< idle_time's closed form holds only for equal chunks and F = B = W
  /// Throws std::invalid_argument when the schedule cannot run p stages, m microbatches, v chunks
  /// (make_schedule has checked p >= 1, m >= 1).
  void (*check)(int p, int m, int v) = nullptr;
  /// Rank s's program for p ranks, m microbatches, v chunks per rank (after check).
  std::vector<PipeOp> (*program)(int s, int p, int m, int v) = nullptr;
  /// Idle time per stage of a balanced pipeline, F, B, W any unit (bubble_time_theory).
  double (*idle_time)(int p, int m, double f, double b, double w, int v) = nullptr;
  /// The most (microbatch, chunk) pairs a stage may hold at once.
  int (*peak_bound)(int p, int m, int v) = nullptr;
  /// The exact peak of rank s, or nullptr when there is no closed form per rank (zbv_peak_theory).
  int (*rank_peak)(int p, int m, int s) = nullptr;
  /// Model chunks per stage with `v` configured: `chunks`, or v where chunks is 0.
  int chunks_for(int v) const { return chunks == 0 ? v : chunks; }
};

/// Every schedule mpt knows, in ScheduleKind's order (the config's list of choices).
const std::vector<ScheduleSpec>& schedule_table();
/// The row of `kind`.
const ScheduleSpec& schedule_spec(ScheduleKind kind);
/// The row named `name`; throws std::invalid_argument as parse_schedule.
const ScheduleSpec& schedule_spec(const std::string& name);
/// Every schedule's config name, in the table's order.
std::vector<std::string> schedule_names();

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
/// ZBV (ZB-V; pytorch torch/distributed/pipelining/schedules.py,
/// ScheduleZBVZeroBubble._calculate_single_rank_operations, chunks = 2, Placement::V): with
/// n = max(2p − 1, m), rank s runs 2(p − s) − 1 forwards of chunk 0, then s pairs F(chunk 1)
/// F(chunk 0), then p − s triples F B W of chunk 1; in the steady state F0 (while < n) B0 W0
/// F1 B1 W1 until both chunks have done n forwards; the cool-down s pairs B0 B1, then p − s
/// pairs B0 W0 (oldest W of chunk 0), then the pending W's of chunk 1, then of chunk 0. The
/// ops of microbatches ≥ m are dropped (torch's None, an idle slot). Every chunk runs its W's
/// in microbatch order.
/// Throws std::invalid_argument for stages < 1, microbatches < 1, ZBV with chunks ≠ 2, chunks ≠ 1
/// for the other schedules, and for Interleaved1F1B chunks < 2 or microbatches not a multiple of stages
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

/// The most (microbatch, chunk) pairs rank `rank` holds at once under ZB-V with `stages` ranks
/// and `microbatches` microbatches: min(2p, 2m, m + 1 + s). For m ≥ 2p − 1 every rank holds 2p
/// chunk activations = p stages' worth, 1F1B's peak (stage 0 holds p microbatches of a whole
/// stage): Qi et al. 2023 §6, "the same peak memory as 1F1B". Derived from the construction
/// (make_schedule): the warm-up runs 2(p − s) − 1 + 2s = 2p − 1 forwards on every rank before
/// its first W, and each steady-state F adds one pair just before a W frees one; for fewer
/// microbatches (the ops of the dropped ones missing) the bounds 2m and m + 1 + s were read off
/// the programs and are checked against peak_in_flight for p ≤ 6, m ≤ 16 in tests. Throws std::invalid_argument for stages < 1, microbatches < 1 or a
/// rank outside 0 .. p − 1.
int zbv_peak_theory(int stages, int microbatches, int rank);

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
/// (p − 1)(F + B + W)/v (interleaved). ZB-V (f, b, w: a whole stage, both chunks; a chunk takes
/// half): the authors' comparison for F = B = W (Qi et al. 2023 §6; the sail-sg
/// zero-bubble-pipeline-parallelism table) gives ZB-V a bubble rate of 0 with 1F1B's activation
/// memory and twice its pipeline communication; torch's construction (make_schedule) replayed with F = B = W = t per chunk
/// leaves max(p − 1, 4p − 2 − 2m)·t per rank: for m ≥ 2p − 1 rank s waits s·t for its first
/// input (the fill of the V's first leg), then never idles, and ends (p − 1 − s)·t before the
/// last rank (each rank is busy 6m·t); fewer microbatches leave 2 t more per missing one.
/// Derived from the replay and checked against it exactly in tests; returned for f = b = w
/// only. Throws std::invalid_argument for ZB-H1 with W > F + B (the formula assumes W fits the
/// gap) and for ZB-V with unequal F, B, W (no closed form: replay with simulate_schedule).
double bubble_time_theory(ScheduleKind kind, int stages, int microbatches, double f, double b, double w,
                          int chunks = 1);


// ----------------------------------------------------------------------------
// The record of a step: executed (core/pipeline's executor) or replayed (simulate_schedule)
// ----------------------------------------------------------------------------

/// One executed operation, times in seconds since the step began.
struct PipeEvent {
  int stage = 0;
  PipeOp op;
  double start_s = 0;  ///< compute began (after the input message arrived)
  double end_s = 0;    ///< compute and send finished
  double wait_s = 0;   ///< time blocked in recv before this op (several stages per thread: since the stage's previous op ended)
};

/// What one pipelined training step produced.
struct PipelineRun {
  std::vector<PipeEvent> events;       ///< every F and B of every stage, stage-major, in program order
  std::vector<torch::Tensor> grads;    ///< gradient of every parameter (PipelineStage::parameters, chunk by chunk)
  double loss = 0;                     ///< Σ_j loss_j / m (the full-batch mean loss)
  double step_s = 0;                   ///< first start to last end, seconds
  std::vector<double> busy_s;          ///< per stage: time spent computing
  std::vector<int> peak_held;          ///< per stage: most (microbatch, chunk) pairs held at once (measured)
  std::vector<int64_t> peak_bytes;     ///< per stage: most activation bytes held at once (measured), bytes
};

/// Start and end times of every op of `schedule` when F, B and W of virtual stage c take
/// f[c], b[c], w[c] (p·v values each; a fused backward, in a program without W, takes
/// b[c] + w[c]), communication is
/// free and each stage runs its program in order, starting an op as soon as its input is
/// there (F(j, c) after F(j, c − 1) ends on the previous stage, B(j, c) after B(j, c + 1);
/// B also after its own F, W after the stage's own B; virtual stage c of rank s and chunk k is
/// virtual_stage(s, k, p, placement)). The deterministic time model of the executor. Returns
/// per-stage events (times in the unit of f, b, w) in a PipelineRun (grads empty, loss 0).
/// Throws std::logic_error when the programs deadlock (an op waits on one never run),
/// std::invalid_argument when a cost vector is not p·v long.
PipelineRun simulate_schedule(const std::vector<std::vector<PipeOp>>& schedule, const std::vector<double>& f,
                              const std::vector<double>& b, const std::vector<double>& w,
                              Placement placement = Placement::Loop);

}  // namespace mpt
