/*
 * mpt contextparallel — the sequence of the tiny GPT split over c processes (c10d, Gloo on CPU),
 * its attention done three ways, each proven against one process on the whole sequence.
 *
 * Every rank holds the tokens of its positions (contiguous, or the causal load-balanced split:
 * 2c chunks, rank r holding chunks r and 2c−1−r) and a replica of the weights. Only attention
 * mixes positions; it needs every earlier key:
 *   ring        K/V blocks sent around the ring, c steps, partial softmaxes merged by their
 *               running max and sum (flash-attention's rescaling); backward: K/V around again,
 *               dK/dV partials travelling with their block back to its owner (Liu et al. 2023)
 *   all_gather  K and V all-gathered, dK and dV reduce-scattered (Llama 3's CP)
 *   ulysses     all-to-all q, k, v to head-sharded, whole-sequence attention, all-to-all back
 *               (Jacobs et al. 2023, DeepSpeed-Ulysses)
 *
 *  1. attention alone, each variant and split against one process and against the exact
 *     (float64) attention of the same fp32 inputs, within a bound derived from the number of
 *     merged blocks (core/parallel/cp's attention_bounds; docs/contextparallel.md)
 *  2. the GPT: logits, loss and every gradient against one process (gradients all-reduced over
 *     the ranks, as data parallelism does: the replicas saw different tokens); the loss within
 *     its bound, logits and gradients reported (tensorparallel's policy: per-operation checks)
 *  3. activation bytes one block keeps per rank, measured by the counting allocator, against
 *     each variant's formula (cp::block_activation_bytes)
 *  4. causal load balance: useful (unmasked) and computed score pairs per rank, contiguous vs
 *     balanced, and the ring's measured compute and wait per rank
 *  5. bytes sent per step and variant, counted by the process group, against the formulas
 * The DP x CP x TP x PP mesh is tensorparallel's (tensorparallel_mesh.cpp, /mesh/cp).
 *
 *   mpt contextparallel                     # c = 2 processes
 *   mpt contextparallel --nproc 4
 *   torchrun --nproc_per_node 2 --no-python mpt contextparallel
 */
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/dist/dist.hpp"
#include "core/errors.hpp"
#include "core/experiment.hpp"
#include "core/models/gpt.hpp"
#include "core/models/gpt_spec.hpp"
#include "core/models/mlp.hpp"
#include "core/numerics/bounds.hpp"
#include "core/parallel/cp.hpp"
#include "core/parallel/tp.hpp"
#include "core/process_plan.hpp"
#include "core/runtime/memory.hpp"
#include "core/runtime/runtime.hpp"
#include "core/runtime/timing.hpp"

namespace mpt {

// A namespace of its own: the experiment files are compiled in unity batches, where another
// file's helpers (GptRun, worst_ratio, ...) would meet these.
namespace cpx {

namespace {

const cp::Variant kVariants[] = {cp::Variant::Ring, cp::Variant::AllGather, cp::Variant::Ulysses};
const cp::Split kSplits[] = {cp::Split::Contiguous, cp::Split::Balanced};

ConfigSpec contextparallel_spec() {
  ConfigSpec s;
  s.integer("/seed", 1, "seed before building each model (torch.manual_seed) and of the data", 0);
  s.integer("/nproc", 2, "worker processes (--nproc N): the CP degree c; ignored under torchrun/SLURM", 1, 8);
  s.integer("/model/vocab", 65, "GPT vocabulary V", 2, 100000);
  s.integer("/model/context", 64, "GPT context (positions)", 1, 4096);
  s.integer("/model/width", 64, "GPT width C (n_embd)", 1, 4096);
  s.integer("/model/heads", 4, "attention heads (c must divide them: Ulysses)", 1, 256);
  s.integer("/model/layers", 2, "transformer blocks", 1, 64);
  s.integer("/model/mlp_ratio", 4, "MLP hidden width / width", 1, 16);
  s.integer("/data/batch", 2, "sequences B", 1, 4096);
  s.integer("/data/seq", 64, "sequence length T (<= /model/context; 2c must divide it: the balanced split)", 1, 4096);
  s.choice("/cp/split", "balanced", {"balanced", "contiguous"},
           "how the GPT's sequence is split (section 2; sections 1 and 3 run both): balanced (2c chunks, rank r "
           "holding r and 2c-1-r) or contiguous");
  s.integer("/balance/seq", 512, "sequence length of the load-balance timing (section 3; 2c must divide it)", 2, 65536);
  s.integer("/balance/steps", 5, "timed forward+backward steps of the ring per split (the median is reported)", 1, 1000);
  add_dist_keys(s, DistKeys{"timed step of the load-balance section", 1, 7, false});
  return s;
}

GptConfig gpt_config(const Config& cfg) { return gpt_config_at(cfg, "/model", cfg.integer("/model/vocab")); }

/// The whole sequence from every rank's share along `dim` (positions under `split`): x [.., Tl, ..] → [.., T, ..].
torch::Tensor gather_sequence(const torch::Tensor& local, dist::Group& g, cp::Split split, int64_t dim) {
  const auto shards = tp::all_gather_shards(local.contiguous(), g);
  const int64_t c = g.size(), T = local.size(dim) * c;
  auto sizes = local.sizes().vec();
  sizes[static_cast<std::size_t>(dim)] = T;
  auto full = torch::empty(sizes, local.options());
  for (int64_t r = 0; r < c; ++r) full.index_copy_(dim, cp::positions(T, c, r, split), shards[static_cast<std::size_t>(r)]);
  return full;
}

/// max |diff| / bound over the elements (an element with bound 0 must match exactly).
double worst_ratio(const torch::Tensor& got, const torch::Tensor& want, const torch::Tensor& bound) {
  auto d = (got.to(torch::kDouble) - want.to(torch::kDouble)).abs();
  auto r = torch::where(bound > 0, d / bound, torch::where(d > 0, torch::full_like(d, INFINITY), torch::zeros_like(d)));
  // where() sends a NaN bound or difference to a branch that hides it: a NaN anywhere fails.
  if (d.isnan().any().item<bool>() || bound.isnan().any().item<bool>()) return NAN;
  return r.max().item<double>();
}

// ----------------------------------------------------------------------------
// 1. Attention alone
// ----------------------------------------------------------------------------

/// Section 1: causal attention of random q, k, v [B, nh, T, hd] (the GPT's shapes), forward and
/// backward, one process and each variant x split, against the exact attention of the same inputs.
Table attention_table(const Config& cfg, dist::Group& g, Report& report) {
  const GptConfig gc = gpt_config(cfg);
  const int64_t B = cfg.integer("/data/batch"), T = cfg.integer("/data/seq"), nh = gc.heads, hd = gc.width / gc.heads;
  const int64_t c = g.size();
  seed_all(static_cast<std::uint64_t>(cfg.integer("/seed")));
  const auto q = torch::randn({B, nh, T, hd}), k = torch::randn({B, nh, T, hd}), v = torch::randn({B, nh, T, hd}),
             dy = torch::randn({B, nh, T, hd});
  // One process: the GPT block's own attention, autograd backward.
  auto q1 = q.clone().requires_grad_(true), k1 = k.clone().requires_grad_(true), v1 = v.clone().requires_grad_(true);
  auto y1 = cp::causal_attention(q1, k1, v1);
  y1.backward(dy);
  const std::vector<torch::Tensor> one = {y1.detach(), q1.grad(), k1.grad(), v1.grad()};
  const char* names[] = {"y", "dq", "dk", "dv"};

  Table t{"attention",
          fmt::format("Causal attention (B = {}, heads = {}, T = {}, hd = {}) on c = {}: each tensor vs one process "
                      "and vs the exact (float64) attention of the same inputs",
                      B, nh, T, hd, c),
          {text_col("name", "run/tensor"), sci_col("vs_one_process", "vs 1-proc"), sci_col("vs_exact", "vs exact"),
           sci_col("max_bound", "max bound"), float_col("worst_ratio", "max err/bound")}};
  auto add_rows = [&](const std::string& run, const std::vector<torch::Tensor>& got, int64_t blocks, int64_t terms) {
    const auto b = cp::attention_bounds(q, k, v, dy, blocks, terms);
    const torch::Tensor refs[] = {b.y_ref, b.dq_ref, b.dk_ref, b.dv_ref}, bounds[] = {b.y, b.dq, b.dk, b.dv};
    double worst = 0, diff_one = 0;
    for (std::size_t i = 0; i < 4; ++i) {
      const double r = worst_ratio(got[i], refs[i], bounds[i]), d1 = max_abs_diff64(got[i], one[i]);
      worst = nan_max(worst, r);  // nan_max: a NaN fails the check instead of vanishing
      diff_one = nan_max(diff_one, d1);
      t.rows.push_back({{"name", run + "/" + names[i]}, {"vs_one_process", d1}, {"vs_exact", max_abs_diff64(got[i], refs[i])},
                        {"max_bound", bounds[i].max().item<double>()}, {"worst_ratio", r}});
    }
    report.check(run + " attention: y, dq, dk, dv within the derived bound of the exact attention (max err/bound)",
                 worst, 1.0);
    return diff_one;
  };
  add_rows("one_process", one, 1, 1);
  for (const auto split : kSplits)
    for (const auto variant : kVariants) {
      const auto pos = cp::positions(T, c, g.rank(), split);
      auto ql = q.index_select(2, pos).requires_grad_(true), kl = k.index_select(2, pos).requires_grad_(true),
           vl = v.index_select(2, pos).requires_grad_(true);
      cp::Attention attn(std::shared_ptr<dist::Group>(&g, [](dist::Group*) {}), variant, split);
      auto yl = attn(ql, kl, vl);
      yl.backward(dy.index_select(2, pos));
      std::vector<torch::Tensor> got;
      for (const auto& x : {yl.detach(), ql.grad(), kl.grad(), vl.grad()}) got.push_back(gather_sequence(x, g, split, 2));
      const std::string run = cp::variant_name(variant) + "/" + cp::split_name(split);
      const int64_t blocks = variant == cp::Variant::Ring ? c : 1;
      const int64_t terms = variant == cp::Variant::Ulysses ? 1 : c;
      const double d1 = add_rows(run, got, blocks, terms);
      // Ulysses runs one process's attention on whole heads (the all-to-alls only move data): each
      // head's GEMMs have one process's shapes, the same bits. All-gather computes each query row
      // as one process does, but through GEMMs of T/c rows (a kernel may order the sums of
      // another shape differently: reported, bounded above), and dK and dV are sums of c partials;
      // the ring merges c partial softmaxes.
      if (variant == cp::Variant::Ulysses) report.check(run + ": y, dq, dk, dv bitwise equal to one process", d1, 0.0);
    }
  t.notes.push_back("vs exact: against the same function of the same fp32 inputs in float64; bound: first order in "
                    "u = 2^-24 from the scores' dot products (gamma_hd), the exponents' rounding, exp and log within "
                    "1 ulp, the softmax sums over T keys and the rescaling of each merged block (ring: c blocks), the "
                    "dK/dV partial sums (ring, all_gather: c terms); docs/contextparallel.md derives it");
  t.notes.push_back("one_process has the same bound with 1 block and 1 term: every run, one process included, is "
                    "checked against the exact attention, so a wrong merge cannot hide behind a loose comparison");
  return t;
}

// ----------------------------------------------------------------------------
// 2. The GPT, 3. its activation bytes and 5. bytes per step
// ----------------------------------------------------------------------------

struct GptRun {
  double loss = 0;
  torch::Tensor logits;                      // [B, T, V], natural order
  std::map<std::string, torch::Tensor> grads;  // all-reduced
  std::map<std::string, dist::CommCount> comm;  // the forward and backward (before the gradient all-reduce)
  std::vector<int64_t> block_bytes;             // this rank's, per block, after its forward
};

GptRun run_gpt(const Config& cfg, const std::shared_ptr<dist::Group>& g, cp::Variant variant, cp::Split split,
               const torch::Tensor& idx, const torch::Tensor& tgt) {
  seed_all(static_cast<std::uint64_t>(cfg.integer("/seed")));
  TinyGpt model(gpt_config(cfg));  // the same draws as the one-process model: the same weights
  const int64_t T = idx.size(1), c = g->size();
  const auto pos = cp::positions(T, c, g->rank(), split);
  cp::Attention attn(g, variant, split);
  g->reset_comm_counts();
  torch::Tensor logits;
  GptRun out;
  auto loss = cp::gpt_loss(*model, idx.index_select(1, pos), tgt.index_select(1, pos), pos, attn, &logits,
                           &out.block_bytes);
  loss.backward();
  out.comm = g->comm_counts();
  cp::allreduce_grads(*model, *g);
  out.loss = loss.item<double>();
  out.logits = gather_sequence(logits.detach(), *g, split, 1);
  for (const auto& kv : model->named_parameters()) out.grads[kv.key()] = kv.value().grad().clone();
  return out;
}

/// Section 2: logits, loss and every gradient of each variant against one process.
Table gpt_table(const Config& cfg, const std::shared_ptr<dist::Group>& g, std::vector<GptRun>& runs, Report& report,
                int64_t& one_block_bytes) {
  const GptConfig gc = gpt_config(cfg);
  const int64_t B = cfg.integer("/data/batch"), T = cfg.integer("/data/seq");
  const auto split = cp::split_from_name(cfg.str("/cp/split"));
  seed_all(static_cast<std::uint64_t>(cfg.integer("/seed")));
  TinyGpt full(gc);
  const auto idx = torch::randint(gc.vocab, {B, T}, torch::kLong), tgt = torch::randint(gc.vocab, {B, T}, torch::kLong);
  // one process's activation bytes per block, as the CP runs measure theirs (the forward of block 0)
  {
    auto token = torch::zeros({1});
    auto x0 = full->wte->forward(idx) + full->wpe->forward(torch::arange(T, torch::kLong));
    const int64_t embedded = cp::settled_bytes(*g, token);
    auto x1 = full->blocks[0]->forward(x0, {});
    one_block_bytes = cp::settled_bytes(*g, token) - embedded;
  }
  const auto logits1 = full->forward(idx);
  auto loss1 = gpt_loss(logits1, tgt);
  loss1.backward();
  Table t{"gpt",
          fmt::format("Tiny GPT (V = {}, C = {}, heads = {}, {} layer{}, B = {}, T = {}) on c = {} ({} split): "
                      "vs one process on the whole sequence",
                      gc.vocab, gc.width, gc.heads, gc.layers, gc.layers == 1 ? "" : "s", B, T, g->size(),
                      cp::split_name(split)),
          {text_col("name", "variant"), float_col("loss", "loss", "nats", 7), sci_col("loss_diff", "loss diff"),
           sci_col("loss_bound", "loss bound"), sci_col("logits_diff", "logits diff"), sci_col("grad_diff", "max grad diff"),
           sci_col("grad_rel", "grad diff/max|g|")}};
  t.rows.push_back({{"name", "one_process"}, {"loss", loss1.item<double>()}, {"loss_diff", 0.0}, {"logits_diff", 0.0},
                    {"grad_diff", 0.0}, {"grad_rel", 0.0}});
  for (const auto variant : kVariants) {
    runs.push_back(run_gpt(cfg, g, variant, split, idx, tgt));
    const GptRun& r = runs.back();
    double gd = 0, grel = 0;
    json per_param = json::object();
    for (const auto& kv : full->named_parameters()) {
      const double d = max_abs_diff64(r.grads.at(kv.key()), kv.value().grad());
      per_param[kv.key()] = d;
      gd = nan_max(gd, d);
      grel = nan_max(grel, d / std::max(kv.value().grad().abs().max().item<double>(), 1e-300));
    }
    const std::string name = cp::variant_name(variant);
    const double ld = max_abs_diff64(r.logits, logits1.detach());
    t.rows.push_back({{"name", name}, {"loss", r.loss}, {"loss_diff", std::abs(r.loss - loss1.item<double>())},
                      {"logits_diff", ld}, {"grad_diff", gd}, {"grad_rel", grel}, {"grads", per_param}});
    // The loss: the mean of N = B·T non-negative token losses, summed in another order (c partial
    // sums of N/c, each divided by N, then all-reduced): each way within γ_{N+c}·L + u·L of the
    // exact mean, so 2(γ_{N+c} + u)·L apart. Where the logits differ (the ring), each token's loss
    // moves by at most 2·max_v |Δlogit| (cross-entropy's gradient softmax − onehot has 1-norm ≤ 2)
    // plus the two computations' own rounding (ce_reorder_bound), averaged over the tokens.
    const double N = static_cast<double>(B * T), u = bounds::kFp32UnitRoundoff;
    double bound = 2 * (bounds::gamma(B * T + g->size()) + u) * loss1.item<double>();
    if (ld > 0) {
      const int64_t V = gc.vocab;
      auto dl = std::get<0>((r.logits.to(torch::kDouble) - logits1.detach().to(torch::kDouble)).abs().reshape({-1, V}).max(1));
      bound += ((2 * dl + tp::ce_reorder_bound(logits1.detach().reshape({-1, V}), tgt.reshape({-1}))).sum() / N).item<double>();
    }
    t.rows.back()["loss_bound"] = bound;
    report.check(name + " gpt: loss within the derived bound of one process's (|diff| / bound)",
                 std::abs(r.loss - loss1.item<double>()) / bound, 1.0);
  }
  t.notes.push_back("logits diff: all_gather and ulysses compute every token's row as one process does, through "
                    "GEMMs of B x T/c rows: 0 where the kernels keep their summation order for that shape, a few "
                    "ulps where they do not; the loss check takes the measured logits difference into its bound");
  t.notes.push_back("grad diff: every parameter's all-reduced gradient against one process's (per parameter in the "
                    "result file); a weight gradient sums over the tokens, here c partial sums all-reduced, so it "
                    "differs in the last bits; the ring's logits carry its merged softmax (section 1 bounds that)");
  return t;
}

/// Section 4: bytes one rank sent in the GPT's forward and backward, per variant, against the formula.
Table comm_table(const Config& cfg, const dist::Group& g, const std::vector<GptRun>& runs, Report& report) {
  const GptConfig gc = gpt_config(cfg);
  const int64_t B = cfg.integer("/data/batch"), T = cfg.integer("/data/seq"), c = g.size();
  const double blk = static_cast<double>(B * (T / c) * gc.width * 4);
  Table t{"comm",
          fmt::format("Bytes one rank sends per step (forward + backward of {} layer{}; K/V block B x T/c x C x 4 = {} "
                      "bytes), counted by the process group (collectives at the ring algorithm's bytes)",
                      gc.layers, gc.layers == 1 ? "" : "s", blk),
          {text_col("name", "variant"), text_col("kinds", "collectives"), int_col("sent", "sent", "bytes"),
           int_col("formula", "formula", "bytes"), float_col("per_layer_blocks", "blocks/layer"),
           int_col("payload", "payload", "bytes")}};
  for (std::size_t i = 0; i < runs.size(); ++i) {
    double sent = 0, payload = 0;
    std::string kinds;
    json payloads = json::object();  // per collective, as `mpt plan`'s communication table counts (its own runs)
    for (const auto& [kind, cc] : runs[i].comm) {
      if (kind == "all_reduce") continue;  // the loss's one float
      sent += cc.sent_bytes;
      payload += static_cast<double>(cc.payload_bytes);
      payloads[kind] = cc.payload_bytes;
      kinds += (kinds.empty() ? "" : " ") + kind + " x" + std::to_string(cc.calls);
    }
    const double formula = static_cast<double>(gc.layers) * cp::bytes_per_layer(kVariants[i], c, blk);
    const std::string name = cp::variant_name(kVariants[i]);
    t.rows.push_back({{"name", name}, {"kinds", kinds}, {"sent", sent}, {"formula", formula},
                      {"per_layer_blocks", formula / static_cast<double>(gc.layers) / blk}, {"payload", payload},
                      {"payloads", payloads}});
    report.check(name + ": bytes sent per step equal to the formula", std::abs(sent - formula), 0.0);
  }
  t.notes.push_back("ring: forward (c-1) K/V blocks, backward (c-1) K/V blocks and c dK/dV partials (the last hop "
                    "home); all_gather: (c-1)/c of K and V gathered and of dK, dV reduce-scattered (ring algorithm); "
                    "ulysses: (c-1)/c of q, k, v and y by all-to-all, the same backward. The loss's all-reduce is "
                    "left out; the gradient all-reduce (the replicas' data-parallel part) comes after");
  t.notes.push_back("payload: the tensors handed to the process group (a send's message and a receive's buffer, an "
                    "all-gather's output, a reduce-scatter's or all-to-all's input), what `mpt plan`'s communication "
                    "table counts; the ring's is its sends' and receives' together");
  t.notes.push_back("collectives are counted as a ring sends them (dist::CommCount); Gloo's native reduce-scatter "
                    "(env.dist) all-reduces the whole input and sends twice the counted dK/dV bytes");
  return t;
}

/// Activation bytes per block and rank: the formula of each variant (results) and the measured
/// bytes of every rank (the counting allocator; timings), checked against it.
std::pair<Table, Table> activation_tables(const Config& cfg, dist::Group& g, const std::vector<GptRun>& runs,
                                          int64_t one_block, Report& report) {
  const GptConfig gc = gpt_config(cfg);
  const int64_t B = cfg.integer("/data/batch"), T = cfg.integer("/data/seq"), c = g.size(), h = gc.width, a = gc.heads;
  const auto split = cp::split_from_name(cfg.str("/cp/split"));
  Table f{"activations",
          fmt::format("Activation bytes one block keeps for its backward, per rank (fp32; B = {}, T = {}, C = {}, "
                      "heads = {}; T/c = {} positions per rank, {} split): the formula", B, T, h, a, T / c,
                      cp::split_name(split)),
          {text_col("name", "run"), int_col("formula", "formula", "B"), float_col("vs_one_process", "vs 1-proc")}};
  Table m{"activations_measured", "The same, measured by the counting allocator (every rank's: the largest and the smallest)",
          {text_col("name", "run"), int_col("min_rank", "min over ranks", "B"), int_col("max_rank", "max over ranks", "B"),
           int_col("formula", "formula", "B")}};
  const double one = cp::block_activation_bytes_one_process(T, B, h, a);
  f.rows.push_back({{"name", "one_process"}, {"formula", one}, {"vs_one_process", 1.0}});
  m.rows.push_back({{"name", "one_process"}, {"min_rank", one_block}, {"max_rank", one_block}, {"formula", one}});
  report.check("one_process: activation bytes of a block = the formula", std::abs(static_cast<double>(one_block) - one), 0.0);
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const auto v = kVariants[i];
    const std::string name = cp::variant_name(v);
    const double formula = cp::block_activation_bytes(v, split, T, c, B, h, a);
    const double mine = static_cast<double>(runs[i].block_bytes.at(0));
    const double hi = dist::max_over(g, mine), lo = -dist::max_over(g, -mine);
    f.rows.push_back({{"name", name}, {"formula", formula}, {"vs_one_process", formula / one}});
    m.rows.push_back({{"name", name}, {"min_rank", lo}, {"max_rank", hi}, {"formula", formula}});
    report.check(name + ": activation bytes of a block = the formula, every rank (max |measured - formula|)",
                 std::max(std::abs(hi - formula), std::abs(lo - formula)), 0.0);
  }
  f.notes.push_back("64 s_l B h (Korthikanti et al. 2022 in fp32, no dropout, without the scores) + LayerNorm mean and "
                    "rstd 16 s_l B; one process: + softmax 4aT^2B + causal mask T^2; ring: + log-sum-exp 4a s_l B; "
                    "all_gather: gathered K, V 8TBh instead of the local copies 8 s_l B h (B > 1 and a > 1: where "
                    "matmul copies; else the q view keeps qkv whole), + probabilities 4a s_l T B, "
                    "mask s_l T; ulysses: + probabilities of a/c heads 4a s_l T B, mask T^2; balanced split: the "
                    "natural-order permutation autograd keeps (8T, Ulysses also its inverse) — core/parallel/cp");
  m.notes.push_back("each reading taken once the CP group's Gloo worker has let go of the collectives' tensors "
                    "(cp::settled_bytes: one more all-reduce of a kept token), so the count is the graph's alone");
  return {std::move(f), std::move(m)};
}

// ----------------------------------------------------------------------------
// 4. Load balance
// ----------------------------------------------------------------------------

/// Section 3: per rank and split, the useful and computed score pairs (deterministic), and the
/// ring's measured compute and wait (timings) over /balance/steps forward+backward steps.
std::pair<Table, Table> balance_tables(const Config& cfg, const std::shared_ptr<dist::Group>& g, World& w,
                                       Report& report) {
  const GptConfig gc = gpt_config(cfg);
  const int64_t T = cfg.integer("/balance/seq"), nh = gc.heads, hd = gc.width / gc.heads, c = g->size();
  const int64_t steps = cfg.integer("/balance/steps");
  Table pairs{"balance",
              fmt::format("Causal load balance of T = {} over c = {}: query-key pairs per rank (useful = unmasked; "
                          "computed = what the ring computes, by the formula and as run)", T, c),
              {text_col("name", "split/rank"), int_col("useful", "useful pairs"), float_col("useful_vs_mean", "useful/mean"),
               int_col("computed", "computed pairs"), int_col("ran", "pairs run")}};
  Table times{"balance_times",
              fmt::format("The ring's measured time per rank and step (median of {}; B = 1, heads = {}, hd = {})",
                          steps, nh, hd),
              {text_col("name", "split/rank"), float_col("compute_ms", "compute", "ms", 3),
               float_col("wait_ms", "wait", "ms", 3), float_col("idle_ms", "idle vs slowest", "ms", 3)}};
  seed_all(static_cast<std::uint64_t>(cfg.integer("/seed")));
  const auto q = torch::randn({1, nh, T, hd}), k = torch::randn({1, nh, T, hd}), v = torch::randn({1, nh, T, hd});
  int64_t step = 0;
  for (const auto split : kSplits) {
    const auto pos = cp::positions(T, c, g->rank(), split);
    cp::Attention attn(g, cp::Variant::Ring, split);
    std::vector<double> compute, wait;
    int64_t ran_pairs = 0;
    for (int64_t s = 0; s < steps; ++s) {
      w.fault_point(step++);
      attn.reset_stats();
      auto ql = q.index_select(2, pos).requires_grad_(true), kl = k.index_select(2, pos).requires_grad_(true),
           vl = v.index_select(2, pos).requires_grad_(true);
      attn(ql, kl, vl).sum().backward();
      compute.push_back(attn.stats().compute_s);
      wait.push_back(attn.stats().wait_s);
      ran_pairs = attn.stats().pairs_computed / 2;  // forward and backward compute the same pairs
    }
    const auto mine = torch::tensor({median_of(compute), median_of(wait), static_cast<double>(ran_pairs)}, torch::kFloat64);
    const auto all = tp::all_gather_shards(mine, *g);
    double total_useful = 0, slowest = 0;
    for (int64_t r = 0; r < c; ++r) {
      total_useful += static_cast<double>(cp::causal_pairs(T, c, r, split));
      slowest = std::max(slowest, all[static_cast<std::size_t>(r)][0].item<double>());
    }
    int64_t max_useful = 0, min_useful = INT64_MAX;
    for (int64_t r = 0; r < c; ++r) {
      const std::string name = cp::split_name(split) + "/" + std::to_string(r);
      const int64_t useful = cp::causal_pairs(T, c, r, split), computed = cp::ring_computed_pairs(T, c, r, split);
      const int64_t ran = static_cast<int64_t>(all[static_cast<std::size_t>(r)][2].item<double>());
      max_useful = std::max(max_useful, useful);
      min_useful = std::min(min_useful, useful);
      pairs.rows.push_back({{"name", name}, {"useful", useful},
                            {"useful_vs_mean", static_cast<double>(useful) / (total_useful / static_cast<double>(c))},
                            {"computed", computed}, {"ran", ran}});
      report.check(name + ": pairs the ring ran (forward, backward) = the formula", std::abs(static_cast<double>(
                       ran - computed)), 0.0);
      const double cms = all[static_cast<std::size_t>(r)][0].item<double>();
      times.rows.push_back({{"name", name}, {"compute_ms", 1e3 * cms},
                            {"wait_ms", 1e3 * all[static_cast<std::size_t>(r)][1].item<double>()},
                            {"idle_ms", 1e3 * (slowest - cms)}});
    }
    if (split == cp::Split::Balanced)
      report.check("balanced split: every rank has the same useful pairs (max - min)",
                   static_cast<double>(max_useful - min_useful), 0.0);
  }
  pairs.notes.push_back("contiguous: rank r's queries see r·T/c earlier keys, useful pairs grow with r (the last rank "
                        "does about 2c-1 times the first's); balanced: chunks r and 2c-1-r pair a short prefix with "
                        "a long one, equal for every rank (Megatron-core, Transformer Engine)");
  pairs.notes.push_back("computed: contiguous, (r+1) whole blocks of (T/c)^2 (later ranks' blocks are all future, "
                        "skipped); balanced, 3/4 of the own block and half of every other, 3(T/c)^2/4 + (c-1)(T/c)^2/2, "
                        "evenly spread and less in total; the masked half of a diagonal chunk is computed and thrown "
                        "away");
  times.notes.push_back("compute: the ring's block computations (forward and backward); wait: blocked on its "
                        "send/recv; idle vs slowest: the slowest rank's compute minus this rank's — the time this "
                        "rank waits at the next synchronisation. With more processes than cores the times "
                        "include the scheduler's");
  return {std::move(pairs), std::move(times)};
}

Report run_contextparallel(const Context& ctx) {
  const auto& cfg = ctx.cfg;
  Report report;
  World& w = *ctx.world;
  auto g = w.new_group("cp/", w.size(), torch::kCPU);
  report.env["cp_degree"] = w.size();
  install_counting_allocator();  // before any model: the activation bytes of section 2
  report.add(attention_table(cfg, *g, report));  // 1
  std::vector<GptRun> runs;
  int64_t one_block = 0;
  report.add(gpt_table(cfg, g, runs, report, one_block));     // 2
  auto [act_formula, act_measured] = activation_tables(cfg, *g, runs, one_block, report);  // 3
  report.add(std::move(act_formula));
  report.add(std::move(act_measured), Store::Timings);
  auto [pairs, times] = balance_tables(cfg, g, w, report);  // 4
  report.add(std::move(pairs));
  report.add(std::move(times), Store::Timings);
  report.add(comm_table(cfg, *g, runs, report));  // 5
  return report;
}

MemoryEstimate contextparallel_memory(const Config& cfg, int world_size) {
  const GptConfig c = gpt_config(cfg);
  const double P = static_cast<double>(gpt_num_params(c));
  MemoryEstimate e;
  e.add("GPT parameters and gradients (one process and 3 variants)", "/model/*", 4 * 2 * 4 * P);
  const double T = static_cast<double>(cfg.integer("/data/seq")), B = static_cast<double>(cfg.integer("/data/batch")),
               C = static_cast<double>(c.width), L = static_cast<double>(c.layers), nh = static_cast<double>(c.heads);
  e.add("GPT activations (one process: the whole sequence)", "/data/batch, /data/seq, /model/*",
        4 * L * T * B * (64 * C + 8 * nh * T) + 8 * T * B * static_cast<double>(c.vocab));
  const double Tb = static_cast<double>(cfg.integer("/balance/seq"));
  e.add("attention of the load-balance section (scores of a K/V block, forward and backward)", "/balance/seq",
        4 * 8 * nh * Tb * Tb / std::max(1, world_size) + 4 * 16 * Tb * C);
  e.times(world_size, "processes (/nproc)");
  return e;
}

/// Cross-key checks before any work and any worker (exit 2 naming the keys).
void validate_contextparallel(const Config& cfg, int world_size) {
  const int64_t c = world_size, a = cfg.integer("/model/heads"), h = cfg.integer("/model/width");
  if (h % a != 0) throw ConfigError(fmt::format("/model/heads: expected a divisor of /model/width = {}, got {}", h, a));
  if (a % c != 0)
    throw ConfigError(fmt::format("/model/heads: expected a multiple of the CP degree c = {} (/nproc; Ulysses gives "
                                  "every rank heads/c whole heads), got {}", c, a));
  const int64_t T = cfg.integer("/data/seq");
  if (T > cfg.integer("/model/context"))
    throw ConfigError(fmt::format("/data/seq: expected at most /model/context = {}, got {}", cfg.integer("/model/context"), T));
  if (T % (2 * c) != 0)
    throw ConfigError(fmt::format("/data/seq: expected a multiple of 2c = {} (the balanced split cuts the sequence "
                                  "into 2c chunks; c = {} from /nproc), got {}", 2 * c, c, T));
  const int64_t Tb = cfg.integer("/balance/seq");
  if (Tb % (2 * c) != 0)
    throw ConfigError(fmt::format("/balance/seq: expected a multiple of 2c = {} (c = {} from /nproc), got {}", 2 * c, c, Tb));
  validate_fault_keys(cfg, world_size, 2 * cfg.integer("/balance/steps"), "2 x /balance/steps");
}

}  // namespace

}  // namespace cpx

Experiment contextparallel_experiment() {
  using namespace cpx;
  return {"contextparallel",
          "Context parallelism: ring attention (flash-attention's merge), all-gather K/V and Ulysses, causal load "
          "balancing, each against one process and the exact attention; bytes per step vs the formulas",
          contextparallel_spec, run_contextparallel, validate_contextparallel, contextparallel_memory, Processes::Multi,
          dist_fault_plan};
}

}  // namespace mpt
