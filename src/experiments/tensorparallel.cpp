/*
 * mpt tensorparallel — Megatron-LM's tensor parallelism (Shoeybi et al. 2019) and sequence
 * parallelism (Korthikanti et al. 2022) across t processes (c10d, Gloo on CPU), each piece
 * proven against the one-process model it was sliced from.
 *
 * A Linear Y = X Aᵀ + b, A [out, in], on t ranks:
 *   ColumnParallelLinear  A split on dim 0: Y_r = X A_rᵀ + b_r      (no sum across ranks)
 *   RowParallelLinear     A split on dim 1: Y = Σ_r X_r A_rᵀ + b    (all-reduce: g)
 * with the conjugate operators f (identity forward, all-reduce backward) before a column-
 * parallel GEMM and g (all-reduce forward, identity backward) after a row-parallel one.
 * Column then Row (the MLP; attention with whole heads per rank) needs one all-reduce forward
 * and one backward. Sequence parallelism replaces g by reduce-scatter along the sequence and f
 * by all-gather, so LayerNorms and the residual stream hold [B, T/t, C].
 *
 * Equality with one process. A column-parallel shard computes the same dot products as the
 * full GEMM: bitwise equal. A row-parallel output sums t partial dot products of length K/t
 * instead of one of length K: with u = 2^-24, any order of summing K products and a bias has
 * |ŝ − s| ≤ γ_{K+1}(Σ|x_i a_i| + |b|), γ_n = nu/(1 − nu) (Higham Thm 3.1), so the two results
 * differ by at most 2γ_{K+1}(Σ|x_i a_i| + |b|) — computed from the actual tensors, per element.
 *
 *  1. MLP (fc1 column, GELU, fc2 row) with loss Σ Z∘R (R fixed, so dZ = R on both sides):
 *     fc1 outputs, their gradients and every parameter gradient bitwise; Z and dX within the bound.
 *  2. tiny GPT: heads split (c_attn by whole q, k, v heads; attn c_proj row), MLP c_fc column /
 *     c_proj row, VocabParallelEmbedding and _VocabParallelCrossEntropy over a vocabulary padded
 *     to a multiple of t (make_vocab_size_divisible_by); every operation checked against the
 *     one-process module fed the same input; loss and every gradient against one process.
 *  3. sequence parallelism: loss and gradients bitwise equal to TP without SP (the same sums of
 *     t terms), LayerNorm and row-bias gradients (all-reduced partial sums) identical across ranks.
 *  4. activation bytes per layer, measured by the counting allocator, against Korthikanti's
 *     formulas (fp16, dropout) and the same count for what runs here (fp32, no dropout).
 *  5. step times (forward + backward) of one process, TP and TP + SP.
 *  6. with /mesh/steps > 0, instead: the GPT on a DP x TP x PP mesh (Megatron's rank order), each
 *     stage's blocks TP-sharded on the pipeline executor, the DP mean, SGD; after every step the
 *     parameters bitwise equal to TP without pipeline and DP (checked), and against one process.
 *
 *   mpt tensorparallel                    # TP = 2 processes
 *   mpt tensorparallel --nproc 4 --set model.heads=8
 *   torchrun --nproc_per_node 2 --no-python mpt tensorparallel
 *   mpt tensorparallel --config configs/tensorparallel_mesh8.json   # dp 2 x tp 2 x pp 2 = 8 processes
 */
#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "core/runtime/compat.hpp"
#include "core/dist/dist.hpp"
#include "core/errors.hpp"
#include "core/experiment.hpp"
#include "core/models/gpt.hpp"
#include "core/runtime/memory.hpp"
#include "core/models/mlp.hpp"
#include "core/pipeline/executor.hpp"
#include "core/process_plan.hpp"
#include "core/runtime/runtime.hpp"
#include "core/parallel/tp.hpp"
#include "core/runtime/timing.hpp"

namespace mpt {

namespace {

ConfigSpec tensorparallel_spec() {
  ConfigSpec s;
  s.integer("/seed", 1, "seed before building each model (torch.manual_seed) and of the data", 0);
  s.integer("/nproc", 2,
            "worker processes (--nproc N): the TP degree t, or dp x tp x pp with a mesh (/mesh); ignored under "
            "torchrun/SLURM",
            1, 8);
  s.integer("/model/vocab", 65, "GPT vocabulary V (65: not divisible by t = 2, padded)", 2, 100000);
  s.integer("/model/vocab_divisible_by", 1, "Megatron's make_vocab_size_divisible_by: V padded to a multiple of this x t",
            1, 1024);
  s.integer("/model/context", 32, "GPT context (positions)", 1, 4096);
  s.integer("/model/width", 64, "GPT width h (n_embd)", 1, 4096);
  s.integer("/model/heads", 4, "attention heads a (t must divide it)", 1, 256);
  s.integer("/model/layers", 2, "transformer blocks", 1, 64);
  s.integer("/model/mlp_ratio", 4, "MLP hidden width / width (t must divide the hidden width)", 1, 16);
  s.integer("/data/batch", 4, "micro-batch b (sequences)", 1, 4096);
  s.integer("/data/seq", 32, "sequence length s (<= /model/context; t must divide it with SP)", 1, 4096);
  s.integer("/mlp/in", 32, "MLP input width", 1, 8192);
  s.integer("/mlp/hidden", 64, "MLP hidden width (t must divide it)", 1, 8192);
  s.integer("/mlp/out", 16, "MLP output width", 1, 8192);
  s.integer("/mlp/batch", 16, "MLP batch rows", 1, 65536);
  s.boolean("/sp/enabled", true, "also run the GPT with sequence parallelism (Korthikanti et al. 2022)");
  s.integer("/time/steps", 5, "timed forward+backward steps per variant (the median is reported)", 1, 1000);
  s.integer("/mesh/steps", 0, "SGD steps of the GPT on the DP x TP x PP mesh (0: no mesh; > 0: the mesh section "
            "alone, on /mesh/dp x /mesh/tp x /mesh/pp = --nproc processes)", 0, 1000);
  s.integer("/mesh/dp", 1, "mesh: data-parallel degree (each DP rank trains on its /data/batch sequences; at most 2: "
            "the two-term gradient all-reduce is what makes the mesh bitwise equal to its TP reference, more terms "
            "would let Gloo reorder the sum)", 1, 2);
  s.integer("/mesh/tp", 1, "mesh: tensor-parallel degree (must divide /model/heads and the MLP width)", 1, 8);
  s.integer("/mesh/pp", 1, "mesh: pipeline stages (must divide /model/layers)", 1, 8);
  s.integer("/mesh/microbatches", 2, "mesh: microbatches per DP rank and step (>= /mesh/pp; must divide /data/batch)",
            1, 4096);
  s.choice("/mesh/schedule", "1f1b", {"gpipe", "1f1b"}, "mesh: the pipeline schedule (core/pipeline/schedule)");
  s.number("/mesh/lr", 0.5, "mesh: SGD learning rate (theta -= lr * grad)", 0.0, 100.0);
  s.number("/dist/timeout_s", 30.0, "timeout of every collective and of the rendezvous (seconds)", 0.1, 3600.0);
  s.integer("/fault/rank", -1, "for testing: this rank fails at /fault/step of the TP timing loop (-1: none)", -1, 7);
  s.integer("/fault/step", 1, "for testing: the step at which /fault/rank fails", 0);
  s.choice("/fault/mode", "exit", {"exit", "hang"},
           "for testing: how /fault/rank fails: exit (the process ends) or hang (alive but silent)");
  return s;
}

GptConfig gpt_of(const Config& cfg) {
  GptConfig c;
  c.vocab = cfg.integer("/model/vocab");
  c.context = cfg.integer("/model/context");
  c.width = cfg.integer("/model/width");
  c.heads = cfg.integer("/model/heads");
  c.layers = cfg.integer("/model/layers");
  c.mlp_ratio = cfg.integer("/model/mlp_ratio");
  return c;
}

/// The largest value of x over the ranks (checks are the worst rank's).
double max_over_ranks(World& w, double x) {
  auto t = torch::tensor({x}, torch::kFloat64);
  w.group()->allreduce(t, dist::ReduceOp::Max);
  return t.item<double>();
}

double max_abs(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.numel() == 0) return 0.0;
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

/// max |diff| / bound over the elements (an element with bound 0 must match exactly).
double worst_ratio(const torch::Tensor& got, const torch::Tensor& want, const torch::Tensor& bound) {
  auto d = (got.to(torch::kDouble) - want.to(torch::kDouble)).abs();
  auto r = torch::where(bound > 0, d / bound, torch::where(d > 0, torch::full_like(d, INFINITY), torch::zeros_like(d)));
  return r.max().item<double>();
}

// ----------------------------------------------------------------------------
// 1. MLP: Column then Row
// ----------------------------------------------------------------------------

void mlp_section(const Config& cfg, World& w, const std::shared_ptr<dist::Group>& g, Report& report) {
  const int64_t in = cfg.integer("/mlp/in"), hid = cfg.integer("/mlp/hidden"), out = cfg.integer("/mlp/out"),
                n = cfg.integer("/mlp/batch");
  seed_all(static_cast<std::uint64_t>(cfg.integer("/seed")));
  torch::nn::Linear fc1(in, hid), fc2(hid, out);
  auto x = torch::randn({n, in});
  auto rw = torch::randn({n, out});  // loss = sum(Z * R): dZ = R exactly on both sides
  // One process.
  auto x1 = x.clone().set_requires_grad(true);
  auto pre1 = torch::linear(x1, fc1->weight, fc1->bias);
  pre1.retain_grad();
  auto h1 = torch::gelu(pre1);
  auto z1 = torch::linear(h1, fc2->weight, fc2->bias);
  (z1 * rw).sum().backward();
  // TP.
  tp::TpMlp mlp(fc1, fc2, g);
  auto xt = x.clone().set_requires_grad(true);
  torch::Tensor pre;
  auto z = mlp.forward(xt, &pre);
  pre.retain_grad();
  (z * rw).sum().backward();

  const auto& rows = mlp.fc1.rows;
  struct Row {
    std::string name, what;
    double diff, bound, ratio;
    bool checked_bitwise;
  };
  std::vector<Row> rowsout;
  auto bit = [&](const std::string& name, const std::string& what, const torch::Tensor& a, const torch::Tensor& b) {
    rowsout.push_back({name, what, max_over_ranks(w, max_abs(a, b)), 0.0, 0.0, true});
  };
  auto bounded = [&](const std::string& name, const std::string& what, const torch::Tensor& a, const torch::Tensor& b,
                     const torch::Tensor& bound) {
    rowsout.push_back({name, what, max_over_ranks(w, max_abs(a, b)), max_over_ranks(w, bound.max().item<double>()),
                       max_over_ranks(w, worst_ratio(a, b, bound)), false});
  };
  torch::NoGradGuard no_grad;
  // Each TP tensor against the one-process operation on the same input (the TP side's own
  // inputs, gathered), so that the bound of that one operation applies whatever happened before.
  // GEMMs: the same dot products, but a CPU GEMM may order K differently for another output
  // width, so every GEMM row is checked against its reordering bound (bitwise where max|diff| = 0).
  auto gather_cols = [&](const torch::Tensor& local) { return tp::unshard(tp::all_gather_shards(local, *g),
                                                                           tp::all_gather_shards(rows, *g), 1, hid); };
  const auto h_tp = gather_cols(torch::gelu(pre));   // [N, hidden]: the TP ranks' fc1 activations
  const auto dpre_tp = gather_cols(pre.grad());      // [N, hidden]
  const auto w1r = fc1->weight.index_select(0, rows), b1r = fc1->bias.index_select(0, rows);
  bounded("fc1_out", "column-parallel output X W1_r^T + b1_r vs the full fc1's columns", pre,
          torch::linear(x, fc1->weight, fc1->bias).index_select(1, rows), tp::reorder_bound(x, w1r, b1r));
  bounded("fc2_out", "row-parallel output Z: t partial sums all-reduced, + bias", z,
          torch::linear(h_tp, fc2->weight, fc2->bias), tp::reorder_bound(h_tp, fc2->weight, fc2->bias));
  bounded("input_grad", "dX = sum_r dpre_r W1_r (f's backward all-reduce)", xt.grad(),
          torch::matmul(dpre_tp, fc1->weight), tp::reorder_bound(dpre_tp, fc1->weight.t(), torch::Tensor()));
  bounded("fc1.weight_grad", "column shard of dW1 = dpre_r^T X (sum over N rows)", mlp.fc1.weight.grad(),
          torch::matmul(dpre_tp.t(), x).index_select(0, rows), tp::reorder_bound(pre.grad().t(), x.t(), torch::Tensor()));
  // db1 = sum over the N rows of dpre; ATen's vectorised dim-0 sum of an [N, hidden/t] tensor may
  // add the rows in another order than for [N, hidden].
  bounded("fc1.bias_grad", "column shard of db1 = sum_rows dpre", mlp.fc1.bias.grad(),
          dpre_tp.sum(0).index_select(0, rows), tp::sum_reorder_bound(pre.grad(), 0));
  bounded("fc2.weight_grad", "row shard of dW2 = R^T H_r", mlp.fc2.weight.grad(),
          torch::matmul(rw.t(), h_tp).index_select(1, rows),
          tp::reorder_bound(rw.t(), torch::gelu(pre).t(), torch::Tensor()));
  bit("fc2.bias_grad", "db2 = sum of R (added once after the reduction, the same [N, out] sum)", mlp.fc2.bias.grad(),
      fc2->bias.grad());
  // End to end against the one-process run (reported: after a GEMM that is not bitwise, the
  // next tensors differ by more than one operation's bound).
  const double e2e_z = max_over_ranks(w, max_abs(z, z1)), e2e_dx = max_over_ranks(w, max_abs(xt.grad(), x1.grad()));
  const double e2e_w1 = max_over_ranks(w, max_abs(mlp.fc1.weight.grad(), fc1->weight.grad().index_select(0, rows)));
  const double e2e_w2 = max_over_ranks(w, max_abs(mlp.fc2.weight.grad(), fc2->weight.grad().index_select(1, rows)));

  Table t{"mlp", fmt::format("MLP {}-{}-{} on TP = {} (ColumnParallelLinear, GELU, RowParallelLinear) vs one process",
                             in, hid, out, g->size()),
          {text_col("name", "tensor"), text_col("kind", "check"), sci_col("max_diff", "max|diff|"),
           sci_col("max_bound", "max bound"), float_col("worst_ratio", "max diff/bound")}};
  for (const auto& r : rowsout) {
    t.rows.push_back({{"name", r.name}, {"kind", r.checked_bitwise ? "bitwise" : "bound"}, {"max_diff", r.diff},
                      {"max_bound", r.bound}, {"worst_ratio", r.ratio}, {"what", r.what}});
    if (r.checked_bitwise)
      report.check("mlp " + r.name + ": bitwise equal to one process", r.diff, 0.0);
    else
      report.check("mlp " + r.name + ": |diff| <= the derived reordering bound, elementwise (max ratio)", r.ratio, 1.0);
  }
  t.notes.push_back("bound = 2 gamma_{K+1} (sum_i |x_i a_i| + |b|) per element, gamma_n = n u/(1 - n u), u = 2^-24, "
                    "from the actual tensors (float64); worst_ratio = max over elements and ranks of |diff| / bound");
  t.notes.push_back("fc1.bias_grad bound: 2 gamma_{N-1} sum_rows |dpre| (the same N terms summed in another order)");
  t.notes.push_back("each row compares the TP tensor with the one-process operation applied to the TP side's own "
                    "(gathered) inputs; a GEMM row with max|diff| = 0 is bitwise (the CPU GEMM kept its K order)");
  t.notes.push_back(fmt::format("end to end vs the one-process run (reported): max|dZ| = {:.3g}, max|d(dX)| = {:.3g}, "
                                "max|d(dW1)| = {:.3g}, max|d(dW2)| = {:.3g}", e2e_z, e2e_dx, e2e_w1, e2e_w2));
  report.add(std::move(t));
}

// ----------------------------------------------------------------------------
// 2-3. Tiny GPT on TP, with and without sequence parallelism
// ----------------------------------------------------------------------------

struct GptRun {
  double loss = 0;
  std::map<std::string, torch::Tensor> grads;   // full layout (gathered), every rank
  std::map<std::string, double> rank_spread;     // SP params: max |grad_r - grad_0| over ranks
  std::vector<tp::SiteCheck> sites;
};

GptRun run_tp(const TinyGpt& full, const std::shared_ptr<dist::Group>& g, int64_t div, bool sp,
              const torch::Tensor& idx, const torch::Tensor& tgt) {
  tp::TpGpt model(full, g, div, sp);
  GptRun out;
  auto loss = model.loss_checked(idx, tgt, out.sites);
  loss.backward();
  model.allreduce_sequence_parallel_grads();
  out.loss = loss.item<double>();
  const auto named = full->named_parameters();
  for (const auto& p : model.params()) {
    auto shards = tp::all_gather_shards(p.local.grad(), *g);
    if (p.dim < 0) {
      double spread = 0;
      for (const auto& s : shards) spread = nan_max(spread, max_abs(s, shards[0]));
      out.rank_spread[p.name] = spread;
      out.grads[p.name] = shards[0];
      continue;
    }
    auto idxs = tp::all_gather_shards(p.index, *g);
    out.grads[p.name] = tp::unshard(shards, idxs, p.dim, named[p.name].size(p.dim));
  }
  return out;
}

/// The bytes one block's autograd graph keeps after its forward, per block, in one process.
std::vector<int64_t> one_process_block_bytes(TinyGpt m, const torch::Tensor& idx) {
  const int64_t T = idx.size(1);
  auto pos = torch::arange(T, torch::kLong);
  auto x = m->wte->forward(idx) + m->wpe->forward(pos);
  std::vector<int64_t> v;
  for (auto& b : m->blocks) {
    const int64_t before = current_bytes(torch::kCPU);
    x = b->forward(x, {});
    v.push_back(current_bytes(torch::kCPU) - before);
  }
  return v;
}


// ----------------------------------------------------------------------------
// 6. The DP x TP x PP mesh (/mesh/steps > 0: this section alone)
// ----------------------------------------------------------------------------
// Rank layout ("pp", "dp", "tp"), tp fastest (tp::MeshLayout: Megatron-LM's default order,
// torchtitan's DeviceMesh): rank = (pp_idx·dp + dp_idx)·tp + tp_idx. Each rank joins three
// groups: its TP group (the Column/Row-parallel collectives of its stage), its PP group (the
// pipeline executor's send/recv, tp-rank i of stage s to tp-rank i of stage s + 1) and its DP
// group (the gradient all-reduce, then ÷ dp: DDP's mean). One step: the executor runs the
// schedule over the DP rank's m microbatches (each loss ÷ m), the DP mean, SGD θ -= lr·g.
//
// The references, on every rank, same seed and global batch (dp·b sequences):
//  (a) the same TP model on its TP group without pipeline and DP: for each DP shard d the m
//      microbatches through all blocks in order (loss ÷ m, gradients accumulated in .grad as the
//      executor's B's do, in microbatch order), then (G_0 + G_1 + ...) ÷ dp, the same SGD. A cut
//      between stages changes no arithmetic (core/pipeline/stage.hpp) and a two-term all-reduce
//      is a + b = b + a, so for dp <= 2 the mesh's parameters equal (a)'s bit for bit: bound 0,
//      checked every step. (Gloo may add dp > 2 terms in another order: then reported.)
//  (b) one process, the plain TinyGpt (torch::linear, F.cross_entropy), the same microbatches,
//      the same mean and SGD: the mesh's shards gathered to full shape against it, reported
//      (the TP arithmetic differs from it by the per-operation reordering bounds the TP
//      sections check; propagated through the network and the steps there is no closed bound).

/// Sum of microbatch gradients of one DP shard into every parameter's .grad (loss ÷ m each),
/// through `forward` (idx [b, T] → loss), microbatch by microbatch in order, like the executor's B's.
template <class F>
double accumulate_shard(const torch::Tensor& x, const torch::Tensor& y, int m, F&& forward_loss) {
  double total = 0;
  const auto xs = x.chunk(m, 0), ys = y.chunk(m, 0);
  for (int j = 0; j < m; ++j) {
    torch::Tensor l = forward_loss(xs[static_cast<std::size_t>(j)], ys[static_cast<std::size_t>(j)]) / m;
    total += l.item<double>();
    l.backward();
  }
  return total;
}

std::vector<torch::Tensor> take_grads(const std::vector<torch::Tensor>& ps) {
  std::vector<torch::Tensor> g;
  for (const auto& p : ps) {
    g.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
    p.mutable_grad() = torch::Tensor();
  }
  return g;
}

void sgd(const std::vector<torch::Tensor>& ps, const std::vector<torch::Tensor>& gs, double lr) {
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < ps.size(); ++i) ps[i].add_(gs[i], -lr);
}

Report run_mesh(const Context& ctx) {
  const auto& cfg = ctx.cfg;
  Report report;
  World& w = *ctx.world;
  const tp::MeshLayout mesh(static_cast<int>(cfg.integer("/mesh/dp")), static_cast<int>(cfg.integer("/mesh/tp")),
                            static_cast<int>(cfg.integer("/mesh/pp")));
  const auto me = mesh.coord(w.rank());
  const int dp = mesh.dp, pp = mesh.pp, m = static_cast<int>(cfg.integer("/mesh/microbatches"));
  const int64_t steps = cfg.integer("/mesh/steps"), b = cfg.integer("/data/batch"), T = cfg.integer("/data/seq");
  const double lr = cfg.number("/mesh/lr");
  report.env["mesh"] = fmt::format("dp {} x tp {} x pp {}", mesh.dp, mesh.tp, mesh.pp);

  // Groups: every rank walks every group in one order (TP, DP, PP), joining its own three.
  std::shared_ptr<dist::Group> tpg, dpg, ppg;
  ProcessPipelineOptions popts;  // this rank's pipeline: its stages' job ranks key the trace's flows
  for (int s = 0; s < pp; ++s)
    for (int d = 0; d < dp; ++d)
      if (auto g = w.new_group(fmt::format("mesh/tp/pp{}dp{}/", s, d), mesh.tp_group(s, d), torch::kCPU)) tpg = g;
  for (int s = 0; s < pp; ++s)
    for (int i = 0; i < mesh.tp; ++i)
      if (auto g = w.new_group(fmt::format("mesh/dp/pp{}tp{}/", s, i), mesh.dp_group(s, i), torch::kCPU)) dpg = g;
  for (int d = 0; d < dp; ++d)
    for (int i = 0; i < mesh.tp; ++i)
      if (auto g = w.new_group(fmt::format("mesh/pp/dp{}tp{}/", d, i), mesh.pp_group(d, i), torch::kCPU)) {
        ppg = g;
        popts.job_ranks = mesh.pp_group(d, i);
      }

  {
    Table lt{"mesh_layout", fmt::format("Rank layout of the dp {} x tp {} x pp {} mesh (ranks in pp, dp, tp order: tp fastest)",
                                        dp, mesh.tp, pp),
             {text_col("name", "rank"), int_col("pp", "pp"), int_col("dp", "dp"), int_col("tp", "tp"),
              text_col("tp_group", "TP group"), text_col("dp_group", "DP group"), text_col("pp_group", "PP group")}};
    auto list = [](const std::vector<int>& v) {
      std::string out;
      for (int r : v) out += (out.empty() ? "" : " ") + std::to_string(r);
      return out;
    };
    for (int r = 0; r < mesh.size(); ++r) {
      const auto c = mesh.coord(r);
      lt.rows.push_back({{"name", fmt::format("rank{}", r)}, {"pp", static_cast<int64_t>(c.pp)},
                         {"dp", static_cast<int64_t>(c.dp)}, {"tp", static_cast<int64_t>(c.tp)},
                         {"tp_group", list(mesh.tp_group(c.pp, c.dp))}, {"dp_group", list(mesh.dp_group(c.pp, c.tp))},
                         {"pp_group", list(mesh.pp_group(c.dp, c.tp))}});
    }
    lt.notes.push_back("rank = (pp_idx * dp + dp_idx) * tp + tp_idx: Megatron-LM's order tp-cp-ep-dp-pp, "
                       "torch's init_device_mesh(..., (pp, dp, tp))");
    report.add(std::move(lt));
  }

  const GptConfig gc = gpt_of(cfg);
  const int64_t div = cfg.integer("/model/vocab_divisible_by");
  seed_all(static_cast<std::uint64_t>(cfg.integer("/seed")));
  TinyGpt full(gc);  // the one-process model (reference b), trained in place
  auto idx = torch::randint(gc.vocab, {dp * b, T}, torch::kLong);
  auto tgt = torch::randint(gc.vocab, {dp * b, T}, torch::kLong);
  tp::TpGpt mesh_model(full, tpg, div, false), ref_model(full, tpg, div, false);
  const tp::TpGptStages stages(mesh_model, pp), ref_stages(ref_model, pp);
  std::vector<torch::Tensor> mesh_ps, ref_ps, full_ps;
  for (int c = 0; c < pp; ++c)
    for (auto& p : stages.parameters(c)) mesh_ps.push_back(p);
  for (int c = 0; c < pp; ++c)
    for (auto& p : ref_stages.parameters(c)) ref_ps.push_back(p);
  // The same order of the full model's parameters, and where each TP shard goes back.
  std::vector<const tp::ShardedParam*> sharded;
  for (int c = 0; c < pp; ++c)
    for (std::size_t i = 0; i < mesh_model.params().size(); ++i)
      if (stages.chunk_of(i) == c) sharded.push_back(&mesh_model.params()[i]);
  const auto named = full->named_parameters();
  for (const auto* sp : sharded) full_ps.push_back(named[sp->name]);
  const auto sched = make_schedule(parse_schedule(cfg.str("/mesh/schedule")), pp, m);
  const auto mine_x = idx.narrow(0, me.dp * b, b), mine_y = tgt.narrow(0, me.dp * b, b);

  Table st{"mesh", fmt::format("GPT on the mesh dp {} x tp {} x pp {} ({} microbatches, {}), parameters after each SGD "
                               "step vs the references", dp, mesh.tp, pp, m, cfg.str("/mesh/schedule")),
           {text_col("name", "step"), float_col("loss", "mesh loss", "nats", 7), sci_col("loss_vs_one", "vs 1-proc"),
            sci_col("vs_tp_ref", "max|d theta| TP ref"), sci_col("bound", "bound"),
            sci_col("vs_one_process", "max|d theta| 1-proc"), sci_col("max_theta", "max|theta|")}};
  std::vector<double> mesh_losses;  // per step, for the divergence note
  for (int64_t k = 0; k < steps; ++k) {
    w.fault_point(k);
    w.note_progress();
    // The mesh: the pipeline over this PP group, the DP mean, SGD.
    const PipelineRun run = run_pipeline_process(ppg, stages, sched, m, mine_x, mine_y, SyntheticCost{}, popts);
    std::vector<torch::Tensor> flat_parts;
    for (const auto& g : run.grads) flat_parts.push_back(g.reshape({-1}));
    auto flat = torch::cat(flat_parts);
    auto loss_t = torch::tensor({run.loss}, torch::kFloat64);
    if (dp > 1) {
      dpg->allreduce(flat);
      flat.div_(dp);
      dpg->allreduce(loss_t);
      loss_t.div_(dp);
    }
    std::vector<torch::Tensor> mesh_g;
    {
      int64_t at = 0;
      for (const auto& p : mesh_ps) {
        mesh_g.push_back(flat.narrow(0, at, p.numel()).view(p.sizes()));
        at += p.numel();
      }
    }
    sgd(mesh_ps, mesh_g, lr);

    // The DP mean of a one-process reference: every shard's microbatches in order, its gradients
    // taken, summed over the shards, then divided by dp (as the mesh's DP all-reduce); returns
    // the gradients and the summed loss.
    auto shard_mean = [&](std::vector<torch::Tensor>& ps, const std::function<torch::Tensor(const torch::Tensor&,
                                                                                           const torch::Tensor&)>& loss_of) {
      double loss = 0;
      std::vector<torch::Tensor> sum;
      for (int d = 0; d < dp; ++d) {
        loss += accumulate_shard(idx.narrow(0, d * b, b), tgt.narrow(0, d * b, b), m, loss_of);
        auto g = take_grads(ps);
        if (d == 0)
          sum = g;
        else
          for (std::size_t k = 0; k < g.size(); ++k) sum[k] = sum[k] + g[k];
      }
      if (dp > 1)
        for (auto& g : sum) g.div_(dp);
      return std::make_pair(sum, loss);
    };
    // (a) TP on the TP group, no pipeline, no DP.
    auto ref_g = shard_mean(ref_ps, [&](const torch::Tensor& x, const torch::Tensor& y) {
                   torch::Tensor h = x;
                   for (int c = 0; c < pp; ++c) h = ref_stages.forward(c, h);
                   return ref_stages.loss(h, y);
                 }).first;
    sgd(ref_ps, ref_g, lr);

    // (b) one process, the plain model.
    auto [full_g, loss1] = shard_mean(full_ps, [&](const torch::Tensor& x, const torch::Tensor& y) {
      return gpt_loss(full->forward(x), y);
    });
    loss1 /= dp;
    sgd(full_ps, full_g, lr);

    // Compare: (a) shard by shard on every rank; (b) the shards gathered over the TP group.
    double da = 0, db = 0, theta = 0;
    for (std::size_t i = 0; i < mesh_ps.size(); ++i) {
      da = nan_max(da, max_abs(mesh_ps[i], ref_ps[i]));
      const auto* spar = sharded[i];
      auto shards = tp::all_gather_shards(mesh_ps[i].detach(), *tpg);
      torch::Tensor whole = spar->dim < 0 ? shards[0]
                                          : tp::unshard(shards, tp::all_gather_shards(spar->index, *tpg), spar->dim,
                                                        full_ps[i].size(spar->dim));
      db = nan_max(db, max_abs(whole, full_ps[i]));
      theta = nan_max(theta, full_ps[i].detach().abs().max().item<double>());
    }
    da = max_over_ranks(w, da);
    db = max_over_ranks(w, db);
    const double loss_mesh = loss_t.item<double>();
    const double loss_diff = max_over_ranks(w, std::abs(loss_mesh - loss1));
    st.rows.push_back({{"name", fmt::format("step{}", k + 1)}, {"loss", loss_mesh}, {"loss_vs_one", loss_diff},
                       {"vs_tp_ref", da}, {"bound", 0.0}, {"vs_one_process", db}, {"max_theta", theta}});
    report.check(fmt::format("mesh step {}: parameters bitwise equal to TP on {} rank(s) without pipeline and DP "
                             "(same sums; dp <= 2)", k + 1, mesh.tp),
                 da, 0.0);
    mesh_losses.push_back(loss_mesh);
  }
  note_divergence(report, st, "mesh", mesh_losses, /*first_step=*/1);  // the rows count steps from 1
  st.notes.push_back("mesh loss: the global batch's mean loss before the step (the DP mean of each pipeline's "
                     "sum of loss_j / m); vs 1-proc: |mesh loss - the plain model's|");
  st.notes.push_back("TP ref: the same TP-sharded GPT on its TP group, no pipeline, no DP (all blocks in order, "
                     "every DP shard's microbatches, (G_0 + ... + G_dp-1) / dp, the same SGD): bound 0 — a stage cut "
                     "changes no arithmetic and a two-term all-reduce is a + b = b + a (checked for dp <= 2)");
  st.notes.push_back("1-proc: the plain TinyGpt (torch::linear, F.cross_entropy) on the same microbatches; the TP "
                     "shards gathered to full shape. Reported: TP's row-parallel partial sums and the vocab-parallel "
                     "cross-entropy round differently (each operation within its reordering bound: the TP "
                     "sections), and the differences propagate through the network and the steps");
  report.add(std::move(st));
  return report;
}

Report run_tensorparallel(const Context& ctx) {
  const auto& cfg = ctx.cfg;
  if (cfg.integer("/mesh/steps") > 0) return run_mesh(ctx);
  Report report;
  World& w = *ctx.world;
  const int t = w.size();
  install_counting_allocator();
  auto g = w.new_group("tp/", t, torch::kCPU);
  report.env["tp_degree"] = t;
  report.env["tp_reduce_scatter"] = dist::collective_algorithm(g->backend(), g->gloo_algorithm(), "reduce_scatter");

  // 1. MLP.
  mlp_section(cfg, w, g, report);

  // 2. GPT: the one-process reference, then TP and TP + SP from the same weights.
  const GptConfig gc = gpt_of(cfg);
  const int64_t B = cfg.integer("/data/batch"), T = cfg.integer("/data/seq"), div = cfg.integer("/model/vocab_divisible_by");
  const bool sp = cfg.boolean("/sp/enabled");
  seed_all(static_cast<std::uint64_t>(cfg.integer("/seed")));
  TinyGpt full(gc);
  auto idx = torch::randint(gc.vocab, {B, T}, torch::kLong);
  auto tgt = torch::randint(gc.vocab, {B, T}, torch::kLong);
  auto loss1 = gpt_loss(full->forward(idx), tgt);
  loss1.backward();
  std::map<std::string, torch::Tensor> grads1;
  for (const auto& kv : full->named_parameters()) grads1[kv.key()] = kv.value().grad().clone();
  full->zero_grad();
  const GptRun tpr = run_tp(full, g, div, false, idx, tgt);
  GptRun spr;
  if (sp) spr = run_tp(full, g, div, true, idx, tgt);
  const int64_t vpad = tp::padded_vocab_size(gc.vocab, div, t);

  // Sites: every operation against the one-process module on the same input.
  {
    Table st{"sites", fmt::format("Every TP operation vs the one-process module fed the same input (t = {})", t),
             {text_col("name", "site"), text_col("kind", "check"), sci_col("max_diff", "max|diff|"),
              sci_col("max_bound", "max bound"), float_col("worst_ratio", "max diff/bound")}};
    auto add = [&](const std::vector<tp::SiteCheck>& sites, const std::string& variant) {
      double worst_bit = 0, worst_ratio_v = 0;
      for (const auto& s : sites) {
        const double d = max_over_ranks(w, s.max_diff), b = max_over_ranks(w, s.max_bound),
                     r = max_over_ranks(w, s.worst_ratio);
        st.rows.push_back({{"name", variant + s.site}, {"kind", s.reduced ? "bound" : "bitwise"}, {"max_diff", d},
                           {"max_bound", b}, {"worst_ratio", r}});
        if (s.reduced)
          worst_ratio_v = nan_max(worst_ratio_v, r);  // nan_max: a nan fails the check
        else
          worst_bit = nan_max(worst_bit, d);
      }
      report.check(variant + "gpt LayerNorms, embedding, attention: bitwise equal to one process", worst_bit, 0.0);
      report.check(variant + "gpt GEMMs (row- and column-parallel), cross-entropy: |diff| <= derived bound (max ratio)",
                   worst_ratio_v, 1.0);
    };
    add(tpr.sites, "tp/");
    if (sp) add(spr.sites, "tp_sp/");
    st.notes.push_back("each row: the TP output against the full module (the one it was sliced from) applied to the "
                       "all-gathered TP input, worst rank; bitwise sites have no sum across ranks");
    st.notes.push_back("row-parallel bound: 2 gamma_{K+1} (sum|x a| + |b|); cross-entropy bound: 2(-log(1 - delta) + "
                       "2u(|log S| + |l_y - m|)), delta = gamma_{V-1} + 2u(1 + gamma_{V-1}) (exp within 1 ulp assumed)");
    report.add(std::move(st));
  }

  // Loss and every gradient against one process.
  {
    Table gt{"gpt_grads",
             fmt::format("Tiny GPT (V = {} padded to {}, h = {}, a = {}, {} layers, b = {}, s = {}) on TP = {}: "
                         "gradients vs one process",
                         gc.vocab, vpad, gc.width, gc.heads, gc.layers, B, T, t),
             {text_col("name", "parameter"), sci_col("max_grad", "max|g|"), sci_col("tp_vs_1", "TP vs 1"),
              sci_col("sp_vs_tp", "SP vs TP"), sci_col("sp_rank_spread", "SP ranks")}};
    double sp_bit = 0, spread = 0;
    for (const auto& kv : grads1) {
      const auto& name = kv.first;
      json row = {{"name", name}, {"max_grad", kv.second.abs().max().item<double>()},
                  {"tp_vs_1", max_abs(tpr.grads.at(name), kv.second)}};
      if (sp) {
        const double d = max_abs(spr.grads.at(name), tpr.grads.at(name));
        row["sp_vs_tp"] = d;
        const auto it = spr.rank_spread.find(name);
        const bool partial = (name.find("ln_") != std::string::npos) || (name.find("proj.bias") != std::string::npos);
        if (it != spr.rank_spread.end()) {
          row["sp_rank_spread"] = it->second;
          if (partial) spread = nan_max(spread, it->second);
        }
        if (!partial) sp_bit = nan_max(sp_bit, d);
      }
      gt.rows.push_back(row);
    }
    if (sp) {
      // Two terms: one addition, commutative — a reduce-scatter's chunk is the all-reduce's, bit
      // for bit. With t > 2 Gloo's ring may add the t terms in another order per collective.
      if (t <= 2) {
        report.check("tp_sp: gradients of parameters outside the SP region bitwise equal to TP's (t <= 2)", sp_bit, 0.0);
        report.check("tp_sp: loss bitwise equal to TP's (t <= 2)", std::abs(spr.loss - tpr.loss), 0.0);
      }
      report.check("tp_sp: LayerNorm and row-bias gradients (all-reduced) bitwise identical across ranks", spread, 0.0);
    }
    gt.notes.push_back("TP vs 1: max |gradient difference| against one process, shards gathered into the full layout "
                       "(padded vocabulary rows dropped); after the first row-parallel sum every later tensor carries "
                       "its reordering, so these are reported, the per-operation checks are in `sites`");
    gt.notes.push_back("SP vs TP: sequence parallelism does the same sums of t terms as TP (reduce-scatter = the "
                       "all-reduce's chunk, all-gather exact): bitwise for t <= 2 (checked), except the LayerNorm and row-parallel bias "
                       "gradients, partial sums over T/t positions then all-reduced (another order, reported)");
    gt.notes.push_back("SP ranks: max |grad_r - grad_0| of the replicated parameters over the ranks");
    report.add(std::move(gt));

    Table lt{"loss", "Mean next-token cross-entropy",
             {text_col("name", "run"), float_col("loss", "loss", "nats", 7), sci_col("vs_one_process", "vs 1-proc")}};
    lt.rows.push_back({{"name", "one_process"}, {"loss", loss1.item<double>()}, {"vs_one_process", 0.0}});
    lt.rows.push_back({{"name", "tp"}, {"loss", tpr.loss}, {"vs_one_process", std::abs(tpr.loss - loss1.item<double>())}});
    if (sp)
      lt.rows.push_back({{"name", "tp_sp"}, {"loss", spr.loss}, {"vs_one_process", std::abs(spr.loss - loss1.item<double>())}});
    lt.notes.push_back(fmt::format("vocabulary {} padded to {} (make_vocab_size_divisible_by = {} x t): padded rows of "
                                   "wte / lm_head are zeros, their logits masked to -inf in the vocab-parallel "
                                   "cross-entropy, so the one-process model of the true vocabulary is the reference",
                                   gc.vocab, vpad, div));
    report.add(std::move(lt));
  }

  // 4. Activation bytes per layer.
  {
    torch::Tensor keep;
    std::vector<int64_t> b1, btp, bsp;
    {
      seed_all(static_cast<std::uint64_t>(cfg.integer("/seed")));
      TinyGpt m(gc);
      b1 = one_process_block_bytes(m, idx);
    }
    // TP: Gloo's worker thread may still hold a collective's temporary when the block returns;
    // the smallest of three measurements is the graph's own storage.
    auto measure_tp = [&](bool seqp) {
      std::vector<int64_t> best;
      tp::TpGpt m(full, g, div, seqp);
      for (int rep = 0; rep < 3; ++rep) {
        std::vector<int64_t> v;
        auto l = m.loss_measuring(idx, tgt, v);
        if (best.empty()) best = v;
        for (std::size_t i = 0; i < v.size(); ++i) best[i] = std::min(best[i], v[i]);
      }
      return best;
    };
    btp = measure_tp(false);
    if (sp) bsp = measure_tp(true);
    auto mean = [](const std::vector<int64_t>& v) {
      double s = 0;
      for (auto x : v) s += static_cast<double>(x);
      return v.empty() ? 0.0 : s / static_cast<double>(v.size());
    };
    Table at{"activations",
             fmt::format("Activation bytes per layer kept for backward, formulas (s = {}, b = {}, h = {}, a = {}, t = {})",
                         T, B, gc.width, gc.heads, t),
             {text_col("name", "run"), int_col("formula_fp32", "fp32 formula", "bytes"),
              int_col("korthikanti", "Korthikanti", "bytes")}};
    Table am{"activations_measured", "Activation bytes per layer kept for backward, measured (run-dependent)",
             {text_col("name", "run"), int_col("measured", "measured", "bytes"),
              int_col("formula_fp32", "fp32 formula", "bytes"), float_col("ratio", "measured/fp32")}};
    auto row = [&](const std::string& name, double measured, int64_t tt, bool s) {
      const auto f = static_cast<int64_t>(std::llround(tp::fp32_activation_bytes(T, B, gc.width, gc.heads, tt, s)));
      at.rows.push_back({{"name", name}, {"formula_fp32", f},
                         {"korthikanti", static_cast<int64_t>(std::llround(tp::korthikanti_bytes(T, B, gc.width, gc.heads, tt, s)))}});
      am.rows.push_back({{"name", name}, {"measured", static_cast<int64_t>(std::llround(measured))}, {"formula_fp32", f},
                         {"ratio", measured / static_cast<double>(f)}});
    };
    row("one_process", mean(b1), 1, false);
    row("tp", max_over_ranks(w, mean(btp)), t, false);
    if (sp) row("tp_sp", max_over_ranks(w, mean(bsp)), t, true);
    am.notes.push_back("measured: live bytes of the counting allocator after a block's forward minus before (the "
                       "graph kept), mean over the blocks, largest rank (TP: the smallest of 3 passes): the storage "
                       "autograd keeps for backward plus the block's output (the next block's LayerNorm input). "
                       "Run-dependent under TP: Gloo's worker threads release collective temporaries asynchronously");
    am.notes.push_back("not in the formulas: LayerNorm mean and rstd (2 x 4sb per LayerNorm), the causal mask "
                       "(s^2 bytes, bool, and its negation), copies that matmul makes of transposed q, k, v");
    at.notes.push_back("Korthikanti et al. 2022 (fp16 activations, 1-byte dropout masks): sbh(34 + 5as/h), "
                       "sbh(10 + 24/t + 5as/(ht)), (sbh/t)(34 + 5as/h)");
    at.notes.push_back("fp32 formula for what runs here (4-byte activations, no dropout): sbh(64 + 4as/h), "
                       "sbh(16 + 48/t + 4as/(ht)); with SP sbh(8/t + 8 + 48/t + 4as/(ht)): the column-parallel "
                       "GEMMs keep their all-gathered input (Megatron re-gathers it in backward instead)");
    report.add(std::move(at));
    report.add(std::move(am), Store::Timings);
  }

  // 5. Step times: forward + backward.
  {
    const int64_t steps = cfg.integer("/time/steps");
    int64_t step = 0;
    const double t1 = median_seconds([&] {
      full->zero_grad();
      gpt_loss(full->forward(idx), tgt).backward();
    }, steps, 1);
    tp::TpGpt mtp(full, g, div, false);
    const double ttp = median_seconds([&] {
      w.fault_point(step++);
      w.note_progress();
      mtp.loss(idx, tgt).backward();
    }, steps, 1);
    double tsp = 0;
    if (sp) {
      tp::TpGpt msp(full, g, div, true);
      tsp = median_seconds([&] {
        w.note_progress();
        msp.loss(idx, tgt).backward();
        msp.allreduce_sequence_parallel_grads();
      }, steps, 1);
    }
    Table tt{"step_time", "Forward + backward of the tiny GPT (median, run-dependent)",
             {text_col("name", "run"), float_col("step_ms", "step", "ms"), float_col("vs_one_process", "vs 1-proc")}};
    tt.rows.push_back({{"name", "one_process"}, {"step_ms", t1 * 1e3}, {"vs_one_process", 1.0}});
    tt.rows.push_back({{"name", "tp"}, {"step_ms", max_over_ranks(w, ttp) * 1e3}, {"vs_one_process", ttp / t1}});
    if (sp) tt.rows.push_back({{"name", "tp_sp"}, {"step_ms", max_over_ranks(w, tsp) * 1e3}, {"vs_one_process", tsp / t1}});
    tt.notes.push_back("one process on rank 0's core alone; TP ranks share this machine's cores, so the ratio says "
                       "what the collectives cost more than what splitting the GEMMs saves");
    report.add(std::move(tt), Store::Timings);

    // Communication of one step, counted by the TP group (dist::Group's counters: payload = the
    // all-reduce buffer, the all-gather's output, the reduce-scatter's input).
    const double btc = static_cast<double>(B * T * gc.width) * 4, bt = static_cast<double>(B * T) * 4;
    const double L = static_cast<double>(gc.layers), C = static_cast<double>(gc.width);
    auto count_step = [&](tp::TpGpt& m) {
      g->reset_comm_counts();
      m.loss(idx, tgt).backward();
      m.allreduce_sequence_parallel_grads();
      return g->comm_counts();
    };
    Table cm{"comm", fmt::format("Communication per step (forward + backward) and rank, TP group of t = {}", t),
             {text_col("name", "run / collective"), int_col("calls", "calls"), int_col("payload_bytes", "payload", "bytes"),
              int_col("formula_bytes", "formula", "bytes"), int_col("sent_bytes", "sent", "bytes")}};
    double worst = 0;
    auto rows_of = [&](const std::string& run, const std::map<std::string, dist::CommCount>& c,
                       const std::map<std::string, double>& f) {
      for (const auto& [kind, formula] : f) {
        const auto it = c.find(kind);
        const dist::CommCount k = it == c.end() ? dist::CommCount{} : it->second;
        worst = std::max(worst, std::abs(static_cast<double>(k.payload_bytes) - formula) / std::max(formula, 1.0));
        cm.rows.push_back({{"name", run + "/" + kind}, {"calls", k.calls}, {"payload_bytes", k.payload_bytes},
                           {"formula_bytes", static_cast<int64_t>(std::llround(formula))}, {"sent_bytes", static_cast<int64_t>(std::llround(k.sent_bytes))}});
      }
    };
    {
      tp::TpGpt m(full, g, div, false);
      // wte's g; per layer g after attn_proj and mlp_proj (forward), f before c_attn and c_fc
      // (backward); lm_head's f (backward); the cross-entropy's max, target logit and sum-exp.
      rows_of("tp", count_step(m), {{"all_reduce", btc * (2 + 4 * L) + 3 * bt}});
    }
    if (sp) {
      tp::TpGpt m(full, g, div, true);
      // all-gather: before c_attn, c_fc (forward) and lm_head, again as the reduce-scatters'
      // backward, and the scatter's backward; reduce-scatter: after attn_proj, mlp_proj, and as
      // the all-gathers' backward; all-reduce: wte's g, the cross-entropy, the SP gradients
      // (per layer two LayerNorms 4C and two row biases 2C, ln_f 2C).
      rows_of("tp_sp", count_step(m),
              {{"all_gather", btc * (4 * L + 2)}, {"reduce_scatter", btc * (4 * L + 1)},
               {"all_reduce", btc + 3 * bt + 4 * (6 * L * C + 2 * C)}});
    }
    report.check("communication: payload bytes per step and collective vs the formula (relative)", worst, 0.0);
    cm.notes.push_back("TP all-reduce payload per step = 4bsh(2 + 4L) + 3*4bs (Megatron: 2 all-reduces per layer "
                       "forward, 2 backward); TP + SP: all-gather 4bsh(4L + 2), reduce-scatter 4bsh(4L + 1) — the same "
                       "ring traffic as the all-reduces they replace (an all-reduce = reduce-scatter + all-gather)");
    if (!compat::kGlooHasReduceScatter)
      cm.notes.push_back("LibTorch 1.13's Gloo has no reduce_scatter: mpt's ring (send/recv) runs it, (t-1)/t of the "
                         "payload sent per rank (see env)");
    report.add(std::move(cm));
  }
  return report;
}

/// Memory per process, times the processes: the GPT's parameters and gradients (full and TP
/// copies: 4 models), activations of the batch, the MLP.
MemoryEstimate tensorparallel_memory(const Config& cfg, int world_size) {
  const GptConfig c = gpt_of(cfg);
  const double P = static_cast<double>(gpt_num_params(c));
  MemoryEstimate e;
  e.add("GPT parameters and gradients (one process, TP, TP + SP copies)", "/model/*", 4 * 2 * 4 * P);
  const double s = static_cast<double>(cfg.integer("/data/seq")), b = static_cast<double>(cfg.integer("/data/batch"));
  e.add("GPT activations", "/data/batch, /data/seq, /model/*",
        4 * static_cast<double>(c.layers) * s * b * (64.0 * static_cast<double>(c.width) + 8 * static_cast<double>(c.heads) * s) +
            8 * s * b * static_cast<double>(c.vocab));
  const double in = static_cast<double>(cfg.integer("/mlp/in")), h = static_cast<double>(cfg.integer("/mlp/hidden")),
               o = static_cast<double>(cfg.integer("/mlp/out")), n = static_cast<double>(cfg.integer("/mlp/batch"));
  e.add("MLP", "/mlp/*", 4 * 4 * (in * h + h * o + n * (in + 2 * h + o)));
  e.times(world_size, "processes (/nproc)");
  return e;
}

/// Cross-key checks before any work and any worker (exit 2 naming the keys).
/// The mesh's cross-key checks (/mesh/steps > 0), before any worker starts.
void validate_mesh(const Config& cfg, int world_size) {
  const int64_t dp = cfg.integer("/mesh/dp"), tp = cfg.integer("/mesh/tp"), pp = cfg.integer("/mesh/pp");
  if (dp * tp * pp != world_size)
    throw ConfigError(fmt::format("/mesh: expected /mesh/dp x /mesh/tp x /mesh/pp = the world size {} (--nproc or the "
                                  "launcher's WORLD_SIZE), got {} x {} x {} = {}",
                                  world_size, dp, tp, pp, dp * tp * pp));
  const int64_t a = cfg.integer("/model/heads"), h = cfg.integer("/model/width"), L = cfg.integer("/model/layers");
  if (h % a != 0)
    throw ConfigError(fmt::format("/model/heads: expected a divisor of /model/width = {}, got {}", h, a));
  if (a % tp != 0)
    throw ConfigError(fmt::format("/mesh/tp: expected a divisor of /model/heads = {} (every TP rank owns whole heads), "
                                  "got {}", a, tp));
  const int64_t mh = cfg.integer("/model/mlp_ratio") * h;
  if (mh % tp != 0)
    throw ConfigError(fmt::format("/mesh/tp: expected a divisor of the MLP width /model/mlp_ratio x /model/width = {}, "
                                  "got {}", mh, tp));
  if (pp > L || L % pp != 0)
    throw ConfigError(fmt::format("/mesh/pp: expected a divisor of /model/layers = {} (every stage holds L/pp blocks), "
                                  "got {}", L, pp));
  const int64_t m = cfg.integer("/mesh/microbatches"), b = cfg.integer("/data/batch");
  if (m < pp)
    throw ConfigError(fmt::format("/mesh/microbatches: expected at least /mesh/pp = {} (a pipeline of p stages needs "
                                  ">= p microbatches in flight), got {}", pp, m));
  if (b % m != 0)
    throw ConfigError(fmt::format("/mesh/microbatches: expected a divisor of /data/batch = {} (equal microbatches), "
                                  "got {}", b, m));
  const int64_t s = cfg.integer("/data/seq");
  if (s > cfg.integer("/model/context"))
    throw ConfigError(fmt::format("/data/seq: expected at most /model/context = {}, got {}", cfg.integer("/model/context"), s));
  const int64_t fault = cfg.integer("/fault/rank");
  if (fault >= world_size)
    throw ConfigError(fmt::format("/fault/rank: expected -1 or a rank 0 .. {}, got {}", world_size - 1, fault));
  if (fault >= 0 && cfg.integer("/fault/step") >= cfg.integer("/mesh/steps"))
    throw ConfigError(fmt::format("/fault/step: expected a step < /mesh/steps = {}, got {}", cfg.integer("/mesh/steps"),
                                  cfg.integer("/fault/step")));
}

void validate_tensorparallel(const Config& cfg, int world_size) {
  if (cfg.integer("/mesh/steps") > 0) return validate_mesh(cfg, world_size);
  const int64_t t = world_size, a = cfg.integer("/model/heads"), h = cfg.integer("/model/width");
  if (h % a != 0)
    throw ConfigError(fmt::format("/model/heads: expected a divisor of /model/width = {}, got {}", h, a));
  if (a % t != 0)
    throw ConfigError(fmt::format("/model/heads: expected a multiple of the TP degree t = {} (/nproc; every rank "
                                  "owns whole heads), got {}", t, a));
  const int64_t mh = cfg.integer("/model/mlp_ratio") * h;
  if (mh % t != 0)
    throw ConfigError(fmt::format("/model/mlp_ratio: expected /model/mlp_ratio x /model/width divisible by the TP "
                                  "degree t = {} (/nproc), got {} x {} = {}", t, cfg.integer("/model/mlp_ratio"), h, mh));
  if (cfg.integer("/mlp/hidden") % t != 0)
    throw ConfigError(fmt::format("/mlp/hidden: expected a multiple of the TP degree t = {} (/nproc), got {}", t,
                                  cfg.integer("/mlp/hidden")));
  const int64_t s = cfg.integer("/data/seq");
  if (s > cfg.integer("/model/context"))
    throw ConfigError(fmt::format("/data/seq: expected at most /model/context = {}, got {}", cfg.integer("/model/context"), s));
  if (cfg.boolean("/sp/enabled") && s % t != 0)
    throw ConfigError(fmt::format("/data/seq: sequence parallelism (/sp/enabled) splits the sequence over the TP "
                                  "degree t = {} (/nproc): expected a multiple of {}, got {}", t, t, s));
  const int64_t fault = cfg.integer("/fault/rank");
  if (fault >= world_size)
    throw ConfigError(fmt::format("/fault/rank: expected -1 or a rank 0 .. {}, got {}", world_size - 1, fault));
  if (fault >= 0 && cfg.integer("/fault/step") >= cfg.integer("/time/steps") + 1)
    throw ConfigError(fmt::format("/fault/step: expected a step <= /time/steps = {}, got {}", cfg.integer("/time/steps"),
                                  cfg.integer("/fault/step")));
}

}  // namespace

Experiment tensorparallel_experiment() {
  return {"tensorparallel",
          "Tensor parallelism (Megatron column/row-parallel linears, heads split, vocab-parallel embedding and "
          "cross-entropy) and sequence parallelism, each operation against one process; activation bytes vs "
          "Korthikanti",
          tensorparallel_spec, run_tensorparallel, validate_tensorparallel, tensorparallel_memory, Processes::Multi,
          dist_fault_plan};
}

}  // namespace mpt
