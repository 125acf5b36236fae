/*
 * mpt underflow — what fp16 and bf16 cannot hold.
 *
 * Five lessons, each a table (or chart) computed here and printed by the harness:
 *  1. formats:   bits, exponent/mantissa split, max, smallest normal and subnormal, eps
 *                (equal to torch.finfo; subnormal = 2^(emin − mantissa bits)).
 *  2. casts:     small fp32 values cast to fp16 / bf16: the stored value, relative error
 *                and class (normal / subnormal / zero / inf).
 *  3. gradients: a deep sigmoid net (σ' ≤ 1/4 per layer, so gradients shrink ~4× per block)
 *                — per Linear layer the weight gradient's mean/max |g| in fp32 and the
 *                fraction that becomes zero when cast to fp16 / bf16 (Micikevicius et al. 2017).
 *  4. updates:   w = 1.0 plus 1000 updates of 1e-3 stored in each format: below half an ulp
 *                of w the update is lost (bf16: ulp(1) = 2^-7); an fp32 master copy keeps it,
 *                and so do, without one, stochastic rounding (unbiased: each step rounds up a
 *                whole ulp with probability u/ulp) and Kahan summation (a bf16 compensation
 *                buffer carries what rounding dropped) — Zamirai et al. 2020.
 *  5. histogram: log2 |g| over all parameters, with the formats' limits marked
 *                (NVIDIA's mixed-precision guide, Figure 2).
 *
 * Same seed and construction order as the PyTorch-Python reference
 * (tests/parity/underflow_ref.py), so the numbers agree bit for bit in fp32 on CPU.
 *
 *   mpt underflow
 *   mpt underflow --config configs/underflow_depth_sweep.json
 */
#include <cmath>
#include <limits>

#include "core/train/amp.hpp"
#include "core/errors.hpp"
#include "core/models/mlp.hpp"
#include "core/numerics/precision.hpp"
#include "core/numerics/quant.hpp"
#include "core/runtime/runtime.hpp"
#include "core/experiment.hpp"

namespace mpt {

namespace {

const std::vector<std::string> kFormatNames = {"fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"};

ConfigSpec underflow_spec() {
  ConfigSpec s;
  s.integer("/seed", 0, "seed before building each model (torch.manual_seed)", 0);
  s.strings("/formats", {"fp32", "fp16", "bf16"}, kFormatNames, "formats in the formats table");
  s.numbers("/cast/values", {1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8, 1e-9},
            "fp32 values cast to each low-precision format (\"nan\", \"inf\" and \"-inf\" too)");
  s.non_finite("/cast/values");
  s.strings("/cast/formats", {"fp16", "bf16"}, kFormatNames, "formats the values are cast to");
  Param depth{ParamType::Int, 12, "number of Linear+Sigmoid blocks; a list runs a sweep", 1.0, 256.0};
  depth.scalar_or_list = true;
  s.add("/model/depth", depth);
  s.integer("/model/width", 16, "units per hidden layer", 1, 4096);
  s.integer("/model/input_dim", 4, "input features", 1, 4096);
  s.integer("/data/batch", 32, "samples (inputs and targets from randn)", 1, 1 << 20);
  s.integer("/updates/count", 1000, "number of updates in the lost-updates table", 1, 10'000'000);
  // fp32's largest finite value: the table's arithmetic is fp32
  const double fp32_max = static_cast<double>(std::numeric_limits<float>::max());
  s.number("/updates/step", 1e-3, "size of each update (a finite fp32)", 0.0, fp32_max);
  s.number("/updates/start", 1.0, "initial weight (a finite fp32)", -fp32_max, fp32_max);
  s.integer("/histogram/min_log2", -64, "histogram range start (log2 |g|); smaller values count in the first bin",
            -160, 0);
  s.integer("/histogram/max_log2", 8, "histogram range end (log2 |g|); larger values count in the last bin", -150,
            130);
  s.distinct("/cast/values");  // each names a row
  s.distinct("/model/depth");  // each names a row
  return s;
}

// ----------------------------------------------------------------------------
// 1. Formats
// ----------------------------------------------------------------------------
Table formats_table(const std::vector<std::string>& names) {
  Table t{"formats", "Formats: what each one can hold (equal to torch.finfo)",
          {text_col("name", "format"), int_col("bits", "bits"), int_col("exponent_bits", "exp"),
           int_col("mantissa_bits", "mant"), sci_col("max", "max"), sci_col("min_normal", "min_normal"),
           sci_col("min_subnormal", "min_subnormal"), sci_col("eps", "eps")}};
  for (const auto& n : names) {
    const FormatInfo& f = format_info(parse_format(n));
    t.rows.push_back({{"name", f.name}, {"bits", f.bits}, {"exponent_bits", f.exponent_bits},
                      {"mantissa_bits", f.mantissa_bits}, {"max", f.max}, {"min_normal", f.min_normal},
                      {"min_subnormal", f.min_subnormal}, {"eps", f.eps}});
  }
  t.notes.push_back("min_subnormal = 2^(emin - mantissa bits); eps = 2^-mantissa bits (spacing just above 1.0)");
  return t;
}

// ----------------------------------------------------------------------------
// 2. Casts
// ----------------------------------------------------------------------------
Table casts_table(const std::vector<double>& values, const std::vector<std::string>& fmts) {
  Table t{"casts", "Casts: small fp32 values stored in low precision", {text_col("name", "value"), sci_col("fp32", "fp32")}};
  for (const auto& n : fmts) {
    t.columns.push_back(sci_col(n, n + " stored"));
    t.columns.push_back(sci_col(n + "_rel_err", "rel err", "-", 2));
    t.columns.push_back(text_col(n + "_class", "class"));
  }
  for (double v : values) {
    const double v32 = round_scalar(v, Format::FP32);
    json row = {{"name", fmt::format("{:g}", v)}, {"fp32", v32}};
    for (const auto& n : fmts) {
      Format f = parse_format(n);
      const double s = round_scalar(v32, f);
      row[n] = s;
      // no relative error of a non-finite value (inf - inf is nan): null, shown as "-"
      row[n + "_rel_err"] = !std::isfinite(v32) ? json(nullptr) : v32 == 0.0 ? json(0.0) : json(std::fabs(s - v32) / std::fabs(v32));
      row[n + "_class"] = classify_cast(v32, f);
    }
    t.rows.push_back(row);
  }
  for (const auto& n : fmts) {
    const FormatInfo& f = format_info(parse_format(n));
    t.notes.push_back(fmt::format("{}: below {:.3g} values are subnormal (fewer significant bits), "
                                  "below {:.3g}/2 they round to 0", n, f.min_normal, f.min_subnormal));
    if (parse_format(n) == Format::FP8_E4M3)
      t.notes.push_back("fp8_e4m3 has no inf: what OCP's non-saturating cast would make NaN (|x| above 464, the "
                        "midpoint past 448 — a tie rounds to even, to 448 —, and inf) is clamped to +-448 by PyTorch 2.15's cast: class 'saturated'");
  }
  return t;
}

// ----------------------------------------------------------------------------
// 3. Gradients of the deep sigmoid network, and 5. their histogram
// ----------------------------------------------------------------------------
struct GradRun {
  std::vector<json> rows;
  double loss = 0;
  torch::Tensor all_grads;  // every parameter's gradient, flattened, fp32, on CPU
};

GradRun gradient_run(const Context& ctx, int64_t depth) {
  const auto& cfg = ctx.cfg;
  // Built on CPU in the reference's order — model, then inputs, then targets — so the
  // same seed gives the same numbers; then moved to the chosen device.
  seed_all(static_cast<std::uint64_t>(cfg.integer("/seed")));
  auto net = deep_sigmoid_net(cfg.integer("/model/input_dim"), cfg.integer("/model/width"), depth);
  auto x = torch::randn({cfg.integer("/data/batch"), cfg.integer("/model/input_dim")});
  auto y = torch::randn({cfg.integer("/data/batch"), 1});
  net->to(ctx.device);
  x = x.to(ctx.device);
  y = y.to(ctx.device);

  auto loss = torch::mse_loss(net->forward(x), y);
  loss.backward();

  GradRun run;
  run.loss = loss.item<double>();
  auto layers = linear_layers(net);
  for (std::size_t i = 0; i < layers.size(); ++i) {
    auto g = layers[i]->weight.grad().detach().to(torch::kCPU);
    const double n = static_cast<double>(g.numel());
    CastStats h = cast_stats(g, Format::FP16), b = cast_stats(g, Format::BF16);
    run.rows.push_back({{"name", fmt::format("d{}.L{:02}", depth, i + 1)},
                        {"depth", depth},
                        {"layer", static_cast<int64_t>(i + 1)},
                        {"shape", fmt::format("{}x{}", g.size(0), g.size(1))},
                        {"mean_abs", g.abs().mean().item<double>()},
                        {"max_abs", g.abs().max().item<double>()},
                        {"zero_fp32", h.zero_before / n},
                        {"underflow_fp16", h.underflow / n},
                        {"underflow_bf16", b.underflow / n},
                        {"subnormal_fp16", h.subnormal / n}});
  }
  std::vector<torch::Tensor> flat;
  for (const auto& p : net->parameters()) flat.push_back(p.grad().detach().to(torch::kCPU).flatten());
  run.all_grads = torch::cat(flat);
  return run;
}

Histogram grad_histogram(const torch::Tensor& g, int64_t depth, int lo, int hi) {
  Histogram h;
  h.name = fmt::format("histogram_d{}", depth);
  h.title = fmt::format("Histogram of log2 |g| over all {} gradients (depth {}), bins of one binade", g.numel(), depth);
  h.axis = "log2 |g|";
  for (int e = lo; e <= hi; ++e) h.edges.push_back(e);
  h.counts.assign(static_cast<std::size_t>(hi - lo), 0);
  auto nz = g.index({g != 0});
  h.zeros = g.numel() - nz.numel();
  // floor(log2 |g|) exactly, from frexp (log2 can round up just below a power of two).
  auto e = std::get<1>(torch::frexp(nz)).to(torch::kLong) - 1;
  e = e.clamp(lo, hi - 1) - lo;
  auto counts = torch::bincount(e, {}, hi - lo);
  for (int64_t i = 0; i < counts.numel(); ++i) h.counts[static_cast<std::size_t>(i)] = counts[i].item<int64_t>();
  const FormatInfo &f16 = format_info(Format::FP16), &bf = format_info(Format::BF16);
  h.markers = {{"fp16 max", std::log2(f16.max)},
               {"fp16 min normal", std::log2(f16.min_normal)},
               {"fp16 min subnormal", std::log2(f16.min_subnormal)},
               {"bf16 min normal", std::log2(bf.min_normal)},
               {"bf16 min subnormal", std::log2(bf.min_subnormal)}};
  return h;
}

// ----------------------------------------------------------------------------
// 4. Lost updates: why fp32 master weights exist
// ----------------------------------------------------------------------------
Table updates_table(double start, double step, int64_t count, std::uint64_t seed) {
  Table t{"updates",
          fmt::format("Lost updates: w = {:g} plus {} updates of {:g}, stored in each format", start, count, step),
          {text_col("name", "storage"), float_col("final", "final w", "-", 8), float_col("expected", "w0 + n*u", "-", 8),
           int_col("lost", "lost", "updates"), float_col("ulp_at_start", "ulp(w0)", "-", 4)}};
  // update: how w + u reaches a weight stored without a master copy (core/train/amp's SGD updates).
  enum class Update { Nearest, Stochastic, Kahan };
  struct Recipe { std::string name; Format stored; bool master; Update update; };
  const std::vector<Recipe> recipes = {{"fp32", Format::FP32, false, Update::Nearest},
                                       {"fp16", Format::FP16, false, Update::Nearest},
                                       {"bf16", Format::BF16, false, Update::Nearest},
                                       {"fp16+fp32_master", Format::FP16, true, Update::Nearest},
                                       {"bf16+fp32_master", Format::BF16, true, Update::Nearest},
                                       {"bf16+sr", Format::BF16, false, Update::Stochastic},
                                       {"bf16+kahan", Format::BF16, false, Update::Kahan}};
  for (const auto& r : recipes) {
    // Arithmetic in fp32, the sum rounded to the stored format ("fp16 storage, fp32 math").
    // Without a master copy the update itself is also held in the low format. The SGD updates
    // of core/train/amp with lr = 1 and g = −u: w − lr·g = w + u.
    auto w = round_to(torch::tensor({static_cast<float>(start)}), r.stored);
    auto master = torch::tensor({static_cast<float>(start)});
    auto u = round_to(torch::tensor({static_cast<float>(step)}), r.master ? Format::FP32 : r.stored);
    auto comp = torch::zeros_like(w);  // bf16+kahan's compensation buffer
    // What exact arithmetic on the values this row holds reaches: its stored start plus n times the update
    // as it applies it (rounded to the low format without a master copy). Stochastic rounding is unbiased
    // for this value, not for start + n·step.
    const double expected = (r.master ? master : w).item<double>() + static_cast<double>(count) * u.item<double>();
    int64_t lost = 0;
    for (int64_t i = 0; i < count; ++i) {
      if (r.master) {
        auto m2 = master + u;
        if (u.item<float>() != 0 && m2.item<float>() == master.item<float>()) ++lost;
        master = m2;
        w = round_to(master, r.stored);  // the low-precision working copy used in forward
      } else if (r.update == Update::Stochastic) {
        // one seed per update: the seed of the run (/seed) and the update's index
        lost += sgd_update_stochastic(w, -u, 1.0f, quant::derive_seed(seed, static_cast<std::uint64_t>(i))).lost;
      } else if (r.update == Update::Kahan) {
        lost += sgd_update_kahan(w, comp, -u, 1.0f).lost;
      } else {
        auto w2 = round_to(w + u, r.stored);
        if (u.item<float>() != 0 && w2.item<float>() == w.item<float>()) ++lost;
        w = w2;
      }
    }
    const double final_v = r.master ? master.item<double>() : w.item<double>();
    // An update that rounds to 0 before it is applied (fp16(1e-30) = 0) is lost at every step, though
    // w + 0 == w is no rounding of the sum: counted here, whatever the update rule.
    if (step != 0 && u.item<float>() == 0) lost = count;
    const FormatInfo& fi = format_info(r.stored);
    t.rows.push_back({{"name", r.name}, {"final", final_v}, {"expected", expected}, {"lost", lost},
                      {"ulp_at_start", std::ldexp(fi.eps, std::ilogb(start == 0 ? 1.0 : start))},
                      {"working_copy", w.item<double>()}});
  }
  t.notes.push_back("an update smaller than half an ulp of w rounds away: w + u == w (lost: u != 0 and the state did not "
                    "move; an update that itself rounds to 0 in the stored format is lost at every step)");
  t.notes.push_back("with a master copy the fp32 master accumulates every update; 'final' is the master value");
  t.notes.push_back(fmt::format("w0 + n*u: the row's stored start plus n times its update as applied (u rounded to the "
                                "stored format without a master copy), in exact arithmetic; start + n*step = {:.8g}",
                                start + static_cast<double>(count) * step));
  t.notes.push_back("bf16+sr: stochastic rounding, seeded (/seed); 'lost' counts steps that left w unchanged, which "
                    "SR makes up in expectation (E[final] = w0 + n*u); bf16+kahan: lost = w and its bf16 compensation "
                    "both unchanged");
  return t;
}

// ----------------------------------------------------------------------------
// Checks against LibTorch's own numeric limits (a wrong formula would fail here)
// ----------------------------------------------------------------------------
void format_checks(Report& report) {
  const FormatInfo &h = format_info(Format::FP16), &b = format_info(Format::BF16), &f = format_info(Format::FP32);
  auto rel = [](double a, double ref) { return std::fabs(a - ref) / std::fabs(ref); };
  report.check("fp16 max == numeric_limits<Half>::max", rel(h.max, static_cast<float>(std::numeric_limits<c10::Half>::max())), 0);
  report.check("fp16 min normal == numeric_limits<Half>::min", rel(h.min_normal, static_cast<float>(std::numeric_limits<c10::Half>::min())), 0);
  report.check("fp16 min subnormal == denorm_min", rel(h.min_subnormal, static_cast<float>(std::numeric_limits<c10::Half>::denorm_min())), 0);
  report.check("fp16 eps == numeric_limits<Half>::epsilon", rel(h.eps, static_cast<float>(std::numeric_limits<c10::Half>::epsilon())), 0);
  report.check("bf16 max == numeric_limits<BFloat16>::max", rel(b.max, static_cast<float>(std::numeric_limits<c10::BFloat16>::max())), 0);
  report.check("bf16 min normal == numeric_limits<BFloat16>::min", rel(b.min_normal, static_cast<float>(std::numeric_limits<c10::BFloat16>::min())), 0);
  report.check("fp32 max == numeric_limits<float>::max", rel(f.max, std::numeric_limits<float>::max()), 0);
  report.check("fp32 min subnormal == denorm_min", rel(f.min_subnormal, std::numeric_limits<float>::denorm_min()), 0);
}

/// Cross-key checks before any work (exit 2): the histogram's range is not empty.
void validate_underflow(const Config& cfg, int /*world_size*/) {
  const int lo = static_cast<int>(cfg.integer("/histogram/min_log2"));
  const int hi = static_cast<int>(cfg.integer("/histogram/max_log2"));
  if (hi <= lo)
    throw ConfigError(fmt::format("/histogram/max_log2: expected a value greater than /histogram/min_log2 ({}), got {}",
                                  lo, hi));
}

Report run_underflow(const Context& ctx) {
  const auto& cfg = ctx.cfg;
  Report report;
  const int lo = static_cast<int>(cfg.integer("/histogram/min_log2"));  // lo < hi: validate_underflow
  const int hi = static_cast<int>(cfg.integer("/histogram/max_log2"));

  double t0 = now_seconds();
  report.add(formats_table(cfg.strings("/formats")));
  report.add(casts_table(cfg.numbers("/cast/values"), cfg.strings("/cast/formats")));
  format_checks(report);
  report.timings["formats_casts_s"] = now_seconds() - t0;

  t0 = now_seconds();
  Table grads{"gradients",
              "Gradient underflow: weight gradient of every Linear layer of the deep sigmoid net (MSE loss)",
              {text_col("name", "name"), int_col("depth", "depth"), int_col("layer", "layer"), text_col("shape", "shape"),
               sci_col("mean_abs", "mean|g|"), sci_col("max_abs", "max|g|"), pct_col("zero_fp32", "zero fp32"),
               pct_col("underflow_fp16", "->0 fp16"), pct_col("underflow_bf16", "->0 bf16"),
               pct_col("subnormal_fp16", "subn fp16")}};
  std::vector<Histogram> hists;
  json losses = json::object();
  for (int64_t depth : cfg.integers("/model/depth")) {
    GradRun run = gradient_run(ctx, depth);
    for (auto& r : run.rows) grads.rows.push_back(std::move(r));
    losses[fmt::format("d{}", depth)] = run.loss;
    hists.push_back(grad_histogram(run.all_grads, depth, lo, hi));
  }
  grads.notes.push_back("->0: nonzero in fp32, exactly zero once cast; subn: lands in fp16's subnormal range");
  grads.notes.push_back("layer 1 is nearest the input: each sigmoid (slope <= 1/4) shrinks the gradient on the way back");
  report.add(std::move(grads));
  report.results["loss"] = losses;
  report.timings["gradients_s"] = now_seconds() - t0;

  t0 = now_seconds();
  report.add(updates_table(cfg.number("/updates/start"), cfg.number("/updates/step"), cfg.integer("/updates/count"),
                           static_cast<std::uint64_t>(cfg.integer("/seed"))));
  report.timings["updates_s"] = now_seconds() - t0;
  for (auto& h : hists) report.add(std::move(h));
  return report;
}

/// Memory of a run (core/runtime/memory): the deepest net of the /model/depth sweep (the nets are built
/// one after the other), Linear(input_dim, w), depth-1 x Linear(w, w), Linear(w, 1); parameter-
/// sized tensors: weights, gradients and the gradients' copies cast to fp16/bf16 and flattened
/// for the histogram (6); per sample and unit: Linear and Sigmoid outputs and a gradient (3).
MemoryEstimate underflow_memory(const Config& cfg, int /*world_size*/) {
  int64_t depth = 1;
  for (int64_t d : cfg.integers("/model/depth")) depth = std::max(depth, d);
  const int64_t w = cfg.integer("/model/width");
  std::vector<int64_t> widths{cfg.integer("/model/input_dim")};
  widths.insert(widths.end(), static_cast<std::size_t>(depth), w);
  widths.push_back(1);
  MemoryEstimate e;
  add_mlp_training(e, "deep sigmoid net", widths, cfg.integer("/data/batch"), 6, 3, "/model/width, /model/depth",
                   "/data/batch, /model/width, /model/depth");
  return e;
}

}  // namespace

Experiment underflow_experiment() {
  return {"underflow", "What fp16 and bf16 cannot hold: formats, casts, gradient underflow, lost updates",
          underflow_spec, run_underflow, validate_underflow, underflow_memory};
}

}  // namespace mpt
