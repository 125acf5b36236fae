/*
 * mpt collectives — how fast the collectives of data, tensor and pipeline parallelism run
 * between these processes, measured the way NVIDIA's nccl-tests measure them
 * (all_reduce_perf & co.: src/common.cu, doc/PERFORMANCE.md), on c10d — Gloo on CPU,
 * NCCL on CUDA — and verified element by element on every row.
 *
 * For each operation and each message size (8 B, 16 B, ... 64 MiB by default):
 *   1. validate before timing: fill the buffers with data every rank can predict
 *      (core/dist/bench: small integers, different per rank and element), run once, count
 *      the received elements that differ from the prediction (#wrong, summed over the ranks).
 *      The integers are small enough that every partial sum is exact in the dtype, so the
 *      comparison is exact;
 *   2. warm up (/warmup_iters calls), line the ranks up with a one-element all-reduce;
 *   3. time /iters calls back to back:  time = elapsed / iters, averaged over the ranks;
 *   4. algbw = size / time;  busbw = algbw · factor, the traffic each rank's link carries:
 *        all_reduce 2(n−1)/n   all_gather, reduce_scatter, alltoall (n−1)/n
 *        broadcast, sendrecv 1
 *      "size" is the larger buffer: all_gather's output, reduce_scatter's input.
 * A row with #wrong > 0 fails the run's check (exit 1), as nccl-tests' "Out of bounds values".
 * The footer of each table gives the average busbw over its rows ("# Avg bus bandwidth").
 *
 * The algorithm matters as much as the link: on Gloo, reduce_scatter and all_gather also run
 * as mpt's own ring from send/recv (dist::Group::ring_reduce_scatter / ring_all_gather: N−1
 * steps of one chunk each, (N−1)/N of the size sent per rank), timed beside c10d's native one
 * on every row ("ring" columns, timings only). LibTorch 1.13's Gloo has no reduce_scatter:
 * there the ring is the only one (column "via"). /dist/gloo_algorithm = "ring" makes the ring
 * the measured default (and drops the comparison). NCCL (CUDA) ignores it.
 *
 *   mpt collectives                                   # 2 processes, all six operations
 *   mpt collectives --nproc 4 --set ops='["all_reduce"]' --set max_bytes=1073741824
 *   torchrun --nproc_per_node 2 --no-python mpt collectives --device cuda
 */
#include "core/runtime/compat.hpp"
#include "core/dist/dist.hpp"
#include "core/dist/bench.hpp"
#include "core/errors.hpp"
#include "core/experiment.hpp"
#include "core/process_plan.hpp"
#include "core/runtime/runtime.hpp"

namespace mpt {

namespace {

using dist::Coll;

ConfigSpec collectives_spec() {
  ConfigSpec s;
  s.integer("/nproc", 2, "worker processes spawned on this machine (--nproc N); ignored under torchrun/SLURM", 1, 64);
  s.strings("/ops", dist::coll_names(), dist::coll_names(),
            "operations to measure, one table each, in this order (nccl-tests' benchmark names)");
  s.integer("/min_bytes", 8, "smallest message size in bytes (nccl-tests -b)", 1, double(int64_t{1} << 40));
  s.integer("/max_bytes", 64 << 20, "largest message size in bytes (nccl-tests -e)", 1, double(int64_t{1} << 40));
  s.integer("/step_factor", 2, "each size is the previous one times this (nccl-tests -f)", 2, 1024);
  s.choice("/dtype", "float32", {"float32", "float64", "float16", "bfloat16"},
           "element type of the buffers (nccl-tests -d float, double, half, bfloat16)");
  s.choice("/redop", "sum", {"sum", "min", "max"}, "reduction of all_reduce and reduce_scatter (nccl-tests -o)");
  s.integer("/root", 0, "root rank of broadcast (nccl-tests -r)", 0, 63);
  s.integer("/iters", 10, "timed calls per size; the time is their average (nccl-tests -n, default 20 there)", 1,
            100000);
  s.integer("/warmup_iters", 1, "untimed calls after the verified one, before the timed ones, per size (nccl-tests -w)",
            0, 100000);
  add_dist_keys(s, DistKeys{"measurement (operation and size)", 2, 63, true});
  s.integer("/check/corrupt_rank", -1,
            "for testing the verification: this rank overwrites the first element it sends before each verified "
            "run, so the ranks that receive it count wrong elements (-1: none)",
            -1, 63);
  return s;
}

torch::ScalarType dtype_of(const std::string& name) {
  if (name == "float64") return torch::kFloat64;
  if (name == "float16") return torch::kFloat16;
  if (name == "bfloat16") return torch::kBFloat16;
  return torch::kFloat32;
}

dist::ReduceOp redop_of(const std::string& name) {
  return name == "min" ? dist::ReduceOp::Min : name == "max" ? dist::ReduceOp::Max : dist::ReduceOp::Sum;
}

/// What every measurement of the run shares.
struct Bench {
  dist::Group* g = nullptr;
  torch::TensorOptions opts;  // dtype and the group's device
  dist::ReduceOp redop = dist::ReduceOp::Sum;
  int root = 0, corrupt_rank = -1;
  int64_t iters = 10, warmup = 1;
};

struct Measurement {
  double seconds = 0;  // per call, averaged over the iterations and the ranks
  int64_t wrong = 0;   // wrong elements of the verified run, summed over the ranks
};

// A send and a receive buffer filled for one run of `op` (in place: one tensor, both names).
void fill(const Bench& b, Coll op, const dist::BenchPattern& p, const dist::CollCounts& c, torch::Tensor& send,
          torch::Tensor& recv) {
  const int me = b.g->rank(), n = b.g->size();
  send = dist::coll_send_values(op, p, me, n, b.root, c, b.opts);
  recv = dist::coll_in_place(op) ? send : torch::full({c.recv_count}, dist::kUnwritten, b.opts);
}

// ----------------------------------------------------------------------------
// One row: nccl-tests' BenchTime
// ----------------------------------------------------------------------------
Measurement bench_time(const Bench& b, Coll op, const dist::CollCounts& c, int64_t rep) {
  dist::Group& g = *b.g;
  const torch::Device dev = g.device();
  const auto dtype = b.opts.dtype().toScalarType();

  // Validate before timing: data every rank can predict, one call, the wrong elements counted.
  const dist::BenchPattern p = dist::bench_pattern(dtype, g.size(), rep);
  torch::Tensor send, recv;
  fill(b, op, p, c, send, recv);
  if (g.rank() == b.corrupt_rank) send.index_put_({0}, dist::corrupting_value(op, b.redop, dtype));
  dist::run_collective(g, op, send, recv, b.redop, b.root);
  sync_device(dev);
  const int64_t wrong = dist::coll_count_wrong(op, p, b.redop, g.rank(), g.size(), b.root, c, recv);

  // Then time, on the same buffers (an in-place all-reduce keeps summing: the values, not the
  // time, change): warm-up calls, the ranks lined up, /iters calls back to back.
  for (int64_t i = 0; i < b.warmup; ++i) dist::run_collective(g, op, send, recv, b.redop, b.root);
  sync_device(dev);
  g.allreduce(torch::zeros({1}, torch::TensorOptions().device(dev)));  // the ranks start together
  sync_device(dev);
  const double t0 = now_seconds();
  for (int64_t i = 0; i < b.iters; ++i) dist::run_collective(g, op, send, recv, b.redop, b.root);
  sync_device(dev);
  const double per_call = (now_seconds() - t0) / static_cast<double>(b.iters);
  g.job()->note_progress();

  // The time averaged over the ranks (nccl-tests: Allreduce(&deltaSec, average)) and the wrong
  // elements summed over them (exact in a double), in one all-reduce.
  auto t = torch::tensor({per_call, static_cast<double>(wrong)},
                         torch::TensorOptions().dtype(torch::kFloat64).device(dev));
  g.allreduce(t);
  t = t.cpu();
  Measurement m;
  m.seconds = t[0].item<double>() / g.size();
  m.wrong = static_cast<int64_t>(t[1].item<double>());
  return m;
}

// ----------------------------------------------------------------------------
// One table per operation
// ----------------------------------------------------------------------------
struct OpResult {
  Table timed;                // printed; stored under timings.<op>
  json rows = json::array();  // the deterministic columns, stored under results.<op>
  int64_t wrong = 0, wrong_rows = 0;
  double avg_busbw = 0;
};

/// The table of `op` (nccl-tests' columns; `via` for reduce-scatter and all-gather, the ring's
/// columns with `ring`), rows: one per size.
Table op_table(const Bench& b, Coll op, bool ring) {
  const int n = b.g->size();
  const std::string name = dist::coll_name(op);
  std::vector<Column> cols{int_col("size", "size", "B"),
                           int_col("count", "count", "elements"),
                           text_col("type", "type"),
                           text_col("redop", "redop"),
                           int_col("root", "root"),
                           text_col("place", "place"),
                           float_col("time_us", "time", "us", 5),
                           float_col("algbw_gbps", "algbw", "GB/s"),
                           float_col("busbw_gbps", "busbw", "GB/s"),
                           int_col("wrong", "#wrong")};
  if (op == Coll::ReduceScatter || op == Coll::AllGather) cols.push_back(text_col("via", "via"));
  if (ring) {
    cols.push_back(float_col("ring_time_us", "ring time", "us", 5));
    cols.push_back(float_col("ring_busbw_gbps", "ring busbw", "GB/s"));
    cols.push_back(float_col("ring_speedup", "native/ring", "x"));
  }
  return Table{name,
               fmt::format("{}: {} ranks, {}, {} iters after {} warm-up per size, busbw = algbw x {:.4g}{}", name, n,
                           b.g->backend(), b.iters, b.warmup, dist::busbw_factor(op, n),
                           ring ? "; beside it mpt's send/recv ring" : ""),
               cols};
}

/// The notes under `op`'s table: sizes skipped, in-place and ring remarks, and nccl-tests' footer
/// (out-of-bounds values, average bus bandwidth).
void add_op_notes(const Bench& b, Coll op, bool ring, const std::vector<int64_t>& skipped, int64_t elem, OpResult& r) {
  const std::string name = dist::coll_name(op);
  const bool chunked = op == Coll::ReduceScatter || op == Coll::AllGather;
  const std::string kind = op == Coll::ReduceScatter ? "reduce_scatter" : "all_gather";
  auto& notes = r.timed.notes;
  if (!skipped.empty()) {
    std::string list;
    for (auto s : skipped) list += (list.empty() ? "" : ", ") + std::to_string(s);
    notes.push_back(fmt::format("sizes {} B skipped: less than one {}-byte element per rank's chunk", list, elem));
  }
  if (dist::coll_in_place(op))
    notes.push_back("place in: c10d's " + name + " works on one tensor (torch.distributed." + name +
                    "); nccl-tests times out-of-place and in-place, c10d offers only this one");
  if (chunked && b.g->uses_ring(kind))
    notes.push_back(op == Coll::ReduceScatter && !compat::kGlooHasReduceScatter &&
                            b.g->gloo_algorithm() == dist::GlooAlgorithm::Native
                        ? "via ring: LibTorch 1.13's Gloo has no reduce_scatter; mpt's ring from send/recv runs it "
                          "((n-1) steps, (n-1)/n x size sent per rank, chunk j summed in rank order from j+1)"
                        : "via ring: dist.gloo_algorithm = ring (mpt's send/recv ring, (n-1)/n x size sent per rank)");
  if (ring)
    notes.push_back("ring: the same call as mpt's send/recv ring (n-1 steps, one chunk each; verified like the row, "
                    "#wrong includes it); native/ring > 1: the ring is faster. " +
                    std::string(op == Coll::ReduceScatter
                                    ? dist::kGlooNativeReduceScatter
                                    : "c10d Gloo's own allgather takes another algorithm, one of the reasons the same "
                                      "bytes cost different times"));
  notes.push_back(fmt::format("{:<20} : {} {}", "Out of bounds values", r.wrong_rows, r.wrong_rows ? "FAILED" : "OK"));
  notes.push_back(fmt::format("{:<20} : {:.4g} GB/s (mean busbw of the rows)", "Avg bus bandwidth", r.avg_busbw));
}

/// The deterministic columns of one size's row (results.<op>): counts, type, redop, root,
/// place, wrong elements (and the ring's, with `ring`).
json size_row(const Bench& b, Coll op, const dist::CollCounts& c, const std::string& type, const std::string& redop,
              bool ring, const Measurement& m, const Measurement& mr) {
  json det = {{"name", std::to_string(c.size_bytes)},
              {"size", c.size_bytes},
              {"count", c.count},
              {"send_count", c.send_count},
              {"recv_count", c.recv_count},
              {"type", type},
              {"redop", dist::coll_reduces(op) ? redop : "none"},
              {"root", dist::coll_has_root(op) ? b.root : -1},
              {"place", dist::coll_in_place(op) ? "in" : "out"},
              {"wrong", m.wrong}};
  if (op == Coll::ReduceScatter || op == Coll::AllGather)
    det["via"] = b.g->uses_ring(op == Coll::ReduceScatter ? "reduce_scatter" : "all_gather") ? "ring" : "native";
  if (ring) det["ring_wrong"] = mr.wrong;
  return det;
}

// Every size of `op` (nccl-tests' TimeTest): one row each, the footer's "Out of bounds values"
// and "Avg bus bandwidth". `step` counts the measurements of the run (the fault point's index).
// `ring`: also time mpt's ring (Group::ring_*) beside the group's own algorithm, per size.
OpResult measure_op(const Bench& b, Coll op, const std::vector<int64_t>& sizes, const std::string& type,
                    const std::string& redop, bool ring, World& w, int64_t& step, Progress& progress) {
  const int n = b.g->size();
  const int64_t elem = static_cast<int64_t>(b.opts.dtype().itemsize());
  OpResult r;
  r.timed = op_table(b, op, ring);
  std::vector<int64_t> skipped;
  double busbw_sum = 0;
  for (int64_t bytes : sizes) {
    const dist::CollCounts c = dist::coll_counts(op, bytes, elem, n);
    if (c.count == 0) {  // less than one element per chunk
      skipped.push_back(bytes);
      continue;
    }
    w.fault_point(step);
    const Measurement m = bench_time(b, op, c, /*rep=*/step + 1);
    Measurement mr;
    if (ring) {  // the same call through the ring, verified and timed alike
      const dist::GlooAlgorithm was = b.g->gloo_algorithm();
      b.g->set_gloo_algorithm(dist::GlooAlgorithm::Ring);
      mr = bench_time(b, op, c, /*rep=*/step + 1);
      b.g->set_gloo_algorithm(was);
    }
    ++step;
    progress.update(step, fmt::format("{} {} B", dist::coll_name(op), c.size_bytes));
    const double algbw = dist::algbw_gbps(c.size_bytes, m.seconds);
    const double busbw = algbw * dist::busbw_factor(op, n);
    json det = size_row(b, op, c, type, redop, ring, m, mr);
    r.rows.push_back(det);
    json row = det;
    row["time_us"] = m.seconds * 1e6;
    row["algbw_gbps"] = algbw;
    row["busbw_gbps"] = busbw;
    if (ring) {
      row["ring_time_us"] = mr.seconds * 1e6;
      row["ring_busbw_gbps"] = dist::algbw_gbps(c.size_bytes, mr.seconds) * dist::busbw_factor(op, n);
      row["ring_speedup"] = mr.seconds > 0 ? m.seconds / mr.seconds : 0.0;
    }
    r.timed.rows.push_back(row);
    r.wrong += m.wrong + mr.wrong;
    r.wrong_rows += m.wrong + mr.wrong > 0 ? 1 : 0;
    busbw_sum += busbw;
  }
  r.avg_busbw = r.timed.rows.empty() ? 0.0 : busbw_sum / static_cast<double>(r.timed.rows.size());
  add_op_notes(b, op, ring, skipped, elem, r);
  return r;
}

Report run_collectives(const Context& ctx) {
  const Config& cfg = ctx.cfg;
  World& w = *ctx.world;
  // Every rank, on this rank's device: Gloo for the CPU, NCCL for its own GPU.
  const std::shared_ptr<dist::Group> group = w.new_group("collectives/", w.size(), w.device());
  Bench b;
  b.g = group.get();
  b.opts = torch::TensorOptions().dtype(dtype_of(cfg.str("/dtype"))).device(group->device());
  b.redop = redop_of(cfg.str("/redop"));
  b.root = static_cast<int>(cfg.integer("/root"));
  b.corrupt_rank = static_cast<int>(cfg.integer("/check/corrupt_rank"));
  b.iters = cfg.integer("/iters");
  b.warmup = cfg.integer("/warmup_iters");
  const std::vector<int64_t> sizes =
      dist::size_schedule(cfg.integer("/min_bytes"), cfg.integer("/max_bytes"), cfg.integer("/step_factor"));
  const bool gloo = group->backend() == "gloo";

  Report report;
  report.env["collectives"] = {
      {"backend", group->backend()},
      {"ranks", group->size()},
      {"device", group->device().str()},
      {"reduce_scatter", dist::collective_algorithm(group->backend(), group->gloo_algorithm(), "reduce_scatter")},
      {"all_gather", dist::collective_algorithm(group->backend(), group->gloo_algorithm(), "all_gather")}};
  report.results["schedule_bytes"] = sizes;
  int64_t rows = 0, step = 0;  // step: the measurements so far (/fault/step counts them)
  for (const std::string& name : cfg.strings("/ops"))
    for (int64_t bytes : sizes)
      rows += dist::coll_counts(dist::coll_from_name(name), bytes, b.opts.dtype().itemsize(), group->size()).count > 0;
  Progress progress(ctx.tty, "collectives", rows, "measurements");
  for (const std::string& name : cfg.strings("/ops")) {
    const Coll op = dist::coll_from_name(name);
    // On Gloo, the ring beside the native reduce_scatter / all_gather (where the native one exists
    // and is not already the ring).
    const bool ring = gloo && group->size() > 1 &&
                      ((op == Coll::ReduceScatter && !group->uses_ring("reduce_scatter")) ||
                       (op == Coll::AllGather && !group->uses_ring("all_gather")));
    OpResult r = measure_op(b, op, sizes, cfg.str("/dtype"), cfg.str("/redop"), ring, w, step, progress);
    // Rank 0 reports (the harness prints and writes its report only); #wrong is summed over the ranks.
    if (ctx.rank == 0)
      report.check(fmt::format("{}: #wrong elements ({} sizes)", name, r.rows.size()), static_cast<double>(r.wrong),
                   0.0);
    report.results[name] = std::move(r.rows);
    report.timings["avg_busbw_gbps"][name] = r.avg_busbw;
    report.add(std::move(r.timed), Store::Timings);  // timings.<op>: times and bandwidths vary run to run
  }
  progress.finish();
  return report;
}

// ----------------------------------------------------------------------------
// Before any work and any worker: cross-key checks, memory, the process plan
// ----------------------------------------------------------------------------
void validate_collectives(const Config& cfg, int world_size) {
  const int64_t lo = cfg.integer("/min_bytes"), hi = cfg.integer("/max_bytes");
  if (lo > hi)
    throw ConfigError(fmt::format("/min_bytes: expected at most /max_bytes ({}), got {}", hi, lo));
  const auto ops = cfg.strings("/ops");
  const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype_of(cfg.str("/dtype"))));
  for (std::size_t i = 0; i < ops.size(); ++i) {
    // (each operation once: the schema checks it, /ops is a list of choices)
    const Coll op = dist::coll_from_name(ops[i]);  // the schema allowed only known names
    if (world_size < dist::coll_min_ranks(op))
      throw ConfigError(fmt::format("/ops/{}: \"{}\" needs at least {} processes (each rank sends to the next), got "
                                    "{}; run with --nproc 2 or leave it out of /ops",
                                    i, ops[i], dist::coll_min_ranks(op), world_size));
    if (dist::coll_counts(op, hi, elem, world_size).count == 0)
      throw ConfigError(fmt::format("/max_bytes: expected at least {} bytes for \"{}\" on {} ranks ({} one element "
                                    "of {} bytes per rank), got {}",
                                    elem * world_size, ops[i], world_size, cfg.str("/dtype"), elem, hi));
  }
  // Gloo (the CPU) in LibTorch 1.13 has no bfloat16; NCCL (CUDA) has.
  const std::string device = cfg.str("/device");
  const bool on_cpu = device == "cpu" || (device == "auto" && !compat::cuda_available());
  if (cfg.str("/dtype") == "bfloat16" && on_cpu && !compat::kGlooHasBFloat16)
    throw ConfigError(fmt::format("/dtype: expected float32, float64 or float16 on the CPU with LibTorch {} (its Gloo "
                                  "has no bfloat16: \"Invalid scalar type\"), got \"bfloat16\"; LibTorch 2.x's Gloo "
                                  "and NCCL (--device cuda) have it",
                                  compat::torch_version()));
  const int64_t root = cfg.integer("/root");
  if (root >= world_size)
    throw ConfigError(fmt::format("/root: expected a rank 0 .. {}, got {}", world_size - 1, root));
  for (const char* key : {"/fault/rank", "/check/corrupt_rank"}) {
    const int64_t r = cfg.integer(key);
    if (r >= world_size)
      throw ConfigError(fmt::format("{}: expected -1 or a rank 0 .. {}, got {}", key, world_size - 1, r));
  }
  // /fault/step counts the measurements (operation and size) that run: a step beyond them never fails.
  if (cfg.integer("/fault/rank") >= 0) {
    const std::vector<int64_t> sizes = dist::size_schedule(lo, hi, cfg.integer("/step_factor"));
    int64_t measurements = 0;
    for (const auto& name : ops)
      for (int64_t bytes : sizes)
        measurements += dist::coll_counts(dist::coll_from_name(name), bytes, elem, world_size).count > 0;
    if (cfg.integer("/fault/step") >= measurements)
      throw ConfigError(fmt::format("/fault/step: expected a measurement 0 .. {} (/ops x the sizes from /min_bytes to "
                                    "/max_bytes), got {}",
                                    measurements - 1, cfg.integer("/fault/step")));
  }
}

/// Memory of a run per process (core/runtime/memory), times the processes spawned here: at the largest
/// size, the send and receive buffers and the expected values (at most 3 x max_bytes; the
/// chunked operations compare chunk by chunk), and the verification's temporaries (an int32
/// or int64 index per element, the comparison's bool mask: at most 9 bytes per element).
MemoryEstimate collectives_memory(const Config& cfg, int world_size) {
  const double hi = static_cast<double>(cfg.integer("/max_bytes"));
  const double elem = static_cast<double>(c10::elementSize(dtype_of(cfg.str("/dtype"))));
  MemoryEstimate e;
  e.add("send, receive and expected buffers", "/max_bytes", 3 * hi);
  e.add("verification temporaries (index, bool mask)", "/max_bytes, /dtype", hi / elem * 9);
  e.times(world_size, "processes (/nproc)");
  return e;
}

}  // namespace

Experiment collectives_experiment() {
  return {"collectives",
          "nccl-tests-style table of c10d collectives (Gloo/NCCL): time, algbw, busbw and #wrong per message size",
          collectives_spec, run_collectives, validate_collectives, collectives_memory, Processes::Multi,
          dist_fault_plan};
}

}  // namespace mpt
