/*
 * mpt checkpoint — less memory by recomputation (gradient checkpointing).
 *
 * A deep MLP of n blocks (Linear(w,w) + ReLU + Dropout) trained on one batch. With
 * checkpoint_sequential(net, s, x) (core/train/checkpoint, as torch.utils.checkpoint) the
 * first s−1 segments of floor(n/s) blocks run without keeping their activations; only
 * each segment's input is kept, and the backward pass recomputes the segment.
 *
 * Arithmetic (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"): with
 * a blocks' worth of saved tensors per block, the activations held at the peak are about
 *     s segment inputs  +  n/s blocks of one segment being recomputed (or the last one),
 * minimised near s = √n, giving O(√n) memory for about one extra forward pass:
 * (s−1)·floor(n/s) of the n blocks run twice.
 *
 * Tables:
 *  1. segments: for s ∈ {none, 1, 2, 4, √n, n}: max |g_ckpt − g_plain| over every
 *     parameter and the input (exactly 0 on CPU fp32: the same kernels on the same
 *     numbers, dropout masks included thanks to the saved RNG state), peak bytes of
 *     forward+backward above parameters and gradients (the counting allocator of
 *     core/runtime/memory; deterministic on CPU), blocks recomputed and the extra forward FLOPs.
 *     Step times go to timings. A last row repeats s = √n without RNG restoration:
 *     dropout draws other masks on recomputation and the gradients are wrong.
 *  2. sweep: peak bytes for every s from 1 to n — the U shape and its minimum near √n.
 *
 *   mpt checkpoint
 *   mpt checkpoint --set model.depth=64 --set data.batch=1024
 *   mpt checkpoint --set model.precision=fp16      # emulated fp16 activations: still 0
 */
#include <cmath>
#include <set>

#include "core/train/checkpoint.hpp"
#include "core/errors.hpp"
#include "core/models/mlp.hpp"
#include "core/runtime/timing.hpp"
#include "core/runtime/memory.hpp"
#include "core/numerics/precision.hpp"
#include "core/runtime/runtime.hpp"
#include "core/experiment.hpp"

namespace mpt {

namespace {

ConfigSpec checkpoint_spec() {
  ConfigSpec s;
  s.integer("/model/depth", 32, "number of blocks n, each Linear(width, width) + ReLU + Dropout", 1, 4096);
  s.integer("/model/width", 32, "units per block", 1, 1 << 16);
  s.number("/model/dropout", 0.1, "dropout probability in every block (0 = no dropout)", 0.0, 0.95);
  s.choice("/model/precision", "fp32", {"fp32", "fp16", "bf16"},
           "emulated compute format: each block's output rounded to it (fp32 math, as core/numerics/precision round_to)");
  s.integer("/data/batch", 256, "samples in the batch (inputs and targets from randn)", 1, 1 << 22);
  s.strings("/checkpoint/segments", {"1", "2", "4", "sqrt", "n"}, {},
            "segment counts s to compare with no checkpointing: integers in [1, n], \"sqrt\" (round(sqrt(n))) or \"n\"");
  s.boolean("/checkpoint/no_rng_row", true, "add a row for s = sqrt(n) without RNG restoration (dropout mismatch)");
  s.boolean("/checkpoint/sweep", true, "also measure peak bytes for every s from 1 to n");
  s.integer("/timing/repeats", 3, "timed forward+backward steps per row (median reported in timings)", 1, 1000);
  return s;
}

// One block: Linear(w, w) → ReLU → Dropout(p), its output rounded to the emulated
// compute format. A module of its own so that checkpoint_sequential splits the net at
// block boundaries. The dropout is core/models/mlp' mpt::dropout: nn.Dropout's numbers and
// draws, its noise drawn in one loop (env.dropout says which kernel ran).
struct MlpBlockImpl : torch::nn::Module {
  MlpBlockImpl(int64_t width, double p_, Format f)
      : lin(register_module("lin", torch::nn::Linear(width, width))), p(p_), format(f) {}
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = mpt::dropout(torch::relu(lin(x)), p, is_training());
    return format == Format::FP32 ? h : round_to(h, format);
  }
  torch::nn::Linear lin;
  double p;
  Format format;
};
TORCH_MODULE(MlpBlock);

/// Parses one entry of /checkpoint/segments for a net of n blocks. Throws ConfigError.
int64_t parse_segments(const std::string& v, int64_t n, std::size_t index) {
  const std::string ptr = fmt::format("/checkpoint/segments/{}", index);
  if (v == "sqrt") return std::max<int64_t>(1, std::llround(std::sqrt(static_cast<double>(n))));
  if (v == "n") return n;
  std::size_t used = 0;
  long long s = 0;
  try {
    s = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty())
    throw ConfigError(fmt::format("{}: expected an integer, \"sqrt\" or \"n\", got \"{}\"", ptr, v));
  if (s < 1 || s > n)
    throw ConfigError(fmt::format("{}: expected a segment count between 1 and the number of blocks "
                                  "/model/depth = {}, got {}", ptr, n, s));
  return s;
}

struct Setup {
  torch::nn::Sequential net;
  torch::Tensor x, y;
  int64_t n = 0;
};

struct StepResult {
  std::vector<torch::Tensor> grads;  // every parameter's gradient, then the input's
  int64_t peak_bytes = 0;
  double loss = 0;
};

// One forward+backward from a fixed dropout seed; segments == 0: no checkpointing.
// Gradients exist (zeroed) before the measurement, as in any training step after the
// first, so the peak is the activations and temporaries of this step.
StepResult step(Setup& su, int64_t segments, bool preserve_rng, torch::Device device, std::uint64_t seed) {
  zero_grads(su.net->parameters());
  auto x = su.x.detach().requires_grad_(true);
  seed_all(seed);
  StepResult r;
  {
    PeakScope scope(device);
    auto out = segments == 0 ? su.net->forward(x) : checkpoint_sequential(su.net, segments, x, {preserve_rng});
    auto loss = torch::mse_loss(out, su.y);
    loss.backward();
    r.peak_bytes = scope.peak_bytes();
    r.loss = loss.item<double>();
  }
  r.grads = clone_grads(su.net->parameters());
  r.grads.push_back(x.grad().detach().clone());
  return r;
}

double median_step_time(Setup& su, int64_t segments, torch::Device device, std::uint64_t seed, int64_t repeats) {
  return median_seconds([&] { step(su, segments, true, device, seed); }, repeats);
}

/// Cross-key checks before any work (exit 2): every /checkpoint/segments entry names a segment
/// count between 1 and /model/depth.
void validate_checkpoint(const Config& cfg, int /*world_size*/) {
  const int64_t n = cfg.integer("/model/depth");
  const auto seg_cfg = cfg.strings("/checkpoint/segments");
  for (std::size_t i = 0; i < seg_cfg.size(); ++i) parse_segments(seg_cfg[i], n, i);
}

/// The net and batch of /model/* and /data/batch, built on the CPU from /seed and moved to the
/// device. Installs the counting allocator first and records env.dropout (before any draw: its
/// check borrows the generator).
Setup build_setup(const Context& ctx, Report& report) {
  const auto& cfg = ctx.cfg;
  const int64_t n = cfg.integer("/model/depth"), w = cfg.integer("/model/width"), batch = cfg.integer("/data/batch");
  const double p = cfg.number("/model/dropout");
  install_counting_allocator();
  report.env["dropout"] = dropout_kernel(p);
  seed_all(static_cast<std::uint64_t>(cfg.integer("/seed")));
  Setup su;
  su.n = n;
  const Format compute = parse_format(cfg.str("/model/precision"));
  for (int64_t i = 0; i < n; ++i) su.net->push_back(MlpBlock(w, p, compute));
  su.x = torch::randn({batch, w});
  su.y = torch::randn({batch, w});
  su.net->to(ctx.device);
  su.net->train();
  su.x = su.x.to(ctx.device);
  su.y = su.y.to(ctx.device);
  return su;
}

/// A row of the segments table: its name, segment count and whether the RNG state is restored.
struct Variant {
  std::string name;
  int64_t s;
  bool rng;
};

/// The checkpointed variants of /checkpoint/segments (validate_checkpoint has checked them;
/// names that repeat are measured once), then s = sqrt(n) without RNG restoration when
/// /checkpoint/no_rng_row.
std::vector<Variant> segment_variants(const Config& cfg) {
  const int64_t n = cfg.integer("/model/depth");
  const auto seg_cfg = cfg.strings("/checkpoint/segments");
  std::vector<Variant> rows;
  std::set<std::string> seen;
  for (std::size_t i = 0; i < seg_cfg.size(); ++i) {
    const int64_t s = parse_segments(seg_cfg[i], n, i);
    std::string name = fmt::format("s={}", s);
    if (seg_cfg[i] == "sqrt") name += " (sqrt n)";
    if (seg_cfg[i] == "n" || s == n) name += " (n)";
    if (seen.insert(name).second) rows.push_back({name, s, true});
  }
  const int64_t s_sqrt = parse_segments("sqrt", n, 0);
  if (cfg.boolean("/checkpoint/no_rng_row")) rows.push_back({fmt::format("s={} no rng restore", s_sqrt), s_sqrt, false});
  return rows;
}

/// The segments table's header and its first row, the plain step (no checkpointing).
Table segments_table(const Config& cfg, const StepResult& plain) {
  Table t{"segments",
          fmt::format("Checkpointing a {}-block MLP (width {}, batch {}, dropout {:g}, {}): gradients and peak memory",
                      cfg.integer("/model/depth"), cfg.integer("/model/width"), cfg.integer("/data/batch"),
                      cfg.number("/model/dropout"), cfg.str("/model/precision")),
          {text_col("name", "variant"), int_col("segments", "s"), text_col("rng", "rng"),
           sci_col("max_abs_diff", "max|dg|"), sci_col("rel_diff", "rel", "-", 2), int_col("peak_bytes", "peak", "bytes"),
           float_col("peak_ratio", "vs none", "x", 3), int_col("recomputed_blocks", "recomp", "blocks"),
           sci_col("extra_fwd_flops", "extra fwd", "FLOP", 3), float_col("extra_fwd_ratio", "extra/fwd", "-", 3)}};
  t.rows.push_back({{"name", "none"}, {"segments", 0}, {"rng", "-"}, {"max_abs_diff", 0.0}, {"rel_diff", 0.0},
                    {"peak_bytes", plain.peak_bytes}, {"peak_ratio", 1.0}, {"recomputed_blocks", 0},
                    {"extra_fwd_flops", 0.0}, {"extra_fwd_ratio", 0.0}});
  return t;
}

/// Section 1: the plain step against every variant of segment_variants (gradients equal, peak
/// bytes, recomputed blocks); adds table segments, the checks, results (param_bytes, loss, the
/// no-RNG row's differences) and timings.step_time_s. Returns the plain step (the sweep's reference).
StepResult segments_section(const Context& ctx, Setup& su, Report& report) {
  const auto& cfg = ctx.cfg;
  const int64_t n = su.n, w = cfg.integer("/model/width");
  const auto seed = static_cast<std::uint64_t>(cfg.integer("/seed"));
  const int64_t repeats = cfg.integer("/timing/repeats");
  int64_t param_bytes = 0;
  for (auto& t : su.net->parameters()) param_bytes += t.numel() * static_cast<int64_t>(t.element_size());
  const double block_flops = 2.0 * static_cast<double>(cfg.integer("/data/batch")) * static_cast<double>(w) * static_cast<double>(w);
  const double tol = ctx.device.is_cpu() ? 0.0 : 1e-6;

  step(su, 0, true, ctx.device, seed);  // warm-up: first-touch allocations, kernels
  StepResult plain = step(su, 0, true, ctx.device, seed);
  double g_scale = 0;  // max |g| over every plain gradient, for relative differences
  for (const auto& g : plain.grads) g_scale = nan_max(g_scale, g.abs().max().item<double>());  // keeps a nan
  Table t = segments_table(cfg, plain);
  json times = json::object();
  const double t_plain = median_step_time(su, 0, ctx.device, seed, repeats);
  times["none"] = {{"step_s", t_plain}, {"vs_none", 1.0}};
  for (const auto& row : segment_variants(cfg)) {
    StepResult r = step(su, row.s, row.rng, ctx.device, seed);
    const double diff = max_abs_diff(r.grads, plain.grads);
    const int64_t recomputed = recomputed_modules(n, row.s);
    t.rows.push_back({{"name", row.name}, {"segments", row.s}, {"rng", row.rng ? "restored" : "not restored"},
                      {"max_abs_diff", diff}, {"rel_diff", diff / g_scale}, {"peak_bytes", r.peak_bytes},
                      {"peak_ratio", static_cast<double>(r.peak_bytes) / static_cast<double>(plain.peak_bytes)},
                      {"recomputed_blocks", recomputed}, {"extra_fwd_flops", block_flops * static_cast<double>(recomputed)},
                      {"extra_fwd_ratio", static_cast<double>(recomputed) / static_cast<double>(n)}});
    if (row.rng) {
      report.check(fmt::format("checkpointed gradients == plain ({})", row.name), diff, tol,
                   "max |g_ckpt - g_plain| over all parameters and the input");
      const double ts = median_step_time(su, row.s, ctx.device, seed, repeats);
      times[row.name] = {{"step_s", ts}, {"vs_none", ts / t_plain}};
    } else {
      report.results["no_rng_restore_max_abs_diff"] = diff;
      report.results["no_rng_restore_rel_diff"] = diff / g_scale;
    }
  }
  t.notes.push_back(fmt::format("peak: bytes allocated above parameters ({} bytes) and their gradients (same size), "
                                "during one forward+backward", param_bytes));
  t.notes.push_back("s segments as torch.utils.checkpoint.checkpoint_sequential: the first s-1 of floor(n/s) blocks "
                    "are checkpointed, the last one runs normally; s=1 is no checkpointing");
  t.notes.push_back(fmt::format("rel: max|dg| / max|g| (max|g| = {:.3g})", g_scale));
  t.notes.push_back(fmt::format("extra fwd: FLOPs of the recomputed blocks (2*batch*width^2 each), one forward = {:.3g} FLOP",
                                block_flops * static_cast<double>(n)));
  if (cfg.number("/model/dropout") > 0)
    t.notes.push_back("no rng restore: recomputation draws new dropout masks, so the gradients belong to another "
                      "network than the forward pass used");
  // A forward that overflowed the emulated format (fp16: beyond 65504) gives an inf or nan loss:
  // then every gradient difference above is nan and the checks fail; say why.
  note_divergence(report, t, "the plain step", {plain.loss});
  report.add(std::move(t));
  report.results["param_bytes"] = param_bytes;
  report.results["loss"] = plain.loss;
  report.timings["step_time_s"] = times;
  return plain;
}

/// Section 2: peak bytes for every segment count s from 1 to n against the plain step's
/// (`plain_peak`); results.best_segments and best_peak_bytes. Returns table sweep.
Table sweep_section(const Context& ctx, Setup& su, int64_t plain_peak, Report& report) {
  const int64_t n = su.n;
  const auto seed = static_cast<std::uint64_t>(ctx.cfg.integer("/seed"));
  Table sw{"sweep", fmt::format("Peak bytes for every segment count s (n = {} blocks; sqrt(n) = {:.2f})", n,
                                std::sqrt(static_cast<double>(n))),
           {text_col("name", "s"), int_col("segments", "s"), int_col("peak_bytes", "peak", "bytes"),
            float_col("peak_ratio", "vs none", "x", 3), int_col("recomputed_blocks", "recomp", "blocks")}};
  int64_t best_s = 1, best = std::numeric_limits<int64_t>::max();
  for (int64_t s = 1; s <= n; ++s) {
    StepResult r = step(su, s, true, ctx.device, seed);
    if (r.peak_bytes < best) best = r.peak_bytes, best_s = s;
    sw.rows.push_back({{"name", fmt::format("s={}", s)}, {"segments", s}, {"peak_bytes", r.peak_bytes},
                       {"peak_ratio", static_cast<double>(r.peak_bytes) / static_cast<double>(plain_peak)},
                       {"recomputed_blocks", recomputed_modules(n, s)}});
  }
  sw.notes.push_back(fmt::format("minimum at s = {} ({} bytes, {:.3f} of no checkpointing); Chen et al.: near "
                                 "sqrt(a*n) for a saved tensors per block",
                                 best_s, best, static_cast<double>(best) / static_cast<double>(plain_peak)));
  sw.notes.push_back("the curve is jagged because the last segment takes the remainder n - (s-1)*floor(n/s) "
                     "blocks and keeps their activations");
  report.results["best_segments"] = best_s;
  report.results["best_peak_bytes"] = best;
  return sw;
}

Report run_checkpoint(const Context& ctx) {
  Report report;
  Setup su = build_setup(ctx, report);

  // 1. The segment counts side by side.
  double t0 = now_seconds();
  const StepResult plain = segments_section(ctx, su, report);
  report.timings["segments_s"] = now_seconds() - t0;

  // 2. Sweep over every segment count: where is the minimum?
  if (ctx.cfg.boolean("/checkpoint/sweep")) {
    t0 = now_seconds();
    report.add(sweep_section(ctx, su, plain.peak_bytes, report));
    report.timings["sweep_s"] = now_seconds() - t0;
  }
  return report;
}

/// Memory of a run (core/runtime/memory): n blocks of Linear(w, w); parameter-sized tensors: weights,
/// gradients, the plain step's gradients kept as the reference, one compared step's gradients
/// and the weight gradient being computed (5); per sample and unit of each block: the Linear
/// and ReLU outputs, dropout's mask and output, the rounded output (emulated fp16/bf16), and
/// gradients in backward (6); the input x and the target y.
MemoryEstimate checkpoint_memory(const Config& cfg, int /*world_size*/) {
  const int64_t n = cfg.integer("/model/depth"), w = cfg.integer("/model/width"), b = cfg.integer("/data/batch");
  MemoryEstimate e;
  add_mlp_training(e, "blocks", std::vector<int64_t>(static_cast<std::size_t>(n) + 1, w), b, 5, 6,
                   "/model/width, /model/depth", "/data/batch, /model/width, /model/depth");
  e.add("target y", "/data/batch, /model/width", 4.0 * static_cast<double>(b) * static_cast<double>(w));
  return e;
}

}  // namespace

Experiment checkpoint_experiment() {
  return {"checkpoint", "Gradient checkpointing: recompute activations, equal gradients, peak memory vs segments",
          checkpoint_spec, run_checkpoint, validate_checkpoint, checkpoint_memory};
}

}  // namespace mpt
