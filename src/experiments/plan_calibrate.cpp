// `mpt plan --calibrate`: this machine as mpt measures it, written as a system file (docs/plan.md,
// "This machine"): GEMM rates by size, the operator overhead of a step, the memory bandwidth and,
// from a `mpt collectives` result, the collectives' busbw and latency.
#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "core/errors.hpp"
#include "core/io/config.hpp"
#include "core/models/mlp.hpp"
#include "core/plan/plan.hpp"
#include "core/runtime/runtime.hpp"
#include "core/runtime/timing.hpp"
#include "experiments/plan_parts.hpp"

namespace mpt::plan_calibrate {

namespace pl = mpt::plan;
using pl::kGiB;

namespace {

/// The busbw (GB/s, the largest over sizes) and latency (us, the smallest time: the smallest
/// size's) of collective `op` in a `mpt collectives` result. Throws ConfigError naming the file.
json collective_from(const json& d, const std::string& op, const std::string& path);

}  // namespace

/// The collectives result /calibrate/collectives names: its ranks and its link (busbw and latency
/// per collective). Read by validate (so --print-config refuses what a run refuses) and by the
/// run, before anything is measured. Throws ConfigError naming /calibrate/collectives and the file.
std::pair<int64_t, json> calibration_link(const Config& cfg) {
  const std::string path = cfg.str("/calibrate/collectives");
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw ConfigError(fmt::format("/calibrate/collectives: {}: no such file (run `mpt collectives --out {}` first: "
                                  "--calibrate reads its busbw)", path, path));
  if (!std::filesystem::is_regular_file(path, ec))
    throw ConfigError(fmt::format("/calibrate/collectives: {}: not a regular file (expected a `mpt collectives` result)", path));
  const json coll = read_json_file(path, "collectives result file", kResultLimits);
  if (!coll.is_object() || coll.value("experiment", "") != "collectives")
    throw ConfigError(fmt::format("/calibrate/collectives: {} is no `mpt collectives` result", path));
  const json* np = coll.contains("config") && coll["config"].is_object() && coll["config"].contains("nproc")
                       ? &coll["config"]["nproc"] : nullptr;
  if (!np || !np->is_number_integer() || np->get<int64_t>() < 1 || np->get<int64_t>() > 1'000'000)
    throw ConfigError(fmt::format("/calibrate/collectives: {}: config.nproc: expected a whole number of ranks in [1, 10^6]", path));
  json link = {{"all_reduce", collective_from(coll, "all_reduce", path)},
               {"all_gather", collective_from(coll, "all_gather", path)},
               {"reduce_scatter", collective_from(coll, "reduce_scatter", path)},
               {"send_recv", collective_from(coll, "sendrecv", path)},
               {"all_to_all", collective_from(coll, "alltoall", path)}};
  return {np->get<int64_t>(), link};
}

namespace {

json collective_from(const json& d, const std::string& op, const std::string& path) {
  const auto& t = d.contains("timings") && d["timings"].is_object() ? d["timings"] : json::object();
  if (!t.contains(op) || !t[op].is_array() || t[op].empty())
    throw ConfigError(fmt::format("/calibrate/collectives: {} has no timings.{} rows (a `mpt collectives` result with "
                                  "that operation in /ops is needed)", path, op));
  double busbw = 0, lat = std::numeric_limits<double>::infinity();
  for (const auto& r : t[op]) {
    if (!r.is_object() || !r.contains("busbw_gbps") || !r.contains("time_us") || !r["busbw_gbps"].is_number() ||
        !r["time_us"].is_number())
      throw ConfigError(fmt::format("/calibrate/collectives: {}: timings.{} rows need numbers busbw_gbps and time_us", path, op));
    const double bw = r["busbw_gbps"].get<double>(), us = r["time_us"].get<double>();
    if (!(bw >= 0 && bw <= 1e6 && us > 0 && us <= 1e7))
      throw ConfigError(fmt::format("/calibrate/collectives: {}: timings.{}: busbw_gbps {} and time_us {}: expected "
                                    "busbw in [0, 10^6] GB/s and a time in (0, 10^7] us", path, op, r["busbw_gbps"].dump(),
                                    r["time_us"].dump()));
    busbw = std::max(busbw, bw);
    lat = std::min(lat, us);
  }
  if (!(busbw >= 1e-6)) throw ConfigError(fmt::format("/calibrate/collectives: {}: timings.{} has no positive busbw", path, op));
  return {{"busbw_gbps", busbw}, {"latency_us", lat}};
}

/// The median seconds of one N×N×N GEMM as a Linear layer's step runs them: the forward
/// addmm(b, x, Wᵀ), the input's gradient dY·W and the weight's dYᵀ·x, timed together and / 3 (their
/// layouts differ by up to 10 % here), each time on other operands, from a set of 64 MiB (up to
/// 64 sets): in a step every GEMM's operands were last touched by other operators, so they come
/// from memory rather than the cache (6-20 % slower than the same operands again, N 64-512 here).
/// Enough repeats for a small N's to average over (at least 20 up to N = 1024, 5 above; up to 400
/// for N = 16).
double linear_gemm_seconds(int64_t n, torch::ScalarType dtype, torch::Device device) {
  auto opts = torch::TensorOptions().device(device).dtype(dtype);
  const int64_t set_bytes = 3 * n * n * static_cast<int64_t>(c10::elementSize(dtype));
  const int64_t sets = std::clamp<int64_t>((int64_t{64} << 20) / set_bytes, 1, 64);
  std::vector<std::array<torch::Tensor, 4>> ops;
  for (int64_t i = 0; i < sets; ++i)
    ops.push_back({torch::rand({n, n}, opts), torch::rand({n, n}, opts), torch::rand({n, n}, opts), torch::rand({n}, opts)});
  const int64_t repeats = std::clamp<int64_t>((int64_t{1} << 26) / (n * n * n), n <= 1024 ? 20 : 5, 400);
  std::size_t next = 0;
  return median_seconds(
             [&] {
               const auto& [x, w, g, bias] = ops[next++ % ops.size()];
               (void)torch::addmm(bias, x, w.t());
               (void)torch::mm(g, w);
               (void)torch::mm(g.t(), x);
               sync_device(device);
             },
             repeats, 2) /
         3;
}

}  // namespace

double bare_operator_seconds(torch::Device device) {
  auto a = torch::rand({16, 16}, torch::TensorOptions().device(device));
  return median_seconds(
             [&] {
               a.zero_();
               (void)a.clone();
               (void)a.slice(0, 0, 8);
               sync_device(device);
             },
             1000, 20) /
         3;
}

namespace {

/// The median seconds (of 400) of one forward and backward of a tiny MLP, `layers` Linear(16, 16)
/// with ReLU between, batch 16, cross entropy, as core/models/mlp's step runs it; gradients
/// dropped before each step (clear_grads), so AccumulateGrad adds none.
double tiny_step_seconds(int layers, torch::Device device) {
  torch::manual_seed(0);
  auto net = mlp(16, std::vector<int64_t>(static_cast<std::size_t>(layers - 1), 16), 16);
  net->to(device);
  auto x = torch::rand({16, 16}, torch::TensorOptions().device(device));
  auto y = torch::arange(16, torch::TensorOptions().device(device).dtype(torch::kLong));
  const auto params = net->parameters();
  return median_seconds(
      [&] {
        clear_grads(params);
        auto loss = torch::nn::functional::cross_entropy(net->forward(x), y) * 1.0;
        loss.backward();
        (void)loss.item<double>();
      },
      400, 20);
}

}  // namespace

Overheads operator_overhead(const pl::System& sys, torch::Device device) {
  Overheads out;
  pl::Training tr;
  tr.recipe = "fp32";
  double rest[2] = {0, 0}, ops[2] = {0, 0};
  const int depth[2] = {2, 8};
  // the deeper step must take longer; a disturbance (another process on the core) that slowed the
  // shallow one is measured again, up to 3 times, and said where it persists
  for (int attempt = 1; attempt <= 3; ++attempt) {
    out.tries = attempt;
    for (int k = 0; k < 2; ++k) {
      pl::ModelShape shape;
      shape.widths.assign(static_cast<std::size_t>(depth[k] + 1), 16);
      shape.dropout = false;
      const pl::MlpOperators o = pl::mlp_operators(shape, tr, 16, 0, depth[k], sys);
      out.step_s[k] = tiny_step_seconds(depth[k], device);
      out.ops[k] = ops[k] = o.forward + o.backward;
      rest[k] = out.step_s[k] - o.gemm_forward_s - o.gemm_backward_s;  // what is not the GEMMs
    }
    if (rest[1] > rest[0]) break;
  }
  out.consistent = rest[1] > rest[0];
  out.operator_s = std::max(0.0, (rest[1] - rest[0]) / (ops[1] - ops[0]));
  out.pass_s = std::max(0.0, rest[0] - out.operator_s * ops[0]);
  return out;
}

/// Measures this machine into a system (the configs/systems/ format): the fastest of 5 N^3
/// products per format (a format whose kernels the probe refuses gets 0) and the median rate of a
/// Linear layer's GEMMs of size 16 ... N (gemm_tflops_by_n, linear_gemm_seconds), the operator overhead of a tiny MLP step
/// (operator_overhead), the bandwidth of a 256 MiB copy (read + write), the collectives' busbw
/// and latency from a `mpt collectives` result (one link: every rank on this machine), the memory
/// per rank (physical memory / ranks) and the reserve (this process's resident memory before any
/// model: LibTorch's own).
Report calibrate(const Context& ctx) {
  const auto& cfg = ctx.cfg;
  Report report;
  const std::string path = cfg.str("/calibrate/collectives");
  const auto [ranks, link] = calibration_link(cfg);

  double rss = 0;  // /proc/self/statm: size resident ... in pages, before this section allocates
  {
    std::ifstream statm("/proc/self/statm");
    double size_pages = 0, resident_pages = 0;
    if (statm >> size_pages >> resident_pages) rss = resident_pages * static_cast<double>(sysconf(_SC_PAGESIZE));
  }
  Table tb{"calibration", fmt::format("This machine as mpt measures it ({} ranks per node, from {})", ranks, path),
           {text_col("name", "quantity"), float_col("value", "value"), text_col("unit", "unit"), text_col("how", "how")}};
  const int64_t n = cfg.integer("/calibrate/gemm_n");
  torch::NoGradGuard no_grad;
  auto opts = torch::TensorOptions().device(ctx.device);
  json peaks = json::object(), by_n = json::object();
  for (auto [name, dtype] : {std::pair<const char*, torch::ScalarType>{"fp32", torch::kFloat32},
                             {"bf16", torch::kBFloat16},
                             {"fp16", torch::kFloat16}}) {
    double tflops = 0;
    std::string how = fmt::format("fastest of 5 {0}x{0}x{0} torch::mm", n);
    const auto probe = dtype == torch::kFloat32 ? KernelProbe{} : probe_kernels(ctx.device, dtype);
    if (dtype != torch::kFloat32 && !probe.native()) {
      how = "no fast native kernels here: " + probe.reason;
    } else {
      auto a = torch::rand({n, n}, opts.dtype(dtype)), b = torch::rand({n, n}, opts.dtype(dtype));
      const double sec = fastest_seconds([&] { (void)torch::mm(a, b); sync_device(ctx.device); }, 5, 1);
      tflops = 2.0 * static_cast<double>(n) * n * n / sec / 1e12;
      json pts = json::array();
      std::vector<std::string> shown;
      for (int64_t k = 16; k <= std::min<int64_t>(n, 2048); k *= 2) {  // above: the peak
        // at most the peak (the fastest N^3 product): a median of cold operands above it is noise
        const double r =
            std::min(tflops, 2.0 * static_cast<double>(k) * k * k / linear_gemm_seconds(k, dtype, ctx.device) / 1e12);
        pts.push_back({k, r});
        shown.push_back(fmt::format("{}: {:.3g}", k, r));
      }
      by_n[name] = pts;
      tb.rows.push_back({{"name", std::string("GEMM rate by N, ") + name},
                         {"value", pts.front()[1]},
                         {"unit", "TFLOP/s"},
                         {"how", fmt::format("a Linear's forward and backward GEMMs, N x N x N (median), N {}; the value: N = 16",
                                            fmt::join(shown, ", "))}});
    }
    peaks[name] = tflops;
    tb.rows.push_back({{"name", std::string("peak ") + name}, {"value", tflops}, {"unit", "TFLOP/s"}, {"how", how}});
  }
  peaks["fp8"] = 0;
  const int64_t elems = 64LL << 20;  // 256 MiB of fp32
  auto src = torch::rand({elems}, opts), dst = torch::empty({elems}, opts);
  const double copy_s = fastest_seconds([&] { dst.copy_(src); sync_device(ctx.device); }, 5, 1);
  const double bw = 2.0 * static_cast<double>(elems) * 4 / copy_s / 1e9;
  src = dst = torch::Tensor();
  tb.rows.push_back({{"name", "memory bandwidth"}, {"value", bw}, {"unit", "GB/s"}, {"how", "fastest of 5 copies of 256 MiB (read + write)"}});
  const double phys = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  const double mem_gib = phys / static_cast<double>(ranks) / kGiB;
  tb.rows.push_back({{"name", "memory per rank"}, {"value", mem_gib}, {"unit", "GiB"}, {"how", "physical memory / ranks"}});
  tb.rows.push_back({{"name", "reserved"}, {"value", rss / kGiB}, {"unit", "GiB"}, {"how", "this process's resident memory (LibTorch's own)"}});
  for (const char* op : {"all_reduce", "all_gather", "reduce_scatter", "send_recv", "all_to_all"}) {
    tb.rows.push_back({{"name", std::string(op) + " busbw"}, {"value", link[op]["busbw_gbps"]}, {"unit", "GB/s"},
                       {"how", "the largest over the collectives result's sizes"}});
    tb.rows.push_back({{"name", std::string(op) + " latency"}, {"value", link[op]["latency_us"]}, {"unit", "us"},
                       {"how", "its smallest time (the smallest size)"}});
  }
  const json hw = hardware_fingerprint();
  json sys = {{"name", fmt::format("this machine ({}; {} ranks)", hw["cpu"].value("model", std::string("unknown CPU")), ranks)},
              {"_comment", "written by `mpt plan --calibrate`: peaks are measured GEMM rates, so gemm_efficiency is 1"},
              {"devices_per_node", ranks},
              {"memory_gib", mem_gib},
              {"reserved_gib", std::min(rss / kGiB, mem_gib / 2)},
              {"peak_tflops", peaks},
              {"gemm_efficiency", 1.0},
              {"gemm_tflops_by_n", by_n},
              {"memory_bandwidth_gbps", bw},
              {"intra_node", link},
              {"inter_node", link}};
  {
    // the overheads: two tiny steps' time less their GEMMs' at the rates just measured
    torch::AutoGradMode grad(true);
    const Overheads o = operator_overhead(pl::parse_system(sys, "the calibrated system"), ctx.device);
    sys["op_overhead_us"] = o.operator_s * 1e6;
    sys["pass_overhead_us"] = o.pass_s * 1e6;
    const std::string steps = fmt::format("tiny MLP steps of 2 and 8 Linear(16, 16), batch 16, forward and backward: "
                                          "{:g} and {:g} operators in {:.1f} and {:.1f} us (medians of 400), less their "
                                          "GEMMs at the rates above", o.ops[0], o.ops[1], o.step_s[0] * 1e6,
                                          o.step_s[1] * 1e6);
    if (!o.consistent)
      spdlog::warn("mpt plan --calibrate: the 8-layer tiny step ({:.1f} us) was not slower than the 2-layer one "
                   "({:.1f} us) in 3 tries: the operator overhead is written as 0 (is the machine busy?)",
                   o.step_s[1] * 1e6, o.step_s[0] * 1e6);
    tb.rows.push_back({{"name", "operator overhead"}, {"value", o.operator_s * 1e6}, {"unit", "us"},
                       {"how", steps + ": the difference / the operators' difference" +
                                   (o.consistent ? std::string()
                                                 : std::string(" (UNRELIABLE: the deeper step was not slower in 3 tries)"))}});
    tb.rows.push_back({{"name", "pass overhead"}, {"value", o.pass_s * 1e6}, {"unit", "us"},
                       {"how", "the 2-layer step's rest less its operators: once per forward and backward (autograd's "
                               "graph task, the loss read back)"}});
  }
  const double bare = bare_operator_seconds(ctx.device);
  tb.rows.push_back({{"name", "bare operator"}, {"value", bare * 1e6}, {"unit", "us"},
                     {"how", "zero_, clone and slice of a 16 x 16 tensor outside autograd (median of 1000) / 3: what an "
                             "operator outside the forward and backward costs (not in the system file)"}});
  pl::parse_system(sys, "the calibrated system");  // what plan will read back must parse
  tb.notes.push_back("the system is stored under timings.system: plan with it by --set system=<this result file>, or copy "
                     "it to configs/systems/<name>.json");
  report.add(tb, Store::Timings);
  report.timings["system"] = sys;
  return report;
}

}  // namespace mpt::plan_calibrate
