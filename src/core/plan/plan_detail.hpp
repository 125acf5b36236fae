// The planner's shared arithmetic of links, collectives, held pairs and quantized weight copies, for
// the files of core/plan (plan.cpp, plan_mlp.cpp). Internal: not part of plan.hpp's interface.
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/pipeline/schedule.hpp"
#include "core/plan/plan.hpp"

namespace mpt::plan::detail {

/// Bytes of one activation element: 4 for the fp32 recipe, 2 for the others (bf16, fp16 and the
/// fp8 recipes keep bf16 activations).
inline double activation_element_bytes(const std::string& recipe) { return recipe == "fp32" ? 4.0 : 2.0; }

/// Whether `recipe` computes its GEMMs in fp8 (fp8-tensorwise, fp8-rowwise, fp8-blockwise, mxfp8).
inline bool fp8_recipe(const std::string& recipe) { return recipe.rfind("fp8", 0) == 0 || recipe == "mxfp8"; }

/// Whether `recipe` computes its GEMMs in fp4 (nvfp4, mxfp4).
inline bool fp4_recipe(const std::string& recipe) { return recipe == "nvfp4" || recipe == "mxfp4"; }

/// The low-precision copies of one weight matrix that a recipe's GEMMs read, and their scales, bytes.
struct WeightCopy {
  double copies = 0;  ///< the quantized elements of every copy
  double scales = 0;  ///< the scale values of every copy
};

/// The copies the GEMMs of `recipe` read of one weight matrix W [rows, cols] (rows: its outputs;
/// cols: its inputs, the forward GEMM's reduction dimension), and their scales, in bytes. A copy
/// scaled along the reduction dimension serves the forward (out = x·Wᵀ, blocks along cols); the
/// backward's dgrad = dy·W reduces over rows, so a recipe whose blocks are not the same under
/// transposition keeps a second copy of Wᵀ with its own scales (as core/numerics/quant's
/// stored_bytes: TE's MXFP8Tensor keeps a row- and a column-wise copy). A partial block (a
/// dimension not a multiple of the block) has a scale of its own: ceil. Per recipe:
///   fp8-tensorwise  rows·cols E4M3 + one fp32 scale, 4 B (torchao TENSORWISE, TE Float8CurrentScaling)
///   fp8-rowwise     2·rows·cols, one fp32 scale per row of W and of Wᵀ: 4·rows + 4·cols (torchao ROWWISE)
///   fp8-blockwise   rows·cols, one fp32 scale per 128x128 block: 4·ceil(rows/128)·ceil(cols/128)
///                   (DeepSeek-V3 §3.3, TE Float8BlockScaling; the same blocks under transposition)
///   mxfp8           2·rows·cols, one E8M0 byte per 1x32 block of each: rows·ceil(cols/32) +
///                   cols·ceil(rows/32) (OCP MX v1.0; TE MXFP8BlockScaling)
///   nvfp4           ceil(rows·cols/2) (E2M1, two a byte), one UE4M3 byte per 16x16 block (the
///                   NVFP4 paper's 2-D weight scaling, the same under transposition) + the fp32
///                   tensor scale: ceil(rows/16)·ceil(cols/16) + 4 (arXiv 2509.25149 §4)
///   mxfp4           2·ceil(rows·cols/2), E8M0 per 1x32 block as mxfp8 (OCP MX v1.0)
/// Other recipes (fp32, bf16, fp16): none, {0, 0}. Kernels' swizzled scale layouts (TE pads MX
/// and NVFP4 scale tensors to 128x4 tiles) are not counted.
inline WeightCopy weight_copy_bytes(const std::string& recipe, double rows, double cols) {
  auto blocks = [](double n, double block) { return std::ceil(n / block); };
  const double n = rows * cols;
  if (recipe == "fp8-tensorwise") return {n, 4};
  if (recipe == "fp8-rowwise") return {2 * n, 4 * rows + 4 * cols};
  if (recipe == "fp8-blockwise") return {n, 4 * blocks(rows, 128) * blocks(cols, 128)};
  if (recipe == "mxfp8") return {2 * n, rows * blocks(cols, 32) + cols * blocks(rows, 32)};
  if (recipe == "nvfp4") return {std::ceil(n / 2), blocks(rows, 16) * blocks(cols, 16) + 4};
  if (recipe == "mxfp4") return {2 * std::ceil(n / 2), rows * blocks(cols, 32) + cols * blocks(rows, 32)};
  return {};
}

/// What weight_copy_bytes counts for `recipe`, as the memory table writes it: {the copies per
/// weight-matrix element, the scales of a [rows, cols] matrix}; {"", ""} for other recipes.
inline std::pair<std::string, std::string> weight_copy_formula(const std::string& recipe) {
  if (recipe == "fp8-tensorwise") return {"1 B per weight-matrix element", "one fp32 scale per matrix, 4 B"};
  if (recipe == "fp8-rowwise")
    return {"2 x 1 B per weight-matrix element (W and Wᵀ, each scaled along its reduction dimension)",
            "one fp32 scale per row of W and of Wᵀ, 4·(rows + cols) B per matrix"};
  if (recipe == "fp8-blockwise")
    return {"1 B per weight-matrix element", "one fp32 scale per 128x128 block, 4·ceil(rows/128)·ceil(cols/128) B per matrix"};
  if (recipe == "mxfp8")
    return {"2 x 1 B per weight-matrix element (row- and column-wise)",
            "one E8M0 byte per 1x32 block of each copy, rows·ceil(cols/32) + cols·ceil(rows/32) B per matrix"};
  if (recipe == "nvfp4")
    return {"1/2 B per weight-matrix element (E2M1, ceil per matrix)",
            "one UE4M3 byte per 16x16 block + the fp32 tensor scale, ceil(rows/16)·ceil(cols/16) + 4 B per matrix"};
  if (recipe == "mxfp4")
    return {"2 x 1/2 B per weight-matrix element (row- and column-wise; E2M1, ceil per matrix)",
            "one E8M0 byte per 1x32 block of each copy, rows·ceil(cols/32) + cols·ceil(rows/32) B per matrix"};
  return {"", ""};
}

/// Seconds of one collective of `bytes` (the per-rank buffer, nccl-tests' "size") over `n` ranks:
/// latency + bytes · factor / busbw, factor factor_num·(n − 1)/n: 2(n − 1)/n for all-reduce,
/// (n − 1)/n for all-gather, reduce-scatter and all-to-all (nccl-tests' doc/PERFORMANCE.md, busbw).
/// 0 for one rank or no bytes.
inline double collective_seconds(const Collective& c, double bytes, int64_t n, double factor_num) {
  if (n <= 1 || bytes <= 0) return 0.0;
  const double factor = factor_num * static_cast<double>(n - 1) / static_cast<double>(n);
  return c.latency_s + bytes * factor / c.busbw;
}

/// Seconds of one send of `bytes`: latency + bytes / busbw (0 for no bytes).
inline double send_seconds(const Collective& c, double bytes) { return bytes <= 0 ? 0.0 : c.latency_s + bytes / c.busbw; }

/// The link of a group of `size` ranks `stride` apart: intra-node when its span fits a node (ranks
/// placed tp fastest, then dp, then pp; nodes hold consecutive ranks), else inter-node.
inline const Link& group_link(const System& s, int64_t size, int64_t stride) {
  return (size - 1) * stride + 1 <= s.devices_per_node ? s.intra : s.inter;
}

/// (Microbatch, chunk) pairs each of the p stages holds at its peak under `schedule` with m
/// microbatches and v chunks per stage: core/pipeline's peak_in_flight of the program replayed,
/// cached. The peak saturates once m reaches the schedule's bound, so a replay with
/// m' = min(m, 4p) gives it for any larger m whose bound is the same (GPipe's bound grows with m,
/// and is its exact peak); beyond 2·10^7 ops every stage gets the schedule's bound.
inline std::vector<int> replayed_held_pairs(const std::string& schedule, int p, int m, int v) {
  static std::mutex mu;
  static std::map<std::tuple<std::string, int, int, int>, std::vector<int>> cache;
  const ScheduleSpec& spec = schedule_spec(schedule);
  int mr = std::min(m, 4 * p);
  if (spec.microbatches_in_groups) mr = std::max(p, mr - mr % p);
  if (spec.peak_bound(p, m, v) != spec.peak_bound(p, mr, v)) return std::vector<int>(p, spec.peak_bound(p, m, v));
  if (static_cast<double>(p) * mr * v * 3 > 2e7) return std::vector<int>(p, spec.peak_bound(p, m, v));
  const auto key = std::make_tuple(schedule, p, mr, v);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  auto peaks = peak_in_flight(make_schedule(spec.kind, p, mr, v));
  cache.emplace(key, peaks);
  return peaks;
}

/// Seconds of `calls` collectives `coll` ("send", "all_reduce", "all_gather", "reduce_scatter",
/// "all_to_all") of `bytes_each` over `n` ranks on link `lk` (0 for a receive, `timed` false: its
/// time is its sender's), added with their bytes and `what` to the (group, coll) row of `comm` when
/// `record`. Returns the seconds; 0, adding nothing, for no calls, no bytes or one rank.
inline double add_comm(std::vector<CommTerm>& comm, bool record, const std::string& group, const std::string& coll,
                       double calls, double bytes_each, const Link& lk, int64_t n, const std::string& what,
                       bool timed = true) {
  if (calls <= 0 || bytes_each <= 0 || n <= 1) return 0.0;
  const double sec = !timed ? 0.0
                     : coll == "send" ? calls * send_seconds(lk.send_recv, bytes_each)
                     : coll == "all_reduce" ? calls * collective_seconds(lk.all_reduce, bytes_each, n, 2)
                     : coll == "all_gather" ? calls * collective_seconds(lk.all_gather, bytes_each, n, 1)
                     // an all-to-all sends (n − 1)/n of its input (nccl-tests' alltoall busbw)
                     : coll == "all_to_all" ? calls * collective_seconds(lk.all_to_all, bytes_each, n, 1)
                                            : calls * collective_seconds(lk.reduce_scatter, bytes_each, n, 1);
  if (!record) return sec;
  auto it = std::find_if(comm.begin(), comm.end(), [&](const CommTerm& c) { return c.group == group && c.collective == coll; });
  if (it == comm.end()) it = comm.insert(comm.end(), CommTerm{group, coll, 0, 0, 0, ""});
  it->calls += calls;
  it->bytes += calls * bytes_each;
  it->seconds += sec;
  it->formula += (it->formula.empty() ? "" : "; ") + what;
  return sec;
}

/// The memory table's last term: the system's reserve (CUDA context, workspaces, allocator).
inline Term reserved_term(const System& sys) {
  return {"reserved", sys.reserved_bytes, "the system's reserve (CUDA context, workspaces, allocator)"};
}

/// The sum of the terms' values (bytes or seconds).
inline double sum_terms(const std::vector<Term>& ts) {
  double x = 0;
  for (const auto& term : ts) x += term.value;
  return x;
}

/// The time table's "dp/zero collectives (exposed)" row of layout `l`: `t_dp` seconds of DP/ZeRO
/// collectives per step, `t_dp_exposed` of them not hidden behind the compute (ZeRO-3: the
/// compute; ZeRO-2: the microbatches' backwards; else the last microbatch's backward).
inline Term dp_exposed_term(const Layout& l, double t_dp, double t_dp_exposed) {
  std::string formula = "none (dp = 1)";
  if (l.dp > 1) {
    const char* behind = l.zero == 3 ? "the compute" : l.zero == 2 ? "the microbatches' backwards" : "the last microbatch's backward";
    if (!l.overlap_dp) formula = fmt::format("{:.3g} s in all, not overlapped", t_dp);
    else if (t_dp_exposed <= 0) formula = fmt::format("{:.3g} s in all, hidden behind {}", t_dp, behind);
    else formula = fmt::format("{:.3g} s in all, {:.3g} s of it hidden behind {}", t_dp, t_dp - t_dp_exposed, behind);
  }
  return {"dp/zero collectives (exposed)", t_dp_exposed, formula};
}

/// Fills the rates of `e` from e.step_s: tokens/s (`tokens_per_step` tokens, or an MLP's samples,
/// per step), MFU (model FLOPs over step × `devices` × `peak` FLOP/s, Narayanan et al. 2021),
/// FLOP/s per device counting the recompute, and the time to train on `tokens_to_train` (0: none).
inline void set_rates(Estimate& e, double tokens_per_step, int64_t devices, double peak, double tokens_to_train) {
  const double n = static_cast<double>(devices);
  e.tokens_per_s = tokens_per_step / e.step_s;
  e.mfu = e.model_flops / (e.step_s * n * peak);
  e.flops_per_device = e.hardware_flops / (e.step_s * n);
  e.time_to_train_s = tokens_to_train > 0 ? tokens_to_train / e.tokens_per_s : 0;
}

}  // namespace mpt::plan::detail
