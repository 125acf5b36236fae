// `mpt fp8`'s operand-level sections: MXFP8 saturation per 1x32 block under FLOOR and RCEIL on
// the fp32 run's operands, and the limited-precision accumulator with and without promotion
// (DeepSeek-V3 §3.3.2). The experiment's overview: src/experiments/fp8.cpp.
#include <algorithm>
#include <cmath>

#include "core/numerics/precision.hpp"
#include "core/numerics/quant.hpp"
#include "core/train/quant_train.hpp"
#include "experiments/fp8_parts.hpp"

namespace mpt::fp8 {

namespace q = mpt::quant;

std::string layer_name(std::size_t l, const std::vector<int64_t>& w) { return fmt::format("L{} {}x{}", l + 1, w[l], w[l + 1]); }

/// The limited-precision accumulator at K (DeepSeek-V3 §3.3.2). Operands from U[0,1) (seeded): fp32 ones,
/// whose bits below the accumulator's last place are uniform (the derivation's assumption; the checks),
/// and the same cast to E4M3 (what an fp8 GEMM multiplies: every product exact in fp32, on a coarse grid).
/// The reference is the float64 GEMM of the same operands.
void accumulator_section(const Context& ctx, Report& report) {
  const auto& cfg = ctx.cfg;
  const int64_t K = cfg.integer("/accumulator/k"), m = cfg.integer("/accumulator/m"), n = cfg.integer("/accumulator/n");
  const int p = static_cast<int>(cfg.integer("/accumulator/significand_bits"));
  const int c = static_cast<int>(cfg.integer("/accumulator/chunk"));
  const int nc = static_cast<int>(std::min<int64_t>(cfg.integer("/accumulator/promote_every"), K));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<std::uint64_t>(cfg.integer("/seed")) + 4096);
  const auto a32 = torch::rand({m, K}, gen), b32 = torch::rand({n, K}, gen);
  Table t{"accumulator",
          fmt::format("Accumulator precision: C = A·Bᵀ, A [{},{}], B [{},{}] from U[0,1) (seeded), against float64", m, K, n, K),
          {text_col("name", "operands / accumulation"), sci_col("mean_rel_error", "mean rel err", "-", 3),
           sci_col("max_rel_error", "max rel err", "-", 3), sci_col("expected_low", "expected from", "-", 3),
           sci_col("expected_high", "to", "-", 3)}};
  // Each truncation to p bits loses on average half an ulp of the accumulator a, and ulp(a)/a ∈ (2^-p, 2^-(p-1)].
  // Over j = 1..s adds of equal expected size a_j = (j/s)·S, so the losses sum to (s+1)/2 half-ulps of S:
  // rel error ∈ (s+1)/2 · [2^-(p+1), 2^-p], s = K/c adds (no promotion) or N_C/c per promoted partial sum.
  auto range = [&](int64_t len) {
    const double adds = std::ceil(static_cast<double>(len) / c);
    return std::make_pair((adds + 1) / 2 * std::ldexp(1.0, -(p + 1)), (adds + 1) / 2 * std::ldexp(1.0, -p));
  };
  const auto [lo, hi] = range(K);
  const auto [lo_p, hi_p] = range(nc);
  double checked[2] = {0, 0};
  for (const bool fp8 : {false, true}) {
    const auto a = fp8 ? q::cast(a32, q::Element::E4M3) : a32, b = fp8 ? q::cast(b32, q::Element::E4M3) : b32;
    const auto ref = a.to(torch::kDouble).mm(b.to(torch::kDouble).t());
    auto err = [&](const torch::Tensor& got) {
      auto r = (got.to(torch::kDouble) - ref).abs() / ref.abs();
      return std::make_pair(r.mean().item<double>(), r.max().item<double>());
    };
    const std::string op = fp8 ? "E4M3" : "fp32";
    const auto [f_mean, f_max] = err(q::gemm(a, b, q::Accumulator{}));
    const auto [t_mean, t_max] = err(q::gemm(a, b, q::Accumulator{p, c, 0}));
    const auto [pr_mean, pr_max] = err(q::gemm(a, b, q::Accumulator{p, c, nc}));
    t.rows.push_back({{"name", op + ", fp32"}, {"mean_rel_error", num(f_mean)}, {"max_rel_error", num(f_max)},
                      {"expected_low", nullptr}, {"expected_high", nullptr}});
    t.rows.push_back({{"name", fmt::format("{}, {}-bit", op, p)}, {"mean_rel_error", num(t_mean)}, {"max_rel_error", num(t_max)},
                      {"expected_low", fp8 ? json(nullptr) : json(lo)}, {"expected_high", fp8 ? json(nullptr) : json(hi)}});
    t.rows.push_back({{"name", fmt::format("{}, {}-bit, promote every {}", op, p, nc)}, {"mean_rel_error", num(pr_mean)},
                      {"max_rel_error", num(pr_max)}, {"expected_low", fp8 ? json(nullptr) : json(lo_p)},
                      {"expected_high", fp8 ? json(nullptr) : json(hi_p)}});
    if (!fp8) {
      checked[0] = t_mean;
      checked[1] = pr_mean;
    }
  }
  t.notes.push_back(fmt::format("{}-bit: products of {} consecutive k summed in fp32, added to the accumulator, the sum truncated "
                                "to {} significant bits (DeepSeek-V3 §3.3.2 measured about 14 bits on H800); promotion: the "
                                "accumulator added into an fp32 sum and cleared every N_C = {} elements of K", p, c, p, nc));
  t.notes.push_back("expected: (s+1)/2 · [2^-(p+1), 2^-p] for s accumulator adds (K/c, or N_C/c with promotion): half an ulp "
                    "lost per add on an accumulator that grows linearly; shown for fp32 operands, whose low bits are uniform. "
                    "E4M3 products sit on a coarse grid, so short sums lose less than half an ulp");
  auto outside = [](double v, double l, double h) { return std::max({0.0, l - v, v - h}); };
  report.check("accumulator: mean error of the truncated sum in its expected range", outside(checked[0], lo, hi), 0.0,
               fmt::format("{:.3e} in [{:.3e}, {:.3e}]", checked[0], lo, hi));
  report.check("accumulator: mean error with promotion every N_C in its expected range", outside(checked[1], lo_p, hi_p), 0.0,
               fmt::format("{:.3e} in [{:.3e}, {:.3e}]", checked[1], lo_p, hi_p));
  report.add(std::move(t));
}

/// MXFP8 per 1x32 block, FLOOR against RCEIL, on the same fp32 operands.
void mx_section(const Context& ctx, const q::Operands& ops, const std::vector<int64_t>& w, Report& report) {
  const auto& cfg = ctx.cfg;
  const int64_t block = cfg.integer("/mx/block");
  const q::Element grad = cfg.str("/format") == "hybrid" ? q::Element::E5M2 : q::Element::E4M3;
  Table t{"mx_saturation",
          fmt::format("MXFP8 1x{} blocks, E8M0 scales, FLOOR vs RCEIL: the fp32 run's operands at step {}", block,
                      cfg.integer("/ledger/step")),
          {text_col("name", "operand"), int_col("blocks", "blocks"), int_col("floor_saturated_blocks", "FLOOR sat blk"),
           pct_col("floor_saturated", "FLOOR sat", 3), sci_col("floor_rel_error", "FLOOR err", "-", 3),
           int_col("rceil_saturated_blocks", "RCEIL sat blk"), pct_col("rceil_saturated", "RCEIL sat", 3),
           sci_col("rceil_rel_error", "RCEIL err", "-", 3), pct_col("rceil_flushed", "RCEIL ->0", 3)}};
  int64_t floor_blocks = 0, rceil_blocks = 0;
  for (std::size_t l = 0; l < ops.x.size(); ++l) {
    struct Op {
      std::string what;
      torch::Tensor t;
      q::Element e;
    };
    // Blocks along the reduction dim of the out GEMM (x, W) and of dgrad (dy).
    for (const Op& o : {Op{"x", ops.x[l], q::Element::E4M3}, Op{"W", ops.w[l], q::Element::E4M3}, Op{"dy", ops.dy[l], grad}}) {
      if (o.t.size(-1) % block != 0) continue;
      q::QuantSpec s;
      s.element = o.e;
      s.block = {1, block};
      s.scale = q::ScaleFormat::E8M0;
      s.rule = q::E8M0Rule::FLOOR;
      const q::Quantized f = q::quantize(o.t, s);
      s.rule = q::E8M0Rule::RCEIL;
      const q::Quantized r = q::quantize(o.t, s);
      floor_blocks += f.saturated_blocks;
      rceil_blocks += r.saturated_blocks;
      t.rows.push_back({{"name", fmt::format("{} {} ({})", layer_name(l, w), o.what, q::element_info(o.e).name)},
                        {"blocks", f.blocks},
                        {"floor_saturated_blocks", f.saturated_blocks},
                        {"floor_saturated", static_cast<double>(f.saturated) / static_cast<double>(f.numel)},
                        {"floor_rel_error", num(relative_error(f.values, o.t))},
                        {"rceil_saturated_blocks", r.saturated_blocks},
                        {"rceil_saturated", static_cast<double>(r.saturated) / static_cast<double>(r.numel)},
                        {"rceil_rel_error", num(relative_error(r.values, o.t))},
                        {"rceil_flushed", static_cast<double>(r.flushed) / static_cast<double>(r.numel)}});
    }
  }
  t.notes.push_back("FLOOR (OCP MX v1.0 §6.3): 2^(floor(log2 amax) - emax_elem); a block whose amax has a mantissa above the "
                    "element max's (amax/2^floor > 1.75 for E4M3) clips at ±max. RCEIL (torchao): 2^ceil(log2(amax/max)) never "
                    "clips in exact arithmetic, at up to one binade less resolution");
  t.notes.push_back("operands whose last dimension the block does not divide (784 inputs, 10 outputs) are left out");
  report.results["mx_saturated_blocks"] = {{"floor", floor_blocks}, {"rceil", rceil_blocks}};
  report.add(std::move(t));
}

}  // namespace mpt::fp8
