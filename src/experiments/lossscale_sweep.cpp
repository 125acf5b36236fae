// `mpt lossscale`, section 1: the static loss-scale sweep on the deep sigmoid net of `mpt
// underflow` — per scale, what underflows and overflows in fp16, the error of the unscaled
// gradient, and the safe window (the experiment's overview: src/experiments/lossscale.cpp).
#include <algorithm>
#include <cmath>

#include "core/errors.hpp"
#include "core/models/mlp.hpp"
#include "core/numerics/precision.hpp"
#include "core/runtime/runtime.hpp"
#include "experiments/lossscale_parts.hpp"

namespace mpt {

namespace {

std::string scale_name(double s) {
  int e = 0;
  const double m = std::frexp(s, &e);
  if (m == 0.5) return fmt::format("2^{}", e - 1);
  return fmt::format("{:g}", s);
}

// ----------------------------------------------------------------------------
// 1. Static loss-scale sweep
// ----------------------------------------------------------------------------
struct Frac {
  double underflow = 0, overflow = 0;
};

Frac fractions(const torch::Tensor& g) {
  CastStats c = cast_stats(g, Format::FP16);
  const double n = static_cast<double>(c.numel);
  return {c.underflow / n, c.overflow / n};
}

// Gradients computed in fp16 (`low`) against the same gradients computed in fp32 (`ref`):
// underflow = nonzero in fp32, zero in fp16; overflow = finite in fp32, inf/NaN in fp16.
Frac fractions_vs(const torch::Tensor& low, const torch::Tensor& ref) {
  const double n = static_cast<double>(low.numel());
  return {((ref != 0) & (low == 0)).sum().item<double>() / n,
          (torch::isfinite(ref) & torch::isfinite(low).logical_not()).sum().item<double>() / n};
}

// ||fp16(gs)·inv − g||₂ / ||g||₂ (inf when anything overflowed).
double unscaled_error(const torch::Tensor& scaled, float inv, const torch::Tensor& ref) {
  auto back = round_to(scaled, Format::FP16) * inv;
  if (!torch::isfinite(back).all().item<bool>()) return INFINITY;
  return relative_error(back, ref);
}

/// The sweep's net and batch (the deep sigmoid net of `mpt underflow`) and the two ways of
/// getting its gradients of S·loss: in fp32 (`grads`) and with every stored tensor in fp16
/// (`fp16_grads`). Each returns the first layer's weight gradient and all parameters' gradients,
/// flattened, as CPU fp32 tensors.
struct SweepNet {
  torch::nn::Sequential net{nullptr};
  torch::Tensor x, y;
  std::vector<torch::nn::Linear> layers;
  bool computed = false;  // false: "cast" (gradients cast to fp16 after an fp32 backward)
  Compute compute = Compute::Emulated;

  std::pair<torch::Tensor, torch::Tensor> collect() {
    std::vector<torch::Tensor> flat;
    for (const auto& p : net->parameters()) flat.push_back(p.grad().detach().flatten().to(torch::kCPU, torch::kFloat));
    // .clone(): .to() returns the gradient itself when it is already a CPU fp32 tensor, and the
    // next zero_grad() would zero it in place.
    return std::make_pair(layers.front()->weight.grad().detach().to(torch::kCPU, torch::kFloat).clone(),
                          torch::cat(flat));
  }

  std::pair<torch::Tensor, torch::Tensor> grads(double s) {
    net->zero_grad();
    auto loss = torch::mse_loss(net->forward(x), y);
    // scaler.scale(loss): loss × S as an fp32 tensor
    (loss * static_cast<float>(s)).backward();
    return collect();
  }

  // The same net in fp16: parameters, every layer's output and every activation stored in
  // fp16, the loss (MSE) in fp32 as autocast computes it; S·loss flows back through fp16.
  std::pair<torch::Tensor, torch::Tensor> fp16_grads(double s) {
    net->zero_grad();
    auto h = store_as(x, Format::FP16, compute);
    for (std::size_t i = 0; i < layers.size(); ++i) {
      auto w = store_as(layers[i]->weight, Format::FP16, compute);
      auto b = store_as(layers[i]->bias, Format::FP16, compute);
      h = store_as(torch::linear(h, w, b), Format::FP16, compute);
      if (i + 1 < layers.size()) h = activation_as(h, "sigmoid", Format::FP16, compute);
    }
    auto loss = torch::mse_loss(h.to(torch::kFloat), y);
    (loss * static_cast<float>(s)).backward();
    return collect();
  }
};

/// Builds the sweep's net from /seed and /sweep/*; throws RuntimeFailure naming /sweep/compute
/// when the device cannot compute in fp16 as asked.
SweepNet sweep_net(const Context& ctx) {
  const auto& cfg = ctx.cfg;
  const int64_t in_dim = cfg.integer("/sweep/model/input_dim");
  SweepNet s;
  // Same construction order as `mpt underflow` and the reference: seed, model, x, y.
  seed_all(static_cast<std::uint64_t>(cfg.integer("/seed")));
  s.net = deep_sigmoid_net(in_dim, cfg.integer("/sweep/model/width"), cfg.integer("/sweep/model/depth"));
  s.x = torch::randn({cfg.integer("/sweep/data/batch"), in_dim});
  s.y = torch::randn({cfg.integer("/sweep/data/batch"), 1});
  s.layers = linear_layers(s.net);
  // "cast": the lesson's table (backward in fp32, gradients cast to fp16), on the CPU where it
  // equals PyTorch-Python bit for bit. Otherwise forward and backward run in fp16 on the
  // chosen device, natively or emulated, and are compared with the fp32 run.
  const std::string mode = cfg.str("/sweep/compute");
  s.computed = mode != "cast";
  try {
    if (s.computed) s.compute = resolve_compute(mode, Format::FP16, ctx.device);
  } catch (const RuntimeFailure& e) {
    throw RuntimeFailure(std::string("/sweep/compute: ") + e.what());
  }
  if (s.computed) {
    s.net->to(ctx.device);
    s.x = s.x.to(ctx.device);
    s.y = s.y.to(ctx.device);
  }
  return s;
}

/// The sweep table's header (rows: one per scale).
Table sweep_table(const SweepNet& s) {
  return {"sweep",
          s.computed ? fmt::format("Static loss scale: forward and backward of S*loss in fp16 ({}), against fp32 "
                                   "(deep sigmoid net of `mpt underflow`)", compute_name(s.compute))
                     : std::string("Static loss scale: gradients of S*loss cast to fp16 (deep sigmoid net of `mpt underflow`)"),
          {text_col("name", "scale"), sci_col("scale", "S"), pct_col("first_underflow", "L1 ->0"),
           pct_col("first_overflow", "L1 ->inf"), pct_col("all_underflow", "all ->0"),
           pct_col("all_overflow", "all ->inf"), sci_col("first_error", "L1 err", "-", 3),
           sci_col("all_error", "all err", "-", 3)}};
}

/// The safe window's bounds: the smallest scale with a clean first layer, the largest without
/// overflow, and the first that overflows (NaN where none).
struct SafeWindow {
  double lowest = NAN, highest = NAN, first_overflow = NAN;
};

/// results.safe_window and the table's notes: the window (or why it is empty) and the columns.
void add_window_notes(Report& report, Table& t, const SafeWindow& w, bool computed) {
  const bool empty = std::isnan(w.lowest) || std::isnan(w.highest) || w.lowest > w.highest;
  report.results["safe_window"] = {{"lowest", num(w.lowest)}, {"highest", num(w.highest)}, {"empty", empty}};
  if (empty)
    t.notes.push_back(fmt::format(
        "safe window: EMPTY - {}; no static scale works here: use dynamic loss scaling",
        std::isnan(w.lowest) ? std::string("no scale in the sweep removes first-layer underflow")
        : std::isnan(w.highest) ? std::string("every scale in the sweep overflows somewhere")
                                : fmt::format("layer 1 stops underflowing at {} but overflow starts at {}",
                                              scale_name(w.lowest), scale_name(w.first_overflow))));
  else
    t.notes.push_back(fmt::format("safe window: [{}, {}] - no first-layer underflow and no overflow anywhere",
                                  scale_name(w.lowest), scale_name(w.highest)));
  t.notes.push_back(computed ? "->0: nonzero in the fp32 run, zero in the fp16 run; ->inf: finite in fp32, inf or NaN in "
                              "fp16; err: ||g16(S)/S - g|| / ||g|| (inf once anything overflows)"
                            : "->0: nonzero in fp32, zero in fp16; ->inf: finite in fp32, inf in fp16; "
                              "err: ||fp16(S*g)/S - g|| / ||g|| (inf once anything overflows)");
}

}  // namespace

// Section 1 (documented in lossscale_parts.hpp): build the net, take fp32's gradients as the
// reference, then one row per scale.
void sweep_section(const Context& ctx, Report& report) {
  SweepNet net = sweep_net(ctx);
  auto [ref_first, ref_all] = net.grads(1.0);
  Table t = sweep_table(net);
  SafeWindow window;
  double linearity = 0;
  std::vector<double> scales = ctx.cfg.numbers("/sweep/scales");
  std::sort(scales.begin(), scales.end());
  const bool ref_normal = (ref_all.abs() >= format_info(Format::FP32).min_normal).logical_or(ref_all == 0).all().item<bool>();
  for (double s : scales) {
    auto [gf, ga] = net.grads(s);
    // GradScaler.unscale_: the reciprocal of the fp32 scale, computed in double.
    const float inv = static_cast<float>(1.0 / static_cast<double>(static_cast<float>(s)));
    Frac f, a;
    double first_err, all_err;
    if (net.computed) {
      auto [lf, la] = net.fp16_grads(s);
      f = fractions_vs(lf, gf);
      a = fractions_vs(la, ga);
      first_err = unscaled_error(lf, inv, ref_first);
      all_err = unscaled_error(la, inv, ref_all);
    } else {
      f = fractions(gf);
      a = fractions(ga);
      first_err = unscaled_error(gf, inv, ref_first);
      all_err = unscaled_error(ga, inv, ref_all);
    }
    t.rows.push_back({{"name", scale_name(s)}, {"scale", s}, {"first_underflow", f.underflow},
                      {"first_overflow", f.overflow}, {"all_underflow", a.underflow}, {"all_overflow", a.overflow},
                      {"first_error", num(first_err)}, {"all_error", num(all_err)}});
    // the first layer is clean only when nothing underflows *and* nothing overflows there (a
    // first layer all inf has no zeros, but that is no fix)
    if (f.underflow == 0 && f.overflow == 0 && std::isnan(window.lowest)) window.lowest = s;
    if (a.overflow == 0) window.highest = s;
    if (a.overflow > 0 && std::isnan(window.first_overflow)) window.first_overflow = s;
    // Before any cast, scaling by a power of two is exact in fp32: (S·g)·(1/S) == g, as long as
    // nothing leaves fp32's normal range. This is what makes loss scaling free of error.
    int e = 0;
    if (std::frexp(s, &e) == 0.5 && ref_normal && torch::isfinite(ga).all().item<bool>() &&
        (ga.abs() >= format_info(Format::FP32).min_normal).logical_or(ga == 0).all().item<bool>())
      linearity = std::max(linearity, (ga * inv - ref_all).abs().max().item<double>());
  }
  report.check("sweep: (S*g)/S == g in fp32 for power-of-two S", linearity, 0.0,
               "loss scaling by a power of two is exact before the fp16 cast");
  add_window_notes(report, t, window, net.computed);
  report.results["sweep_compute"] = net.computed ? compute_name(net.compute) : "cast";
  report.add(std::move(t));
}


}  // namespace mpt
