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
#include <cmath>
#include <map>
#include <set>

#include "core/runtime/compat.hpp"
#include "core/io/data.hpp"
#include "core/dist/dist.hpp"
#include "core/parallel/zero.hpp"
#include "core/errors.hpp"
#include "core/experiment.hpp"
#include "core/models/gpt.hpp"
#include "core/models/gpt_spec.hpp"
#include "core/process_plan.hpp"
#include "core/models/mlp.hpp"
#include "core/runtime/runtime.hpp"

namespace mpt {

namespace {

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
  s.number("/dist/timeout_s", 30.0, "timeout of every collective and of the rendezvous (seconds)", 0.1, 3600.0);
  s.choice("/dist/gloo_algorithm", "native", {"native", "ring"},
           "how Gloo (CPU) runs reduce-scatter and all-gather: native (c10d ProcessGroupGloo's; LibTorch 1.13 has no "
           "reduce_scatter, so that one is the ring there) or ring (mpt's send/recv ring: N-1 steps, chunk j summed "
           "in rank order from j+1, docs/shard.md); NCCL (CUDA) ignores it");
  s.integer("/fault/rank", -1, "for testing: this rank fails at /fault/step (-1: none)", -1, 63);
  s.integer("/fault/step", 2, "for testing: the step (of the first run) at which /fault/rank fails", 0);
  s.choice("/fault/mode", "exit", {"exit", "hang"},
           "for testing: how /fault/rank fails: exit (the process ends) or hang (alive but silent)");
  s.distinct("/train/stages");  // each names a row
  return s;
}

torch::ScalarType dtype_of(const std::string& name) { return name == "bf16" ? torch::kBFloat16 : torch::kFloat32; }
int64_t bytes_of(torch::ScalarType t) { return t == torch::kBFloat16 ? 2 : 4; }

std::vector<int64_t> hidden_of(const Config& cfg) {
  std::vector<int64_t> h;
  for (auto v : cfg.integers("/model/hidden")) h.push_back(v);
  return h;
}

struct Setup {
  int64_t seed = 1, global_batch = 64, micro = 1, steps = 1;
  std::vector<int64_t> hidden;
  std::string optimizer = "adam";
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0, momentum = 0;
};

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

/// Optimizer state bytes per parameter element: Adam's m and v (fp32), SGD's momentum buffer.
int64_t state_bytes(const Setup& s) { return s.optimizer == "adam" ? 8 : (s.momentum > 0 ? 4 : 0); }

/// Rank r's samples of step `step`: the DistributedSampler shard perm[r::n], local batch b.
torch::Tensor local_indices(const torch::Tensor& perm, int64_t r, int64_t n, int64_t step, int64_t b) {
  return perm.index({Slice(r, None, n)}).index({Slice(step * b, (step + 1) * b)});
}

torch::Tensor flat(const std::vector<torch::Tensor>& ts) {
  std::vector<torch::Tensor> v;
  for (const auto& t : ts) v.push_back(t.detach().reshape({-1}).to(torch::kFloat32));
  return torch::cat(v);
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
    auto idx = local_indices(perm, r, n, step, b);
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

/// One process, LibTorch's own modules and optimizer: each step the gradient is the sum, in
/// rank order, of (local gradient of rank r) / N, each local gradient accumulated over the
/// micro-batches as the ranks do (whole = false); or the mean over the whole global batch in
/// one backward (whole = true). Returns the flat parameters after every step and the losses.
/// `w`: this rank's World; its peers wait meanwhile and see every step as progress.
struct Trajectory {
  std::vector<torch::Tensor> params;
  std::vector<double> losses;
};

Trajectory single_process(const Workload& wl, int64_t n, const Setup& s, bool whole, const World& w) {
  Net net = wl.build(s.seed);
  auto opt = make_optimizer(s, net.parameters());
  const int64_t b = s.global_batch / n;
  Trajectory t;
  for (int64_t step = 0; step < s.steps; ++step) {
    w.note_progress();  // the other ranks wait for this one in a barrier
    if (whole) {
      std::vector<torch::Tensor> xs, ys;
      for (int64_t r = 0; r < n; ++r) {
        auto [x, y] = wl.local(r, n, step, b);
        xs.push_back(x);
        ys.push_back(y);
      }
      opt->zero_grad();
      auto loss = wl.loss(net.forward(torch::cat(xs)), torch::cat(ys));
      loss.backward();
      t.losses.push_back(loss.item<double>());
    } else {
      std::vector<torch::Tensor> sum;
      double loss_sum = 0;
      for (int64_t r = 0; r < n; ++r) {
        clear_grads(net.parameters());
        auto [x, y] = wl.local(r, n, step, b);
        auto xs = x.tensor_split(s.micro);
        auto ys = y.tensor_split(s.micro);
        double local = 0;
        for (int64_t m = 0; m < s.micro; ++m) {
          auto loss = wl.loss(net.forward(xs[m]), ys[m]) / static_cast<double>(s.micro);
          loss.backward();
          local += loss.item<double>();
        }
        loss_sum += local;
        const auto ps = net.parameters();
        for (std::size_t i = 0; i < ps.size(); ++i) {
          auto term = n == 1 ? ps[i].grad().clone() : ps[i].grad() / static_cast<double>(n);
          if (r == 0)
            sum.push_back(term);
          else
            sum[i] = sum[i] + term;
        }
      }
      const auto ps = net.parameters();
      for (std::size_t i = 0; i < ps.size(); ++i) ps[i].mutable_grad() = sum[i];
      t.losses.push_back(loss_sum / static_cast<double>(n));
    }
    opt->step();
    t.params.push_back(flat(net.parameters()));
  }
  return t;
}

// ----------------------------------------------------------------------------
// One sharded run
// ----------------------------------------------------------------------------

struct RunSpec {
  std::string name;
  dist::ShardOptions opts;
};

struct RunOut {
  std::vector<double> losses;
  std::vector<torch::Tensor> params;  // rank 0: flat parameters after every step
  dist::HeldBytes held;               // the largest over the ranks, per role
  std::map<std::string, dist::CommCount> comm;  // this rank's counters over the training steps
  int64_t numel = 0, padded = 0;
  double step_s = 0;
  int64_t transient_peak = 0;  // allocator: bytes above a step's start, largest over steps >= 1 and ranks
  dist::ReductionError red;    // N > 2: every gradient reduction vs the exact sum of its terms (maxima)
};

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
    auto full = flat(model->full_parameters());
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
  std::sort(timed.begin(), timed.end());
  out.step_s = timed.empty() ? 0.0 : timed[timed.size() / 2];
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

/// Largest |a - b| over two trajectories of flat parameters (core/models/mlp' max_abs_diff).
double max_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  return max_abs_diff(a, b);
}

// ----------------------------------------------------------------------------
// Formulas
// ----------------------------------------------------------------------------

/// Model-state bytes of one rank by role, as real numbers (a formula's value).
struct Bytes {
  double params = 0, grads = 0, optimizer = 0;
  double total() const { return params + grads + optimizer; }
};

/// Model-state bytes per rank of this implementation (dist::ShardedDataParallel), at the
/// optimizer step: bp = bytes of param_dtype, S = optimizer state bytes per element, Ψ, N.
/// The fp32 master is the parameter itself in fp32 stage 0 and a separate 4-byte copy otherwise
/// (stages 1-2: a shard; stage 3: the sharded parameter is the master, FSDP2's fp32 shard).
/// `sharded` is the element count of the sharded terms: Ψ for the formula, or the elements the
/// largest rank really holds times N (Ψ' = Σ N·ceil(dim0/N)·row size) for its upper bound.
Bytes formula_bytes(int stage, int64_t bp_, int64_t S_, double psi, double sharded, int n) {
  const double bp = static_cast<double>(bp_), S = static_cast<double>(S_), m = bp_ != 4 ? 4.0 : 0.0;
  const double shard = sharded / n;
  Bytes f;
  switch (stage) {
    case 0: f = {bp * psi, bp * psi + m * psi, m * psi + S * psi}; break;
    case 1: f = {bp * psi, bp * psi + 4 * shard, (4 + S) * shard}; break;
    case 2: f = {bp * psi, 4 * shard, (4 + S) * shard}; break;
    default: f = {4 * shard, 4 * shard, S * shard};
  }
  return f;
}

/// x rounded to the nearest integer (bytes for display).
int64_t rounded(double x) { return static_cast<int64_t>(std::llround(x)); }

/// The ZeRO paper's model-state bytes per rank (Rajbhandari et al. 2020, §5, Figure 1) for
/// parameters and gradients of bp bytes and K bytes of optimizer state per element.
double paper_bytes(int stage, double bp, double k, double psi, int n) {
  switch (stage) {
    case 0: return (bp + bp + k) * psi;
    case 1: return bp * psi + bp * psi + k * psi / n;
    case 2: return bp * psi + (bp + k) * psi / n;
    default: return (bp + bp + k) * psi / n;
  }
}

/// Payload bytes per step and rank of each collective kind (what the caller hands to the group:
/// all-reduce buffer, all-gather output, reduce-scatter input; see dist::CommCount), for Ψ
/// elements (Ψ' = padded for the dim-0 sharded collectives) and M micro-batches:
///   stage 0  all-reduce Ψ·b_r;  stages 1-2  reduce-scatter R·Ψ'·b_r + all-gather Ψ'·b_p;
///   stage 3  all-gather 2M·Ψ'·b_p (forward and backward of every micro-batch) + reduce-scatter R·Ψ'·b_r,
/// R = M when reducing every micro-batch (stages 2-3), else 1.
std::map<std::string, double> formula_payload(const dist::ShardOptions& o, double psi, double padded, int64_t micro) {
  const double bp = bytes_of(o.param_dtype), br = bytes_of(o.reduce_dtype);
  const double reductions = o.reduce_every_micro_batch && o.stage >= 2 ? static_cast<double>(micro) : 1.0;
  std::map<std::string, double> f;
  if (o.stage == 0) {
    f["all_reduce"] = psi * br;
  } else if (o.stage < 3) {
    f["reduce_scatter"] = reductions * padded * br;
    f["all_gather"] = padded * bp;
  } else {
    f["all_gather"] = 2.0 * static_cast<double>(micro) * padded * bp;
    f["reduce_scatter"] = reductions * padded * br;
  }
  return f;
}

/// Bytes one rank sends for a payload of `payload` bytes of collective `kind` under the ring
/// algorithm, N ranks: all-reduce 2(N−1)/N, the others (N−1)/N (dist::CommCount).
double ring_sent(const std::string& kind, double payload, int n) {
  return (kind == "all_reduce" ? 2.0 : 1.0) * payload * (n - 1) / n;
}

// ----------------------------------------------------------------------------
// The experiment
// ----------------------------------------------------------------------------

Report run_shard(const Context& ctx) {
  const auto& cfg = ctx.cfg;
  Report report;
  World& w = *ctx.world;
  const int n = w.size(), rank = w.rank();
  const Setup s = setup_of(cfg);
  install_counting_allocator();  // before the tensors whose peaks are measured

  const Workload wl = workload_of(cfg, s);

  // What the shards' Gloo groups run (also env.dist, from the harness).
  report.env["shard_reduce_scatter"] = dist::collective_algorithm("gloo", w.gloo_algorithm(), "reduce_scatter");
  report.env["shard_all_gather"] = dist::collective_algorithm("gloo", w.gloo_algorithm(), "all_gather");
  report.env["shard_world_size"] = n;
  const std::string model_desc =
      wl.gpt ? fmt::format("tiny GPT: {} layer{}, width {}, {} heads, context {}, vocabulary {}, {} parameters",
                           wl.gc.layers, wl.gc.layers == 1 ? "" : "s", wl.gc.width, wl.gc.heads, wl.gc.context, wl.gc.vocab, gpt_num_params(wl.gc))
             : std::string();

  // 1. The references, in one process (rank 0; the others wait in the barrier below). The group
  // forms first, so that rank 0's heartbeat tells the waiting ranks it is working, not gone.
  w.group();
  Trajectory same, whole;
  if (rank == 0) {
    same = single_process(wl, n, s, /*whole=*/false, w);
    whole = single_process(wl, n, s, /*whole=*/true, w);
  }
  w.group()->barrier();

  // 2. The runs: every stage asked for, then the other micro-batch reduction, then mixed precision.
  const torch::ScalarType pd = dtype_of(cfg.str("/mixed/param_dtype")), rd = dtype_of(cfg.str("/mixed/reduce_dtype"));
  const bool every = cfg.boolean("/zero/reduce_every_micro_batch");
  std::vector<RunSpec> runs;
  for (auto st : cfg.integers("/train/stages")) {
    RunSpec r{fmt::format("stage{}", st), {}};
    r.opts.stage = static_cast<int>(st);
    r.opts.param_dtype = pd;
    r.opts.reduce_dtype = rd;
    r.opts.reduce_every_micro_batch = every;
    runs.push_back(r);
  }
  const bool has0 = !runs.empty() && runs.front().opts.stage == 0;
  if (!has0) {  // the DDP baseline every stage is compared with
    RunSpec r{"stage0", {}};
    r.opts.param_dtype = pd;
    r.opts.reduce_dtype = rd;
    runs.insert(runs.begin(), r);
  }
  const std::size_t main_runs = runs.size();
  if (cfg.boolean("/zero/compare_every_micro_batch") && s.micro > 1) {
    RunSpec r{every ? "stage2_reduce_after_last" : "stage2_reduce_every_micro_batch", {}};
    r.opts.stage = 2;
    r.opts.param_dtype = pd;
    r.opts.reduce_dtype = rd;
    r.opts.reduce_every_micro_batch = !every;
    runs.push_back(r);
  }
  const std::size_t mixed_first = runs.size();
  const int mstage = static_cast<int>(cfg.integer("/mixed/stage"));
  const KernelProbe bf16 = probe_kernels(torch::kCPU, torch::kBFloat16);
  if (cfg.boolean("/mixed/compare")) {
    std::vector<std::pair<std::string, std::string>> policies{{"fp32", "fp32"}};
    if (bf16.runs) policies.emplace_back("bf16", "fp32");  // where this LibTorch's bf16 GEMM runs
    if (bf16.runs && compat::kTorch2) policies.emplace_back("bf16", "bf16");  // 1.13's Gloo cannot sum bf16
    for (auto [p, q] : policies) {
      RunSpec r{fmt::format("stage{}_{}_{}", mstage, p, q), {}};
      r.opts.stage = mstage;
      r.opts.param_dtype = dtype_of(p);
      r.opts.reduce_dtype = dtype_of(q);
      r.opts.reduce_every_micro_batch = every;
      runs.push_back(r);
    }
  }
  // N > 2: Gloo's collectives add the N terms in another order than DDP's / one process's, so
  // every reduction is checked against the exact sum of its own summands within a derived bound.
  for (auto& r : runs) r.opts.record_reductions = n > 2;
  std::vector<RunOut> outs;
  for (std::size_t i = 0; i < runs.size(); ++i)
    outs.push_back(train(wl, w, s, runs[i], static_cast<int>(i), /*faults=*/i == 0));
  if (rank != 0) return report;

  // 3. Equivalence, every step.
  const bool order_same = n <= 2;
  const bool fp32 = pd == torch::kFloat32 && rd == torch::kFloat32;
  Table eq{"equivalence",
           fmt::format("Parameters every step vs DDP and vs one process ({} ranks, {} steps, {} micro-batches, {}{})", n,
                       s.steps, s.micro, s.optimizer, wl.gpt ? "; " + model_desc : std::string()),
           {text_col("name", "run"), int_col("stage", "stage"), sci_col("vs_ddp", "vs DDP"),
            sci_col("vs_single", "vs 1-proc"), sci_col("vs_whole_batch", "vs 1-proc whole"),
            float_col("final_loss", "final loss")}};
  const RunOut& ddp = outs[0];
  for (std::size_t i = 0; i < mixed_first; ++i) {
    const RunOut& o = outs[i];
    const double vd = max_diff(o.params, ddp.params), vs = max_diff(o.params, same.params),
                 vw = max_diff(o.params, whole.params);
    eq.rows.push_back({{"name", runs[i].name}, {"stage", runs[i].opts.stage}, {"vs_ddp", vd}, {"vs_single", vs},
                       {"vs_whole_batch", vw}, {"final_loss", o.losses.back()}});
    if (i >= main_runs) continue;  // the other micro-batch order: a different sum (reported)
    // Reducing every micro-batch (stages 2-3 with /zero/reduce_every_micro_batch) sums the N*M
    // terms in another order than DDP's local accumulation: reported, checked below among themselves.
    if (every && runs[i].opts.stage >= 2) continue;
    if (order_same)
      report.check(fmt::format("{}: parameters equal DDP's bitwise, every step (N = {})", runs[i].name, n), vd, 0.0);
    if (order_same && fp32)
      report.check(fmt::format("{}: parameters equal one process's bitwise, every step (N = {})", runs[i].name, n), vs,
                   0.0);
  }
  // Runs whose reductions are the same calls on the same buffers add in the same order at any N:
  // stages 1 and 2 (one reduce-scatter of every gradient after the last micro-batch); with
  // reduce_every_micro_batch at N <= 2, stages 2 and 3 (per micro-batch, accumulated alike).
  auto find = [&](int stage) -> int {
    for (std::size_t i = 0; i < main_runs; ++i)
      if (runs[i].opts.stage == stage) return static_cast<int>(i);
    return -1;
  };
  const int i1 = find(1), i2 = find(2), i3 = find(3);
  if (!order_same && i1 >= 0 && i2 >= 0 && !every)
    report.check("stage2 vs stage1: parameters equal bitwise, every step (the same reduce-scatter)",
                 max_diff(outs[static_cast<std::size_t>(i2)].params, outs[static_cast<std::size_t>(i1)].params), 0.0);
  // The GPT's stage 3 is one parameter group: its one reduce-scatter per step takes the same
  // buffer (every gradient, in order, accumulated alike) as stages 1-2's, so it adds in the same
  // order at any N too (the MLP's stage 3 reduce-scatters per Linear: other buffers, other orders).
  if (!order_same && wl.gpt && i2 >= 0 && i3 >= 0 && !every)
    report.check("stage3 vs stage2: parameters equal bitwise, every step (the GPT: one reduce-scatter of all "
                 "gradients, as stage 2's)",
                 max_diff(outs[static_cast<std::size_t>(i3)].params, outs[static_cast<std::size_t>(i2)].params), 0.0);
  if (order_same && every && i2 >= 0 && i3 >= 0)
    report.check("stage3 vs stage2, reducing every micro-batch: parameters equal bitwise, every step",
                 max_diff(outs[static_cast<std::size_t>(i3)].params, outs[static_cast<std::size_t>(i2)].params), 0.0);
  eq.notes.push_back("max |param difference| over all steps and parameters; 0 = bitwise equal at every step");
  eq.notes.push_back(
      "vs DDP / vs 1-proc: the gradient of every rank is divided by N, then summed over the ranks; with N <= 2 that "
      "sum is one addition (commutative) and /2 is exact, so every stage must match bit for bit. With N > 2 Gloo's "
      "collectives may add the N terms in other orders (the order depends on the algorithm and on an element's place "
      "in the buffer): then only stages 1 and 2 (the same reduce-scatter call) must match each other; the others are "
      "reported (no a-priori bound on parameters after several Adam steps: its update is not Lipschitz in g near 0)");
  eq.notes.push_back("vs 1-proc = one process, LibTorch's own modules and optimizer, accumulating the ranks' local "
                     "batches in rank order; vs 1-proc whole = one backward over the whole global batch (one GEMM "
                     "over B rows instead of N*M over B/(N*M): other rounding, reported, not checked)");
  if (mixed_first > main_runs)
    eq.notes.push_back("stage2_reduce_*: the other micro-batch reduction — a sum of N*M terms in another order "
                       "(sum over ranks of each micro-batch, then over micro-batches): reported, not checked");
  if (wl.gpt)
    eq.notes.push_back(
        "the GPT's embedding gradients (wte, wpe) are index_add sums over a rank's tokens: the same kernel on the same "
        "local batch in every run and in the 1-proc reference, so the N <= 2 argument holds for them too; its stage 3 "
        "gathers the whole model once per forward and once per backward (one FSDP2 group, the root) and recomputes the "
        "forward in backward, which gives the same gradients bit for bit");
  if (!fp32) eq.notes.push_back("the 1-proc references train in fp32; these runs compute in bf16 or reduce in bf16");
  // A run whose loss became nan or inf: said once per run (its differences above are nan: a mismatch).
  for (std::size_t i = 0; i < mixed_first; ++i) note_divergence(report, eq, runs[i].name, outs[i].losses);
  note_divergence(report, eq, "1-proc", same.losses);
  note_divergence(report, eq, "1-proc whole", whole.losses);
  report.add(std::move(eq));

  // The reduction-order bound (N > 2), a row per run: each reduction of each step against the
  // float64 sum of the very terms the ranks sent (dist::reduction_error).
  if (n > 2) {
    Table rb{"reduction_bound",
             fmt::format("Gradient reductions vs the exact sum of their terms, every step ({} ranks: any order of "
                         "{} terms)", n, n),
             {text_col("name", "run"), int_col("stage", "stage"), sci_col("max_abs_diff", "max|d|"),
              sci_col("max_bound", "max bound"), sci_col("max_ratio", "max|d|/bound"),
              int_col("elements", "elements")}};
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const auto& e = outs[i].red;
      rb.rows.push_back({{"name", runs[i].name}, {"stage", runs[i].opts.stage}, {"max_abs_diff", e.max_abs_diff},
                         {"max_bound", e.max_bound}, {"max_ratio", e.max_ratio}, {"elements", e.elements}});
      report.check(fmt::format("{}: every gradient reduction within (g_{{N-1}} + g64_{{N-1}}) sum|t| of the exact sum "
                               "(N = {})", runs[i].name, n),
                   e.max_ratio, 1.0);
    }
    rb.notes.push_back(
        "d = reduced - sum over ranks of the terms t_r (each rank's gradient in the reduce dtype, divided by N, as "
        "sent), the sum in float64; bound = (g_{N-1} + g64_{N-1}) * sum_r |t_r| per element, g_k = k*u/(1 - k*u), u = "
        "2^-24 (fp32) or 2^-8 (bf16) — Higham eq. 3.5: any order of recursive summation of N terms, which ring, "
        "halving-doubling and tree all-reduces / reduce-scatters are; g64 covers the float64 reference");
    rb.notes.push_back(
        "max over steps, micro-batch reductions, elements and ranks (elements: summed over steps, this rank's); "
        "DDP's parameters after several Adam steps have no such a-priori bound (see equivalence): the bound is per "
        "reduction, where the order differs");
    report.add(std::move(rb));
  }

  // Loss curves side by side.
  {
    std::vector<Column> cols{int_col("step", "step")};
    for (std::size_t i = 0; i < main_runs; ++i) cols.push_back(float_col(runs[i].name, runs[i].name));
    cols.push_back(float_col("single", "1-proc"));
    Table lc{"loss", fmt::format("Loss per step (mean over the global batch of {})", s.global_batch), cols};
    for (int64_t t = 0; t < s.steps; ++t) {
      json row = {{"name", fmt::format("step{}", t)}, {"step", t}};
      for (std::size_t i = 0; i < main_runs; ++i) row[runs[i].name] = outs[i].losses[static_cast<std::size_t>(t)];
      row["single"] = same.losses[static_cast<std::size_t>(t)];
      lc.rows.push_back(row);
    }
    lc.notes.push_back("the loss of step t is computed before step t's update; micro-batch losses are summed per rank "
                       "and averaged over the ranks");
    report.add(std::move(lc));
  }

  // 4. Memory per rank against the formulas.
  const int64_t S = state_bytes(s);
  const double psi = static_cast<double>(ddp.numel);
  {
    Table mem{"memory",
              fmt::format("Model states per rank at the optimizer step (Psi = {} parameters, N = {}, {} state {} B/param)",
                          ddp.numel, n, s.optimizer, S),
              {text_col("name", "run"), int_col("params", "params", "bytes"), int_col("params_formula", "formula", "bytes"),
               int_col("grads", "grads", "bytes"), int_col("grads_formula", "formula", "bytes"),
               int_col("optimizer", "optim", "bytes"), int_col("optimizer_formula", "formula", "bytes"),
               int_col("total", "total", "bytes"), int_col("total_formula", "formula", "bytes"),
               int_col("paper", "ZeRO paper", "bytes")}};
    double worst = 0;
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const auto& h = outs[i].held;
      const int st = runs[i].opts.stage;
      const int64_t bp = bytes_of(runs[i].opts.param_dtype);
      const auto f = formula_bytes(st, bp, S, psi, psi, n);
      const double k = (bp != 4 ? 4.0 : 0.0) + static_cast<double>(S);
      mem.rows.push_back({{"name", runs[i].name}, {"params", h.params}, {"params_formula", rounded(f.params)},
                          {"grads", h.grads}, {"grads_formula", rounded(f.grads)}, {"optimizer", h.optimizer},
                          {"optimizer_formula", rounded(f.optimizer)}, {"total", h.total()},
                          {"total_formula", rounded(f.total())},
                          {"paper", rounded(paper_bytes(st, static_cast<double>(bp), k, psi, n))}});
      // Per role: formula(Ψ) <= held <= formula(Ψ'): the largest rank holds ceil(dim0/N) rows of
      // every sharded tensor, Ψ'/N elements (equal when N divides every dim 0).
      const auto up = formula_bytes(st, bp, S, psi, static_cast<double>(outs[i].padded), n);
      const double held[3] = {static_cast<double>(h.params), static_cast<double>(h.grads),
                              static_cast<double>(h.optimizer)};
      const double lo[3] = {f.params, f.grads, f.optimizer}, hi[3] = {up.params, up.grads, up.optimizer};
      for (int q = 0; q < 3; ++q)
        worst = std::max({worst, (held[q] - hi[q]) / std::max(hi[q], 1.0), (lo[q] - held[q]) / std::max(lo[q], 1.0)});
    }
    report.check("memory: held bytes per role outside [formula(Psi), formula(Psi')] (relative, largest rank)", worst,
                 0.0);
    mem.notes.push_back(fmt::format(
        "formula, this implementation (bp = bytes of the param dtype: 4 fp32, 2 bf16; S = {} B optimizer state per "
        "element; fp32 master 4 B): "
        "stage 0 P = bp*Psi, G = bp*Psi (+4Psi fp32 master grads if bp != 4), O = S*Psi (+4Psi master if bp != 4); "
        "stage 1 P = bp*Psi, G = bp*Psi + 4Psi/N, O = (4+S)Psi/N; stage 2 P = bp*Psi, G = 4Psi/N, O = (4+S)Psi/N; "
        "stage 3 P = 4Psi/N (the fp32 shard is the parameter), G = 4Psi/N, O = S*Psi/N", S));
    mem.notes.push_back(fmt::format(
        "ZeRO paper: stage 0 (2bp+K)Psi, 1: 2bp*Psi + K*Psi/N, 2: bp*Psi + (bp+K)Psi/N, 3: (2bp+K)Psi/N with "
        "K = S + 4 when bp != 4 (the master copy), else S; the paper's mixed-precision case is bp = 2, K = 12. "
        "Stages 1-2 here keep an fp32 gradient shard and an fp32 master shard beside the parameters, which the "
        "paper counts in K only"));
    mem.notes.push_back("measured = numel * element size of the tensors each rank keeps (the largest rank; uneven "
                        "dim-0 chunks give the first ranks ceil(dim0/N) rows), at the optimizer step; gathered "
                        "parameters and unsharded gradients inside a step are transient: see timings.memory_peak");
    report.add(std::move(mem));

    Table peak{"memory_peak", "Allocator peak per step above the step's start, per rank (run-dependent)",
               {text_col("name", "run"), int_col("transient_peak", "peak", "bytes"), float_col("step_ms", "step", "ms")}};
    for (std::size_t i = 0; i < runs.size(); ++i)
      peak.rows.push_back({{"name", runs[i].name}, {"transient_peak", outs[i].transient_peak},
                           {"step_ms", outs[i].step_s * 1e3}});
    peak.notes.push_back("core/runtime/memory's counting CPU allocator: activations, unsharded gradients, gathered parameters, "
                         "communication buffers and the optimizer's temporaries of one step (largest over steps >= 1 "
                         "and ranks); step = forward + backward + reduction + optimizer step, median over steps >= 1");
    report.add(std::move(peak), Store::Timings);
  }

  // 5. Communication per step, counted by the process group.
  {
    Table cm{"comm", fmt::format("Communication per step and rank, counted at the collective layer (N = {})", n),
             {text_col("name", "run / collective"), float_col("calls", "calls"),
              float_col("payload_bytes", "payload", "bytes"), float_col("payload_formula", "formula", "bytes"),
              float_col("sent_bytes", "sent", "bytes"), float_col("formula_bytes", "formula", "bytes"),
              float_col("psi_units", "sent", "Psi")}};
    double worst = 0;
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const auto f = formula_payload(runs[i].opts, psi, static_cast<double>(outs[i].padded), s.micro);
      double total = 0, total_f = 0;
      std::set<std::string> kinds;
      for (const auto& kv : outs[i].comm) kinds.insert(kv.first);
      for (const auto& kv : f) kinds.insert(kv.first);
      const double steps = static_cast<double>(s.steps);
      // The paper's unit: Ψ elements of the reduce dtype moved by a ring collective, (N−1)/N·Ψ·B.
      const double unit = psi * static_cast<double>(bytes_of(runs[i].opts.reduce_dtype)) * (n - 1) / n;
      for (const auto& k : kinds) {
        const auto it = outs[i].comm.find(k);
        const dist::CommCount c = it == outs[i].comm.end() ? dist::CommCount{} : it->second;
        const double fp = f.count(k) ? f.at(k) : 0.0, fs = ring_sent(k, fp, n);
        const double payload = static_cast<double>(c.payload_bytes) / steps;
        total += c.sent_bytes / steps;
        total_f += fs;
        if (fp > 0 || payload > 0) worst = std::max(worst, std::abs(payload - fp) / std::max(fp, 1.0));
        cm.rows.push_back({{"name", runs[i].name + "/" + k}, {"calls", c.calls / steps}, {"payload_bytes", payload},
                           {"payload_formula", fp}, {"sent_bytes", c.sent_bytes / steps}, {"formula_bytes", fs},
                           {"psi_units", n > 1 ? c.sent_bytes / steps / unit : 0.0}});
      }
      cm.rows.push_back({{"name", runs[i].name + "/total"}, {"sent_bytes", total}, {"formula_bytes", total_f},
                         {"psi_units", n > 1 ? total / unit : 0.0}});
    }
    report.check("communication: payload bytes per step and collective vs the formula (relative)", worst, 0.0);
    cm.notes.push_back("sent = ring-algorithm bytes of each call (all-reduce 2(N-1)/N*S, all-gather and reduce-scatter "
                       "(N-1)/N*S of the full payload S), summed by dist::Group's counters, per step");
    cm.notes.push_back("payload formula per step: DDP all-reduce Psi*b_r; stages 1-2 reduce-scatter R*Psi'*b_r + "
                       "all-gather Psi'*b_p; stage 3 all-gather 2M*Psi'*b_p + reduce-scatter R*Psi'*b_r (M micro-batches, "
                       "each gathers in forward and backward; R = M when reducing every micro-batch, else 1); Psi' = "
                       "Psi padded to N*ceil(dim0/N) rows per parameter; sent formula = the ring share of it");
    cm.notes.push_back("sent in Psi = sent / ((N-1)/N * Psi * b_reduce): the ZeRO paper's units — DDP 2, stages 1-2 2, "
                       "stage 3 3 per forward+backward (here 2M+1 with M micro-batches); the unit is the reduce dtype's, so bf16 "
                       "parameters gathered under an fp32 reduction count half, and with both in bf16 they count whole");
    if (n > 1 && w.gloo_algorithm() == dist::GlooAlgorithm::Native && compat::kGlooHasReduceScatter)
      cm.notes.push_back(std::string(dist::kGlooNativeReduceScatter) +
                         ": the sent column is the ring's accounting; --set dist.gloo_algorithm=ring sends exactly the "
                         "formula (env.dist)");
    if (n > 1 && (w.gloo_algorithm() == dist::GlooAlgorithm::Ring || !compat::kGlooHasReduceScatter))
      cm.notes.push_back(fmt::format("{}: mpt's ring from send/recv, (N-1)/N*S sent per rank as the formula "
                                     "(env.dist)",
                                     w.gloo_algorithm() == dist::GlooAlgorithm::Ring
                                         ? "reduce-scatter and all-gather (dist.gloo_algorithm = ring)"
                                         : "reduce-scatter (LibTorch 1.13's Gloo has none)"));
    report.add(std::move(cm));
  }

  // 6. Mixed precision: bf16 parameters, fp32 or bf16 reduction, against fp32.
  if (cfg.boolean("/mixed/compare")) {
    Table mp{"mixed_precision",
             fmt::format("Mixed precision at stage {} (FSDP2 MixedPrecisionPolicy; fp32 master shard)", mstage),
             {text_col("name", "run"), text_col("param_dtype", "params"), text_col("reduce_dtype", "reduce"),
              sci_col("vs_fp32", "max|dparam|"), sci_col("loss_diff", "max|dloss|"),
              float_col("final_loss", "final loss"), float_col("sent_bytes", "sent/step", "bytes")}};
    const RunOut& ref = outs[mixed_first];
    for (std::size_t i = mixed_first; i < runs.size(); ++i) {
      // nan when either run's loss is nan at some step (std::max would keep the finite steps' maximum)
      const double ld = max_abs_diff(outs[i].losses, ref.losses);
      double sent = 0;
      for (const auto& kv : outs[i].comm) sent += kv.second.sent_bytes / static_cast<double>(s.steps);
      mp.rows.push_back({{"name", runs[i].name},
                         {"param_dtype", runs[i].opts.param_dtype == torch::kBFloat16 ? "bf16" : "fp32"},
                         {"reduce_dtype", runs[i].opts.reduce_dtype == torch::kBFloat16 ? "bf16" : "fp32"},
                         {"vs_fp32", num(max_diff(outs[i].params, ref.params))}, {"loss_diff", num(ld)},
                         {"final_loss", num(outs[i].losses.back())}, {"sent_bytes", sent}});
    }
    for (std::size_t i = mixed_first; i < runs.size(); ++i) note_divergence(report, mp, runs[i].name, outs[i].losses);
    mp.notes.push_back("bf16 keeps 8 significand bits (unit roundoff 2^-8 = 3.9e-3): forward and backward in bf16 "
                       "move the parameters by ~lr per step in other directions than fp32; reducing in bf16 rounds "
                       "the gradient sum too, and halves the reduce-scatter bytes");
    if (mstage == 3 || mstage == 0)
      mp.notes.push_back("the fp32 row is the same computation as the stage's own run above: its difference is 0");
    if (!bf16.runs) mp.notes.push_back("no bf16 rows: this LibTorch's bf16 matrix product does not run here (" + bf16.reason + ")");
    if (!compat::kTorch2)
      mp.notes.push_back("no bf16 reduction row: LibTorch " + compat::torch_version() +
                         "'s Gloo has no bf16 all-reduce (its bf16 all-gathers travel as bytes)");
    report.add(std::move(mp));
  }
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
