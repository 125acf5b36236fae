/*
 * mpt lossscale — loss scaling and the mixed-precision recipe, from one gradient to a
 * training run on Fashion-MNIST (Micikevicius et al. 2017, "Mixed Precision Training").
 *
 *  1. sweep:    the deep sigmoid net of `mpt underflow` (same seed, data and MSE loss).
 *               For each static loss scale S: backward of S·loss, gradients cast to fp16;
 *               for the first Linear layer and for all parameters, the fraction that
 *               underflows to 0 and the fraction that overflows to inf, and the error of the
 *               unscaled gradient fp16(S·g)·(1/S) against fp32's g. The safe window is
 *               [smallest S with no first-layer underflow, largest S with no overflow]; when
 *               it is empty no static scale works and dynamic scaling is the answer
 *               (src/experiments/lossscale_sweep.cpp).
 *  2. recipes:  an MLP trained on Fashion-MNIST from the same initial weights on the same
 *               batches with: fp32; fp16 (weights, gradients, update all fp16); fp16+master
 *               (fp32 master weights); fp16+master+static (fixed S); fp16+master+dynamic
 *               (GradScaler, PyTorch semantics, core/train/amp); bf16; bf16+master; and pure bf16
 *               weights without a master copy, updated with stochastic rounding (bf16+sr) or
 *               Kahan-compensated summation (bf16+kahan; Zamirai et al. 2020). Low precision
 *               is emulated: fp32 math, every stored tensor rounded (parameters, each layer's
 *               output in forward, the gradient entering each layer in backward).
 *               Per recipe: final train loss, test accuracy, skipped steps, final scale,
 *               updates lost to rounding (w + Δw == w with Δw ≠ 0), gradients underflowed.
 *               Step time and peak allocator bytes are run-dependent: printed, and stored
 *               under timings.
 *               Default: ReLU MLP 784-64x2-10, plain SGD at a small learning rate (0.01), so
 *               that many updates fall below half an ulp of the stored weight — pure bf16
 *               loses most of them and lags fp32; the master-weight recipes match fp32.
 *               /train/gemm_ceiling adds the device's GEMM ceilings and a verdict per narrow
 *               format (src/experiments/lossscale_ceiling.cpp).
 *
 *  3. gpt:      a tiny GPT (core/models/gpt) trained on Debian's fortunes text under per-operation
 *               precision policies — which intermediates are stored in fp16/bf16 and which
 *               (softmax, LayerNorm, logits) stay fp32: losses, and what flushed or overflowed
 *               where (src/experiments/lossscale_gpt.cpp).
 *
 * Section 1 equals PyTorch-Python bit for bit (tests/parity/lossscale_ref.py), and so does
 * section 3's fp32 policy (tests/parity/lossscale_gpt_ref.py).
 *
 *   mpt lossscale
 *   mpt lossscale --config configs/lossscale_overflow.json   # sweep to 2^60: the window is empty
 *   mpt lossscale --config configs/lossscale_full.json       # longer training
 *   mpt lossscale --config configs/lossscale_gpt.json        # section 3 alone, the tiny GPT at 2 x 128
 */
#include <algorithm>
#include <cmath>
#include <map>

#include <spdlog/spdlog.h>

#include "core/train/amp.hpp"
#include "core/io/data.hpp"
#include "core/errors.hpp"
#include "core/runtime/memory.hpp"
#include "core/models/mlp.hpp"
#include "core/numerics/precision.hpp"
#include "core/train/amp_recipe.hpp"
#include "core/runtime/runtime.hpp"
#include "core/runtime/timing.hpp"
#include "core/experiment.hpp"
#include "experiments/lossscale_parts.hpp"

namespace mpt {

namespace {

const std::vector<std::string> kRecipes = {"fp32",        "fp16",        "fp16+master", "fp16+master+static",
                                           "fp16+master+dynamic", "bf16", "bf16+master", "bf16+sr", "bf16+kahan"};

Param positive_number(double def, std::string doc) {
  Param p{ParamType::Number, def, std::move(doc)};
  p.exclusive_min = 0.0;
  return p;
}

ConfigSpec lossscale_spec() {
  ConfigSpec s;
  s.integer("/seed", 0, "seed before building each model (torch.manual_seed)", 0);
  // 1. sweep
  Param scales{ParamType::NumberList, json::array({1.0, 65536.0, 1048576.0, 16777216.0, 268435456.0}),
               "static loss scales of the sweep (each > 0)"};
  scales.exclusive_min = 0.0;
  s.add("/sweep/scales", scales);
  s.integer("/sweep/model/depth", 12, "Linear+Sigmoid blocks of the deep sigmoid net", 1, 256);
  s.integer("/sweep/model/width", 16, "units per hidden layer", 1, 4096);
  s.integer("/sweep/model/input_dim", 4, "input features", 1, 4096);
  s.integer("/sweep/data/batch", 32, "samples (inputs and targets from randn)", 1, 1 << 20);
  s.choice("/sweep/compute", "cast", {"cast", "auto", "native", "emulated"},
           "cast: backward in fp32, gradients cast to fp16 (the lesson's table); native/emulated/auto: "
           "forward and backward in fp16 (native kernels or fp32 math with fp16 storage)");
  // 2. training recipes
  s.boolean("/train/enabled", true, "run the training recipes on Fashion-MNIST");
  s.strings("/train/recipes", kRecipes, kRecipes, "recipes to train");
  s.string("/train/data_dir", kFashionMnistDir, "folder with the Fashion-MNIST IDX .gz files");
  s.integer("/train/train_samples", 10000, "training samples used (first N of the 60000)", 1, 60000);
  s.integer("/train/test_samples", 1000, "test samples used (first N of the 10000)", 1, 10000);
  s.integer("/train/hidden/depth", 2, "hidden layers of the MLP", 1, 64);
  s.integer("/train/hidden/width", 64, "units per hidden layer", 1, 8192);
  s.choice("/train/hidden/activation", "relu", {"sigmoid", "relu", "tanh"}, "hidden activation");
  s.integer("/train/batch", 64, "samples per step", 1, 60000);
  s.integer("/train/steps", 400, "optimizer steps per recipe", 1, 10'000'000);
  s.add("/train/lr", positive_number(0.01, "SGD learning rate (> 0); small, so that many updates fall below half an ulp of bf16/fp16 weights"));
  s.integer("/train/log_every", 50, "loss-curve sampling interval (steps)", 1, 1'000'000);
  s.integer("/train/gemm_ceiling", 0,
            "N > 0: also time an N x N x N matrix product (torch::mm) in fp32 and in each format the recipes train "
            "in that has native kernels, on the device (GFLOP/s, median of 3 after a warm-up; timings.gemm_ceiling): "
            "the ceilings the recipes' GEMM rates compare with; 0 = off",
            0, 4096);
  s.add("/train/static_scale", positive_number(1024.0, "loss scale of fp16+master+static (> 0)"));
  s.choice("/train/compute", "auto", {"auto", "native", "emulated"},
           "low-precision compute: native kernels, emulated (fp32 math, rounded storage), or auto (native where "
           "the device has the kernels)");
  s.boolean("/train/loss_in_low_precision", false,
            "compute log-softmax and the loss in the low format too (autocast keeps them in fp32)");
  // The scale is held in fp32 (as PyTorch's): it must be a finite, normal fp32 value.
  Param init = positive_number(65536.0, "GradScaler init_scale (> 0, at most fp32's max)");
  init.max = 3.4028234663852886e38;
  s.add("/train/scaler/init_scale", init);
  Param growth{ParamType::Number, 2.0, "GradScaler growth_factor (> 1, at most fp32's max)"};
  growth.exclusive_min = 1.0;
  growth.max = 3.4028234663852886e38;  // the scale is fp32: a larger factor overflows any scale
  s.add("/train/scaler/growth_factor", growth);
  Param backoff{ParamType::Number, 0.5, "GradScaler backoff_factor (in (0, 1))"};
  backoff.exclusive_min = 0.0;
  backoff.exclusive_max = 1.0;
  s.add("/train/scaler/backoff_factor", backoff);
  s.integer("/train/scaler/growth_interval", 100, "GradScaler growth_interval (PyTorch: 2000)", 1, 1'000'000'000);
  s.integer("/train/scaler/hysteresis", 1, "overflows tolerated before backing off (1 = PyTorch)", 1, 1'000'000);
  s.boolean("/train/scaler/consecutive_hysteresis", false,
            "refill the hysteresis on every finite step, not only when the scale grows (DeepSpeed's option)");
  s.choice("/train/scaler/rule", "megatron", {"megatron", "deepspeed"},
           "when the scale grows: megatron (Megatron's DynamicGradScaler, PyTorch's rule at hysteresis 1: after "
           "growth_interval finite steps since the last overflow or growth) or deepspeed (DeepSpeed's "
           "DynamicLossScaler: after growth_interval + 1 finite steps since the last overflow, then every "
           "growth_interval)");
  Param floor = positive_number(1.0, "floor of the dynamic scale (>= fp32's smallest normal, 1.18e-38)");
  floor.min = 1.1754943508222875e-38;
  s.add("/train/scaler/min_scale", floor);
  s.choice("/train/scaler/min_scale_policy", "clamp", {"clamp", "error"}, "at the floor: clamp, or stop with an error");
  // 3. the tiny GPT (lossscale_gpt.cpp)
  add_gpt_spec(s);
  s.distinct("/sweep/scales");  // each names a row
  return s;
}

}  // namespace

GradScaler::Options scaler_options(const Config& cfg) {
  GradScaler::Options o;
  o.init_scale = cfg.number("/train/scaler/init_scale");
  o.growth_factor = cfg.number("/train/scaler/growth_factor");
  o.backoff_factor = cfg.number("/train/scaler/backoff_factor");
  o.growth_interval = cfg.integer("/train/scaler/growth_interval");
  o.hysteresis = cfg.integer("/train/scaler/hysteresis");
  o.consecutive_hysteresis = cfg.boolean("/train/scaler/consecutive_hysteresis");
  o.rule = parse_scale_rule(cfg.str("/train/scaler/rule"));
  o.min_scale = cfg.number("/train/scaler/min_scale");
  o.min_scale_policy = parse_min_scale_policy(cfg.str("/train/scaler/min_scale_policy"));
  return o;
}

namespace {

/// Cross-key checks before any work (exit 2): with training on, GradScaler's floor is not
/// above its initial scale.
void validate_lossscale(const Config& cfg, int /*world_size*/) {
  validate_gpt(cfg);
  if (!cfg.boolean("/train/enabled")) {
    if (cfg.integer("/train/gemm_ceiling") > 0)
      spdlog::warn("/train/gemm_ceiling = {} is not used: the ceilings are timed with the training recipes, and "
                   "/train/enabled is false", cfg.integer("/train/gemm_ceiling"));
    return;
  }
  if (cfg.boolean("/train/scaler/consecutive_hysteresis") && cfg.integer("/train/scaler/hysteresis") == 1)
    spdlog::warn("/train/scaler/consecutive_hysteresis = true changes nothing at /train/scaler/hysteresis = 1: it "
                 "refills a hysteresis that every overflow already exhausts");
  const double init = cfg.number("/train/scaler/init_scale"), floor = cfg.number("/train/scaler/min_scale");
  if (floor > init)
    throw ConfigError(fmt::format("/train/scaler/min_scale: expected a value <= /train/scaler/init_scale ({:g}), got {:g}",
                                  init, floor));
  require_fashion_mnist(cfg.str("/train/data_dir"), "/train/data_dir", /*with_test=*/true);
}

// ----------------------------------------------------------------------------
// 2. Training recipes on Fashion-MNIST (the engine: core/recipe)
// ----------------------------------------------------------------------------
/// The training run of /train/* (everything but the recipe).
RecipeTraining recipe_training(const Context& ctx) {
  const auto& cfg = ctx.cfg;
  RecipeTraining o;
  o.steps = cfg.integer("/train/steps");
  o.batch = cfg.integer("/train/batch");
  o.lr = static_cast<float>(cfg.number("/train/lr"));
  o.loss_in_low_precision = cfg.boolean("/train/loss_in_low_precision");
  o.seed = static_cast<std::uint64_t>(cfg.integer("/seed"));
  o.static_scale = static_cast<float>(cfg.number("/train/static_scale"));
  o.scaler = scaler_options(cfg);
  o.activation = cfg.str("/train/hidden/activation");
  o.device = ctx.device;
  o.progress = ctx.tty;
  o.progress_label = "lossscale";
  return o;
}

/// The recipes table's header (rows: one per recipe).
Table recipes_table(const Config& cfg) {
  return {"recipes",
          fmt::format("Training recipes: MLP 784-{}x{}({})-10 on Fashion-MNIST, {} steps of {} samples, SGD lr {:g}",
                      cfg.integer("/train/hidden/width"), cfg.integer("/train/hidden/depth"),
                      cfg.str("/train/hidden/activation"), cfg.integer("/train/steps"), cfg.integer("/train/batch"),
                      cfg.number("/train/lr")),
          {text_col("name", "recipe"), float_col("final_train_loss", "train loss"),
           pct_col("test_accuracy", "test acc"), int_col("skipped_steps", "skipped", "steps"),
           sci_col("final_scale", "final S", "-", 3), pct_col("lost_updates", "lost upd", 3),
           pct_col("grad_underflow", "grad ->0", 3)}};
}

/// The cost table's header (run-dependent: stored under timings).
Table cost_table() {
  return {"recipes", "Cost per recipe (run-dependent; stored under timings)",
          {text_col("name", "recipe"), float_col("step_ms", "step", "ms", 3), float_col("vs_fp32", "vs fp32", "x", 3),
           float_col("gflops", "GEMM rate", "GFLOP/s", 3), int_col("weight_bytes", "weights", "bytes"),
           int_col("peak_bytes", "peak", "bytes"), text_col("why", "where the time goes")}};
}

/// One SGD step of the MLP: the FLOPs of its matrix products and its parameter count.
struct StepShape {
  double flops = 0;
  int64_t params = 0;
};

/// The matrix products of one SGD step: forward y = xWᵀ per layer (2·B·in·out), the weight
/// gradient (the same), the input gradient for every layer but the first (the images need none).
StepShape step_shape(const Config& cfg, int64_t train_size) {
  const int64_t width = cfg.integer("/train/hidden/width"), depth = cfg.integer("/train/hidden/depth");
  const int64_t batch = std::min<int64_t>(cfg.integer("/train/batch"), train_size);
  StepShape s;
  for (int64_t l = 0, in = 28 * 28; l <= depth; ++l) {
    const int64_t out = l == depth ? 10 : width;
    s.flops += 2.0 * static_cast<double>(batch * in * out) * (l == 0 ? 2 : 3);
    s.params += in * out + out;
    in = out;
  }
  return s;
}

/// The compute mode of /train/compute for `format`; throws RuntimeFailure naming the key.
Compute train_compute(const Context& ctx, Format format) {
  try {
    return resolve_compute(ctx.cfg.str("/train/compute"), format, ctx.device);
  } catch (const RuntimeFailure& e) {
    throw RuntimeFailure(std::string("/train/compute: ") + e.what());
  }
}

/// The recipes table's row of recipe `n`.
json recipe_row(const std::string& n, const PrecisionRecipe& r, Compute c, const RecipeRun& run) {
  return {{"name", n},
          {"format", format_name(r.format)},
          {"compute", r.format == Format::FP32 ? "fp32" : compute_name(c)},
          {"master_weights", r.master},
          {"scaling", r.scaling == LossScaling::None ? "none" : r.scaling == LossScaling::Static ? "static" : "dynamic"},
          {"final_train_loss", num(run.final_loss)},
          {"test_accuracy", run.accuracy},
          {"skipped_steps", run.skipped},
          {"final_scale", run.final_scale},
          {"lost_updates", run.updates ? static_cast<double>(run.lost) / run.updates : 0.0},
          {"lost_update_count", run.lost},
          {"grad_underflow", run.grads.total ? static_cast<double>(run.grads.underflow) / run.grads.total : 0.0},
          {"first_loss", num(run.loss.front())},
          {"last_loss", num(run.loss.back())}};
}

/// The cost table's row of recipe `n`: step time against fp32's (`fp32_step`, NaN before the
/// fp32 recipe ran), GEMM rate, the bytes of weights kept between steps, and where the time goes.
json cost_row(const Config& cfg, const std::string& n, const PrecisionRecipe& r, Compute c, const RecipeRun& run,
              const StepShape& shape, double fp32_step) {
  // Bytes of the weights a recipe keeps between steps: the stored format's width (fp32 masters:
  // 4 bytes; the low-precision working copy is rebuilt every step). Emulated formats are held
  // in fp32 tensors by mpt, but a real run stores them narrow: this counts the format.
  // bf16+kahan keeps a bf16 compensation buffer beside the weights: 2 more bytes per parameter.
  const int64_t weight_bytes =
      shape.params * (r.master ? 4 : format_info(r.format).bits / 8 + (r.update == UpdateRounding::Kahan ? 2 : 0));
  const std::string why = r.format == Format::FP32 ? "fp32 GEMMs (the baseline)"
                          : c == Compute::Native
                              ? fmt::format("native {} GEMMs ({})", format_name(r.format),
                                            r.master                                 ? "plus fp32 master weights and casts"
                                            : r.update == UpdateRounding::Stochastic ? "weights stored narrow, SR update"
                                            : r.update == UpdateRounding::Kahan      ? "weights and compensation stored narrow"
                                                                                     : "weights stored narrow")
                              : fmt::format("emulated: fp32 GEMMs plus a rounding pass per stored tensor ({})",
                                            cfg.str("/train/compute") == "emulated"
                                                ? std::string("compute=emulated")
                                                : fmt::format("no native kernels: env.{}_compute_reason",
                                                              format_name(r.format)));
  return {{"name", n}, {"step_ms", run.step_s * 1e3}, {"vs_fp32", num(run.step_s / fp32_step)},
          {"gflops", shape.flops / run.step_s / 1e9}, {"weight_bytes", weight_bytes},
          {"peak_bytes", run.peak_bytes}, {"why", why}, {"step_time_s", run.step_s},
          {"gemm_flops_per_step", shape.flops}};
}

/// The loss curve: one row every /train/log_every steps, one column per recipe.
Table loss_curve_table(const Config& cfg, const std::vector<std::string>& names, const std::vector<RecipeRun>& runs) {
  const int64_t every = cfg.integer("/train/log_every");
  Table curve{"loss_curve", fmt::format("Training loss every {} steps", every), {int_col("step", "step")}};
  for (const auto& n : names) curve.columns.push_back(float_col(n, n));
  const int64_t steps = cfg.integer("/train/steps");
  for (int64_t s = 0; s < steps; s += every) {
    json row = {{"name", fmt::format("step{}", s + 1)}, {"step", s + 1}};
    for (std::size_t i = 0; i < names.size(); ++i) row[names[i]] = num(runs[i].loss[static_cast<std::size_t>(s)]);
    curve.rows.push_back(row);
  }
  return curve;
}

/// The recipes table's notes: what its columns count, and the compute mode of each format.
void add_recipe_notes(Table& t, const json& compute_used) {
  t.notes.push_back("train loss: cross-entropy over the training subset with the final weights, in the recipe's format");
  t.notes.push_back("lost upd: non-zero updates lr*g that left the stored weight unchanged (w - lr*g == w); bf16+sr: "
                    "the same count, but SR keeps them in expectation (a step rounds up a whole ulp with probability "
                    "|lr*g|/ulp); bf16+kahan: w and its compensation buffer both unchanged");
  t.notes.push_back("grad ->0: parameter gradients (scaled, if the recipe scales) nonzero in fp32 math but 0 once stored");
  std::vector<std::string> modes;
  for (const auto& [fmt_name, mode] : compute_used.items()) modes.push_back(fmt_name + " " + mode.get<std::string>());
  if (!modes.empty())
    t.notes.push_back(fmt::format("compute: {} (native: the format's own kernels; emulated: fp32 math, every "
                                  "stored tensor rounded)", fmt::join(modes, ", ")));
}

/// Section 2: trains the MLP under each recipe of /train/recipes from the same initial weights;
/// adds tables recipes, loss_curve and the timings table recipes (cost), results.history and
/// env.lossscale_compute.
void training_section(const Context& ctx, Report& report) {
  const auto& cfg = ctx.cfg;
  const std::string dir = cfg.str("/train/data_dir");
  Dataset train = load_fashion_mnist(dir, "train", cfg.integer("/train/train_samples"));
  Dataset test = load_fashion_mnist(dir, "test", cfg.integer("/train/test_samples"));
  seed_all(static_cast<std::uint64_t>(cfg.integer("/seed")));
  const auto init = init_recipe_mlp(cfg.integer("/train/hidden/depth"), cfg.integer("/train/hidden/width"));

  Table t = recipes_table(cfg), cost = cost_table();
  const StepShape shape = step_shape(cfg, train.size());
  json history = json::object(), compute_used = json::object();
  std::map<Format, double> best_rate;  // the highest GEMM rate of the recipes of each format
  double fp32_step = NAN;
  std::vector<RecipeRun> runs;
  const auto names = cfg.strings("/train/recipes");
  const RecipeTraining training = recipe_training(ctx);
  for (const auto& n : names) {
    const PrecisionRecipe r = parse_precision_recipe(n);
    const Compute c = train_compute(ctx, r.format);
    RecipeRun run = train_recipe(r, c, init, train, test, training);
    if (r.format != Format::FP32) compute_used[format_name(r.format)] = compute_name(c);
    t.rows.push_back(recipe_row(n, r, c, run));
    json h = {{"loss", json::array()}, {"scale", json::array()}};
    for (double v : run.loss) h["loss"].push_back(num(v));
    for (double v : run.scale) h["scale"].push_back(v);
    history[n] = h;
    if (n == "fp32") fp32_step = run.step_s;
    best_rate[r.format] = std::max(best_rate[r.format], shape.flops / run.step_s / 1e9);
    cost.rows.push_back(cost_row(cfg, n, r, c, run, shape, fp32_step));
    note_divergence(report, t, n, run.loss, /*first_step=*/1);  // nan or inf, at which step (counted from 1, as the curve)
    runs.push_back(std::move(run));
  }
  add_recipe_notes(t, compute_used);
  report.add(std::move(t));
  report.add(loss_curve_table(cfg, names, runs));
  if (const int64_t n = cfg.integer("/train/gemm_ceiling"); n > 0)
    add_gemm_ceilings(ctx, n, names, best_rate, fp32_step, cost, report);
  cost.notes.push_back("weights: bytes of the weights a recipe keeps between steps, in its storage format (emulated "
                       "formats count at their own width); peak: the allocator's peak during training, which counts "
                       "the fp32 and the narrow copy a cast makes, so narrow recipes can peak above fp32");
  report.add(std::move(cost), Store::TimingsByName);  // timings.recipes.<recipe>
  report.results["history"] = history;
  report.env["lossscale_compute"] = compute_used;
}

Report run_lossscale(const Context& ctx) {
  Report report;
  double t0 = now_seconds();
  sweep_section(ctx, report);
  report.timings["sweep_s"] = now_seconds() - t0;
  if (ctx.cfg.boolean("/train/enabled")) {
    t0 = now_seconds();
    training_section(ctx, report);
    report.timings["train_s"] = now_seconds() - t0;
  }
  if (ctx.cfg.boolean("/gpt/enabled")) {
    t0 = now_seconds();
    gpt_section(ctx, report);
    report.timings["gpt_s"] = now_seconds() - t0;
  }
  return report;
}

/// Memory of a run (core/runtime/memory), the larger of its two parts (they run one after the other):
///  sweep: the deep sigmoid net (as underflow) with the fp32 gradients and their casts (6
///         parameter-sized tensors; 3 per sample and unit);
///  train: the MLP 784 -> hidden^depth -> 10 with its initial weights, the recipe's weights,
///         fp32 master copy, gradients and scaled gradients (6); 4 per sample and unit (Linear
///         and activation outputs, their low-precision copies); plus the data sets as floats
///         (784 features) and int64 labels.
MemoryEstimate lossscale_memory(const Config& cfg, int /*world_size*/) {
  const int64_t w = cfg.integer("/sweep/model/width");
  std::vector<int64_t> sweep_widths{cfg.integer("/sweep/model/input_dim")};
  sweep_widths.insert(sweep_widths.end(), static_cast<std::size_t>(cfg.integer("/sweep/model/depth")), w);
  sweep_widths.push_back(1);
  MemoryEstimate sweep;
  add_mlp_training(sweep, "sweep net", sweep_widths, cfg.integer("/sweep/data/batch"), 6, 3,
                   "/sweep/model/width, /sweep/model/depth", "/sweep/data/batch, /sweep/model/width, /sweep/model/depth");
  if (cfg.boolean("/gpt/enabled")) {
    MemoryEstimate gpt = gpt_memory(cfg);
    if (gpt.total() > sweep.total()) sweep = gpt;
  }
  if (!cfg.boolean("/train/enabled")) return sweep;
  std::vector<int64_t> widths{784};
  widths.insert(widths.end(), static_cast<std::size_t>(cfg.integer("/train/hidden/depth")),
                cfg.integer("/train/hidden/width"));
  widths.push_back(10);
  MemoryEstimate train;
  add_mlp_training(train, "training MLP", widths, cfg.integer("/train/batch"), 6, 4,
                   "/train/hidden/width, /train/hidden/depth", "/train/batch, /train/hidden/width, /train/hidden/depth");
  train.add("Fashion-MNIST images and labels", "/train/train_samples, /train/test_samples",
            fashion_mnist_bytes(cfg.integer("/train/train_samples") + cfg.integer("/train/test_samples")));
  return train.total() > sweep.total() ? train : sweep;
}

}  // namespace

Experiment lossscale_experiment() {
  return {"lossscale", "Loss scaling: static sweep, GradScaler, fp16/bf16 training recipes on Fashion-MNIST",
          lossscale_spec, run_lossscale, validate_lossscale, lossscale_memory};
}

}  // namespace mpt
