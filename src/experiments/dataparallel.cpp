/*
 * mpt dataparallel — data parallelism proven in miniature, then run for real across
 * processes through PyTorch's own distributed engine (c10d, Gloo on CPU).
 *
 *  1. equivalence: Linear(8,16)-ReLU-Linear(16,1), MSE, a batch of 64 from randn. The
 *     gradient of the mean loss over the whole batch equals the average of the gradients
 *     of 4 equal shards (each on an identical copy of the model):
 *         ∇ (1/B) Σ_i l_i = (1/K) Σ_k ∇ (1/b) Σ_{i∈k} l_i      when every shard has b = B/K.
 *     The table gives the max abs difference per parameter: roundoff (~1e-8).
 *  2. uneven: 65 samples in 3 shards (22, 22, 21). The naive average (1/K) Σ_k g_k is
 *     biased (~1e-3); the sample-weighted average Σ_k (n_k/N) g_k is exact again.
 *  3. training: real processes (`--nproc N`), each reading its shard of Fashion-MNIST
 *     through a distributed sampler (global batch fixed as N changes), gradients averaged
 *     by a DDP-style reducer (core/dist): rank 0's parameters broadcast at start, buckets
 *     in reverse parameter order (first 1 MB, then 25 MB), all-reduce launched from the
 *     gradient hooks (overlap) or after backward. Checked every step: replicas identical
 *     (a checksum compared across ranks); at the end: parameters equal a single-process
 *     run on the same global batches within /check/tolerance.
 *  4. no_sync: gradient accumulation that communicates on the last micro-step only gives
 *     the same update as communicating on every micro-step.
 *  5. fp16: summing fp16 gradients of ~30000 from 4 ranks overflows (> 65504) before the
 *     division by the world size; dividing first stays finite.
 *  Timings per N: compute, all-reduce, exposed all-reduce, algbw/busbw (nccl-tests:
 *  busbw = algbw · 2(N−1)/N), scaling efficiency T_1 / (N · T_N).
 *
 * Sections 1-2 (dataparallel_equivalence.cpp) draw in tests/parity/dataparallel_ref.py's
 * order (model, inputs, targets), so they agree with PyTorch-Python bit for bit.
 *
 *   mpt dataparallel                      # 4 processes on this machine, sweep N = 1, 2, 4
 *   mpt dataparallel --nproc 2 --set train.nprocs=[1,2]
 *   torchrun --nproc_per_node 2 --no-python mpt dataparallel
 */
#include <algorithm>
#include <cmath>

#include "core/io/data.hpp"
#include "core/dist/dist.hpp"
#include "core/parallel/ddp.hpp"
#include "core/errors.hpp"
#include "core/models/mlp.hpp"
#include "core/runtime/runtime.hpp"
#include "core/experiment.hpp"
#include "core/process_plan.hpp"
#include "core/runtime/trace.hpp"
#include "core/parallel/reference.hpp"
#include "core/runtime/timing.hpp"
#include "experiments/dataparallel_parts.hpp"

namespace mpt {

namespace {

using torch::indexing::Slice;

ConfigSpec dataparallel_spec() {
  ConfigSpec s;
  s.integer("/seed", 1, "seed before building each model (torch.manual_seed)", 0);
  s.integer("/nproc", 4, "worker processes spawned on this machine (--nproc N); ignored under torchrun/SLURM", 1,
            64);
  s.integer("/equivalence/batch", 64, "samples in the even case", 1, 1 << 20);
  s.integer("/equivalence/shards", 4, "shards (replicas) in the even case", 1, 1024);
  s.integer("/equivalence/uneven_samples", 65, "samples in the uneven case (exercise 3)", 1, 1 << 20);
  s.integer("/equivalence/uneven_shards", 3, "shards in the uneven case (torch.tensor_split sizes)", 1, 1024);
  s.integer("/equivalence/in_dim", 8, "input features of Linear(in, hidden)-ReLU-Linear(hidden, 1)", 1, 4096);
  s.integer("/equivalence/hidden", 16, "hidden units", 1, 4096);
  s.boolean("/train/enabled", true, "run the multi-process training part");
  s.integers("/train/nprocs", {1, 2, 4}, "group sizes N to train with (each <= the number of processes)", 1, 64);
  s.integer("/train/samples", 2048, "Fashion-MNIST training samples used (the first ones, then shuffled)", 1, 60000);
  s.integer("/train/global_batch", 64, "samples per step over all ranks (a multiple of every N)", 1, 60000);
  s.integer("/train/max_steps", 16, "steps per run (0: until a rank runs out of full batches)", 0);
  s.integer("/train/hidden", 128, "hidden units of the MLP 784-hidden-10", 1, 8192);
  s.number("/train/lr", 0.05, "SGD learning rate", 0.0);
  s.integer("/train/micro_steps", 2, "micro-steps per step in the no_sync comparison", 1, 64);
  s.integer("/train/nosync_steps", 4, "steps of the no_sync comparison (0: skip it)", 0);
  s.string("/data/dir", kFashionMnistDir, "folder with Fashion-MNIST's IDX .gz files");
  Param cap{ParamType::Number, 25.0, "bucket cap in MB (2^20 bytes), DDP's bucket_cap_mb"};
  cap.exclusive_min = 0.0;
  s.add("/ddp/bucket_cap_mb", cap);
  Param first{ParamType::Number, 1.0, "cap of the first bucket in MB (DDP: 1 MB, so communication starts early)"};
  first.exclusive_min = 0.0;
  s.add("/ddp/first_bucket_cap_mb", first);
  s.boolean("/ddp/overlap", true, "launch each bucket's all-reduce from the gradient hooks, during backward");
  s.choice("/ddp/divide", "before", {"before", "after"}, "divide by the world size before the sum (DDP) or after");
  add_dist_keys(s, DistKeys{"step", 2, 63, false});
  s.number("/fp16/grad", 30000.0, "gradient value every rank holds in the fp16 demonstration", 0.0, 65504.0);
  s.integer("/fp16/ranks", 4, "ranks in the in-process fp16 demonstration", 1, 1024);
  s.number("/check/tolerance", 1e-5, "max abs difference allowed between data-parallel and single-process parameters",
           0.0);
  s.distinct("/train/nprocs");  // each names a row
  return s;
}

// ----------------------------------------------------------------------------
// 3-4. Real data-parallel training across processes
// ----------------------------------------------------------------------------
/// The options of a training run (/seed, /train/*, /ddp/*), where it runs and who fails.
struct TrainSetup {
  int64_t seed = 1, global_batch = 64, max_steps = 0, hidden = 128, micro_steps = 1;
  double lr = 0.05;
  bool sync_every_micro_step = true;  // false: DDP's no_sync on all but the last micro-step
  dist::ReducerOptions ropts;
  const World* faults = nullptr;  // whose fault_point() each step passes (null: none, e.g. the no_sync runs)
  torch::Device device = torch::kCPU;  // this rank's device: CPU (Gloo) or its own GPU (NCCL)
};

/// What a training run measured: steps, buckets, losses, replica spread, final parameters, times.
struct TrainOut {
  int64_t steps = 0, used = 0, dropped = 0, buckets = 0, bytes = 0;
  double final_loss = 0, replica_dev = 0;
  std::vector<double> losses;  // the global loss of every step
  torch::Tensor params;  // final parameters, flattened
  // Per step, after a warm-up step: medians over the timed steps (core/runtime/timing's rule). A
  // few steps of every run wait 4-6 ms (a time slice) for the all-reduce when the ranks' main
  // threads and Gloo's threads outnumber the cores; a mean of 60 such steps moved 1.3-1.5x from
  // run to run, the median does not (docs/performance.md, "The DDP step's spread").
  double step_s = 0, compute_s = 0, exposed_s = 0, allreduce_s = 0;
};

/// One step's micro-steps on this rank's local batch (x, y): forward, backward (the overlapped
/// buckets' all-reduces start from the gradient hooks) and the reducer's wait, communicating on
/// every micro-step or, with no_sync, on the last only. Returns {exposed seconds, loss sum}.
std::pair<double, double> micro_steps(torch::nn::Sequential& net, dist::Reducer& reducer, const torch::Tensor& x,
                                      const torch::Tensor& y, const TrainSetup& ts) {
  clear_grads(net->parameters());  // zero_grad(set_to_none=True)
  auto xs = x.tensor_split(ts.micro_steps), ys = y.tensor_split(ts.micro_steps);
  double exposed = 0, loss_sum = 0;
  for (int64_t m = 0; m < ts.micro_steps; ++m) {
    const bool last = m + 1 == ts.micro_steps;
    reducer.set_sync(last || ts.sync_every_micro_step);
    torch::Tensor loss;
    {
      trace::Scope f(trace::Track::Compute, "forward");  // timeline slices (--trace; core/runtime/trace)
      loss = torch::cross_entropy_loss(net->forward(xs[m]), ys[m]) / static_cast<double>(ts.micro_steps);
    }
    {
      trace::Scope bw(trace::Track::Compute, "backward");  // the overlapped buckets' all-reduces start here
      loss.backward();
    }
    loss_sum += loss.item<double>();
    trace::Scope waiting(trace::Track::Compute, "wait all-reduce");  // Reducer::finalize: the exposed part
    exposed += reducer.finalize();
  }
  return {exposed, loss_sum};
}

/// The spread of a parameter checksum across the ranks of `g` (max − min; 0 = identical
/// replicas, NaN once diverged), one all-reduce of (c, −c) with MAX.
double replica_spread(const torch::nn::Sequential& net, dist::Group& g, const torch::TensorOptions& on_device) {
  double c = 0;
  {
    torch::NoGradGuard ng;
    for (const auto& p : net->parameters()) c += p.to(torch::kFloat64).sum().item<double>();
  }
  auto cs = torch::tensor({c, -c}, on_device.dtype(torch::kFloat64));
  g.allreduce(cs, dist::ReduceOp::Max);
  return cs[0].item<double>() + cs[1].item<double>();
}

/// Rank r of `g` trains on its DistributedSampler shard of the permutation
/// (reference::shard_of, drop_last) in local batches of global_batch/N, until a rank has no
/// full local batch left or /train/max_steps; gradients averaged by the DDP-style reducer.
TrainOut train(const Dataset& data, const torch::Tensor& perm, const std::shared_ptr<dist::Group>& g,
               const TrainSetup& ts) {
  const int64_t n = g->size(), r = g->rank(), b = ts.global_batch / n;
  seed_all(static_cast<std::uint64_t>(ts.seed));
  auto net = mlp(784, {ts.hidden}, 10);
  net->to(ts.device);
  const auto on_device = torch::TensorOptions().device(ts.device);
  dist::Reducer reducer(net->parameters(), g, ts.ropts);  // broadcasts rank 0's parameters
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(ts.lr));
  const torch::Tensor shard = reference::shard_of(perm, r, n);
  TrainOut out;
  out.buckets = static_cast<int64_t>(reducer.buckets().size());
  out.bytes = reducer.total_bytes();
  std::vector<double> t_step, t_comp, t_exp;
  for (int64_t s = 0;; ++s) {
    // Every rank says whether it still has a full local batch; all stop together.
    const bool mine = (s + 1) * b <= shard.size(0) && (ts.max_steps == 0 || s < ts.max_steps);
    auto flag = torch::tensor({mine ? 1.0f : 0.0f}, on_device);
    g->allreduce(flag, dist::ReduceOp::Min);
    if (flag.item<float>() == 0.0f) break;
    if (ts.faults) ts.faults->fault_point(s);  // tests of failure handling: /fault/rank stops here
    g->job()->note_progress();  // ranks waiting for this one (N smaller than the world) see it work
    const double t0 = now_seconds();
    auto idx = shard.index({Slice(s * b, (s + 1) * b)});
    auto x = data.images.index_select(0, idx).to(ts.device), y = data.labels.index_select(0, idx).to(ts.device);
    const auto [exposed, loss_sum] = micro_steps(net, reducer, x, y, ts);
    const double t1 = now_seconds();  // finalize() waited for the device
    {
      trace::Scope o(trace::Track::Optimizer, "optimizer.step");
      opt.step();
      sync_device(ts.device);
    }
    const double t2 = now_seconds();  // the step ends here; what follows is checking
    out.replica_dev = nan_max(out.replica_dev, replica_spread(net, *g, on_device));  // 0: identical; nan: diverged
    auto l = torch::tensor({loss_sum / n}, on_device.dtype(torch::kFloat64));
    g->allreduce(l);
    out.final_loss = l.item<double>();
    out.losses.push_back(out.final_loss);
    if (s > 0) {  // step 0 is a warm-up
      t_step.push_back(t2 - t0);
      t_comp.push_back((t1 - t0) - exposed);
      t_exp.push_back(exposed);
    }
    out.steps = s + 1;
  }
  out.step_s = median_of(t_step);
  out.compute_s = median_of(t_comp);
  out.exposed_s = median_of(t_exp);
  out.allreduce_s = reducer.time_allreduce(5);
  // Samples the sampler could not use: what is left once a shard has no full local batch (every
  // shard holds floor(samples / N): drop_last).
  const int64_t data_steps = shard.size(0) / b;
  out.used = out.steps * ts.global_batch;
  out.dropped = perm.size(0) - data_steps * ts.global_batch;
  out.params = reference::flat(net->parameters());
  return out;
}

/// The fraction of all-reduce time hidden behind backward on this rank, from the recorded
/// timeline (core/runtime/trace): the buckets' all-reduce slices (communication track, args.bucket) that
/// lie inside backward slices (compute track), over the total all-reduce time
/// (trace::overlap_fraction). `allreduce_us` receives the total all-reduce time, microseconds.
double hidden_behind_backward(const std::vector<trace::Event>& ev, double* allreduce_us) {
  trace::Intervals comm, backward;
  for (const auto& e : ev) {
    if (e.ph != 'X') continue;
    if (e.tid == static_cast<int>(trace::Track::Comm) && e.args.is_object() && e.args.contains("bucket"))
      comm.emplace_back(e.ts_us, e.ts_us + e.dur_us);
    if (e.tid == static_cast<int>(trace::Track::Compute) && e.name == "backward")
      backward.emplace_back(e.ts_us, e.ts_us + e.dur_us);
  }
  double total = 0;
  for (const auto& c : comm) total += c.second - c.first;
  if (allreduce_us) *allreduce_us = total;
  return trace::overlap_fraction(comm, backward);
}

/// The same global batches in one process (reference::replay, WholeBatch): the concatenation of
/// every rank's local batch, one backward, the same SGD; the final parameters, flattened.
/// `w`: this rank's World, whose peers wait meanwhile (they see each step as progress).
torch::Tensor single_process(const Dataset& data, const torch::Tensor& perm, int64_t n, int64_t steps,
                             const TrainSetup& ts, const World& w) {
  const int64_t b = ts.global_batch / n;
  seed_all(static_cast<std::uint64_t>(ts.seed));
  auto net = mlp(784, {ts.hidden}, 10);
  net->to(ts.device);  // the same device as the ranks: the same kernels
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(ts.lr));
  std::vector<torch::Tensor> shards;
  for (int64_t r = 0; r < n; ++r) shards.push_back(reference::shard_of(perm, r, n));
  reference::ReplaySpec spec;
  spec.ranks = n;
  spec.steps = steps;
  spec.mode = reference::Mode::WholeBatch;
  spec.every_step = false;
  spec.on_step = [&w] { w.note_progress(); };
  const auto local = [&](int64_t r, int64_t s) {
    auto idx = shards[static_cast<std::size_t>(r)].index({Slice(s * b, (s + 1) * b)});
    return std::make_pair(data.images.index_select(0, idx).to(ts.device),
                          data.labels.index_select(0, idx).to(ts.device));
  };
  const auto loss = [&](const auto& x, const auto& y) { return torch::cross_entropy_loss(net->forward(x), y); };
  return reference::replay(net->parameters(), opt, loss, local, spec).params.back();
}

/// The training options of the config (no fault point, the CPU: run_training sets them).
TrainSetup train_setup(const Config& cfg) {
  TrainSetup ts;
  ts.seed = cfg.integer("/seed");
  ts.global_batch = cfg.integer("/train/global_batch");
  ts.max_steps = cfg.integer("/train/max_steps");
  ts.hidden = cfg.integer("/train/hidden");
  ts.lr = cfg.number("/train/lr");
  ts.ropts.bucket_cap_mb = cfg.number("/ddp/bucket_cap_mb");
  ts.ropts.first_bucket_cap_mb = cfg.number("/ddp/first_bucket_cap_mb");
  ts.ropts.overlap = cfg.boolean("/ddp/overlap");
  ts.ropts.divide_before = cfg.str("/ddp/divide") == "before";
  return ts;
}

/// The tables of sections 3-4 (rank 0 fills them) and the worst values of their checks.
struct TrainingTables {
  Table t, tm, ov;
  double t1 = 0, worst_dev = 0, worst_match = 0;  // t1: the step time at N = 1
};

/// The tables of sections 3-4, empty: titles and columns (global batch gb).
TrainingTables training_tables(const TrainSetup& ts, int64_t gb) {
  TrainingTables tt;
  tt.t = Table{"training",
               fmt::format("Data-parallel training on Fashion-MNIST (MLP 784-{}-10, global batch {}, SGD lr {:g})",
                           ts.hidden, gb, ts.lr),
               {text_col("name", "N"), int_col("buckets", "buckets"), int_col("bytes", "grad", "bytes"),
                int_col("steps", "steps"), int_col("dropped", "dropped", "samples"), float_col("final_loss", "loss"),
                sci_col("replica_dev", "replica dev"), sci_col("vs_single", "vs 1-proc")}};
  tt.tm = Table{"per_n", "Step time per N (run-dependent: stored under timings)",
                {text_col("name", "N"), float_col("step_ms", "step", "ms"), float_col("compute_ms", "compute", "ms"),
                 float_col("allreduce_ms", "all-reduce", "ms"), float_col("exposed_ms", "exposed", "ms"),
                 float_col("algbw", "algbw", "GB/s"), float_col("busbw", "busbw", "GB/s"),
                 pct_col("efficiency", "efficiency", 1)}};
  // Overlap from the timeline (recorded with or without --trace: trace::Capture): the fraction
  // of the buckets' all-reduce time that ran while backward was still computing, per N, with
  // the configured /ddp/overlap, and once with it flipped for the largest N > 1.
  tt.ov = Table{"overlap", "All-reduce hidden behind backward, from the recorded timeline (rank 0; run-dependent)",
                {text_col("name", "run"), int_col("n", "N"), text_col("overlap", "overlap"),
                 int_col("steps", "steps"), float_col("allreduce_ms", "all-reduce/step", "ms"),
                 float_col("exposed_ms", "exposed/step", "ms"), pct_col("hidden", "hidden", 1)}};
  return tt;
}

/// A row of the overlap table: run `o` with N = n under `setup`, from its timeline `ev`.
void overlap_row(Table& ov, int64_t n, const TrainSetup& ts, const TrainOut& o, const std::vector<trace::Event>& ev) {
  double ar_us = 0;
  const double hidden = hidden_behind_backward(ev, &ar_us);
  const double steps = static_cast<double>(std::max<int64_t>(1, o.steps));
  ov.rows.push_back({{"name", fmt::format("n{}.overlap_{}", n, ts.ropts.overlap ? "on" : "off")}, {"n", n},
                     {"overlap", ts.ropts.overlap ? "on" : "off"}, {"steps", o.steps},
                     {"allreduce_ms", ar_us / steps / 1e3}, {"exposed_ms", o.exposed_s * 1e3}, {"hidden", hidden}});
}

/// Section 3: a run for every N of the sweep on ranks 0 .. N-1 (the others wait in the
/// barrier), rank 0 checking it against one process; rows of the training, per-N and overlap tables.
void sweep(World& w, const Dataset& data, const torch::Tensor& perm, const TrainSetup& ts,
           const std::vector<int64_t>& ns, TrainingTables& tt, Report& report) {
  const int64_t rank = w.rank();
  for (int64_t n : ns) {
    TrainOut o;
    if (rank < n) {
      auto g = w.new_group(fmt::format("train_n{}/", n), static_cast<int>(n), ts.device);
      trace::Capture cap(fmt::format("n{}.overlap_{}", n, ts.ropts.overlap ? "on" : "off"));
      o = train(data, perm, g, ts);
      if (rank == 0 && n > 1) overlap_row(tt.ov, n, ts, o, cap.events());
    }
    // Rank 0 checks against one process (as long again as its training): the other ranks wait
    // in the barrier below, which waits as long as rank 0 makes progress (heartbeats), however
    // long that is compared with /dist/timeout_s.
    if (rank == 0) {
      const double match = max_abs_diff(o.params, single_process(data, perm, n, o.steps, ts, w));
      // nan_max: a diverged run's nan must fail the checks below, not vanish in std::max
      tt.worst_dev = nan_max(tt.worst_dev, o.replica_dev);
      tt.worst_match = nan_max(tt.worst_match, match);
      note_divergence(report, tt.t, fmt::format("N={}", n), o.losses);
      tt.t.rows.push_back({{"name", fmt::format("n{}", n)}, {"buckets", o.buckets}, {"bytes", o.bytes},
                           {"steps", o.steps}, {"dropped", o.dropped}, {"final_loss", o.final_loss},
                           {"replica_dev", o.replica_dev}, {"vs_single", match}});
      if (n == 1) tt.t1 = o.step_s;
      const double algbw = o.allreduce_s > 0 ? o.bytes / o.allreduce_s / 1e9 : 0.0;
      const double busbw = algbw * 2.0 * (n - 1) / n;
      const double eff = tt.t1 > 0 ? tt.t1 / (n * o.step_s) : 0.0;
      tt.tm.rows.push_back({{"name", fmt::format("n{}", n)}, {"step_ms", o.step_s * 1e3},
                            {"compute_ms", o.compute_s * 1e3}, {"allreduce_ms", o.allreduce_s * 1e3},
                            {"exposed_ms", o.exposed_s * 1e3}, {"algbw", algbw}, {"busbw", busbw}, {"efficiency", eff}});
    }
    w.group()->barrier();
  }
}

/// The same training with /ddp/overlap flipped, for the largest N > 1: overlap on vs off.
void overlap_flipped(World& w, const Dataset& data, const torch::Tensor& perm, const TrainSetup& ts,
                     const std::vector<int64_t>& ns, TrainingTables& tt) {
  const int64_t n_max = ns.empty() ? 1 : *std::max_element(ns.begin(), ns.end());
  if (n_max <= 1) return;
  TrainSetup flipped = ts;
  flipped.ropts.overlap = !ts.ropts.overlap;
  flipped.faults = nullptr;
  if (w.rank() < n_max) {
    auto g = w.new_group(fmt::format("train_n{}_flipped/", n_max), static_cast<int>(n_max), ts.device);
    trace::Capture cap(fmt::format("n{}.overlap_{}", n_max, flipped.ropts.overlap ? "on" : "off"));
    const TrainOut o = train(data, perm, g, flipped);
    if (w.rank() == 0) overlap_row(tt.ov, n_max, flipped, o, cap.events());
  }
  w.group()->barrier();
}

/// Section 4, no_sync: accumulate micro-steps locally, communicate on the last one only, against
/// communicating on every micro-step, on all the processes (results.no_sync and a check).
void no_sync_check(const Config& cfg, Report& report, World& w, const Dataset& data, const torch::Tensor& perm,
                   const TrainSetup& ts, int64_t world) {
  const int64_t nsteps = cfg.integer("/train/nosync_steps");
  if (nsteps <= 0) return;
  const std::shared_ptr<dist::Group> world_group = w.group();
  TrainSetup a = ts, b = ts;
  a.max_steps = b.max_steps = nsteps;
  a.micro_steps = b.micro_steps = cfg.integer("/train/micro_steps");
  a.faults = b.faults = nullptr;
  a.device = b.device = world_group->device();  // the world group is Gloo: CPU tensors
  b.sync_every_micro_step = false;
  TrainOut oa = train(data, perm, world_group, a), ob = train(data, perm, world_group, b);
  const double d = max_abs_diff(oa.params, ob.params);
  report.results["no_sync"] = {{"world_size", world}, {"micro_steps", a.micro_steps}, {"steps", oa.steps},
                               {"max_abs_diff", d}};
  report.check(fmt::format("no_sync (N={}, {} micro-steps): max |params sync-every - sync-last|", world,
                           a.micro_steps),
               d, cfg.number("/check/tolerance"));
}

/// Section 5 across processes: fp16 gradients through a real Gloo all-reduce among all of them,
/// raised to 1.25·65504/N where needed so that the sum overflows.
void fp16_gloo_row(const Config& cfg, World& w, int64_t world, Table& fp16) {
  if (world <= 1) return;
  const double gval = std::max(cfg.number("/fp16/grad"), 65504.0 / world * 1.25);
  auto h = torch::full({1024}, gval, torch::kFloat16);
  auto sum_first = h.clone();
  w.group()->allreduce(sum_first);
  sum_first = sum_first / static_cast<double>(world);
  auto div_first = h / static_cast<double>(world);
  w.group()->allreduce(div_first);
  fp16.rows.push_back({{"name", fmt::format("gloo_{}_ranks", world)}, {"ranks", world},
                       {"grad", h[0].item<double>()}, {"sum_then_divide", sum_first[0].item<double>()},
                       {"divide_then_sum", div_first[0].item<double>()}});
}

/// Rank 0: the notes, checks and tables of sections 3-4 (the per-N and overlap tables under timings).
void report_training(const Config& cfg, Report& report, TrainingTables& tt, int64_t world) {
  Table& t = tt.t;
  t.notes.push_back("replica dev: max over steps of (max - min across ranks) of a parameter checksum; 0 = identical");
  t.notes.push_back("vs 1-proc: max |param| difference from one process training on the same global batches "
                    "(summation order differs: roundoff)");
  t.notes.push_back("dropped: samples left when the first rank runs out of full local batches (ranks agree each step "
                    "with an all-reduce MIN of 'I still have data'); /train/max_steps may stop earlier");
  for (int64_t n : cfg.integers("/train/nprocs"))
    if (n > world) t.notes.push_back(fmt::format("N = {} skipped: only {} process(es); run with --nproc {}", n, world, n));
  report.add(std::move(t));
  report.check("replicas identical after every step (checksum max - min across ranks)", tt.worst_dev, 0.0);
  report.check("data-parallel vs single-process parameters (max abs diff)", tt.worst_match,
               cfg.number("/check/tolerance"));
  tt.tm.notes.push_back("compute = forward+backward (overlapped all-reduce runs meanwhile); exposed = waiting for the "
                        "all-reduce after backward; all-reduce = the buckets all-reduced alone (5 iterations)");
  tt.tm.notes.push_back("algbw = bytes / all-reduce time; busbw = algbw * 2(N-1)/N (nccl-tests); efficiency = T1/(N*TN)");
  report.add(std::move(tt.tm), Store::TimingsByName);  // timings.per_n.n<N>
  if (!tt.ov.rows.empty()) {
    tt.ov.notes.push_back("all-reduce: each bucket's slice from its start (posted, and the group's previous collective "
                          "done: Gloo runs them in order) to its completion (the Work's future); hidden = the part of "
                          "it inside backward / all of it, over every step (trace::overlap_fraction)");
    tt.ov.notes.push_back("overlap on: buckets launched from the gradient hooks during backward (DDP); off: after "
                          "backward, so nothing can hide (hidden ~ 0)");
    report.add(std::move(tt.ov), Store::TimingsByName);  // timings.overlap.n<N>.overlap_<on|off>
  }
}

/// Sections 3-5 across processes: the N sweep, the overlap comparison, the no_sync comparison
/// and the real fp16 all-reduce row.
void run_training(const Context& ctx, Report& report, Table& fp16) {
  const auto& cfg = ctx.cfg;
  const int64_t world = ctx.world_size;
  std::vector<int64_t> ns;
  for (int64_t n : cfg.integers("/train/nprocs"))  // validate_dataparallel checked that N divides the batch
    if (n <= world) ns.push_back(n);
  World& w = *ctx.world;
  w.group();  // every rank, Gloo: formed before the data loads
  const Dataset data = load_fashion_mnist(cfg.str("/data/dir"), "train", cfg.integer("/train/samples"));
  const torch::Tensor perm = shuffled_indices(data.size(), static_cast<std::uint64_t>(cfg.integer("/seed")));
  TrainSetup ts = train_setup(cfg);
  ts.faults = &w;
  // On CUDA every rank trains on its own GPU (the World's device: local rank) over NCCL, as DDP
  // does; the world group (flags, barriers, the fp16 demonstration) stays on Gloo.
  ts.device = w.device();
  TrainingTables tt = training_tables(ts, cfg.integer("/train/global_batch"));
  sweep(w, data, perm, ts, ns, tt, report);
  overlap_flipped(w, data, perm, ts, ns, tt);
  no_sync_check(cfg, report, w, data, perm, ts, world);
  fp16_gloo_row(cfg, w, world, fp16);
  if (ctx.rank == 0) report_training(cfg, report, tt, world);
}

Report run_dataparallel(const Context& ctx) {
  Report report;
  double t0 = now_seconds();
  report.add(dataparallel::equivalence_table(ctx.cfg, report));
  report.add(dataparallel::uneven_table(ctx.cfg, report));
  report.timings["equivalence_s"] = now_seconds() - t0;

  // 5. fp16: sum-then-divide overflows where divide-then-sum stays finite (in one process;
  // run_training adds a row through a real Gloo all-reduce).
  Table fp16 = dataparallel::fp16_table(ctx.cfg);
  if (ctx.cfg.boolean("/train/enabled")) {
    t0 = now_seconds();
    run_training(ctx, report, fp16);
    report.timings["training_s"] = now_seconds() - t0;
  }
  fp16.notes.push_back("fp16 max is 65504: the sum of N gradients overflows to inf before the division "
                       "(DDP divides first for this reason; /ddp/divide picks the order for training's fp32 buckets)");
  fp16.notes.push_back("the Gloo row (with more than one process) sends fp16 buffers through a real all-reduce; "
                       "its per-rank gradient is raised to 1.25*65504/N if needed so the sum overflows");
  for (const auto& row : fp16.rows)
    report.check(fmt::format("fp16 {}: divide-then-sum finite (1 = not finite)", row["name"].get<std::string>()),
                 std::isfinite(row["divide_then_sum"].get<double>()) ? 0.0 : 1.0, 0.0);
  if (ctx.rank == 0) report.add(std::move(fp16));
  return report;
}

/// Memory of a run (core/runtime/memory), per process, times the processes spawned on this machine:
/// the equivalence part (Linear(in, hidden)-ReLU-Linear(hidden, 1) on the even and the uneven
/// batch: the model, its shard replicas' gradients and the reference, shards + 4 parameter-
/// sized tensors; 3 per sample and unit), the training part (the MLP 784-hidden-10 of each rank
/// with its gradients, the flat gradient buckets, the single-process reference model and its
/// gradients: 6; 3 per sample and unit of the global batch) and the loaded samples (784 floats
/// and an int64 label each). The parts run one after the other: the larger one counts.
MemoryEstimate dataparallel_memory(const Config& cfg, int world_size) {
  const int64_t in = cfg.integer("/equivalence/in_dim"), hidden = cfg.integer("/equivalence/hidden");
  const int64_t batch = std::max(cfg.integer("/equivalence/batch"), cfg.integer("/equivalence/uneven_samples"));
  const double shards = static_cast<double>(std::max(cfg.integer("/equivalence/shards"),
                                                     cfg.integer("/equivalence/uneven_shards")));
  MemoryEstimate eq;
  add_mlp_training(eq, "equivalence net", {in, hidden, 1}, batch, shards + 4, 3,
                   "/equivalence/in_dim, /equivalence/hidden, /equivalence/shards",
                   "/equivalence/batch, /equivalence/uneven_samples, /equivalence/in_dim, /equivalence/hidden");
  MemoryEstimate e = eq;
  if (cfg.boolean("/train/enabled")) {
    MemoryEstimate train;
    add_mlp_training(train, "training MLP", {784, cfg.integer("/train/hidden"), 10}, cfg.integer("/train/global_batch"),
                     6, 3, "/train/hidden", "/train/global_batch, /train/hidden");
    train.add("Fashion-MNIST images and labels", "/train/samples",
              fashion_mnist_bytes(cfg.integer("/train/samples")));
    if (train.total() > e.total()) e = train;
  }
  e.times(world_size, "processes (/nproc)");
  return e;
}

// The training section's checks (validate_dataparallel): every N divides the global batch, at
// least one N fits the processes, the samples give at least one full step, the fault rank exists
// and trains, and the fault step is one of its steps.
void validate_training(const Config& cfg, int world_size, int64_t gb) {
  std::vector<int64_t> runnable;
  for (int64_t n : cfg.integers("/train/nprocs")) {
    if (gb % n != 0)
      throw ConfigError(fmt::format("/train/global_batch: expected a multiple of every N in /train/nprocs, got {} "
                                    "(N = {})", gb, n));
    if (n <= world_size) runnable.push_back(n);
  }
  if (runnable.empty())
    throw ConfigError(fmt::format("/train/nprocs: expected at least one N <= the {} process(es) of this run, got {}; "
                                  "run with --nproc N (or list a smaller N)",
                                  world_size, json(cfg.integers("/train/nprocs")).dump()));
  if (cfg.integer("/train/samples") < gb)
    throw ConfigError(fmt::format("/train/samples: expected at least /train/global_batch = {} samples (one full step), "
                                  "got {}", gb, cfg.integer("/train/samples")));
  const int64_t fault = cfg.integer("/fault/rank");
  if (fault >= world_size)
    throw ConfigError(fmt::format("/fault/rank: expected -1 or a rank 0 .. {}, got {}", world_size - 1, fault));
  if (fault < 0) return;
  // The fault point is passed by the ranks of each run of the N sweep (train: step s, 0-based);
  // the run with N ranks takes min(/train/max_steps, floor(floor(samples / N) / (global_batch / N)))
  // steps (every rank's shard of the permutation holds floor(samples / N) samples at least; all
  // stop when one runs out of full local batches). A step no run reaches never fails: the run
  // would "pass" a test of failure handling without any failure.
  const int64_t samples = cfg.integer("/train/samples"), max_steps = cfg.integer("/train/max_steps");
  int64_t last = -1;  // the last step /fault/rank takes part in
  for (int64_t n : runnable) {
    if (fault >= n) continue;  // rank `fault` is not in this run's group
    int64_t steps = (samples / n) / (gb / n);
    if (max_steps > 0) steps = std::min(steps, max_steps);
    last = std::max(last, steps - 1);
  }
  if (last < 0)
    throw ConfigError(fmt::format("/fault/rank: expected a rank that trains (below the largest N of /train/nprocs "
                                  "that fits the {} process(es): {}), got {}",
                                  world_size, *std::max_element(runnable.begin(), runnable.end()), fault));
  if (cfg.integer("/fault/step") > last)
    throw ConfigError(fmt::format("/fault/step: expected a step 0 .. {} (the last step rank {} trains: /train/max_steps, "
                                  "/train/samples / /train/global_batch), got {}",
                                  last, fault, cfg.integer("/fault/step")));
}

/// Cross-key checks before any work and any worker (exit 2 naming the keys): the training
/// section's (validate_training), then the equivalence section's shard counts.
void validate_dataparallel(const Config& cfg, int world_size) {
  const int64_t gb = cfg.integer("/train/global_batch");
  if (cfg.boolean("/train/enabled")) validate_training(cfg, world_size, gb);
  // Only the training runs pass the fault point: without them a fault never happens.
  else if (cfg.integer("/fault/rank") >= 0)
    throw ConfigError(fmt::format("/fault/rank: expected -1 with /train/enabled = false (only the training runs pass "
                                  "the fault point), got {}", cfg.integer("/fault/rank")));
  const int64_t n = cfg.integer("/equivalence/batch"), k = cfg.integer("/equivalence/shards");
  if (k > n) throw ConfigError(fmt::format("/equivalence/shards: expected at most /equivalence/batch ({}), got {}", n, k));
  const int64_t un = cfg.integer("/equivalence/uneven_samples"), uk = cfg.integer("/equivalence/uneven_shards");
  if (uk > un)
    throw ConfigError(fmt::format("/equivalence/uneven_shards: expected at most /equivalence/uneven_samples ({}), got {}",
                                  un, uk));
  if (cfg.boolean("/train/enabled")) require_fashion_mnist(cfg.str("/data/dir"), "/data/dir", /*with_test=*/false);
}

/// dist_fault_plan; without /train/enabled nothing runs across processes (the other sections run
/// in one process), so `--set train.enabled=false` runs there without spawning /nproc idle workers.
ProcessPlan dataparallel_plan(const Config& cfg) {
  ProcessPlan p = dist_fault_plan(cfg);
  if (!cfg.boolean("/train/enabled")) p.one_process_because = "/train/enabled is false";
  return p;
}

}  // namespace

Experiment dataparallel_experiment() {
  return {"dataparallel",
          "Data parallelism: shard-average equivalence, then real multi-process training with a DDP-style reducer",
          dataparallel_spec, run_dataparallel, validate_dataparallel, dataparallel_memory, Processes::Multi,
          dataparallel_plan};
}

}  // namespace mpt
