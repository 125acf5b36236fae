/*
 * mpt shard — sharded data parallelism: ZeRO stages 0-3 (Rajbhandari et al. 2020) with
 * FSDP2's per-parameter dim-0 sharding, trained for real across processes (c10d, Gloo on CPU),
 * each stage proven equal to DDP and to one process, step by step.
 *
 * Ψ parameters, N ranks, optimizer states of K bytes per parameter. A data-parallel rank of
 * DDP (stage 0) holds everything; ZeRO shards, per stage, one more of the model states:
 *   stage 1  optimizer states (fp32 master + Adam's m, v)   bytes/rank  bpΨ + bgΨ + KΨ/N
 *   stage 2  + gradients (reduce-scatter instead of all-reduce)         bpΨ + (bg + K)Ψ/N
 *   stage 3  + parameters (all-gather before forward and backward)      (bp + bg + K)Ψ/N
 * (the paper's mixed-precision case: bp = bg = 2, K = 12 → 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N).
 * Communication per step and rank, ring algorithm: DDP's all-reduce = reduce-scatter +
 * all-gather = 2Ψ elements; stages 1-2 the same 2Ψ (reduce-scatter the gradients, all-gather
 * the updated parameters); stage 3 3Ψ (all-gather in forward, again in backward, reduce-scatter).
 *
 *  1. training: the Fashion-MNIST MLP (core/models/mlp' mlp(784, hidden, 10)) or, with
 *     /model/name = gpt, the tiny GPT (core/models/gpt, character-level on Debian's fortunes text),
 *     every stage from the same initial weights and the same global batches (MLP: rank r reads
 *     samples r, r+N, ... of a fixed permutation, as DistributedSampler; GPT: every rank draws
 *     the same global batch of sequences from one seeded generator and takes sequences r, r+N,
 *     ...), micro-batches accumulated, Adam or SGD. The MLP is sharded per Linear at stage 3
 *     (FSDP2's per-module groups), the GPT as one group (fully_shard on the root alone).
 *  2. equivalence, every step: the parameters of each stage vs the DDP run and vs one process
 *     accumulating the same local batches in rank order (bitwise where the sums are in the
 *     same order: N ≤ 2 — one addition is commutative and ÷2 exact), and vs one process on the
 *     whole batch (different GEMM blocking: reported). N > 2: every gradient reduction against
 *     the float64 sum of its own terms, within (γ_{N−1} + γ⁽⁶⁴⁾_{N−1})·Σ|t| (Higham eq. 3.5:
 *     any order of N terms), a row and a check per run (dist::reduction_error).
 *  3. memory per rank: bytes of parameters, gradients and optimizer states held, counted from
 *     the tensors, against the formulas for the dtypes in use; the allocator's peak per step.
 *  4. communication per step: bytes counted by the process group (core/dist/group's counters)
 *     against the formulas.
 *  5. mixed precision (FSDP2 MixedPrecisionPolicy): bf16 parameters with fp32 or bf16 gradient
 *     reduction against fp32, on an fp32 master shard.
 *
 *   mpt shard                                   # 2 processes, stages 0-3, Adam
 *   mpt shard --nproc 4 --config configs/shard_n4.json
 *   mpt shard --config configs/shard_gpt.json         # the tiny GPT, 2 processes
 *   torchrun --nproc_per_node 2 --no-python mpt shard
 */
#include <algorithm>
#include <cmath>

#include "core/runtime/compat.hpp"
#include "core/io/data.hpp"
#include "core/dist/dist.hpp"
#include "core/parallel/reference.hpp"
#include "core/parallel/zero.hpp"
#include "core/errors.hpp"
#include "core/experiment.hpp"
#include "core/models/gpt.hpp"
#include "core/models/gpt_spec.hpp"
#include "core/process_plan.hpp"
#include "core/models/mlp.hpp"
#include "core/runtime/runtime.hpp"
#include "core/runtime/timing.hpp"
#include "experiments/shard_parts.hpp"

namespace mpt {

namespace {

using shard::Plan;
using shard::References;
using shard::RunOut;
using shard::RunSpec;
using shard::Setup;
using torch::indexing::None;
using torch::indexing::Slice;

ConfigSpec shard_spec() {
  ConfigSpec s;
  s.integer("/seed", 1, "seed before building each model (torch.manual_seed) and of the data order", 0);
  s.integer("/nproc", 2, "worker processes spawned on this machine (--nproc N); ignored under torchrun/SLURM", 1,
            64);
  s.choice("/model/name", "mlp", {"mlp", "gpt"},
           "mlp: the Fashion-MNIST MLP 784-hidden...-10; gpt: the tiny GPT (core/models/gpt) on the fortunes text");
  s.integers("/model/hidden", {128}, "hidden widths of the MLP 784-hidden...-10 (/model/name = mlp)", 1, 8192);
  add_gpt_keys(s, "/model/gpt", GptKeyDefaults{/*layers=*/2, /*width=*/32, /*heads=*/4, /*context=*/32,
                                               /*mlp_ratio=*/4});
  s.integers("/train/stages", {0, 1, 2, 3}, "ZeRO stages to train (0 = DDP); each is compared with stage 0", 0, 3);
  s.integer("/train/samples", 2048, "Fashion-MNIST training samples used (the first ones, then shuffled; mlp)", 1,
            60000);
  s.integer("/train/global_batch", 64,
            "samples (mlp) or sequences of /model/gpt/context tokens (gpt) per step over all ranks (a multiple of N x "
            "micro_batches)", 1, 60000);
  s.integer("/train/micro_batches", 2, "micro-batches per rank and step (gradient accumulation)", 1, 1024);
  s.integer("/train/steps", 12, "optimizer steps per run", 1, 100000);
  s.choice("/optimizer/name", "adam", {"adam", "sgd"}, "torch.optim.Adam or torch.optim.SGD");
  s.number("/optimizer/lr", 1e-3, "learning rate", 0.0);
  // torch.optim.Adam requires 0 <= beta < 1
  Param beta1{ParamType::Number, 0.9, "Adam beta1, in [0, 1)", 0.0};
  beta1.exclusive_max = 1.0;
  s.add("/optimizer/beta1", beta1);
  Param beta2{ParamType::Number, 0.999, "Adam beta2, in [0, 1)", 0.0};
  beta2.exclusive_max = 1.0;
  s.add("/optimizer/beta2", beta2);
  s.number("/optimizer/eps", 1e-8, "Adam eps", 0.0);
  s.number("/optimizer/weight_decay", 0.0, "L2 weight decay (both optimizers)", 0.0);
  s.number("/optimizer/momentum", 0.0, "SGD momentum (a state of 4 bytes per parameter when > 0)", 0.0, 1.0);
  s.choice("/mixed/param_dtype", "fp32", {"fp32", "bf16"},
           "compute dtype of the training runs (FSDP2 MixedPrecisionPolicy.param_dtype)");
  s.choice("/mixed/reduce_dtype", "fp32", {"fp32", "bf16"}, "gradient reduction dtype of the training runs");
  s.boolean("/mixed/compare", true, "train /mixed/stage with bf16 parameters (fp32 and bf16 reduction) vs fp32");
  s.integer("/mixed/stage", 3, "the ZeRO stage of the mixed-precision comparison", 0, 3);
  s.boolean("/zero/reduce_every_micro_batch", false,
            "stages 2-3: reduce-scatter after every micro-batch (DeepSpeed) instead of after the last (FSDP2 no-sync)");
  s.boolean("/zero/compare_every_micro_batch", true,
            "also train stage 2 with the other /zero/reduce_every_micro_batch setting and report the difference");
  s.string("/data/dir", kFashionMnistDir, "folder with Fashion-MNIST's IDX .gz files (mlp)");
  add_text_keys(s, "/data");  // the GPT's corpus: /data/text_dir, /data/text_files
  add_dist_keys(s, DistKeys{"step (of the first run)", 2, 63, true});
  s.distinct("/train/stages");  // each names a row
  return s;
}

torch::ScalarType dtype_of(const std::string& name) { return name == "bf16" ? torch::kBFloat16 : torch::kFloat32; }

std::vector<int64_t> hidden_of(const Config& cfg) {
  std::vector<int64_t> h;
  for (auto v : cfg.integers("/model/hidden")) h.push_back(v);
  return h;
}

/// The training options of the config.
Setup setup_of(const Config& cfg) {
  Setup s;
  s.seed = cfg.integer("/seed");
  s.global_batch = cfg.integer("/train/global_batch");
  s.micro = cfg.integer("/train/micro_batches");
  s.steps = cfg.integer("/train/steps");
  s.hidden = hidden_of(cfg);
  s.optimizer = cfg.str("/optimizer/name");
  s.lr = cfg.number("/optimizer/lr");
  s.beta1 = cfg.number("/optimizer/beta1");
  s.beta2 = cfg.number("/optimizer/beta2");
  s.eps = cfg.number("/optimizer/eps");
  s.weight_decay = cfg.number("/optimizer/weight_decay");
  s.momentum = cfg.number("/optimizer/momentum");
  return s;
}

/// torch.optim.Adam / SGD with the config's options, over `params` (full tensors or shards).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Setup& s, std::vector<torch::Tensor> params) {
  if (s.optimizer == "adam")
    return std::make_unique<torch::optim::Adam>(
        params, torch::optim::AdamOptions(s.lr).betas(std::make_tuple(s.beta1, s.beta2)).eps(s.eps).weight_decay(
                    s.weight_decay));
  return std::make_unique<torch::optim::SGD>(
      params, torch::optim::SGDOptions(s.lr).momentum(s.momentum).weight_decay(s.weight_decay));
}

// ----------------------------------------------------------------------------
// The model and its data: the MLP on Fashion-MNIST or the tiny GPT on the fortunes text
// ----------------------------------------------------------------------------

/// One model of a run, built from torch.manual_seed(seed): the MLP (a Sequential of Linears,
/// sharded per Linear at stage 3) or the tiny GPT (sharded as one parameter group).
struct Net {
  torch::nn::Sequential mlp{nullptr};
  TinyGpt gpt{nullptr};
  std::vector<torch::Tensor> parameters() const { return mlp ? mlp->parameters() : gpt->parameters(); }
  torch::Tensor forward(const torch::Tensor& x) { return mlp ? mlp->forward(x) : gpt->forward(x); }
};

/// What every run trains on. MLP: rank r's samples of step t are perm[r::N][t·b, (t+1)·b)
/// (DistributedSampler over a fixed permutation). GPT: step t's global batch of B sequences is
/// drawn by text_batch (nanoGPT's get_batch) from one generator seeded with /seed, identically
/// on every rank; rank r takes sequences r, r+N, ... of it (DistributedSampler's split of a
/// global batch), b = B/N of them.
struct Workload {
  bool gpt = false;
  std::vector<int64_t> hidden;
  GptConfig gc;
  Dataset data;       // mlp
  torch::Tensor perm; // mlp: [samples]
  torch::Tensor x, y; // gpt: [steps, B, T] int64 inputs and next-token targets

  Net build(int64_t seed) const {
    seed_all(static_cast<std::uint64_t>(seed));
    Net net;
    if (gpt)
      net.gpt = TinyGpt(gc);
    else
      net.mlp = mlp(784, hidden, 10);
    return net;
  }
  /// Rank r's local batch of step `step` (b rows): inputs and targets.
  std::pair<torch::Tensor, torch::Tensor> local(int64_t r, int64_t n, int64_t step, int64_t b) const {
    if (gpt) {
      const auto rows = Slice(r, None, n);
      return {x[step].index({rows}), y[step].index({rows})};
    }
    auto idx = reference::shard_of(perm, r, n).index({Slice(step * b, (step + 1) * b)});
    return {data.images.index_select(0, idx), data.labels.index_select(0, idx)};
  }
  /// Mean cross-entropy: logits [b, 10] vs labels, or [b, T, V] vs next tokens (gpt_loss).
  torch::Tensor loss(const torch::Tensor& out, const torch::Tensor& target) const {
    return gpt ? gpt_loss(out, target) : torch::cross_entropy_loss(out, target);
  }
};

/// The workload of the config: Fashion-MNIST and its permutation (mlp), or the corpus, the GPT's
/// shape and every step's global batch [steps, B, T] (gpt). Throws RuntimeFailure for missing
/// data files; std::invalid_argument from text_batch for a corpus not longer than the context.
Workload workload_of(const Config& cfg, const Setup& s) {
  Workload wl;
  wl.gpt = cfg.str("/model/name") == "gpt";
  wl.hidden = s.hidden;
  if (!wl.gpt) {
    wl.data = load_fashion_mnist(cfg.str("/data/dir"), "train", cfg.integer("/train/samples"));
    wl.perm = shuffled_indices(wl.data.size(), static_cast<std::uint64_t>(s.seed));
    return wl;
  }
  const TextCorpus corpus = load_text_corpus_at(cfg, "/data");
  wl.gc = gpt_config_at(cfg, "/model/gpt", corpus.vocab());
  auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<std::uint64_t>(s.seed));
  std::vector<torch::Tensor> xs, ys;
  for (int64_t t = 0; t < s.steps; ++t) {
    auto [x, y] = text_batch(corpus.train, s.global_batch, wl.gc.context, gen);
    xs.push_back(x);
    ys.push_back(y);
  }
  wl.x = torch::stack(xs);
  wl.y = torch::stack(ys);
  return wl;
}

// ----------------------------------------------------------------------------
// References in one process
// ----------------------------------------------------------------------------

/// One process, LibTorch's own modules and optimizer, on the N ranks' local batches
/// (reference::replay): each step the gradient is the sum, in rank order, of (local gradient of
/// rank r) / N, each local gradient accumulated over the micro-batches as the ranks do
/// (whole = false); or the mean over the whole global batch in one backward (whole = true).
/// Returns the flat parameters after every step and the losses. `w`: this rank's World; its
/// peers wait meanwhile and see every step as progress.
reference::Trajectory single_process(const Workload& wl, int64_t n, const Setup& s, bool whole, const World& w) {
  Net net = wl.build(s.seed);
  auto opt = make_optimizer(s, net.parameters());
  const int64_t b = s.global_batch / n;
  reference::ReplaySpec spec;
  spec.ranks = n;
  spec.steps = s.steps;
  spec.micro_batches = s.micro;
  spec.mode = whole ? reference::Mode::WholeBatch : reference::Mode::RankByRank;
  spec.on_step = [&w] { w.note_progress(); };  // the other ranks wait for this one in a barrier
  return reference::replay(
      net.parameters(), *opt, [&](const auto& x, const auto& y) { return wl.loss(net.forward(x), y); },
      [&](int64_t r, int64_t step) { return wl.local(r, n, step, b); }, spec);
}

// ----------------------------------------------------------------------------
// One sharded run
// ----------------------------------------------------------------------------

RunOut train(const Workload& wl, World& w, const Setup& s, const RunSpec& spec, int index, bool faults) {
  const int n = w.size(), r = w.rank();
  const int64_t b = s.global_batch / n;
  auto g = w.new_group(fmt::format("shard_{}/", index), n, torch::kCPU);
  Net net = wl.build(s.seed);
  auto factory = [&](auto ps) { return make_optimizer(s, std::move(ps)); };
  // The MLP: sharded per Linear (FSDP2's per-module groups); the GPT: one group, the root.
  auto model = net.mlp ? std::make_unique<dist::ShardedDataParallel>(net.mlp, g, spec.opts, factory)
                       : std::make_unique<dist::ShardedDataParallel>(
                             net.gpt.ptr(), [gpt = net.gpt](const torch::Tensor& x) mutable { return gpt->forward(x); },
                             g, spec.opts, factory);
  g->reset_comm_counts();  // the initial broadcast is not a training step's traffic
  RunOut out;
  out.numel = model->numel();
  out.padded = model->padded_numel();
  std::map<std::string, dist::CommCount> comm;
  std::vector<double> timed;  // steps >= 1, seconds
  for (int64_t step = 0; step < s.steps; ++step) {
    if (faults) w.fault_point(step);
    w.note_progress();
    auto [x, y] = wl.local(r, n, step, b);
    auto xs = x.tensor_split(s.micro);
    auto ys = y.tensor_split(s.micro);
    PeakScope peak(torch::kCPU);
    const double t0 = now_seconds();
    double local = 0;
    for (int64_t m = 0; m < s.micro; ++m) {
      auto logits = model->forward(xs[m]).to(torch::kFloat32);
      auto loss = wl.loss(logits, ys[m]) / static_cast<double>(s.micro);
      model->backward(loss, m + 1 == s.micro);
      local += loss.item<double>();
    }
    model->step();
    if (step > 0) {
      timed.push_back(now_seconds() - t0);
      out.transient_peak = std::max(out.transient_peak, peak.peak_bytes());
    }
    // Outside the step: the global loss and the parameters for the equivalence check.
    const auto counts = g->comm_counts();
    if (spec.opts.record_reductions) {  // N > 2: this step's reductions vs their exact sums and bound
      const auto e = dist::reduction_error(*g, model->take_reductions());
      out.red.max_abs_diff = std::max(out.red.max_abs_diff, e.max_abs_diff);
      out.red.max_bound = std::max(out.red.max_bound, e.max_bound);
      out.red.max_ratio = std::max(out.red.max_ratio, e.max_ratio);
      out.red.elements += e.elements;
    }
    auto l = torch::tensor({local}, torch::kFloat64);
    w.group()->allreduce(l);
    out.losses.push_back(l.item<double>() / n);
    auto full = reference::flat(model->full_parameters());
    if (r == 0) out.params.push_back(full);
    g->reset_comm_counts();
    for (const auto& kv : counts) {
      auto& c = comm[kv.first];
      c.calls += kv.second.calls;
      c.payload_bytes += kv.second.payload_bytes;
      c.sent_bytes += kv.second.sent_bytes;
    }
  }
  out.comm = comm;
  // The median over steps >= 1 (core/runtime/timing.hpp's statistic: a late start of one step, common
  // with two ranks on two cores, moves a mean, not the median).
  out.step_s = median_of(timed);
  // Memory: the largest over the ranks (the first ranks hold the larger shards).
  const dist::HeldBytes h = model->held_peak();
  auto m = torch::tensor({h.params, h.grads, h.optimizer, out.transient_peak}, torch::kInt64).to(torch::kFloat64);
  w.group()->allreduce(m, dist::ReduceOp::Max);
  out.held.params = static_cast<int64_t>(m[0].item<double>());
  out.held.grads = static_cast<int64_t>(m[1].item<double>());
  out.held.optimizer = static_cast<int64_t>(m[2].item<double>());
  out.transient_peak = static_cast<int64_t>(m[3].item<double>());
  return out;
}

// ----------------------------------------------------------------------------
// The experiment
// ----------------------------------------------------------------------------

/// The runs, in order: every stage of /train/stages (stage 0 first, added as the DDP baseline
/// when absent), then stage 2 with the other micro-batch reduction, then the mixed-precision
/// policies at /mixed/stage (bf16 parameters where this LibTorch's bf16 GEMM runs; bf16
/// reduction where its Gloo sums bf16).
Plan plan_runs(const Config& cfg, const Setup& s, int n) {
  Plan p;
  const torch::ScalarType pd = dtype_of(cfg.str("/mixed/param_dtype")), rd = dtype_of(cfg.str("/mixed/reduce_dtype"));
  const bool every = cfg.boolean("/zero/reduce_every_micro_batch");
  p.every = every;
  p.fp32 = pd == torch::kFloat32 && rd == torch::kFloat32;
  auto add = [&](std::string name, int stage, torch::ScalarType param, torch::ScalarType reduce, bool each) {
    RunSpec r{std::move(name), {}};
    r.opts.stage = stage;
    r.opts.param_dtype = param;
    r.opts.reduce_dtype = reduce;
    r.opts.reduce_every_micro_batch = each;
    p.runs.push_back(r);
  };
  const auto stages = cfg.integers("/train/stages");
  if (stages.empty() || stages.front() != 0)  // the DDP baseline every stage is compared with
    add("stage0", 0, pd, rd, false);
  for (auto st : stages) add(fmt::format("stage{}", st), static_cast<int>(st), pd, rd, every);
  p.main_runs = p.runs.size();
  if (cfg.boolean("/zero/compare_every_micro_batch") && s.micro > 1)
    add(every ? "stage2_reduce_after_last" : "stage2_reduce_every_micro_batch", 2, pd, rd, !every);
  p.mixed_first = p.runs.size();
  p.mixed_stage = static_cast<int>(cfg.integer("/mixed/stage"));
  p.bf16 = probe_kernels(torch::kCPU, torch::kBFloat16);
  if (cfg.boolean("/mixed/compare")) {
    std::vector<std::pair<std::string, std::string>> policies{{"fp32", "fp32"}};
    if (p.bf16.runs) policies.emplace_back("bf16", "fp32");  // where this LibTorch's bf16 GEMM runs
    if (p.bf16.runs && compat::kTorch2) policies.emplace_back("bf16", "bf16");  // 1.13's Gloo cannot sum bf16
    for (const auto& [param, reduce] : policies)
      add(fmt::format("stage{}_{}_{}", p.mixed_stage, param, reduce), p.mixed_stage, dtype_of(param), dtype_of(reduce),
          every);
  }
  // N > 2: Gloo's collectives add the N terms in another order than DDP's / one process's, so
  // every reduction is checked against the exact sum of its own summands within a derived bound.
  for (auto& r : p.runs) r.opts.record_reductions = n > 2;
  return p;
}

/// Section 1: the single-process references, on rank 0; the others wait in the barrier. The
/// group forms first, so that rank 0's heartbeat tells the waiting ranks it is working, not gone.
References references(const Workload& wl, World& w, const Setup& s) {
  w.group();
  References refs;
  if (w.rank() == 0) {
    refs.same = single_process(wl, w.size(), s, /*whole=*/false, w);
    refs.whole = single_process(wl, w.size(), s, /*whole=*/true, w);
  }
  w.group()->barrier();
  return refs;
}

/// The tiny GPT's shape for the equivalence table's title (empty for the MLP).
std::string model_description(const Workload& wl) {
  if (!wl.gpt) return std::string();
  return fmt::format("tiny GPT: {} layer{}, width {}, {} heads, context {}, vocabulary {}, {} parameters",
                     wl.gc.layers, wl.gc.layers == 1 ? "" : "s", wl.gc.width, wl.gc.heads, wl.gc.context, wl.gc.vocab,
                     gpt_num_params(wl.gc));
}

Report run_shard(const Context& ctx) {
  const auto& cfg = ctx.cfg;
  Report report;
  World& w = *ctx.world;
  const int n = w.size();
  const Setup s = setup_of(cfg);
  install_counting_allocator();  // before the tensors whose peaks are measured
  const Workload wl = workload_of(cfg, s);
  // What the shards' Gloo groups run (also env.dist, from the harness).
  report.env["shard_reduce_scatter"] = dist::collective_algorithm("gloo", w.gloo_algorithm(), "reduce_scatter");
  report.env["shard_all_gather"] = dist::collective_algorithm("gloo", w.gloo_algorithm(), "all_gather");
  report.env["shard_world_size"] = n;

  // 1. The references in one process; 2. the runs: every stage, the other micro-batch
  // reduction, mixed precision.
  const References refs = references(wl, w, s);
  const Plan plan = plan_runs(cfg, s, n);
  std::vector<RunOut> outs;
  for (std::size_t i = 0; i < plan.runs.size(); ++i)
    outs.push_back(train(wl, w, s, plan.runs[i], static_cast<int>(i), /*faults=*/i == 0));
  if (w.rank() != 0) return report;

  const shard::Results res{plan, outs, refs, s, n, wl.gpt, model_description(wl)};
  report.add(shard::equivalence_table(report, res));  // 3. every step, vs DDP and one process
  if (n > 2) report.add(shard::reduction_table(report, res));
  report.add(shard::loss_table(res));
  auto [mem, peak] = shard::memory_tables(report, res);  // 4. bytes per rank vs the formulas
  report.add(std::move(mem));
  report.add(std::move(peak), Store::Timings);
  report.add(shard::comm_table(report, res, w.gloo_algorithm()));  // 5. bytes per step vs the formulas
  if (cfg.boolean("/mixed/compare")) report.add(shard::mixed_table(report, res));  // 6. bf16 vs fp32
  return report;
}


/// Memory (core/runtime/memory) per process, times the processes of this machine: the MLP's model
/// states of the largest stage (16 bytes per parameter: parameters, gradients, Adam's m, v,
/// plus a master copy), the single-process references (rank 0: two models and the flat
/// parameters of every step of every run), activations of a local batch, and the data set.
/// The GPT: two models' states at 24 B/param, the activations of a whole global batch
/// (Korthikanti et al. 2022's per-block count in fp32, vocabulary ≤ 96), the flat parameters
/// of every step, the token batches.
MemoryEstimate shard_memory(const Config& cfg, int world_size) {
  const double runs = static_cast<double>(cfg.integers("/train/stages").size()) + 5;
  if (cfg.str("/model/name") == "gpt") {
    const GptConfig g = gpt_config_at(cfg, "/model/gpt", 96);  // at most 96 characters (clean_fortune_text)
    const double P = static_cast<double>(gpt_num_params(g));
    const double B = static_cast<double>(cfg.integer("/train/global_batch")), T = static_cast<double>(g.context),
                 C = static_cast<double>(g.width), a = static_cast<double>(g.heads), L = static_cast<double>(g.layers);
    MemoryEstimate e;
    // two models at once (a reference and a run), each 24 B/param: fp32 parameters, gradients,
    // Adam's m and v, an fp32 master, a gathered or accumulated copy
    e.add("tiny GPT model states, a run and a reference (2 x 24 B/param)", "/model/gpt/width, /model/gpt/layers",
          2 * 24 * P);
    // Korthikanti et al. 2022's sbh(34 + 5as/h) bytes per block for 16-bit values, as fp32 (x2),
    // for the whole global batch (the whole-batch reference), plus the logits and their gradient
    e.add("tiny GPT activations of a global batch (Korthikanti et al. 2022, fp32; logits)",
          "/train/global_batch, /model/gpt/context, /model/gpt/width, /model/gpt/heads, /model/gpt/layers",
          gpt_activation_bytes(L, T, B, C, a, 96));
    e.add("flat parameters of every step (rank 0)", "/train/steps, /train/stages, /model/gpt",
          runs * static_cast<double>(cfg.integer("/train/steps")) * P * 4);
    e.add("token batches of every step", "/train/steps, /train/global_batch, /model/gpt/context",
          2.0 * static_cast<double>(cfg.integer("/train/steps")) * B * T * 8);
    e.times(world_size, "processes (/nproc)");
    return e;
  }
  std::vector<int64_t> widths{784};
  for (auto h : cfg.integers("/model/hidden")) widths.push_back(h);
  widths.push_back(10);
  const double P = mlp_param_count(widths);
  MemoryEstimate e;
  add_mlp_training(e, "MLP model states and references", widths, cfg.integer("/train/global_batch"), 24, 4,
                   "/model/hidden", "/train/global_batch, /model/hidden");
  e.add("flat parameters of every step (rank 0)", "/train/steps, /train/stages, /model/hidden",
        runs * static_cast<double>(cfg.integer("/train/steps")) * P * 4);
  e.add("Fashion-MNIST images and labels", "/train/samples",
        fashion_mnist_bytes(cfg.integer("/train/samples")));
  e.times(world_size, "processes (/nproc)");
  return e;
}

/// Cross-key checks before any work and any worker (exit 2 naming the keys).
void validate_shard(const Config& cfg, int world_size) {
  const int64_t gb = cfg.integer("/train/global_batch"), m = cfg.integer("/train/micro_batches");
  if (gb % (world_size * m) != 0)
    throw ConfigError(fmt::format("/train/global_batch: expected a multiple of N x /train/micro_batches = {} x {} = "
                                  "{} (every rank's local batch splits into equal micro-batches), got {}",
                                  world_size, m, world_size * m, gb));
  const bool gpt = cfg.str("/model/name") == "gpt";
  if (gpt) {
    // heads divide the width; text files whose training split has more tokens than the context
    validate_gpt_keys(cfg, "/model/gpt", "/data", /*validation_windows=*/false);
  }
  const int64_t steps = cfg.integer("/train/steps"), samples = cfg.integer("/train/samples");
  if (!gpt && steps * gb > samples)
    throw ConfigError(fmt::format("/train/samples: expected at least /train/steps x /train/global_batch = {} x {} = {} "
                                  "(every step reads new samples), got {}", steps, gb, steps * gb, samples));
  bool stage3 = cfg.integer("/mixed/stage") == 3 && cfg.boolean("/mixed/compare");
  for (auto st : cfg.integers("/train/stages")) stage3 |= st == 3;
  if (stage3 && gpt) {
    // Every GPT parameter's dim 0 is the width C (LayerNorms, c_proj's weight and biases), 3C,
    // 4C (c_attn, c_fc), the context T (wpe) or the vocabulary V (wte, lm_head).
    for (const char* key : {"/model/gpt/width", "/model/gpt/context"})
      if (cfg.integer(key) < world_size)
        throw ConfigError(fmt::format("{}: stage 3 (/train/stages or /mixed/stage) shards every GPT parameter along "
                                      "dim 0 over N = {} ranks: expected >= {}, got {}",
                                      key, world_size, world_size, cfg.integer(key)));
    // V is the corpus's: read it (small text files) before any worker starts. A corpus that
    // cannot be read is left to the run, which says so (exit 3); this check needs only V.
    int64_t v = world_size;
    if (world_size > 1) {
      try {
        v = load_text_corpus_at(cfg, "/data").vocab();
      } catch (const RuntimeFailure&) {
      }
      if (v < world_size)
        throw ConfigError(fmt::format("/data/text_files: stage 3 shards wte and lm_head ({} rows: the corpus's "
                                      "characters) over N = {} ranks: expected a vocabulary of >= {}, got {}",
                                      v, world_size, world_size, v));
    }
  }
  if (stage3 && !gpt) {
    for (auto h : cfg.integers("/model/hidden"))
      if (h < world_size)
        throw ConfigError(fmt::format("/model/hidden: stage 3 (/train/stages or /mixed/stage) shards every parameter "
                                      "along dim 0 over N = {} ranks: expected every width >= {}, got {}",
                                      world_size, world_size, h));
    if (10 < world_size)
      throw ConfigError(fmt::format("/nproc: stage 3 (/train/stages or /mixed/stage) shards the output layer's 10 "
                                    "rows over the ranks: expected at most 10 ranks, got {}", world_size));
  }
  if (cfg.str("/mixed/param_dtype") == "bf16") {
    const KernelProbe bf16 = probe_kernels(torch::kCPU, torch::kBFloat16);
    if (!bf16.runs)
      throw ConfigError("/mixed/param_dtype: expected fp32: this LibTorch's bf16 matrix product does not run here (" +
                        bf16.reason + "), got \"bf16\"");
  }
  if (!compat::kTorch2 && cfg.str("/mixed/reduce_dtype") == "bf16")
    throw ConfigError("/mixed/reduce_dtype: expected fp32 with LibTorch " + compat::torch_version() +
                      " (its Gloo has no bf16 all-reduce or reduce-scatter), got \"bf16\"");
  const int64_t fault = cfg.integer("/fault/rank");
  if (fault >= world_size)
    throw ConfigError(fmt::format("/fault/rank: expected -1 or a rank 0 .. {}, got {}", world_size - 1, fault));
  if (cfg.integer("/fault/step") >= steps && fault >= 0)
    throw ConfigError(fmt::format("/fault/step: expected a step < /train/steps = {}, got {}", steps,
                                  cfg.integer("/fault/step")));
  // Checked once here, not by every rank at load (each would print the same exit-3 failure).
  if (!gpt) require_fashion_mnist(cfg.str("/data/dir"), "/data/dir", /*with_test=*/false);
}

}  // namespace

Experiment shard_experiment() {
  return {"shard",
          "Sharded data parallelism: ZeRO stages 0-3 (FSDP2 dim-0 shards) on the MLP or the tiny GPT, each equal to DDP and one process; bytes "
          "per rank and per step against the formulas",
          shard_spec, run_shard, validate_shard, shard_memory, Processes::Multi, dist_fault_plan};
}

}  // namespace mpt
