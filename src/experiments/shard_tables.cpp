// `mpt shard`'s tables (shard_parts.hpp): the trained runs against DDP and the single-process
// references, and the bytes per rank and per step against the ZeRO formulas.
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

#include "core/runtime/compat.hpp"
#include "core/models/mlp.hpp"
#include "experiments/shard_parts.hpp"

namespace mpt::shard {

namespace {

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

}  // namespace

Table equivalence_table(Report& report, const Results& res) {
  const auto& runs = res.plan.runs;
  const auto& outs = res.outs;
  const auto& same = res.refs.same;
  const auto& whole = res.refs.whole;
  const Setup& s = res.s;
  const int n = res.n;
  const std::size_t main_runs = res.plan.main_runs, mixed_first = res.plan.mixed_first;
  const bool every = res.plan.every, fp32 = res.plan.fp32;
  const bool order_same = n <= 2;
  Table eq{"equivalence",
           fmt::format("Parameters every step vs DDP and vs one process ({} ranks, {} steps, {} micro-batches, {}{})", n,
                       s.steps, s.micro, s.optimizer, res.gpt ? "; " + res.model_desc : std::string()),
           {text_col("name", "run"), int_col("stage", "stage"), sci_col("vs_ddp", "vs DDP"),
            sci_col("vs_single", "vs 1-proc"), sci_col("vs_whole_batch", "vs 1-proc whole"),
            float_col("final_loss", "final loss")}};
  const RunOut& ddp = outs[0];
  for (std::size_t i = 0; i < mixed_first; ++i) {
    const RunOut& o = outs[i];
    const double vd = max_abs_diff(o.params, ddp.params), vs = max_abs_diff(o.params, same.params),
                 vw = max_abs_diff(o.params, whole.params);
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
                 max_abs_diff(outs[static_cast<std::size_t>(i2)].params, outs[static_cast<std::size_t>(i1)].params), 0.0);
  // The GPT's stage 3 is one parameter group: its one reduce-scatter per step takes the same
  // buffer (every gradient, in order, accumulated alike) as stages 1-2's, so it adds in the same
  // order at any N too (the MLP's stage 3 reduce-scatters per Linear: other buffers, other orders).
  if (!order_same && res.gpt && i2 >= 0 && i3 >= 0 && !every)
    report.check("stage3 vs stage2: parameters equal bitwise, every step (the GPT: one reduce-scatter of all "
                 "gradients, as stage 2's)",
                 max_abs_diff(outs[static_cast<std::size_t>(i3)].params, outs[static_cast<std::size_t>(i2)].params), 0.0);
  if (order_same && every && i2 >= 0 && i3 >= 0)
    report.check("stage3 vs stage2, reducing every micro-batch: parameters equal bitwise, every step",
                 max_abs_diff(outs[static_cast<std::size_t>(i3)].params, outs[static_cast<std::size_t>(i2)].params), 0.0);
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
  if (res.gpt)
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
  return eq;
}

Table reduction_table(Report& report, const Results& res) {
  const auto& runs = res.plan.runs;
  const auto& outs = res.outs;
  const int n = res.n;
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
  return rb;
}

Table loss_table(const Results& res) {
  const auto& runs = res.plan.runs;
  const auto& outs = res.outs;
  const auto& same = res.refs.same;
  const Setup& s = res.s;
  const std::size_t main_runs = res.plan.main_runs;
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
  return lc;
}

std::pair<Table, Table> memory_tables(Report& report, const Results& res) {
  const auto& runs = res.plan.runs;
  const auto& outs = res.outs;
  const RunOut& ddp = outs[0];
  const Setup& s = res.s;
  const int n = res.n;
  const int64_t S = state_bytes(s);
  const double psi = static_cast<double>(ddp.numel);
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

  Table peak{"memory_peak", "Allocator peak per step above the step's start, per rank (run-dependent)",
             {text_col("name", "run"), int_col("transient_peak", "peak", "bytes"), float_col("step_ms", "step", "ms")}};
  for (std::size_t i = 0; i < runs.size(); ++i)
    peak.rows.push_back({{"name", runs[i].name}, {"transient_peak", outs[i].transient_peak},
                         {"step_ms", outs[i].step_s * 1e3}});
  peak.notes.push_back("core/runtime/memory's counting CPU allocator: activations, unsharded gradients, gathered parameters, "
                       "communication buffers and the optimizer's temporaries of one step (largest over steps >= 1 "
                       "and ranks); step = forward + backward + reduction + optimizer step, median over steps >= 1");
  return {std::move(mem), std::move(peak)};
}

Table comm_table(Report& report, const Results& res, dist::GlooAlgorithm gloo) {
  const auto& runs = res.plan.runs;
  const auto& outs = res.outs;
  const Setup& s = res.s;
  const int n = res.n;
  const double psi = static_cast<double>(outs[0].numel);
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
  if (n > 1 && gloo == dist::GlooAlgorithm::Native && compat::kGlooHasReduceScatter)
    cm.notes.push_back(std::string(dist::kGlooNativeReduceScatter) +
                       ": the sent column is the ring's accounting; --set dist.gloo_algorithm=ring sends exactly the "
                       "formula (env.dist)");
  if (n > 1 && (gloo == dist::GlooAlgorithm::Ring || !compat::kGlooHasReduceScatter))
    cm.notes.push_back(fmt::format("{}: mpt's ring from send/recv, (N-1)/N*S sent per rank as the formula "
                                   "(env.dist)",
                                   gloo == dist::GlooAlgorithm::Ring
                                       ? "reduce-scatter and all-gather (dist.gloo_algorithm = ring)"
                                       : "reduce-scatter (LibTorch 1.13's Gloo has none)"));
  return cm;
}

Table mixed_table(Report& report, const Results& res) {
  const auto& runs = res.plan.runs;
  const auto& outs = res.outs;
  const Setup& s = res.s;
  const std::size_t mixed_first = res.plan.mixed_first;
  const int mstage = res.plan.mixed_stage;
  const KernelProbe& bf16 = res.plan.bf16;
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
                       {"vs_fp32", num(max_abs_diff(outs[i].params, ref.params))}, {"loss_diff", num(ld)},
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
  return mp;
}

}  // namespace mpt::shard
