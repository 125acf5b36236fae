// `mpt lossscale`, section 2's GEMM ceilings (/train/gemm_ceiling): what the device's matrix
// products reach in fp32 and in each format the recipes train in, and the verdict per narrow
// format on the recipes' cost table (is storing it narrow faster here, and if not, why).
#include <algorithm>
#include <cmath>

#include "core/numerics/precision.hpp"
#include "core/runtime/runtime.hpp"
#include "core/runtime/timing.hpp"
#include "core/train/amp_recipe.hpp"
#include "experiments/lossscale_parts.hpp"

namespace mpt {

namespace {

/// Times an n x n x n torch::mm in each of `formats` on the device (median of 3 after a warm-up);
/// formats without working native kernels (the probe's verdict: they would fail, abort or
/// accumulate in the low format) are not timed; slow ones are (the ceiling shows how slow).
/// Returns timings.gemm_ceiling ({format: {n, seconds, gflops} or {n, skipped}}) and appends
/// one note part per format to `parts`.
json time_ceilings(const Context& ctx, int64_t n, const std::vector<Format>& formats,
                   const std::map<Format, double>& best_rate, std::vector<std::string>& parts) {
  json ceilings = json::object();
  for (const Format f : formats) {
    if (f != Format::FP32) {
      if (const KernelProbe probe = probe_kernels(ctx.device, storage_dtype(f));
          !probe.runs || !probe.fp32_accumulation) {
        ceilings[format_name(f)] = {{"n", n}, {"skipped", probe.reason}};
        parts.push_back(fmt::format("{} not timed (no native kernels: env.{}_compute_reason)", format_name(f),
                                    format_name(f)));
        continue;
      }
    }
    torch::NoGradGuard ng;
    auto opts = torch::TensorOptions().dtype(storage_dtype(f)).device(ctx.device);
    auto a = torch::randn({n, n}, opts), b = torch::randn({n, n}, opts);
    const double seconds = median_seconds(
        [&] {
          auto c = torch::mm(a, b);
          sync_device(ctx.device);
        },
        /*repeats=*/3, /*warmup=*/1);
    const double gflops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / seconds / 1e9;
    ceilings[format_name(f)] = {{"n", n}, {"seconds", seconds}, {"gflops", gflops}};
    const double reached = best_rate.count(f) ? best_rate.at(f) : 0.0;
    parts.push_back(reached > gflops ? fmt::format("{} {:.3g} (below the {:.3g} a recipe reached: at N = {} this "
                                                   "product is not the ceiling; take a larger N)",
                                                   format_name(f), gflops, reached, n)
                                     : fmt::format("{} {:.3g}", format_name(f), gflops));
  }
  return ceilings;
}

/// The verdict on the fastest native recipe `best` (a cost row) of format `fname`: its step
/// against fp32's (`vs`) and the format's ceiling against fp32's (`x`).
std::string ceiling_verdict(const json& best, const std::string& fname, double ceiling, double fp32_ceiling,
                            double fp32_step) {
  const double x = ceiling / fp32_ceiling;
  const double vs = best["step_ms"].get<double>() / (fp32_step * 1e3), share = best["gflops"].get<double>() / ceiling;
  const std::string name = best["name"].get<std::string>();
  if (vs < 0.9)
    return fmt::format("faster than fp32 here ({} at {:.2f}x fp32's step; the {} ceiling is {:.2g}x fp32's)", name, vs,
                       fname, x);
  if (vs <= 1.1)
    return fmt::format("about as fast as fp32 ({} at {:.2f}x fp32's step: within the 10 % a single run varies by; "
                       "the {} ceiling is {:.2g}x fp32's)", name, vs, fname, x);
  if (x < 0.9)
    return fmt::format("not faster ({} at {:.2f}x fp32's step): this device's {} kernels are slower than fp32's "
                       "(ceiling {:.2g}x fp32's), so storing {} saves memory here, not time",
                       name, vs, fname, x, fname);
  if (x < 1.5)
    return fmt::format("not faster ({} at {:.2f}x fp32's step): this device's {} kernels are about as fast as "
                       "fp32's (ceiling {:.2g}x fp32's), so the casts to and from {} cost more than its GEMMs save",
                       name, vs, fname, x, fname);
  return fmt::format("not faster at this size ({} at {:.2f}x fp32's step) although its ceiling is {:.2g}x "
                     "fp32's: the recipe reached {:.0f} % of it, so casts, weight reorders and small GEMMs "
                     "dominate (overhead-bound; larger layers or batches move it toward the ceiling)",
                     name, vs, x, 100.0 * share);
}

}  // namespace

void add_gemm_ceilings(const Context& ctx, int64_t n, const std::vector<std::string>& recipes,
                       const std::map<Format, double>& best_rate, double fp32_step, Table& cost, Report& report) {
  // What the device's kernels reach on a large square product, for fp32 and each format the
  // recipes train in: a recipe far below its format's ceiling is overhead-bound (small
  // matrices), and a format whose ceiling is below fp32's has no fast kernels here (e.g. no AMX
  // or AVX512-FP16 on a CPU), so storing it narrow cannot make the step faster.
  std::vector<Format> formats{Format::FP32};
  for (const auto& name : recipes)
    if (const Format f = parse_precision_recipe(name).format; std::find(formats.begin(), formats.end(), f) == formats.end())
      formats.push_back(f);
  std::vector<std::string> parts;
  json ceilings = time_ceilings(ctx, n, formats, best_rate, parts);
  report.timings["gemm_ceiling"] = ceilings;
  cost.notes.push_back(fmt::format("GEMM ceilings of this device ({0}x{0}x{0} torch::mm, median of 3, GFLOP/s): {1}",
                                   n, fmt::join(parts, "; ")));
  // The verdict per narrow format: does storing it narrow make the step faster here, and if
  // not, is it the kernels (a ceiling no higher than fp32's) or the size (a recipe far below its
  // format's ceiling: casts, reorders and small GEMMs dominate)? Only where both ceilings are
  // ceilings and a recipe ran the format natively; otherwise a note says why there is none.
  const double fp32_ceiling = ceilings["fp32"].value("gflops", 0.0);
  auto is_ceiling = [&](Format f) {  // no recipe of the format reached more than its product
    return ceilings[format_name(f)].contains("gflops") &&
           !(best_rate.count(f) && best_rate.at(f) > ceilings[format_name(f)]["gflops"].get<double>());
  };
  for (const Format f : formats) {
    const std::string fname = format_name(f);
    if (f == Format::FP32 || !ceilings[fname].contains("gflops")) continue;  // not timed: said above
    if (!std::isfinite(fp32_step)) {
      cost.notes.push_back(fname + ": no verdict: no fp32 recipe ran to compare its step with");
      continue;
    }
    const json* best = nullptr;  // the fastest native recipe of the format
    for (const auto& row : cost.rows)
      if (parse_precision_recipe(row["name"].get<std::string>()).format == f &&
          row["why"].get<std::string>().rfind("native", 0) == 0 &&
          (!best || row["step_ms"].get<double>() < (*best)["step_ms"].get<double>()))
        best = &row;
    if (!best) {
      cost.notes.push_back(fmt::format("{}: no verdict: no recipe ran {} natively (its ceiling is what its kernels "
                                       "would reach)", fname, fname));
      continue;
    }
    if (!is_ceiling(Format::FP32) || !is_ceiling(f)) {
      cost.notes.push_back(fmt::format("{}: no verdict: at N = {} a recipe outran the product, so it is no ceiling; "
                                       "take a larger N", fname, n));
      continue;
    }
    cost.notes.push_back(fname + ": " +
                         ceiling_verdict(*best, fname, ceilings[fname]["gflops"].get<double>(), fp32_ceiling, fp32_step));
  }
}

}  // namespace mpt
