/*
 * mpt pipeline — a model cut into stages: exact gradients, microbatch schedules, the bubble.
 *
 *  1. exact_split: the lesson's TwoStageNet (Linear(8,16)-ReLU-Linear(16,16)-ReLU |
 *     Linear(16,16)-ReLU-Linear(16,1), seed 2, batch 8 from randn, MSE). The whole model's
 *     backward against the split one: stage k's output is detached at the boundary and the
 *     copy marked as requiring grad; the last stage backpropagates to its boundary, the
 *     boundary's .grad goes back and the previous stage's backward resumes with it
 *     (output.backward(grad)). The same operations in the same order, so the max abs
 *     difference per parameter is exactly 0.0 (checked bitwise, torch::equal). The same for
 *     the configured cuts and for 3 and 4 balanced stages.
 *  2. schedules: each stage's program of forwards F(j) and backwards B(j) for p stages and
 *     m microbatches: GPipe (all F, then all B; Huang et al. 2019) and 1F1B / PipeDream-flush
 *     (min(p-s-1, m) warm-up forwards, then one F one B, then cool-down; Narayanan et al. 2021),
 *     and ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): the backward split into B
 *     (gradient w.r.t. the stage input: what the previous stage waits for) and W (weight
 *     gradients: nobody waits), stage s postponing its W's by s microbatches so that they
 *     fill 1F1B's cool-down. Per-stage bubble (p-1)(F+B-W) instead of (p-1)(F+B+W), with the
 *     same peak memory (p microbatches); gradients bitwise GPipe's.
 *  3. sweep: each schedule run for real on a deeper MLP, one thread per stage exchanging
 *     activations and gradients through a transport, with a synthetic per-layer cost (with
 *     none, the stages' real work shares the cores: min(p, cores) threads run them).
 *     Microbatch losses are divided by m, so the accumulated gradients equal the full-batch
 *     gradient (max abs difference checked); the peak number of microbatches a stage holds
 *     (GPipe: m, 1F1B: at most p) with its bytes. Measured per stage: when it computes and
 *     when it waits; the bubble (idle/total) next to the theory (p-1)/(m+p-1), step time,
 *     a Gantt chart. Timings (and every event) go to `timings`.
 *
 *     With zb-h1 in the sweep, the table zero_bubble puts it next to 1f1b: Qi et al.'s per-stage
 *     bubble (p-1)(F+B-W) against (p-1)(F+B+W), the replayed time model (simulate_schedule), the
 *     peak held (p on every stage, 1F1B's peak) and bytes; measured idle time under timings.
 *

 *     zb-v (Qi et al. 2023 §6; torch.distributed.pipelining's ScheduleZBVZeroBubble): the model
 *     cut into 2p chunks placed in a V, rank s holding virtual stages s and 2p-1-s, so that the
 *     turn (p-1 -> p) is a hand-over inside rank p-1 and the loss is on rank 0; with F = B = W
 *     only the fill of the V's first leg is idle ((p-1) chunk forwards per rank for m >= 2p-1),
 *     and every rank holds at most 2p chunk activations, 1F1B's p stages. It joins the
 *     zero_bubble table.
 *
 *  4. executor = "processes": the same sweep with one process per stage (rank r owns stage r),
 *     activations and gradients sent between processes with c10d send/recv (Gloo on CPU, NCCL
 *     on CUDA, one GPU per rank); rank 0 gathers every stage's events and gradients and builds
 *     the same rows, and checks the gradients against the full batch and against the threaded
 *     executor (bitwise).
 *
 *  Sections 3 and 4 (the sweep, the step-end barrier, the processes' check) live in
 *  src/experiments/pipeline_sweep.cpp; every schedule trait is read from the schedule table
 *  (core/pipeline/schedule.hpp).
 *
 *   mpt pipeline
 *   mpt pipeline --config configs/pipeline_uneven.json     (one stage 3x slower)
 *   mpt pipeline --config configs/pipeline_split3.json     (the lesson's 3-stage exercise)
 *   mpt pipeline --config configs/pipeline_processes.json  (4 processes, one per stage)
 *   mpt pipeline --set "pipeline.schedules=[\"1f1b\",\"zb-h1\"]"   (zero bubble against 1F1B)
 *   mpt pipeline --set "pipeline.schedules=[\"1f1b\",\"zb-h1\",\"zb-v\"]"   (and the V)
 *   torchrun --nproc_per_node 4 --no-python mpt pipeline --set executor=processes
 */
#include <algorithm>
#include <cstdlib>

#include "core/dist/dist.hpp"
#include "core/errors.hpp"
#include "core/models/mlp.hpp"
#include "core/pipeline/executor.hpp"
#include "core/pipeline/trace.hpp"
#include "core/runtime/runtime.hpp"
#include "core/runtime/trace.hpp"
#include "core/experiment.hpp"
#include "experiments/pipeline_parts.hpp"

namespace mpt::pipe {

namespace {

ConfigSpec pipeline_spec() {
  ConfigSpec s;
  s.integer("/seed", 2, "seed before building each model and its data (torch.manual_seed)", 0);
  s.integers("/split/widths", {8, 16, 16, 16, 1}, "layer widths of the exact-split MLP (input, hidden..., output)", 1,
             4096);
  s.integers("/split/cuts", {2}, "layer indices where the exact-split model is cut (2: TwoStageNet's two stages)");
  s.integers("/split/extra_stages", {3, 4}, "also split into this many balanced stages (exact check for K stages)", 1,
             64);
  s.integer("/split/batch", 8, "samples (inputs and targets from randn)", 1, 1 << 20);
  s.integers("/pipeline/widths", {16, 64, 64, 64, 64, 64, 64, 64, 1}, "layer widths of the pipelined MLP", 1, 4096);
  s.integer("/pipeline/stages", 4, "pipeline stages p (layers split as evenly as possible)", 1, 64);
  s.integer("/pipeline/batch", 64, "samples per step (split into m microbatches)", 1, 1 << 20);
  s.integers("/pipeline/microbatches", {1, 2, 4, 8, 16}, "microbatch counts m of the sweep", 1, 4096);
  s.strings("/pipeline/schedules", {"naive", "gpipe", "1f1b", "zb-h1"}, schedule_names(),
            "schedules of the sweep (naive: the whole batch as one microbatch; interleaved-1f1b: Megatron-LM's, "
            "/pipeline/chunks model chunks per stage; zb-h1: zero bubble, B and W split, Qi et al. 2023; zb-v: "
            "zero bubble with 2 chunks per stage in a V, Qi et al. 2023 section 6)");
  s.integer("/pipeline/chunks", 2, "model chunks per stage v of interleaved-1f1b (the model cut into stages x v "
            "virtual stages; stage s runs s, s+p, ...)", 2, 64);
  s.integer("/pipeline/steps", 3, "timed steps per run; the one with the median step time is reported", 1, 100);
  s.number("/pipeline/timeout_s", 30,
           "a stage waiting longer than this for a message fails (processes: also the rendezvous and collectives)",
           0.001, 3600.0);
  s.integer("/pipeline/workers", 0, "threads executor only: threads that run the p stages (W < p: thread w runs "
            "the contiguous stages w*p/W .. (w+1)*p/W-1 interleaved, whichever has its input; the same results). 0: "
            "auto, one per stage with a synthetic cost (a sleep holds its thread), else min(p, usable cores)", 0, 64);
  s.choice("/executor", "threads", {"threads", "processes"},
           "run the sweep with one thread per stage, or one process per stage (c10d send/recv: Gloo on CPU, NCCL on "
           "CUDA)");
  s.integer("/nproc", 1, "processes spawned on this machine (--nproc N): 1 for threads, /pipeline/stages for "
            "processes; ignored under torchrun/SLURM", 1, 64);
  s.integer("/fault/rank", -1, "for testing (processes): this rank exits in the middle of step /fault/step (-1: none)",
            -1, 63);
  s.integer("/fault/step", 1, "for testing: the step (0 = the warm-up step, then every timed step in sweep order) in "
            "which /fault/rank exits, after its first operation", 0);
  s.number("/cost/forward_us", 500, "synthetic forward cost per layer per microbatch, microseconds", 0, 1e7);
  s.number("/cost/backward_factor", 2, "whole backward cost (B + W) = factor x forward cost", 0, 100);
  s.number("/cost/weight_factor", 1, "weight-gradient part W = factor x forward cost (split backward: B = "
           "backward_factor - weight_factor); 1 with backward_factor 2: F = B = W", 0, 100);
  s.choice("/cost/mode", "sleep", {"sleep", "spin"}, "how the synthetic cost is spent (sleep frees the core)");
  s.integer("/cost/heavy_stage", -1, "stage whose cost is multiplied by heavy_factor (-1: none)", -1, 63);
  s.number("/cost/heavy_factor", 2, "cost multiplier of the heavy stage", 0, 100);
  s.boolean("/sync/enabled", true, "time two steps with and without a step-end barrier (gradient-norm or inf-check "
            "all-reduce over the stages) at m = /gantt/microbatches, for gpipe, 1f1b, zb-h1 and zb-v");
  s.integer("/gantt/microbatches", 8, "Gantt charts are drawn for the runs with this m (and for naive)", 1, 4096);
  s.integer("/gantt/width", 96, "columns of a Gantt chart", 10, 1000);
  s.distinct("/split/extra_stages");  // each names a row
  s.distinct("/pipeline/microbatches");  // each names a row
  return s;
}

}  // namespace

bool wants(const Config& cfg, const std::string& name) {
  const auto names = cfg.strings("/pipeline/schedules");
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::vector<int64_t> i64(const std::vector<long long>& v) { return {v.begin(), v.end()}; }

namespace {

std::vector<std::string> param_names(const std::vector<torch::nn::Linear>& layers) {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    names.push_back(fmt::format("L{}.weight", i + 1));
    names.push_back(fmt::format("L{}.bias", i + 1));
  }
  return names;
}


// ----------------------------------------------------------------------------
// 1. The exact split
// ----------------------------------------------------------------------------
struct SplitCase {
  std::string name;
  std::vector<int64_t> cuts;
};

// Whole-model backward, then the split one on the same modules; per parameter the max
// abs difference and whether the two gradients are bitwise equal.
void exact_split(const Config& cfg, const SplitCase& c, torch::Device device, Table& t, Report& report) {
  const auto widths = i64(cfg.integers("/split/widths"));
  // Model, then inputs, then targets: the order of tests/parity/pipeline_ref.py. Drawn on
  // the CPU (the same numbers as Python's), then moved to `device`.
  seed_all(static_cast<std::uint64_t>(cfg.integer("/seed")));
  auto layers = mlp_layers(widths);
  for (auto& l : layers) l->to(device);
  const int L = static_cast<int>(layers.size());
  auto x = torch::randn({cfg.integer("/split/batch"), widths.front()}).to(device);
  auto y = torch::randn({cfg.integer("/split/batch"), widths.back()}).to(device);
  const auto ranges = stage_ranges(L, c.cuts);
  const int K = static_cast<int>(ranges.size());

  // Whole model: one graph, one backward.
  auto loss_whole = torch::mse_loss(stage_forward(layers, 0, L, x), y);
  loss_whole.backward();
  const auto whole = param_grads(layers);
  reset_grads(layers);

  // Split: each stage's input is a fresh leaf (detached copy of the previous output
  // that requires grad), so each backward stops at the boundary.
  std::vector<torch::Tensor> inputs(static_cast<std::size_t>(K)), outputs(static_cast<std::size_t>(K));
  for (int k = 0; k < K; ++k) {
    const auto& [b, e] = ranges[static_cast<std::size_t>(k)];
    auto in = k == 0 ? x : outputs[static_cast<std::size_t>(k - 1)].detach().requires_grad_(true);
    inputs[static_cast<std::size_t>(k)] = in;
    outputs[static_cast<std::size_t>(k)] = stage_forward(layers, b, e, in);
  }
  auto loss_split = torch::mse_loss(outputs.back(), y);
  loss_split.backward();  // last stage: down to its boundary
  for (int k = K - 2; k >= 0; --k)  // boundary gradient sent back; the stage resumes with it
    outputs[static_cast<std::size_t>(k)].backward(inputs[static_cast<std::size_t>(k + 1)].grad());
  const auto split = param_grads(layers);

  const auto names = param_names(layers);
  double worst = 0;
  int unequal = 0;
  for (std::size_t i = 0; i < whole.size(); ++i) {
    const int layer = static_cast<int>(i / 2);
    int stage = 0;
    while (layer >= ranges[static_cast<std::size_t>(stage)].second) ++stage;
    const double d = max_abs_diff(whole[i], split[i]);
    const bool eq = torch::equal(whole[i], split[i]);
    worst = std::max(worst, d);
    unequal += eq ? 0 : 1;
    t.rows.push_back({{"name", c.name + "." + names[i]},
                      {"stages", K},
                      {"stage", stage + 1},
                      {"shape", fmt::format("{}", fmt::join(whole[i].sizes().vec(), "x"))},
                      {"grad_abs_sum", whole[i].abs().sum().item<double>()},
                      {"max_abs_diff", d},
                      {"bitwise_equal", eq ? "yes" : "no"}});
  }
  report.results["split_loss"][c.name] = {{"whole", loss_whole.item<double>()}, {"split", loss_split.item<double>()}};
  report.check(c.name + ": split == whole gradient, max abs diff", worst, 0.0,
               fmt::format("{} stages, cuts {}", K, fmt::join(c.cuts, ",")));
  report.check(c.name + ": parameters whose gradient differs bitwise (torch::equal)", unequal, 0.0);
  report.check(c.name + ": split loss == whole loss", std::fabs(loss_whole.item<double>() - loss_split.item<double>()),
               0.0);
}

// All split cases (the configured cuts, then each of /split/extra_stages balanced) in one table.
Table exact_split_table(const Config& cfg, torch::Device device, Report& report) {
  const int split_layers = static_cast<int>(cfg.integers("/split/widths").size()) - 1;
  const auto cuts = i64(cfg.integers("/split/cuts"));
  Table split{"exact_split", "Exact split: whole-model gradient vs stage-by-stage backward through detached boundaries",
              {text_col("name", "name"), int_col("stages", "stages"), int_col("stage", "stage"), text_col("shape", "shape"),
               sci_col("grad_abs_sum", "sum|g|"), sci_col("max_abs_diff", "max|diff|"),
               text_col("bitwise_equal", "bitwise")}};
  std::vector<SplitCase> cases = {{fmt::format("k{}", cuts.size() + 1), cuts}};
  for (auto k : cfg.integers("/split/extra_stages")) {
    SplitCase c{fmt::format("k{}_balanced", k), balanced_cuts(split_layers, static_cast<int>(k))};
    if (k >= 2) cases.push_back(c);
  }
  for (const auto& c : cases) exact_split(cfg, c, device, split, report);
  split.notes.push_back("boundary: out.detach().requires_grad_(true) feeds the next stage; its .grad is passed to "
                        "out.backward(grad)");
  split.notes.push_back("same kernels in the same order on the same numbers: the difference is exactly 0, not roundoff");
  return split;
}

// ----------------------------------------------------------------------------
// 2. Schedules: what each stage runs
// ----------------------------------------------------------------------------
Table schedules_table(int p, int m, int v, const std::vector<std::string>& kinds) {
  Table t{"schedules", fmt::format("Schedules: the program of each stage, p = {} stages, m = {} microbatches", p, m),
          {text_col("name", "name"), text_col("schedule", "schedule"), int_col("stage", "stage"),
           int_col("peak_held", "peak held", "mb"), text_col("program", "program (F/B/W of microbatch j)")}};
  bool skipped = false;
  for (const auto& k : kinds) {
    const ScheduleSpec& spec = schedule_spec(k);
    if (spec.microbatches_in_groups && m % p != 0) {
      skipped = true;
      continue;
    }
    const auto sched = make_schedule(spec.kind, p, m, spec.chunks_for(v));
    const auto peaks = peak_in_flight(sched);
    for (int s = 0; s < p; ++s)
      t.rows.push_back({{"name", fmt::format("{}.s{}", k, s)}, {"schedule", k}, {"stage", s},
                        {"peak_held", peaks[static_cast<std::size_t>(s)]},
                        {"program", schedule_string(sched[static_cast<std::size_t>(s)])}});
  }
  if (std::find(kinds.begin(), kinds.end(), "1f1b") != kinds.end())
    t.notes.push_back("1f1b: stage s runs min(p-s-1, m) warm-up forwards, then alternates F and B, then drains the B's");
  if (std::find(kinds.begin(), kinds.end(), "zb-h1") != kinds.end())
    t.notes.push_back("zb-h1 (Qi et al. 2023): 1f1b's F and B, B = input gradient only; after its i-th B stage s runs "
                      "the oldest pending W (weight gradient) once i >= s, the rest at the end");
  if (std::find(kinds.begin(), kinds.end(), "zb-v") != kinds.end())
    t.notes.push_back("zb-v (torch's ScheduleZBVZeroBubble): Fj.k = microbatch j through chunk k, chunk 0 = virtual "
                      "stage s, chunk 1 = 2p-1-s (a V); warm-up 2(p-s)-1 F of chunk 0, s pairs F1 F0, p-s triples "
                      "F1 B1 W1; steady F0 B0 W0 F1 B1 W1; cool-down s pairs B0 B1, p-s pairs B0 W0, then the "
                      "pending W's; peak held counts (microbatch, chunk) pairs, each half a stage");
  t.notes.push_back("peak held: microbatches whose forward ran and backward (zb-h1, zb-v: W) did not (activations "
                    "kept at once)");
  if (std::find(kinds.begin(), kinds.end(), "interleaved-1f1b") != kinds.end()) {
    if (skipped)
      t.notes.push_back(fmt::format("interleaved-1f1b: not shown, m = {} is not a multiple of p = {}", m, p));
    else
      t.notes.push_back(fmt::format("interleaved-1f1b: Fj.k = microbatch j through the stage's chunk k (virtual stage "
                                    "k*p+s); peak held counts (microbatch, chunk) pairs, each 1/{} of the stage", v));
  }
  return t;
}

// ----------------------------------------------------------------------------
// Checks the schema cannot express (run before any worker process is spawned)
// ----------------------------------------------------------------------------
void validate_pipeline(const Config& cfg, int world_size) {
  const auto split_widths = cfg.integers("/split/widths");
  const int split_layers = static_cast<int>(split_widths.size()) - 1;
  if (split_layers < 1) throw ConfigError("/split/widths: expected at least 2 widths (input and output), got 1");
  const auto cuts = i64(cfg.integers("/split/cuts"));
  for (std::size_t i = 0; i < cuts.size(); ++i) {
    if (cuts[i] < 1 || cuts[i] > split_layers - 1)
      throw ConfigError(fmt::format("/split/cuts/{}: expected a cut between layers, 1 .. {} (the model has {} layers), "
                                    "got {}: outside the model", i, split_layers - 1, split_layers, cuts[i]));
    if (i > 0 && cuts[i] <= cuts[i - 1])
      throw ConfigError(fmt::format("/split/cuts/{}: expected cuts in strictly increasing order, got {} after {}", i,
                                    cuts[i], cuts[i - 1]));
  }
  const auto extra = cfg.integers("/split/extra_stages");
  for (std::size_t i = 0; i < extra.size(); ++i)
    if (extra[i] > split_layers)
      throw ConfigError(fmt::format("/split/extra_stages/{}: expected at most {} stages (one layer each at least), got "
                                    "{}: more stages than layers", i, split_layers, extra[i]));
  const auto widths = i64(cfg.integers("/pipeline/widths"));
  const int layers_n = static_cast<int>(widths.size()) - 1;
  if (layers_n < 1) throw ConfigError("/pipeline/widths: expected at least 2 widths (input and output), got 1");
  const int p = static_cast<int>(cfg.integer("/pipeline/stages"));
  if (p > layers_n)
    throw ConfigError(fmt::format("/pipeline/stages: expected at most {} (the model has {} layers, every stage needs "
                                  "one), got {}: more stages than layers", layers_n, layers_n, p));
  const int64_t batch = cfg.integer("/pipeline/batch");
  const auto ms = cfg.integers("/pipeline/microbatches");
  for (std::size_t i = 0; i < ms.size(); ++i)
    if (batch % ms[i] != 0)
      throw ConfigError(fmt::format("/pipeline/microbatches/{}: expected a divisor of /pipeline/batch ({}) so that "
                                    "microbatches are equal, got {}", i, batch, ms[i]));
  // The step-end barrier runs two steps at m = /gantt/microbatches (section 4).
  const int64_t gm = cfg.integer("/gantt/microbatches");
  if (cfg.boolean("/sync/enabled") && batch % gm != 0)
    throw ConfigError(fmt::format("/gantt/microbatches: expected a divisor of /pipeline/batch ({}) with /sync/enabled "
                                  "(the step-end barrier is timed at this m), got {}; or set sync.enabled=false",
                                  batch, gm));
  if (wants(cfg, "interleaved-1f1b")) {
    const int v = static_cast<int>(cfg.integer("/pipeline/chunks"));
    if (p < 2)
      throw ConfigError(fmt::format("/pipeline/stages: expected at least 2 with interleaved-1f1b in "
                                    "/pipeline/schedules (chunks are spread over stages), got {}", p));
    if (p * 2 > layers_n)
      throw ConfigError(fmt::format("/pipeline/stages: expected at most {} with interleaved-1f1b (at least 2 chunks of "
                                    "one layer per stage; the model has {} layers), got {}: use fewer stages or more "
                                    "layers (/pipeline/widths)", layers_n / 2, layers_n, p));
    if (p * v > layers_n)
      throw ConfigError(fmt::format("/pipeline/chunks: expected at most {} (interleaved-1f1b cuts the {} layers into "
                                    "stages x chunks = {} x {} virtual stages of one layer at least), got {}",
                                    layers_n / p, layers_n, p, v, v));
    bool any = false;
    for (auto m : ms) any = any || m % p == 0;
    if (!any)
      throw ConfigError(fmt::format("/pipeline/microbatches: expected at least one multiple of /pipeline/stages ({}) "
                                    "for interleaved-1f1b (Megatron's requirement), got none", p));
  }
  if (wants(cfg, "zb-v") && 2 * p > layers_n)
    throw ConfigError(fmt::format("/pipeline/stages: expected at most {} with zb-v in /pipeline/schedules (2 chunks of "
                                  "one layer at least per stage, placed in a V; the model has {} layers), got {}: use "
                                  "fewer stages or more layers (/pipeline/widths)", layers_n / 2, layers_n, p));
  if (cfg.number("/cost/weight_factor") > cfg.number("/cost/backward_factor"))
    throw ConfigError(fmt::format("/cost/weight_factor: expected at most /cost/backward_factor ({}): W is a part of "
                                  "the backward, got {}", cfg.number("/cost/backward_factor"),
                                  cfg.number("/cost/weight_factor")));
  {
    // ZB-H1's bubble (p-1)(F+B-W) needs W <= F + B (Qi et al. 2023, §3.1): with B = backward - W,
    // weight_factor <= (1 + backward_factor) / 2. Beyond it the theory column has no formula.
    const auto scheds = cfg.strings("/pipeline/schedules");
    const double wf = cfg.number("/cost/weight_factor"), bf = cfg.number("/cost/backward_factor");
    if (std::find(scheds.begin(), scheds.end(), "zb-h1") != scheds.end() && 2 * wf > 1 + bf)
      throw ConfigError(fmt::format("/cost/weight_factor: expected at most (1 + /cost/backward_factor) / 2 = {} with "
                                    "zb-h1 in /pipeline/schedules (its bubble (p-1)(F+B-W) assumes W <= F + B, "
                                    "B = backward_factor - weight_factor), got {}", (1 + bf) / 2, wf));
  }
  const int heavy = static_cast<int>(cfg.integer("/cost/heavy_stage"));
  if (heavy >= p)
    throw ConfigError(fmt::format("/cost/heavy_stage: expected -1 or a stage 0 .. {}, got {}", p - 1, heavy));

  if (cfg.str("/executor") == "processes") {
    if (world_size != p)
      throw ConfigError(fmt::format("/nproc: expected {} processes with /executor = \"processes\" (one per stage, "
                                    "/pipeline/stages = {}), got {}; run with --nproc {} (or {} ranks under "
                                    "torchrun/SLURM)", p, p, world_size, p, p));
  } else if (world_size != 1) {
    throw ConfigError(fmt::format("/nproc: expected 1 with /executor = \"threads\" (every stage is a thread of one "
                                  "process), got {}; set executor=processes for one process per stage", world_size));
  }
  const int fault = static_cast<int>(cfg.integer("/fault/rank"));
  if (fault >= 0 && cfg.str("/executor") != "processes")
    throw ConfigError(fmt::format("/fault/rank: expected -1 with /executor = \"threads\" (a fault stops a stage "
                                  "process), got {}", fault));
  if (fault >= world_size)
    throw ConfigError(fmt::format("/fault/rank: expected -1 or a rank 0 .. {}, got {}", world_size - 1, fault));
  if (fault >= 0) {
    // The steps the processes run, in order (run_pipeline_experiment's step_index): the warm-up,
    // /pipeline/steps per (schedule, m) of the sweep (naive: m = 1 only; interleaved-1f1b: the
    // m that are multiples of p), and with /sync/enabled 2 x /pipeline/steps (one step, and two
    // steps' programs in one) per gpipe, 1f1b or zb-h1. A step beyond them never fails.
    const int64_t n_steps = cfg.integer("/pipeline/steps");
    int64_t steps = 1;
    for (const auto& k : cfg.strings("/pipeline/schedules")) {
      const ScheduleSpec& spec = schedule_spec(k);
      if (spec.one_microbatch) {
        steps += n_steps;
        continue;
      }
      for (auto m : ms) steps += !spec.microbatches_in_groups || m % p == 0 ? n_steps : 0;
      if (cfg.boolean("/sync/enabled") && spec.step_sync) steps += 2 * n_steps;
    }
    if (cfg.integer("/fault/step") >= steps)
      throw ConfigError(fmt::format("/fault/step: expected a step 0 .. {} (the run's last step: the warm-up, "
                                    "/pipeline/steps per schedule and m of the sweep, and the /sync/enabled steps), "
                                    "got {}", steps - 1, cfg.integer("/fault/step")));
  }
}

/// The multi-process plan: /pipeline/timeout_s, and the stage process that /fault/rank stops
/// in the middle of step /fault/step (after its first operation).
ProcessPlan pipeline_plan(const Config& cfg) {
  ProcessPlan p;
  p.timeout_s = cfg.number("/pipeline/timeout_s");
  p.fault.rank = static_cast<int>(cfg.integer("/fault/rank"));
  p.fault.step = cfg.integer("/fault/step");
  return p;
}

}  // namespace

// ----------------------------------------------------------------------------
// The bench of sections 3 and 4
// ----------------------------------------------------------------------------
Bench open_bench(const Context& ctx, Report& report) {
  const auto& cfg = ctx.cfg;
  Bench b;
  b.cfg = &cfg;
  b.layers_n = static_cast<int>(cfg.integers("/pipeline/widths").size()) - 1;
  b.p = static_cast<int>(cfg.integer("/pipeline/stages"));
  b.v = static_cast<int>(cfg.integer("/pipeline/chunks"));
  b.n_steps = static_cast<int>(cfg.integer("/pipeline/steps"));
  b.gantt_m = static_cast<int>(cfg.integer("/gantt/microbatches"));
  b.heavy = static_cast<int>(cfg.integer("/cost/heavy_stage"));
  b.timeout_s = cfg.number("/pipeline/timeout_s");
  // Where the stages run: the chosen device (threads: every stage on it); with one process per
  // stage on CUDA each rank takes its own GPU (the World's device: local rank) and the stages
  // talk over NCCL, as Megatron-LM's pipeline ranks do; on the CPU over Gloo.
  b.processes = cfg.str("/executor") == "processes";
  b.lead = ctx.rank == 0;
  b.world = ctx.world;
  b.device = b.processes ? b.world->device() : ctx.device;
  if (b.processes && b.device.is_cuda() && wants(cfg, "zb-v"))
    throw ConfigError("/pipeline/schedules: zb-v with /executor = \"processes\" on CUDA is not supported: between two "
                      "neighbour ranks activations go both ways (chunk 0 down the V, chunk 1 up) on one NCCL stream "
                      "(it needs batched send/recv); run it with executor=threads or on the CPU (Gloo)");
  if (b.processes && b.device.is_cuda() && wants(cfg, "interleaved-1f1b"))
    throw ConfigError("/pipeline/schedules: interleaved-1f1b with /executor = \"processes\" on CUDA is not "
                      "supported: with p = 2 both directions of a lap share one NCCL stream (it needs batched "
                      "send/recv); run it with executor=threads or on the CPU (Gloo)");
  if (b.processes) {
    b.group = b.world->new_group("pipeline/", ctx.world_size, b.device);
    // Gradients on a group of their own: one stream per direction (see ProcessGroupTransport).
    b.popts.backward_group = b.world->new_group("pipeline_bwd/", ctx.world_size, b.device);
    // Every stage's events on rank 0's clock (NTP-style exchanges through the store, as --trace
    // does; error ± rtt/2, tens of microseconds on one host), so that a step's span does not
    // depend on when each rank left the step's barrier (milliseconds apart under load).
    const trace::ClockSync clock =
        trace::clock_from_exchanges(ctx.rank, b.world->job()->clock_exchanges(8, "pipeline/"));
    b.popts.clock_offset_us = clock.offset_us;
  }
  report.env["pipeline_device"] = b.device.is_cuda() ? "cuda" : "cpu";
  report.env["pipeline_transport"] = b.processes ? b.group->backend() : "in-process queue";
  // Threads executor: how many threads run the p stages. A synthetic cost stands for a device's
  // compute time, so each stage keeps a thread of its own (a sleep must not hold another stage);
  // with none, the stages' real work shares the usable cores, and more computing threads than
  // cores only adds context switches (4 stage threads on 2 cores: docs/pipeline.md).
  b.workers_cfg = static_cast<int>(cfg.integer("/pipeline/workers"));
  b.workers = b.processes ? 0
              : b.workers_cfg > 0 ? std::min(b.workers_cfg, b.p)
              : cfg.number("/cost/forward_us") > 0 ? b.p
                                                   : std::min(b.p, usable_cores());
  return b;
}

// The sweep's threads executor runs W stage threads at once, each computing with the process's
// T intra-op threads (core/pipeline/stage_threads: the same count everywhere keeps the reduction
// order, so the stages equal the whole-model reference bit for bit): W·T threads on T cores, whose
// OpenMP teams wait on each other's descheduled threads (1F1B m = 8, 2 vCPUs, T = 2: 2.9-9.9 ms a
// step against 1.5 ms at T = 1; docs/performance.md). So where the thread policy chose T itself
// (/threads 0, no OMP_NUM_THREADS), the process computes sections 3-4 — reference included —
// with max(1, T / W) threads; env.pipeline_intra_op says so.
void share_threads_among_stages(const Bench& b, Report& report) {
  if (b.processes || b.workers <= 1 || b.cfg->integer("/threads") != 0 || std::getenv("OMP_NUM_THREADS")) return;
  const int t = at::get_num_threads(), share = std::max(1, t / b.workers);
  if (share == t) return;
  at::set_num_threads(share);
  report.env["pipeline_intra_op"] =
      fmt::format("sections 3-4: {} intra-op thread(s), max(1, {} / {} stage threads): the stage threads share the "
                  "process's threads (/threads or OMP_NUM_THREADS set it otherwise)", share, t, b.workers);
}

void build_model(Bench& b, Report& report) {
  const auto& cfg = *b.cfg;
  const auto widths = i64(cfg.integers("/pipeline/widths"));
  const int64_t batch = cfg.integer("/pipeline/batch");
  seed_all(static_cast<std::uint64_t>(cfg.integer("/seed")));
  b.layers = mlp_layers(widths);
  for (auto& l : b.layers) l->to(b.device);
  b.x = torch::randn({batch, widths.front()}).to(b.device);
  b.y = torch::randn({batch, widths.back()}).to(b.device);
  // The reference: the whole batch through the whole model in one graph.
  auto full_loss = torch::mse_loss(stage_forward(b.layers, 0, b.layers_n, b.x), b.y);
  full_loss.backward();
  b.full = param_grads(b.layers);
  report.results["full_batch_loss"] = full_loss.item<double>();

  b.cost.forward_us = cfg.number("/cost/forward_us");
  b.cost.backward_factor = cfg.number("/cost/backward_factor");
  b.cost.weight_factor = cfg.number("/cost/weight_factor");
  b.cost.spin = cfg.str("/cost/mode") == "spin";
  b.cost.stage_factor.assign(static_cast<std::size_t>(b.p), 1.0);
  if (b.heavy >= 0) b.cost.stage_factor[static_cast<std::size_t>(b.heavy)] = cfg.number("/cost/heavy_factor");
}

void warm_up(Bench& b) {
  // --trace: the sweep's metadata; each group of steps is labelled with its row name.
  trace_pipeline_sweep(b.processes ? "processes" : "threads", b.p, b.cfg->strings("/pipeline/schedules"));
  PipelineTraceRun traced("warmup", "gpipe", 1, 1, Placement::Loop);
  b.step(make_schedule(ScheduleKind::GPipe, b.p, 1), 1, b.ranges(1), b.x, b.y, Placement::Loop);
}

void note_workers(const Bench& b, Report& report) {
  if (b.processes) return;
  const auto& cfg = *b.cfg;
  report.env["pipeline_workers"] = fmt::format(
      "{} thread(s) for {} stages ({}); last step: {}", b.workers, b.p,
      b.workers_cfg > 0                     ? "/pipeline/workers"
      : cfg.number("/cost/forward_us") > 0 ? "auto: one per stage, synthetic cost"
                                            : fmt::format("auto: min(stages, {} usable cores)", usable_cores()),
      stage_threads_binding());
}

namespace {

// ----------------------------------------------------------------------------
// The run: sections 1 to 4, each a function returning its table(s)
// ----------------------------------------------------------------------------
Report run_pipeline_experiment(const Context& ctx) {
  const auto& cfg = ctx.cfg;
  Report report;  // the harness has called validate_pipeline
  Bench bench = open_bench(ctx, report);

  // --- 1. exact split (in one process: rank 0) ---
  double t0 = now_seconds();
  if (bench.lead) report.add(exact_split_table(cfg, bench.device, report));
  report.timings["exact_split_s"] = now_seconds() - t0;

  // --- 2. schedules ---
  std::vector<std::string> kinds;
  for (const auto& k : cfg.strings("/pipeline/schedules"))
    if (!schedule_spec(k).one_microbatch) kinds.push_back(k);
  if (!kinds.empty() && bench.lead) report.add(schedules_table(bench.p, bench.gantt_m, bench.v, kinds));

  // --- 3. sweep, 4. the step-end barrier, the processes against the threads ---
  t0 = now_seconds();
  share_threads_among_stages(bench, report);
  build_model(bench, report);
  warm_up(bench);
  SweepTables st = run_sweep(bench, report);
  auto sync = step_sync_tables(bench, kinds, st.measured);
  if (bench.processes && bench.lead) check_processes_against_threads(bench, st.process_grads, report);
  add_sweep_notes(bench, st);
  if (!bench.lead) {
    report.timings["sweep_s"] = now_seconds() - t0;
    return report;  // rank 0 prints and writes
  }
  add_sweep_report(bench, st, sync, report);
  report.timings["sweep_s"] = now_seconds() - t0;
  note_workers(bench, report);
  return report;
}

/// Memory of a run (core/runtime/memory), per process, times the processes spawned on this machine (each
/// stage process is counted as holding the whole model: the reference runs there too): the
/// larger of the exact-split part (the MLP of /split/widths, its split copy and both gradients:
/// 4 parameter-sized tensors; 3 per sample and unit of /split/batch) and the pipelined part (the
/// MLP of /pipeline/widths, the reference copy and both gradients: 4; every microbatch's
/// activations are alive at once under GPipe, so 3 per sample and unit of the whole batch).
MemoryEstimate pipeline_memory(const Config& cfg, int world_size) {
  auto widths = [&](const char* ptr) {
    std::vector<int64_t> w;
    for (long long v : cfg.integers(ptr)) w.push_back(v);
    return w;
  };
  MemoryEstimate split, pipe;
  add_mlp_training(split, "exact-split MLP", widths("/split/widths"), cfg.integer("/split/batch"), 4, 3, "/split/widths",
                   "/split/batch, /split/widths");
  add_mlp_training(pipe, "pipelined MLP", widths("/pipeline/widths"), cfg.integer("/pipeline/batch"), 4, 3,
                   "/pipeline/widths", "/pipeline/batch, /pipeline/widths");
  MemoryEstimate e = pipe.total() > split.total() ? pipe : split;
  e.times(world_size, "processes (/nproc)");
  return e;
}

}  // namespace

}  // namespace mpt::pipe

namespace mpt {

Experiment pipeline_experiment() {
  return {"pipeline", "Model split across stages: exact gradients, GPipe/1F1B/interleaved/ZB-H1/ZB-V schedules, the bubble "
          "measured",
          pipe::pipeline_spec, pipe::run_pipeline_experiment, pipe::validate_pipeline, pipe::pipeline_memory,
          Processes::Multi, pipe::pipeline_plan};
}

}  // namespace mpt
