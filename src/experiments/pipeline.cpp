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
 *   mpt pipeline
 *   mpt pipeline --config configs/pipeline_uneven.json     (one stage 3x slower)
 *   mpt pipeline --config configs/pipeline_split3.json     (the lesson's 3-stage exercise)
 *   mpt pipeline --config configs/pipeline_processes.json  (4 processes, one per stage)
 *   mpt pipeline --set "pipeline.schedules=[\"1f1b\",\"zb-h1\"]"   (zero bubble against 1F1B)
 *   mpt pipeline --set "pipeline.schedules=[\"1f1b\",\"zb-h1\",\"zb-v\"]"   (and the V)
 *   torchrun --nproc_per_node 4 --no-python mpt pipeline --set executor=processes
 */
#include <algorithm>

#include "core/dist/dist.hpp"
#include "core/errors.hpp"
#include "core/models/mlp.hpp"
#include "core/pipeline/executor.hpp"
#include "core/pipeline/trace.hpp"
#include "core/runtime/runtime.hpp"
#include "core/runtime/trace.hpp"
#include "core/experiment.hpp"

namespace mpt {

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
  s.strings("/pipeline/schedules", {"naive", "gpipe", "1f1b", "zb-h1"},
            {"naive", "gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v"},
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

// Whether /pipeline/schedules asks for `name`.
bool wants(const Config& cfg, const std::string& name) {
  const auto names = cfg.strings("/pipeline/schedules");
  return std::find(names.begin(), names.end(), name) != names.end();
}

// Whether /pipeline/schedules asks for interleaved-1f1b (the schedule with /pipeline/chunks model chunks).
bool wants_interleaved(const Config& cfg) { return wants(cfg, "interleaved-1f1b"); }

// Model chunks per stage of a schedule: v interleaved, 2 for zb-v (a V), else 1.
int chunks_of(ScheduleKind kind, int v) {
  return kind == ScheduleKind::Interleaved1F1B ? v : kind == ScheduleKind::ZBV ? 2 : 1;
}

// Config lists are long long; LibTorch sizes are int64_t (long on Linux).
std::vector<int64_t> i64(const std::vector<long long>& v) { return {v.begin(), v.end()}; }

constexpr double kMicrobatchTol = 1e-6;  // microbatched vs full-batch gradient: fp32 roundoff

std::vector<std::string> param_names(const std::vector<torch::nn::Linear>& layers) {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    names.push_back(fmt::format("L{}.weight", i + 1));
    names.push_back(fmt::format("L{}.bias", i + 1));
  }
  return names;
}


// When each stage's last op ends, in ms: "27,27,27,27". `per_ms`: the run's time unit per ms
// (1e3 for the time model in µs, 1e-3 for a measured run in seconds).
std::string stage_ends_ms(const PipelineRun& run, int p, double per_ms = 1e3) {
  std::vector<double> ends(static_cast<std::size_t>(p), 0.0);
  for (const auto& e : run.events) ends[static_cast<std::size_t>(e.stage)] = std::max(ends[static_cast<std::size_t>(e.stage)], e.end_s);
  std::vector<std::string> parts;
  for (double e : ends) parts.push_back(fmt::format("{:.3g}", e / per_ms));
  return fmt::format("{}", fmt::join(parts, ","));
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
    const auto kind = parse_schedule(k);
    if (kind == ScheduleKind::Interleaved1F1B && m % p != 0) {
      skipped = true;
      continue;
    }
    const auto sched = make_schedule(kind, p, m, chunks_of(kind, v));
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
  if (wants_interleaved(cfg)) {
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
      if (k == "naive") {
        steps += n_steps;
        continue;
      }
      for (auto m : ms) steps += k != "interleaved-1f1b" || m % p == 0 ? n_steps : 0;
      if (cfg.boolean("/sync/enabled") && (k == "gpipe" || k == "1f1b" || k == "zb-h1" || k == "zb-v"))
        steps += 2 * n_steps;
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

// ----------------------------------------------------------------------------
// 3. The sweep, run for real
// ----------------------------------------------------------------------------
Report run_pipeline_experiment(const Context& ctx) {
  const auto& cfg = ctx.cfg;
  Report report;  // the harness has called validate_pipeline
  const auto widths = i64(cfg.integers("/pipeline/widths"));
  const int layers_n = static_cast<int>(widths.size()) - 1;
  const int p = static_cast<int>(cfg.integer("/pipeline/stages"));
  const int64_t batch = cfg.integer("/pipeline/batch");
  const auto ms = cfg.integers("/pipeline/microbatches");
  const int heavy = static_cast<int>(cfg.integer("/cost/heavy_stage"));
  const double timeout_s = cfg.number("/pipeline/timeout_s");

  // --- processes: this process is stage `rank` of p; rank 0 reports ---
  // Where the stages run: the chosen device (threads: every stage on it); with one process per
  // stage on CUDA each rank takes its own GPU (the World's device: local rank) and the stages
  // talk over NCCL, as Megatron-LM's pipeline ranks do; on the CPU over Gloo.
  const bool processes = cfg.str("/executor") == "processes";
  const bool lead = ctx.rank == 0;
  World& world = *ctx.world;
  std::shared_ptr<dist::Group> group;
  ProcessPipelineOptions popts;
  const torch::Device device = processes ? world.device() : ctx.device;
  const bool interleaved = wants_interleaved(cfg);
  if (processes && device.is_cuda() && wants(cfg, "zb-v"))
    throw ConfigError("/pipeline/schedules: zb-v with /executor = \"processes\" on CUDA is not supported: between two "
                      "neighbour ranks activations go both ways (chunk 0 down the V, chunk 1 up) on one NCCL stream "
                      "(it needs batched send/recv); run it with executor=threads or on the CPU (Gloo)");
  if (processes && device.is_cuda() && interleaved)
    throw ConfigError("/pipeline/schedules: interleaved-1f1b with /executor = \"processes\" on CUDA is not "
                      "supported: with p = 2 both directions of a lap share one NCCL stream (it needs batched "
                      "send/recv); run it with executor=threads or on the CPU (Gloo)");
  if (processes) {
    group = world.new_group("pipeline/", ctx.world_size, device);
    // Gradients on a group of their own: one stream per direction (see ProcessGroupTransport).
    popts.backward_group = world.new_group("pipeline_bwd/", ctx.world_size, device);
    // Every stage's events on rank 0's clock (NTP-style exchanges through the store, as --trace
    // does; error ± rtt/2, tens of microseconds on one host), so that a step's span does not
    // depend on when each rank left the step's barrier (milliseconds apart under load).
    const trace::ClockSync clock = trace::clock_from_exchanges(ctx.rank, world.job()->clock_exchanges(8, "pipeline/"));
    popts.clock_offset_us = clock.offset_us;
  }
  report.env["pipeline_device"] = device.is_cuda() ? "cuda" : "cpu";
  report.env["pipeline_transport"] = processes ? group->backend() : "in-process queue";
  // Threads executor: how many threads run the p stages. A synthetic cost stands for a device's
  // compute time, so each stage keeps a thread of its own (a sleep must not hold another stage);
  // with none, the stages' real work shares the usable cores, and more computing threads than
  // cores only adds context switches (4 stage threads on 2 cores: docs/pipeline.md).
  const int workers_cfg = static_cast<int>(cfg.integer("/pipeline/workers"));
  const int workers = processes ? 0
                      : workers_cfg > 0 ? std::min(workers_cfg, p)
                      : cfg.number("/cost/forward_us") > 0 ? p
                                                           : std::min(p, usable_cores());
  // env.pipeline_workers: set after the sweep, with how the threads sat in its last step.
  auto note_workers = [&] {
    if (processes) return;
    report.env["pipeline_workers"] = fmt::format(
        "{} thread(s) for {} stages ({}); last step: {}", workers, p,
        workers_cfg > 0                       ? "/pipeline/workers"
        : cfg.number("/cost/forward_us") > 0 ? "auto: one per stage, synthetic cost"
                                              : fmt::format("auto: min(stages, {} usable cores)", usable_cores()),
        stage_threads_binding());
  };

  // --- 1. exact split (in one process: rank 0) ---
  double t0 = now_seconds();
  if (lead) report.add(exact_split_table(cfg, device, report));
  report.timings["exact_split_s"] = now_seconds() - t0;

  // --- 2. schedules ---
  std::vector<std::string> kinds;
  for (const auto& k : cfg.strings("/pipeline/schedules"))
    if (k != "naive") kinds.push_back(k);
  const int gantt_m = static_cast<int>(cfg.integer("/gantt/microbatches"));
  const int v = static_cast<int>(cfg.integer("/pipeline/chunks"));
  if (!kinds.empty() && lead) report.add(schedules_table(p, gantt_m, v, kinds));

  // --- 3. sweep ---
  t0 = now_seconds();
  seed_all(static_cast<std::uint64_t>(cfg.integer("/seed")));
  auto layers = mlp_layers(widths);
  for (auto& l : layers) l->to(device);
  auto x = torch::randn({batch, widths.front()}).to(device);
  auto y = torch::randn({batch, widths.back()}).to(device);
  const auto ranges = stage_ranges(layers_n, balanced_cuts(layers_n, p));

  // The reference: the whole batch through the whole model in one graph.
  auto full_loss = torch::mse_loss(stage_forward(layers, 0, layers_n, x), y);
  full_loss.backward();
  const auto full = param_grads(layers);
  report.results["full_batch_loss"] = full_loss.item<double>();

  SyntheticCost cost;
  cost.forward_us = cfg.number("/cost/forward_us");
  cost.backward_factor = cfg.number("/cost/backward_factor");
  cost.weight_factor = cfg.number("/cost/weight_factor");
  cost.spin = cfg.str("/cost/mode") == "spin";
  cost.stage_factor.assign(static_cast<std::size_t>(p), 1.0);
  if (heavy >= 0) cost.stage_factor[static_cast<std::size_t>(heavy)] = cfg.number("/cost/heavy_factor");

  // One training step with the chosen executor. Steps are counted (0 = the warm-up) so that
  // /fault/step can stop a stage process in the middle of one.
  int step_index = 0;
  // `step_ranges`: the layer ranges of the virtual stages (p, or p·v interleaved).
  // `xx`, `yy`: the batch (x, y; both doubled for two steps' programs in one run).
  // `placement`: where the chunks sit (zb-v: a V).
  auto one_step_on = [&](const std::vector<std::vector<PipeOp>>& sched, int m,
                         const std::vector<std::pair<int, int>>& step_ranges, const torch::Tensor& xx,
                         const torch::Tensor& yy, Placement placement) {
    if (!processes) {
      QueueTransport transport(timeout_s);
      ++step_index;
      return run_pipeline(MlpStage(layers, step_ranges), sched, m, xx, yy, cost, transport, placement, workers);
    }
    popts.placement = placement;
    const int64_t step = step_index++;
    popts.after_op = [&world, step](int done) {
      if (done >= 1) world.fault_point(step);  // /fault/rank stops in the middle of step /fault/step
    };
    return run_pipeline_process(group, MlpStage(layers, step_ranges), sched, m, xx, yy, cost, popts);
  };
  auto one_step = [&](const std::vector<std::vector<PipeOp>>& sched, int m,
                      const std::vector<std::pair<int, int>>& step_ranges, Placement placement) {
    return one_step_on(sched, m, step_ranges, x, y, placement);
  };

  // One untimed warm-up step (thread or process start-up, first allocations, lazy initialisation).
  const int n_steps = static_cast<int>(cfg.integer("/pipeline/steps"));
  // --trace: the sweep's metadata; each group of steps below is labelled with its row name.
  trace_pipeline_sweep(processes ? "processes" : "threads", p, cfg.strings("/pipeline/schedules"));
  {
    PipelineTraceRun traced("warmup", "gpipe", 1, 1, Placement::Loop);
    one_step(make_schedule(ScheduleKind::GPipe, p, 1), 1, ranges, Placement::Loop);
  }

  Table sweep{"sweep", fmt::format("Microbatched step on {} stages ({} layers, batch {}): gradients and memory", p,
                                   layers_n, batch),
              {text_col("name", "name"), text_col("schedule", "schedule"), int_col("microbatches", "m"),
               pct_col("bubble_theory", "bubble theory", 1), float_col("step_model_ms", "step model", "ms"),
               int_col("peak_held", "peak held", "mb"),
               text_col("peak_held_per_stage", "per stage"), int_col("peak_bytes", "peak act", "bytes"),
               sci_col("grad_max_abs_diff", "max|g-g_full|"), sci_col("loss", "loss")}};
  const std::string runs_on = processes       ? "one process per stage"
                              : workers >= p    ? "one thread per stage"
                                                : fmt::format("{} threads for the {} stages", workers, p);
  const std::string cost_text = cfg.number("/cost/forward_us") > 0 ? "synthetic cost" : "no synthetic cost";
  Table measured{"measured", fmt::format("Measured ({}, {}): bubble = idle / step time, per stage mean", runs_on,
                                         cost_text),
                 {text_col("name", "name"), float_col("step_ms", "step", "ms"), float_col("step_model_ms", "model", "ms"),
                  pct_col("bubble", "bubble", 1),
                  pct_col("bubble_theory", "theory", 1), float_col("slowest_stage_busy_ms", "slowest busy", "ms"),
                  float_col("wait_ms", "total wait", "ms")}};
  // Zero bubble (zb-h1 next to 1f1b): Qi et al.'s per-stage bubble formula, the executor's time
  // model, and (timings) the measured idle time per stage.
  const auto all_kinds = cfg.strings("/pipeline/schedules");
  const bool wants_zb = std::find(all_kinds.begin(), all_kinds.end(), "zb-h1") != all_kinds.end() ||
                        std::find(all_kinds.begin(), all_kinds.end(), "zb-v") != all_kinds.end();
  const bool zbv_wanted = wants(cfg, "zb-v");
  Table zb_table{"zero_bubble", fmt::format("Zero bubble: {} against 1F1B on {} stages, per-stage bubble (idle "
                                            "time) from the formula and from the time model",
                                            zbv_wanted ? "ZB-H1 and ZB-V" : "ZB-H1", p),
                 {text_col("name", "name"), text_col("schedule", "schedule"), int_col("microbatches", "m"),
                  float_col("f_ms", "F", "ms"), float_col("b_ms", "B", "ms"), float_col("w_ms", "W", "ms"),
                  float_col("idle_formula_ms", "idle formula", "ms"), float_col("idle_model_ms", "idle model", "ms"),
                  float_col("step_model_ms", "step model", "ms"), pct_col("bubble_model", "bubble model", 1),
                  int_col("peak_held", "peak held", "mb"), int_col("peak_bytes", "peak act", "bytes"),
                  text_col("stage_ends_model_ms", "stage ends ms")}};
  Table zb_measured{"zero_bubble_measured", "Zero bubble, measured: idle time per stage (mean over stages of step - "
                                            "busy) against the formula and the time model",
                    {text_col("name", "name"), float_col("idle_formula_ms", "formula", "ms"),
                     float_col("idle_model_ms", "model", "ms"), float_col("idle_ms", "idle", "ms"),
                     float_col("step_ms", "step", "ms"), pct_col("bubble", "bubble", 1),
                     text_col("stage_ends_ms", "stage ends ms")}};
  std::vector<TextBlock> charts;
  json events = json::object();
  std::map<int, std::vector<torch::Tensor>> gpipe_grads;
  std::vector<std::tuple<std::string, ScheduleKind, int, std::vector<torch::Tensor>>> process_grads;  // name, kind, m, grads
  // Interleaved 1F1B: the model cut into p·v virtual stages; stage s runs chunks s, s + p, ...
  const auto chunk_ranges = interleaved ? stage_ranges(layers_n, balanced_cuts(layers_n, p * v)) : ranges;
  // ZB-V: the model cut into 2p virtual stages; rank s runs s and 2p - 1 - s (a V).
  const auto v_ranges = zbv_wanted ? stage_ranges(layers_n, balanced_cuts(layers_n, 2 * p)) : ranges;
  std::vector<long long> skipped_m;
  for (const auto& k : cfg.strings("/pipeline/schedules")) {
    const auto kind = parse_schedule(k);
    const bool interleaved_k = kind == ScheduleKind::Interleaved1F1B, zbv = kind == ScheduleKind::ZBV;
    const bool chunked = interleaved_k || zbv;  // more than one model chunk per stage
    const int chunks = chunks_of(kind, v);
    const Placement placement = schedule_placement(kind);
    const auto& run_ranges = interleaved_k ? chunk_ranges : zbv ? v_ranges : ranges;
    std::vector<long long> mlist = ms;
    if (kind == ScheduleKind::Naive) mlist = {1};
    for (auto m64 : mlist) {
      const int m = static_cast<int>(m64);
      if (interleaved_k && m % p != 0) {  // Megatron's requirement: microbatches in groups of p
        skipped_m.push_back(m);
        continue;
      }
      const auto sched = make_schedule(kind, p, m, chunks);
      const std::string name = kind == ScheduleKind::Naive ? "naive" : fmt::format("{}.m{}", k, m);
      // Several identical steps; timings from the median one (the machine may be shared),
      // numbers checked to be bitwise the same in every step.
      std::vector<PipelineRun> steps;
      {
        PipelineTraceRun traced(name, k, m, chunks, placement);
        for (int i = 0; i < n_steps; ++i) steps.push_back(one_step(sched, m, run_ranges, placement));
      }
      std::vector<std::size_t> order(steps.size());
      for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::sort(order.begin(), order.end(), [&](auto a, auto b) { return steps[a].step_s < steps[b].step_s; });
      const PipelineRun& run = steps[order[order.size() / 2]];

      double gdiff = 0;
      for (std::size_t i = 0; i < full.size(); ++i) gdiff = nan_max(gdiff, max_abs_diff(full[i], run.grads[i]));
      report.check(name + ": microbatched == full-batch gradient, max abs diff", gdiff, kMicrobatchTol);
      double repeat = 0;
      for (const auto& st : steps)
        for (std::size_t i = 0; i < full.size(); ++i) repeat = nan_max(repeat, max_abs_diff(steps[0].grads[i], st.grads[i]));
      report.check(name + ": every step gives the same gradient (bitwise)", repeat, 0.0);
      if (processes) process_grads.emplace_back(name, kind, m, run.grads);
      if (kind == ScheduleKind::GPipe) gpipe_grads[m] = run.grads;
      if ((kind == ScheduleKind::OneFOneB || chunked || kind == ScheduleKind::ZBH1) && gpipe_grads.count(m)) {
        // Every layer accumulates its microbatch gradients in the same order (B0, B1, ...;
        // zb-h1, zb-v: W0, W1, ... per chunk) in every schedule, and a cut (interleaved and zb-v cut
        // into more chunks than gpipe's stages) changes no arithmetic, so the
        // results are bitwise identical. zb-h1's W runs the fused backward's weight-gradient
        // kernels (the same AddmmBackward node) on the same numbers.
        double d = 0;
        for (std::size_t i = 0; i < full.size(); ++i) d = nan_max(d, max_abs_diff(gpipe_grads[m][i], run.grads[i]));
        report.check(name + fmt::format(": {} gradient == gpipe gradient (bitwise)", k), d, 0.0);
      }
      // Peak activations: the measured count must equal the schedule's, and obey the bound.
      const auto expect = peak_in_flight(sched);
      int mismatch = 0, peak = 0;
      int64_t peak_bytes = 0;  // measured: the most activation bytes a stage held at once
      for (int s = 0; s < p; ++s) {
        mismatch += run.peak_held[static_cast<std::size_t>(s)] != expect[static_cast<std::size_t>(s)];
        peak = std::max(peak, run.peak_held[static_cast<std::size_t>(s)]);
        peak_bytes = std::max(peak_bytes, run.peak_bytes[static_cast<std::size_t>(s)]);
      }
      report.check(name + ": stages whose measured peak differs from the schedule's", mismatch, 0.0);
      // GPipe holds all m; 1F1B at most p; interleaved at most its warm-up + 1 (microbatch, chunk)
      // pairs on stage 0: 2(p-1) + (v-1)p + 1, or all m*v when m = p.
      // zb-h1: every stage up to 1F1B's peak, p (a microbatch is held until its W). zb-v: every
      // rank min(2p, 2m, m + 1 + s) chunk pairs (zbv_peak_theory), at most 2p = 1F1B's p stages.
      const int bound = kind == ScheduleKind::OneFOneB || kind == ScheduleKind::ZBH1 ? std::min(p, m)
                        : zbv                                                        ? std::min(2 * p, 2 * m)
                        : chunked ? std::min(m * v, 2 * (p - 1) + (v - 1) * p + 1)
                                  : m;
      if (zbv) {
        int off = 0;  // ranks whose measured peak is not the theory's
        for (int s = 0; s < p; ++s) off += run.peak_held[static_cast<std::size_t>(s)] != zbv_peak_theory(p, m, s);
        report.check(name + ": ranks whose measured peak differs from min(2p, 2m, m+1+s)", off, 0.0);
      }
      report.check(name + fmt::format(": peak {} held - bound ({})", chunked ? "(microbatch, chunk) pairs" : "microbatches",
                                      bound),
                   std::max(0, peak - bound), 0.0);

      // Time model from the synthetic cost alone: the first microbatch crosses the first p
      // virtual stages, then the slowest (virtual) stage adds one F+B per further microbatch
      // and chunk: Σ_{c<p} t_c + (m·v − 1)·max_c t_c — (m + p − 1)·t for p equal stages,
      // (m·v + p − 1)·t/v interleaved.
      double sum_us = 0, max_us = 0;
      for (std::size_t c = 0; c < run_ranges.size(); ++c) {
        const auto [b, e] = run_ranges[c];
        const double us = cost.forward_us *
                          cost.stage_factor[static_cast<std::size_t>(stage_rank(static_cast<int>(c), p, placement))] *
                          (e - b) * (1 + cost.backward_factor);
        if (c < static_cast<std::size_t>(p)) sum_us += us;
        max_us = std::max(max_us, us);
      }
      // The executor's time model (simulate_schedule: the programs replayed with the synthetic
      // cost of each op, communication free). zb-h1's step is not the formula above (W fills
      // the cool-down), so its model is the simulation; F, B, W per virtual stage in µs.
      std::vector<double> f_us, b_us, w_us;
      for (std::size_t c = 0; c < run_ranges.size(); ++c) {
        const auto [b, e] = run_ranges[c];
        const double fc = cost.forward_us *
                          cost.stage_factor[static_cast<std::size_t>(stage_rank(static_cast<int>(c), p, placement))] *
                          (e - b);
        f_us.push_back(fc);
        b_us.push_back(fc * (cost.backward_factor - cost.weight_factor));
        w_us.push_back(fc * cost.weight_factor);
      }
      const PipelineRun sim = simulate_schedule(sched, f_us, b_us, w_us, placement);
      double sim_idle_us = 0;  // per stage, mean
      for (double busy : sim.busy_s) sim_idle_us += (sim.step_s - busy) / p;
      const bool zb = kind == ScheduleKind::ZBH1 || zbv;
      const double model_ms = zb ? sim.step_s / 1e3 : (sum_us + (m * chunks - 1) * max_us) / 1e3;
      // With no synthetic cost (/cost/forward_us = 0) the model's step is 0 s and its bubble has no value.
      const json sim_bubble = sim.step_s > 0 ? json(sim_idle_us / sim.step_s) : json(nullptr);
      const json theory = zb ? sim_bubble : json(bubble_theory(p, m, chunks));
      if (wants_zb && (zb || kind == ScheduleKind::OneFOneB)) {
        // Qi et al. 2023's per-stage bubble, for the slowest stage's F, B, W (equal stages: every stage's).
        // zb-v: F, B, W of a whole stage, its two chunks (virtual stages s and 2p - 1 - s).
        std::vector<double> fs = f_us, bs = b_us, ws = w_us;
        if (zbv) {
          fs.assign(static_cast<std::size_t>(p), 0.0);
          bs = ws = fs;
          for (int c = 0; c < 2 * p; ++c) {
            const auto r = static_cast<std::size_t>(stage_rank(c, p, placement));
            fs[r] += f_us[static_cast<std::size_t>(c)];
            bs[r] += b_us[static_cast<std::size_t>(c)];
            ws[r] += w_us[static_cast<std::size_t>(c)];
          }
        }
        const std::size_t slow = static_cast<std::size_t>(std::max_element(fs.begin(), fs.end()) - fs.begin());
        // Equal stages only: under /cost/heavy_stage the formula does not apply ("-"); zb-v's
        // closed form needs equal chunks and F = B = W (else "-": the idle model replays it).
        const bool equal_chunks = std::adjacent_find(f_us.begin(), f_us.end(), std::not_equal_to<>()) == f_us.end();
        const bool formula_ok =
            heavy < 0 && (!zbv || (equal_chunks && fs[slow] == bs[slow] && bs[slow] == ws[slow]));
        const json formula_ms = !formula_ok ? json(nullptr)
                                            : json(bubble_time_theory(kind, p, m, fs[slow], bs[slow], ws[slow]) / 1e3);
        zb_table.rows.push_back({{"name", name}, {"schedule", k}, {"microbatches", m}, {"f_ms", fs[slow] / 1e3},
                           {"b_ms", bs[slow] / 1e3}, {"w_ms", ws[slow] / 1e3},
                           {"idle_formula_ms", formula_ms}, {"idle_model_ms", sim_idle_us / 1e3},
                           {"step_model_ms", sim.step_s / 1e3}, {"bubble_model", sim_bubble},
                           {"peak_held", peak}, {"peak_bytes", peak_bytes},
                           {"stage_ends_model_ms", stage_ends_ms(sim, p)}});
        zb_measured.rows.push_back({{"name", name}, {"idle_formula_ms", formula_ms},
                                    {"idle_model_ms", sim_idle_us / 1e3}, {"idle_ms", 0.0}});
        double idle = 0;
        for (double busy : run.busy_s) idle += (run.step_s - busy) / p;
        zb_measured.rows.back()["idle_ms"] = idle * 1e3;
        zb_measured.rows.back()["step_ms"] = run.step_s * 1e3;
        zb_measured.rows.back()["bubble"] = measured_bubble(run);
        zb_measured.rows.back()["stage_ends_ms"] = stage_ends_ms(run, p, 1e-3);
      }
      sweep.rows.push_back({{"name", name}, {"schedule", k}, {"microbatches", m}, {"step_model_ms", model_ms},
                            {"bubble_theory", theory}, {"peak_held", peak},
                            {"peak_held_per_stage", fmt::format("{}", fmt::join(run.peak_held, ","))},
                            {"peak_bytes", peak_bytes}, {"grad_max_abs_diff", gdiff}, {"loss", run.loss}});
      double slowest = 0, wait = 0;
      for (double b : run.busy_s) slowest = std::max(slowest, b);
      json ev = json::array();
      for (const auto& e : run.events) {
        wait += e.wait_s;
        ev.push_back({{"stage", e.stage},
                      {"op", chunked ? fmt::format("{}{}.{}", e.op.kind, e.op.microbatch, e.op.chunk)
                                     : fmt::format("{}{}", e.op.kind, e.op.microbatch)},
                      {"start_s", e.start_s}, {"end_s", e.end_s}, {"wait_s", e.wait_s}});
      }
      events[name] = ev;
      measured.rows.push_back({{"name", name}, {"step_ms", run.step_s * 1e3}, {"step_model_ms", model_ms}, {"bubble", measured_bubble(run)},
                               {"bubble_theory", theory},
                               {"slowest_stage_busy_ms", slowest * 1e3},
                               {"wait_ms", wait * 1e3}});
      if (kind == ScheduleKind::Naive || m == gantt_m)
        charts.push_back({fmt::format("Timeline {} (p = {}, m = {}{}): {} + microbatch, '.' idle", name, p, m,
                                      chunked ? fmt::format(", v = {}; {}", chunks,
                                                          zbv ? "f/b/w: chunk 1 = virtual stage 2p-1-s"
                                                              : "f/b: odd chunks")
                                              : "",
                                      zb ? "F/B/W (B input gradient, W weight gradient)" : "F/B"),
                          render_gantt(run, p, static_cast<int>(cfg.integer("/gantt/width")))});
    }
  }
  // --- 4. the step-end synchronisation (Qi et al. 2023, §4) ---
  // Two steps back to back. With a barrier between them (an all-reduce over the stages before the
  // optimizer step: gradient-norm clipping, GradScaler's inf-check), no stage starts step 2 before
  // every stage ended step 1: two steps take twice one step. Without one, each stage starts step 2
  // as soon as its own step 1 is done (repeat_steps): what the barrier costs is the difference.
  Table sync{"step_sync",
             fmt::format("Step-end synchronisation (time model): two steps at m = {} with a barrier between them (a "
                         "gradient-norm or inf-check all-reduce over the stages) and without",
                         gantt_m),
             {text_col("name", "name"), text_col("schedule", "schedule"), int_col("microbatches", "m"),
              float_col("step_model_ms", "one step", "ms"), float_col("barrier_ms", "2 steps, barrier", "ms"),
              float_col("free_ms", "2 steps, none", "ms"), float_col("sync_cost_ms", "cost/step", "ms"),
              pct_col("sync_cost", "of a step", 1), text_col("stage_ends_model_ms", "stage ends ms")}};
  Table sync_measured{"step_sync_measured",
                      fmt::format("Step-end synchronisation, measured (median of {} runs): two steps with a barrier "
                                  "(two separate steps, first start to last end each) and without (one run of both "
                                  "steps' programs)",
                                  n_steps),
                      {text_col("name", "name"), float_col("barrier_ms", "2 steps, barrier", "ms"),
                       float_col("free_ms", "2 steps, none", "ms"), float_col("sync_cost_ms", "cost/step", "ms"),
                       float_col("sync_cost_model_ms", "model", "ms")}};
  if (cfg.boolean("/sync/enabled")) {
    const auto x2 = torch::cat({x, x}), y2 = torch::cat({y, y});  // step 2 sees the same microbatches
    auto median_step = [&](const std::vector<std::vector<PipeOp>>& sched, int m, const torch::Tensor& xx,
                           const torch::Tensor& yy, const std::vector<std::pair<int, int>>& step_ranges,
                           Placement placement) {
      std::vector<double> t;
      for (int i = 0; i < n_steps; ++i) t.push_back(one_step_on(sched, m, step_ranges, xx, yy, placement).step_s);
      std::sort(t.begin(), t.end());
      return t[t.size() / 2];
    };
    for (const auto& k : kinds) {
      const auto kind = parse_schedule(k);
      if (kind != ScheduleKind::GPipe && kind != ScheduleKind::OneFOneB && kind != ScheduleKind::ZBH1 &&
          kind != ScheduleKind::ZBV)
        continue;
      const int m = gantt_m;
      const Placement placement = schedule_placement(kind);
      const auto& sync_ranges = kind == ScheduleKind::ZBV ? v_ranges : ranges;  // zb-v: 2p chunks in a V
      const auto one = make_schedule(kind, p, m, chunks_of(kind, v));
      const auto two = repeat_steps(one, 2, m);
      std::vector<double> f_us, b_us, w_us;  // F, B, W of each virtual stage, µs (as in the zero-bubble table)
      for (std::size_t c = 0; c < sync_ranges.size(); ++c) {
        const auto [lo, hi] = sync_ranges[c];
        const double fc = cost.forward_us *
                          cost.stage_factor[static_cast<std::size_t>(stage_rank(static_cast<int>(c), p, placement))] *
                          (hi - lo);
        f_us.push_back(fc);
        b_us.push_back(fc * (cost.backward_factor - cost.weight_factor));
        w_us.push_back(fc * cost.weight_factor);
      }
      const PipelineRun sim1 = simulate_schedule(one, f_us, b_us, w_us, placement),
                        sim2 = simulate_schedule(two, f_us, b_us, w_us, placement);
      const double barrier_us = 2 * sim1.step_s, free_us = sim2.step_s, cost_us = (barrier_us - free_us) / 2;
      const std::string name = fmt::format("{}.m{}", k, m);
      sync.rows.push_back({{"name", name}, {"schedule", k}, {"microbatches", m}, {"step_model_ms", sim1.step_s / 1e3},
                           {"barrier_ms", barrier_us / 1e3}, {"free_ms", free_us / 1e3},
                           {"sync_cost_ms", cost_us / 1e3},
                           {"sync_cost", sim1.step_s > 0 ? json(cost_us / sim1.step_s) : json(nullptr)},
                           {"stage_ends_model_ms", stage_ends_ms(sim1, p)}});
      double barrier_s = 0, free_s = 0;
      {
        PipelineTraceRun traced("step_sync." + name + ".barrier", k, m, chunks_of(kind, v), placement);
        barrier_s = 2 * median_step(one, m, x, y, sync_ranges, placement);
      }
      {
        PipelineTraceRun traced("step_sync." + name + ".free", k, 2 * m, chunks_of(kind, v), placement);
        free_s = median_step(two, 2 * m, x2, y2, sync_ranges, placement);
      }
      sync_measured.rows.push_back({{"name", name}, {"barrier_ms", barrier_s * 1e3}, {"free_ms", free_s * 1e3},
                                    {"sync_cost_ms", (barrier_s - free_s) / 2 * 1e3},
                                    {"sync_cost_model_ms", cost_us / 1e3}});
    }
    if (sync.rows.empty())
      measured.notes.push_back("step_sync: not timed, /pipeline/schedules has none of gpipe, 1f1b, zb-h1, zb-v (the schedules "
                             "it compares); /sync/enabled has no effect");
    sync.notes.push_back("cost/step = (barrier - none) / 2: the idle time a step-end all-reduce over the stages adds "
                         "to each step, its own latency not counted (communication free in the model)");
    sync.notes.push_back("gpipe, 1f1b: 0 - every stage's last op is a backward whose gradient came from the stage "
                         "after it, so stage 0 ends last and no stage could start step 2 earlier anyway; zb-h1: the "
                         "last ops are W's, which wait for nothing: a stage that ends later than stage 0 (unequal "
                         "stages, /cost/heavy_stage) holds every stage at the barrier, while without it stage 0 "
                         "starts step 2's forwards during that stage's W's");
    sync.notes.push_back("zb-v: rank s ends (p-1-s) chunk times before the last rank (rank 0 first), and without a "
                         "barrier it starts step 2's forwards then, the V's fill overlapping the other ranks' last "
                         "W's; the barrier takes that back. ZB-H2 and ZB-V start step 2's warm-up during step 1's "
                         "cool-down by design, so Qi et al. 2023 (§4) replace the barrier with post-validation: each "
                         "stage steps at once and a later all-reduce of the gradient norm and inf/nan flag rolls the "
                         "step back when it fails");
  }
  if (processes && lead) {
    // The same steps with one thread per stage (no synthetic cost: only the gradients
    // matter here): the two executors run the same stage code in the same order.
    SyntheticCost no_cost;
    for (const auto& [name, kind, m, grads] : process_grads) {
      QueueTransport transport(timeout_s);
      const auto& rr = kind == ScheduleKind::Interleaved1F1B ? chunk_ranges : kind == ScheduleKind::ZBV ? v_ranges : ranges;
      // On rank 0's timeline these steps are the threads of lanes 1..p: named as a run of their own.
      PipelineTraceRun traced("threads_check." + name, schedule_name(kind), m, chunks_of(kind, v), schedule_placement(kind));
      const auto threaded = run_pipeline(MlpStage(layers, rr), make_schedule(kind, p, m, chunks_of(kind, v)), m, x, y,
                                         no_cost, transport, schedule_placement(kind));
      double d = 0;
      for (std::size_t i = 0; i < grads.size(); ++i) d = nan_max(d, max_abs_diff(threaded.grads[i], grads[i]));
      report.check(name + ": processes gradient == threads gradient (bitwise)", d, 0.0,
                   fmt::format("{} processes, c10d send/recv over {}", p, group->backend()));
    }
  }
  if (!skipped_m.empty())
    sweep.notes.push_back(fmt::format("interleaved-1f1b skipped for m = {}: not a multiple of p = {} (Megatron-LM runs "
                                      "microbatches through the chunks in groups of p)", fmt::join(skipped_m, ", "), p));
  if (zbv_wanted)
    sweep.notes.push_back(fmt::format("zb-v: the {} layers cut evenly into 2p = {} virtual stages placed in a V, rank s "
                                      "runs s and {}-s (the turn p-1 -> p inside rank {}, the loss on rank 0); peak "
                                      "held counts (microbatch, chunk) pairs, at most 2p = {} (1F1B's p stages)",
                                      layers_n, 2 * p, 2 * p - 1, p - 1, 2 * p));
  if (interleaved)
    sweep.notes.push_back(fmt::format("interleaved-1f1b: the {} layers cut evenly into p*v = {} virtual stages, stage "
                                      "s runs chunks s, s+{}, ...; peak held counts (microbatch, chunk) pairs; bubble "
                                      "theory (p-1)/(v*m+p-1)", layers_n, p * v, p));
  if (!lead) {
    report.timings["sweep_s"] = now_seconds() - t0;
    return report;  // rank 0 prints and writes
  }
  if (processes)
    sweep.notes.push_back(fmt::format("executor: {} processes, one per stage; activations and gradients sent with "
                                      "c10d send/recv ({}; gradients on a second group), tag = 2*microbatch + "
                                      "(backward)", p, group->backend()));
  sweep.notes.push_back("each microbatch loss is divided by m once: the sum of microbatch gradients is the mean-loss "
                        "gradient of the full batch (differences are fp32 roundoff)");
  sweep.notes.push_back(interleaved ? "step model: sum over the first p virtual stages of F+B (synthetic cost) + "
                                      "(m*v-1) x the slowest virtual stage's F+B (v = 1 but for interleaved-1f1b)"
                                    : "step model: sum over stages of F+B (synthetic cost) + (m-1) x the slowest "
                                      "stage's F+B");
  sweep.notes.push_back(fmt::format("peak act: the most activation bytes a stage held at once, measured (largest "
                                    "stage); gpipe holds m microbatches, 1f1b at most p = {}", p));
  measured.notes.push_back(fmt::format("median of {} steps after one warm-up step; theory (p-1)/(m+p-1){} assumes "
                                       "equal stages and free communication{}", n_steps,
                                       interleaved ? ", interleaved (p-1)/(v*m+p-1)," : "",
                                       wants_zb ? "; zb-h1, zb-v: the time model's idle / step (zero_bubble)" : ""));
  if (heavy >= 0)
    measured.notes.push_back(fmt::format("stage {} costs {}x: the slowest stage sets the pace of every other stage",
                                         heavy, cfg.number("/cost/heavy_factor")));
  report.add(std::move(sweep));
  if (wants_zb) {
    zb_table.notes.push_back("formula (Qi et al. 2023): 1f1b (p-1)(F+B+W), zb-h1 (p-1)(F+B-W) idle per stage for "
                             "m >= p ((p-1)(F+B) - (m-1)W for m < p: fewer W's to fill the cool-down); idle model: mean over stages of step - busy when the programs are replayed with "
                             "the synthetic cost (simulate_schedule, communication free)");
    if (heavy >= 0)
      zb_table.notes.push_back(fmt::format("idle formula '-': the formula assumes equal stages, and stage {} costs {}x "
                                           "(/cost/heavy_stage); the idle model replays the unequal costs",
                                           heavy, cfg.number("/cost/heavy_factor")));
    if (zbv_wanted)
      zb_table.notes.push_back("zb-v (Qi et al. 2023 section 6; torch's ScheduleZBVZeroBubble): F, B, W of a whole stage "
                               "(its 2 chunks). The authors give a bubble rate of 0 for F = B = W; the construction "
                               "replayed leaves the fill of the V's first leg, max(p-1, 4p-2-2m) x F/2 per rank (rank "
                               "s waits s chunk forwards for its first input, then never idles); formula '-' unless "
                               "the chunks are equal and F = B = W (no closed form: the idle model replays it)");
    zb_table.notes.push_back("B = input gradient (backward_factor - weight_factor) x F, W = weight gradient "
                             "(weight_factor x F); 1f1b runs B and W fused, zb-h1 apart (autograd::grad on the stage "
                             "input and each Linear's output, then on each Linear's weight and bias)");
    zb_table.notes.push_back("peak held: microbatches whose F ran and whose W (1f1b: fused B) did not; zb-h1 holds p "
                             "on every stage, 1f1b p - s on stage s: the same peak, p");
    zb_table.notes.push_back("stage ends (model): when each stage's last op ends; with F = B = W zb-h1's stages end "
                             "together, so a step-end synchronisation (grad-norm or inf-check all-reduce) adds no "
                             "idle time to it; it does to schedules whose next step starts before the last stage "
                             "ends (ZB-H2, ZB-V: Qi et al. 2023 §4, post-validation)");
    report.add(std::move(zb_table));
    zb_measured.notes.push_back("measured idle = step - busy per stage, mean over stages; formula and model as in "
                                "zero_bubble; stage ends: when each stage's last op ended (a step-end all-reduce "
                                "waits for the latest)");
    report.add(std::move(zb_measured), Store::Timings);
  }
  if (!sync.rows.empty()) {
    report.add(std::move(sync));
    report.add(std::move(sync_measured), Store::Timings);
  }
  // Measured values vary run to run: printed, and stored under timings (not results).
  report.timings["events"] = events;
  // The charts are drawn at m = /gantt/microbatches only: say so when the sweep has no such m.
  const auto sweep_ms = cfg.integers("/pipeline/microbatches");
  if (std::find(sweep_ms.begin(), sweep_ms.end(), static_cast<long long>(gantt_m)) == sweep_ms.end())
    measured.notes.push_back(fmt::format("no Gantt chart for the schedules but naive: they are drawn at "
                                         "/gantt/microbatches = {}, which /pipeline/microbatches does not hold",
                                         gantt_m));
  report.add(std::move(measured), Store::Timings);
  for (auto& c : charts) report.add(std::move(c));
  report.timings["sweep_s"] = now_seconds() - t0;
  note_workers();
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

Experiment pipeline_experiment() {
  return {"pipeline", "Model split across stages: exact gradients, GPipe/1F1B/interleaved/ZB-H1/ZB-V schedules, the bubble "
          "measured",
          pipeline_spec, run_pipeline_experiment, validate_pipeline, pipeline_memory, Processes::Multi,
          pipeline_plan};
}

}  // namespace mpt
