// mpt tensorparallel, sections 4-5 — what tensor and sequence parallelism cost: activation bytes
// per layer (measured against Korthikanti et al. 2022's formulas), step time, and the bytes each
// collective carries per step against the formulas. See tensorparallel.cpp.
#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "core/dist/dist.hpp"
#include "core/parallel/tp.hpp"
#include "core/parallel/tp_gpt.hpp"
#include "core/runtime/compat.hpp"
#include "core/runtime/memory.hpp"
#include "core/runtime/runtime.hpp"
#include "core/runtime/timing.hpp"
#include "experiments/tensorparallel_parts.hpp"

namespace mpt {

namespace {

/// The bytes one block's autograd graph keeps after its forward, per block, in one process. Each
/// reading waits for `g`'s worker to let go of the earlier sections' collective tensors
/// (dist::settle): one freed during a block read 8 bytes short (fresh-clone CI, under load).
std::vector<int64_t> one_process_block_bytes(TinyGpt m, const torch::Tensor& idx, dist::Group& g) {
  const int64_t T = idx.size(1);
  auto token = torch::zeros({1});
  auto pos = torch::arange(T, torch::kLong);
  auto x = m->wte->forward(idx) + m->wpe->forward(pos);
  std::vector<int64_t> v;
  for (auto& b : m->blocks) {
    dist::settle(g, token);
    const int64_t before = current_bytes(torch::kCPU);
    x = b->forward(x, {});
    dist::settle(g, token);
    v.push_back(current_bytes(torch::kCPU) - before);
  }
  return v;
}

}  // namespace

/// Section 4: activation bytes per layer kept for backward — the formulas (fp32 here,
/// Korthikanti's fp16) and the counting allocator's measurement (run-dependent).
std::pair<Table, Table> activation_tables(const Config& cfg, World& w, const std::shared_ptr<dist::Group>& g,
                                          const GptCase& c) {
  const GptConfig& gc = c.gc;
  const int64_t B = c.B, T = c.T, div = c.div;
  const bool sp = c.sp;
  const int t = c.t;
  TinyGpt full = c.full;  // the holder shares the model (its forward is not const)
  const torch::Tensor &idx = c.idx, &tgt = c.tgt;
  torch::Tensor keep;
  std::vector<int64_t> b1, btp, bsp;
  {
    seed_all(static_cast<std::uint64_t>(cfg.integer("/seed")));
    TinyGpt m(gc);
    b1 = one_process_block_bytes(m, idx, *g);
  }
  // TP: each reading waits until Gloo's worker has dropped the collectives' temporaries
  // (dist::settle in TpGpt::loss_measuring); the smallest of three passes as well.
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
                     "graph kept), mean over the blocks, largest rank (TP: each reading after Gloo's worker dropped the "
                     "collectives' temporaries, the smallest of 3 passes): the storage autograd keeps for backward "
                     "plus the block's output (the next block's LayerNorm input)");
  am.notes.push_back("not in the formulas: LayerNorm mean and rstd (2 x 4sb per LayerNorm), the causal mask "
                     "(s^2 bytes, bool, and its negation), copies that matmul makes of transposed q, k, v");
  at.notes.push_back("Korthikanti et al. 2022 (fp16 activations, 1-byte dropout masks): sbh(34 + 5as/h), "
                     "sbh(10 + 24/t + 5as/(ht)), (sbh/t)(34 + 5as/h)");
  at.notes.push_back("fp32 formula for what runs here (4-byte activations, no dropout): sbh(64 + 4as/h), "
                     "sbh(16 + 48/t + 4as/(ht)); with SP sbh(8/t + 8 + 48/t + 4as/(ht)): the column-parallel "
                     "GEMMs keep their all-gathered input (Megatron re-gathers it in backward instead)");
  return {std::move(at), std::move(am)};
}

/// Section 5: forward + backward of one process, TP and TP + SP (median, run-dependent).
Table step_time_table(const Config& cfg, World& w, const std::shared_ptr<dist::Group>& g, const GptCase& c) {
  const int64_t div = c.div;
  const bool sp = c.sp;
  TinyGpt full = c.full;  // the holder shares the model (its forward is not const)
  const torch::Tensor &idx = c.idx, &tgt = c.tgt;
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
  return tt;
}

/// Communication of one step and rank on the TP group (dist::Group's counters) against the
/// formulas; check: payload bytes equal to the formula.
Table comm_table(const std::shared_ptr<dist::Group>& g, const GptCase& c, Report& report) {
  const GptConfig& gc = c.gc;
  const int64_t B = c.B, T = c.T, div = c.div;
  const bool sp = c.sp;
  const int t = c.t;
  TinyGpt full = c.full;  // the holder shares the model (its forward is not const)
  const torch::Tensor &idx = c.idx, &tgt = c.tgt;
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
  return cm;
}

}  // namespace mpt
