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
#include "core/models/gpt_spec.hpp"
#include "core/runtime/memory.hpp"
#include "core/models/mlp.hpp"
#include "core/pipeline/executor.hpp"
#include "core/process_plan.hpp"
#include "core/runtime/runtime.hpp"
#include "core/parallel/tp.hpp"
#include "core/parallel/tp_gpt.hpp"
#include "experiments/tensorparallel_parts.hpp"
#include "core/runtime/timing.hpp"

namespace mpt {

namespace {

ConfigSpec tensorparallel_spec() {
  ConfigSpec s;
  s.integer("/seed", 1, "seed before building each model (torch.manual_seed) and of the data", 0);
  s.integer("/nproc", 2,
            "worker processes (--nproc N): the TP degree t, or dp x cp x tp x pp with a mesh (/mesh); ignored under "
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
  s.integer("/mesh/steps", 0, "SGD steps of the GPT on the DP x CP x TP x PP mesh (0: no mesh, and the /mesh keys are "
            "not used; > 0: the mesh section alone, on /mesh/dp x /mesh/cp x /mesh/tp x /mesh/pp = --nproc processes)",
            0, 1000);
  s.integer("/mesh/dp", 1, "mesh: data-parallel degree (each DP rank trains on its /data/batch sequences; at most 2: "
            "the two-term gradient all-reduce is what makes the mesh bitwise equal to its TP reference, more terms "
            "would let Gloo reorder the sum)", 1, 2);
  s.integer("/mesh/tp", 1, "mesh: tensor-parallel degree (must divide /model/heads and the MLP width)", 1, 8);
  s.integer("/mesh/pp", 1, "mesh: pipeline stages (must divide /model/layers)", 1, 8);
  s.integer("/mesh/cp", 1, "mesh: context-parallel degree (each sequence's positions split over cp ranks, "
            "core/parallel/cp; at most 2, as /mesh/dp)", 1, 2);
  s.choice("/mesh/cp_attention", "ring", {"ring", "all_gather", "ulysses"},
           "mesh: how the CP ranks' attention sees the whole sequence (mpt contextparallel): ring, all_gather or "
           "ulysses");
  s.choice("/mesh/cp_split", "balanced", {"balanced", "contiguous"},
           "mesh: the CP split of the sequence (balanced: 2cp chunks, rank r holding r and 2cp-1-r)");
  s.integer("/mesh/microbatches", 2, "mesh: microbatches per DP rank and step (>= /mesh/pp; must divide /data/batch)",
            1, 4096);
  s.choice("/mesh/schedule", "1f1b", {"gpipe", "1f1b"}, "mesh: the pipeline schedule (core/pipeline/schedule)");
  s.number("/mesh/lr", 0.5, "mesh: SGD learning rate (theta -= lr * grad)", 0.0, 100.0);
  add_dist_keys(s, DistKeys{"step of the TP timing loop (with /mesh/steps > 0: the mesh's SGD step)", 1, 7, false});
  return s;
}

}  // namespace

GptConfig gpt_of(const Config& cfg) { return gpt_config_at(cfg, "/model", cfg.integer("/model/vocab")); }

/// The largest value of x over the ranks (checks are the worst rank's).
double max_over_ranks(World& w, double x) { return dist::max_over(*w.group(), x); }

namespace {

/// max |diff| / bound over the elements (an element with bound 0 must match exactly).
double worst_ratio(const torch::Tensor& got, const torch::Tensor& want, const torch::Tensor& bound) {
  auto d = (got.to(torch::kDouble) - want.to(torch::kDouble)).abs();
  auto r = torch::where(bound > 0, d / bound, torch::where(d > 0, torch::full_like(d, INFINITY), torch::zeros_like(d)));
  return r.max().item<double>();
}

// ----------------------------------------------------------------------------
// 1. MLP: Column then Row
// ----------------------------------------------------------------------------

/// Section 1's two runs of one MLP from the same seed: one process (pre1 = fc1's output) and TP
/// (TpMlp; pre = this rank's fc1 columns), loss Σ Z∘R with the same R, each run's backward done.
struct MlpRuns {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::Tensor x, rw, x1, z1, xt, pre, z;
  std::unique_ptr<tp::TpMlp> mlp;
};

MlpRuns run_mlp(const Config& cfg, const std::shared_ptr<dist::Group>& g) {
  const int64_t in = cfg.integer("/mlp/in"), hid = cfg.integer("/mlp/hidden"), out = cfg.integer("/mlp/out"),
                n = cfg.integer("/mlp/batch");
  MlpRuns r;
  seed_all(static_cast<std::uint64_t>(cfg.integer("/seed")));
  r.fc1 = torch::nn::Linear(in, hid);
  r.fc2 = torch::nn::Linear(hid, out);
  r.x = torch::randn({n, in});
  r.rw = torch::randn({n, out});  // loss = sum(Z * R): dZ = R exactly on both sides
  // One process.
  r.x1 = r.x.clone().set_requires_grad(true);
  auto pre1 = torch::linear(r.x1, r.fc1->weight, r.fc1->bias);
  pre1.retain_grad();
  auto h1 = torch::gelu(pre1);
  r.z1 = torch::linear(h1, r.fc2->weight, r.fc2->bias);
  (r.z1 * r.rw).sum().backward();
  // TP.
  r.mlp = std::make_unique<tp::TpMlp>(r.fc1, r.fc2, g);
  r.xt = r.x.clone().set_requires_grad(true);
  r.z = r.mlp->forward(r.xt, &r.pre);
  r.pre.retain_grad();
  (r.z * r.rw).sum().backward();
  return r;
}

/// One row of the MLP table: a TP tensor against the one-process operation on the same input.
struct MlpRow {
  std::string name, what;
  double diff, bound, ratio;
  bool checked_bitwise;
};

/// Each TP tensor of section 1 against the one-process operation on the same input (the TP
/// side's own inputs, gathered), so that the bound of that one operation applies whatever
/// happened before. Collective (max over the ranks).
std::vector<MlpRow> mlp_rows(World& w, const std::shared_ptr<dist::Group>& g, const MlpRuns& r) {
  const auto& fc1 = r.fc1;
  const auto& fc2 = r.fc2;
  const auto& x = r.x;
  const auto& rw = r.rw;
  const auto& pre = r.pre;
  const auto& z = r.z;
  const auto& xt = r.xt;
  const auto& mlp = *r.mlp;
  const int64_t hid = fc1->weight.size(0);
  const auto& rows = mlp.fc1.rows;
  std::vector<MlpRow> rowsout;
  auto bit = [&](const std::string& name, const std::string& what, const torch::Tensor& a, const torch::Tensor& b) {
    rowsout.push_back({name, what, max_over_ranks(w, max_abs_diff64(a, b)), 0.0, 0.0, true});
  };
  auto bounded = [&](const std::string& name, const std::string& what, const torch::Tensor& a, const torch::Tensor& b,
                     const torch::Tensor& bound) {
    rowsout.push_back({name, what, max_over_ranks(w, max_abs_diff64(a, b)), max_over_ranks(w, bound.max().item<double>()),
                       max_over_ranks(w, worst_ratio(a, b, bound)), false});
  };
  torch::NoGradGuard no_grad;
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
  return rowsout;
}

/// Section 1: the MLP on TP (ColumnParallelLinear, GELU, RowParallelLinear) against one process.
Table mlp_table(const Config& cfg, World& w, const std::shared_ptr<dist::Group>& g, Report& report) {
  const int64_t in = cfg.integer("/mlp/in"), hid = cfg.integer("/mlp/hidden"), out = cfg.integer("/mlp/out");
  const MlpRuns r = run_mlp(cfg, g);
  const std::vector<MlpRow> rowsout = mlp_rows(w, g, r);
  const auto& rows = r.mlp->fc1.rows;
  const auto& mlp = *r.mlp;
  const auto &z = r.z, &z1 = r.z1, &xt = r.xt, &x1 = r.x1;
  const auto &fc1 = r.fc1, &fc2 = r.fc2;
  // End to end against the one-process run (reported: after a GEMM that is not bitwise, the
  // next tensors differ by more than one operation's bound).
  const double e2e_z = max_over_ranks(w, max_abs_diff64(z, z1)), e2e_dx = max_over_ranks(w, max_abs_diff64(xt.grad(), x1.grad()));
  const double e2e_w1 = max_over_ranks(w, max_abs_diff64(mlp.fc1.weight.grad(), fc1->weight.grad().index_select(0, rows)));
  const double e2e_w2 = max_over_ranks(w, max_abs_diff64(mlp.fc2.weight.grad(), fc2->weight.grad().index_select(1, rows)));

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
  return t;
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
      for (const auto& s : shards) spread = nan_max(spread, max_abs_diff64(s, shards[0]));
      out.rank_spread[p.name] = spread;
      out.grads[p.name] = shards[0];
      continue;
    }
    auto idxs = tp::all_gather_shards(p.index, *g);
    out.grads[p.name] = tp::unshard(shards, idxs, p.dim, named[p.name].size(p.dim));
  }
  return out;
}

}  // namespace

GptCase gpt_case(const Config& cfg, int t) {
  GptCase c;
  c.gc = gpt_of(cfg);
  c.B = cfg.integer("/data/batch");
  c.T = cfg.integer("/data/seq");
  c.div = cfg.integer("/model/vocab_divisible_by");
  c.sp = cfg.boolean("/sp/enabled");
  c.t = t;
  c.vpad = tp::padded_vocab_size(c.gc.vocab, c.div, t);
  seed_all(static_cast<std::uint64_t>(cfg.integer("/seed")));
  c.full = TinyGpt(c.gc);
  c.idx = torch::randint(c.gc.vocab, {c.B, c.T}, torch::kLong);
  c.tgt = torch::randint(c.gc.vocab, {c.B, c.T}, torch::kLong);
  auto loss1 = gpt_loss(c.full->forward(c.idx), c.tgt);
  loss1.backward();
  c.loss1 = loss1.item<double>();
  for (const auto& kv : c.full->named_parameters()) c.grads1[kv.key()] = kv.value().grad().clone();
  c.full->zero_grad();
  return c;
}

namespace {

/// Every TP operation against the one-process module fed the same input (TpGpt::loss_checked's
/// sites), worst rank; checks: bitwise sites, bounded sites (max ratio).
Table sites_table(World& w, const GptCase& c, const GptRun& tpr, const GptRun& spr, Report& report) {
  const bool sp = c.sp;
  const int t = c.t;
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
  return st;
}

/// The loss and every gradient against one process (shards gathered into the full layout), SP
/// against TP; checks: SP bitwise equal to TP (t <= 2), SP's all-reduced gradients equal on every rank.
Table grads_table(const GptCase& c, const GptRun& tpr, const GptRun& spr, Report& report) {
  const GptConfig& gc = c.gc;
  const int64_t B = c.B, T = c.T;
  const bool sp = c.sp;
  const int t = c.t;
  const auto& grads1 = c.grads1;
  const int64_t vpad = c.vpad;
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
                {"tp_vs_1", max_abs_diff64(tpr.grads.at(name), kv.second)}};
    if (sp) {
      const double d = max_abs_diff64(spr.grads.at(name), tpr.grads.at(name));
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
  return gt;
}

/// Mean next-token cross-entropy: one process, TP, TP + SP.
Table loss_table(const GptCase& c, const GptRun& tpr, const GptRun& spr) {
  const GptConfig& gc = c.gc;
  const bool sp = c.sp;
  const int64_t div = c.div, vpad = c.vpad;
  const double loss1 = c.loss1;
  Table lt{"loss", "Mean next-token cross-entropy",
           {text_col("name", "run"), float_col("loss", "loss", "nats", 7), sci_col("vs_one_process", "vs 1-proc")}};
  lt.rows.push_back({{"name", "one_process"}, {"loss", loss1}, {"vs_one_process", 0.0}});
  lt.rows.push_back({{"name", "tp"}, {"loss", tpr.loss}, {"vs_one_process", std::abs(tpr.loss - loss1)}});
  if (sp)
    lt.rows.push_back({{"name", "tp_sp"}, {"loss", spr.loss}, {"vs_one_process", std::abs(spr.loss - loss1)}});
  lt.notes.push_back(fmt::format("vocabulary {} padded to {} (make_vocab_size_divisible_by = {} x t): padded rows of "
                                 "wte / lm_head are zeros, their logits masked to -inf in the vocab-parallel "
                                 "cross-entropy, so the one-process model of the true vocabulary is the reference",
                                 gc.vocab, vpad, div));
  return lt;
}

/// Sections 1-5 on a TP group of every rank (section 6, the mesh, with /mesh/steps > 0).
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

  report.add(mlp_table(cfg, w, g, report));  // 1. MLP
  // 2-3. GPT: the one-process reference, then TP and TP + SP from the same weights.
  const GptCase gpt = gpt_case(cfg, t);
  const GptRun tpr = run_tp(gpt.full, g, gpt.div, false, gpt.idx, gpt.tgt);
  GptRun spr;
  if (gpt.sp) spr = run_tp(gpt.full, g, gpt.div, true, gpt.idx, gpt.tgt);
  report.add(sites_table(w, gpt, tpr, spr, report));
  report.add(grads_table(gpt, tpr, spr, report));
  report.add(loss_table(gpt, tpr, spr));
  auto [formulas, measured] = activation_tables(cfg, w, g, gpt);  // 4. activation bytes
  report.add(std::move(formulas));
  report.add(std::move(measured), Store::Timings);
  report.add(step_time_table(cfg, w, g, gpt), Store::Timings);  // 5. step time and communication
  report.add(comm_table(g, gpt, report));
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
