// The planner's terms (docs/plan.md has each formula with its source and what it leaves out).
#include "core/plan/plan.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <stdexcept>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/errors.hpp"
#include "core/pipeline/schedule.hpp"
#include "core/plan/plan_detail.hpp"

namespace mpt::plan {

namespace {

// Bytes per parameter of each model state: ZeRO's 2Ψ (weights) + 2Ψ (gradients) + KΨ (K = 12: fp32
// master, Adam's m and v) for mixed precision (Rajbhandari et al. 2020, §3.1).
struct StateBytes {
  double weights, grads, master, optimizer;
};
StateBytes state_bytes(const Training& t) {
  const bool fp32 = t.recipe == "fp32";
  StateBytes b{};
  b.weights = fp32 ? 4 : 2;
  b.grads = (fp32 || t.fp32_grads) ? 4 : 2;
  b.master = fp32 ? 0 : 4;
  b.optimizer = t.optimizer == "adam" ? 8 : t.optimizer == "sgd-momentum" ? 4 : 0;
  return b;
}

}  // namespace

ModelStates model_states(double params, const Training& t, int zero, int64_t dp) {
  const StateBytes sb = state_bytes(t);
  const double d = static_cast<double>(dp);
  ModelStates m;
  m.weights = params * sb.weights / (zero >= 3 ? d : 1);
  m.gradients = params * sb.grads / (zero >= 2 ? d : 1);
  m.master = params * sb.master / (zero >= 1 ? d : 1);
  m.optimizer = params * sb.optimizer / (zero >= 1 ? d : 1);
  return m;
}

Estimate estimate(const ModelShape& m, const Training& t, const Layout& l, const System& sys) {
  if (m.mlp()) return estimate_mlp(m, t, l, sys);  // plan_mlp.cpp: an MLP's stages differ
  Estimate e;
  const double peak = sys.peak_for(t.recipe);
  if (peak <= 0) throw std::invalid_argument(fmt::format("the system '{}' has no {} peak", sys.name, t.recipe));
  const ParamCounts pc = count_params(m);
  // s: the positions of a sequence on one device — the whole sequence, or its 1/cp share under
  // context parallelism (every activation, message and logit of this device scales with it); S
  // the whole sequence (the FLOPs of the model, the keys each query sees).
  const double cpd = static_cast<double>(l.cp), S = static_cast<double>(m.sequence);
  const double h = static_cast<double>(m.hidden), s = S / cpd;
  const double a = static_cast<double>(m.heads), f = static_cast<double>(m.ffn), V = static_cast<double>(m.vocab);
  const double kv = static_cast<double>(m.kv_heads) * h / a;
  const double b = static_cast<double>(t.microbatch);
  const double tp = static_cast<double>(l.tp);
  const int p = static_cast<int>(l.pp);
  const int v = static_cast<int>(l.pp > 1 ? l.virtual_stages : 1);
  e.microbatches = t.global_batch / (l.dp * t.microbatch);
  const int mb = static_cast<int>(e.microbatches);
  // the layers of each stage: L/p, or the uneven split of Megatron-core's keys (stage_layers); a
  // middle stage's (they all hold the same), 0 without middle stages
  const std::vector<int64_t> sl = stage_layers(m, l);
  const double L_first = static_cast<double>(sl.front()), L_last = static_cast<double>(sl.back());
  const double L_mid = p > 2 ? static_cast<double>(sl[1]) : 0.0;
  const double sp = l.sequence_parallel ? tp : 1.0;  // what sequence parallelism divides by

  // ---- a mixture of experts with drop-and-pad (GShard, Switch; Megatron-core's capacity factor
  // with moe_pad_expert_input_to_capacity; core/models/moe): per microbatch and layer a rank routes
  // its s positions of b sequences (1/t of them under SP), n_route tokens; each expert takes cap of
  // them, the rest are dropped and empty rows padded, so the buffer [E, cap, h] has E·cap rows
  // whatever the routing. A device's E/ep experts receive cap rows from each of the ep ranks: E·cap
  // rows, and under SP the t TP ranks' rows gathered for the expert-TP GEMMs (Megatron-core's
  // all-to-all dispatcher), t·E·cap rows at f/t.
  const bool moe = m.moe();
  const double E = moe ? static_cast<double>(m.experts) : 0.0, k = moe ? static_cast<double>(m.top_k) : 0.0;
  const double epd = static_cast<double>(l.ep);
  const int64_t n_route_i = moe ? t.microbatch * (m.sequence / l.cp) / (l.sequence_parallel ? l.tp : 1) : 0;
  const int64_t cap_i = moe ? expert_capacity(n_route_i, m.top_k, t.capacity_factor, m.experts) : 0;
  const double n_route = static_cast<double>(n_route_i), cap = static_cast<double>(cap_i);
  const double rows = E * cap;         // one routing group's buffer: E·cap rows
  const double rows_dev = sp * rows;   // the rows of one device's expert GEMMs
  // the ranks holding the same experts: Megatron-core's expert-data-parallel group, dp·cp/ep
  const int64_t edp = l.dp * l.cp / l.ep;
  if (moe) {
    e.moe.push_back({"tokens routed", n_route,
                     fmt::format("microbatch x s/cp{} = {:g} x {:g}{}: the tokens a rank routes per microbatch and layer",
                                 l.sequence_parallel && l.tp > 1 ? " / t (sequence parallel)" : "", b, s,
                                 l.sequence_parallel && l.tp > 1 ? fmt::format(" / {:g}", tp) : "")});
    e.moe.push_back({"capacity", cap,
                     fmt::format("min(n, ceil(n·k·cf/E)) = min({:g}, ceil({:g}·{:g}·{:g}/{:g})) rows per expert "
                                 "(Megatron-core's get_capacity of n·k choices)", n_route, n_route, k, t.capacity_factor, E)});
    e.moe.push_back({"expert rows", rows,
                     "E·cap: the [E, cap, h] buffer each rank dispatches; the experts compute on these rows whatever "
                     "the routing (drop-and-pad: the imbalance moves drops and padding, not compute)"});
    e.moe.push_back({"padding, at least", std::max(0.0, 1 - n_route * k / rows),
                     "1 - n·k/(E·cap): the buffer's rows no choice can fill (every choice kept)"});
    e.moe.push_back({"dropped fraction, at least", std::max(0.0, 1 - rows / (n_route * k)),
                     "1 - E·cap/(n·k): at most E·cap of the n·k choices are kept (perfectly balanced routing reaches it)"});
    e.moe.push_back({"dropped fraction, at most", 1 - cap / n_route,
                     "1 - cap/n: every token on the same k experts (router collapse), each keeping cap"});
  }

  // ---- parameters on one device of the first and of the last stage
  // Matrices and column-parallel biases split over TP; norms and row-parallel biases replicated
  // (Megatron-LM's ColumnParallelLinear / RowParallelLinear); vocabulary-parallel embedding and head.
  // With experts the block's dense part is the attention, the router (replicated over TP, as
  // Megatron-core's TopKRouter and core/parallel/ep's TpMoeShards keep it) and the norms; each of
  // the E/ep experts a device holds is split over TP as the dense MLP (expert TP = TP).
  double layer_tp = 0, expert_tp = 0;
  if (!moe) {
    layer_tp = pc.matmul_per_layer / tp + 2 * (m.rmsnorm ? h : 2 * h);
    if (m.bias) layer_tp += (h + 2 * kv + (m.swiglu ? 2 * f : f)) / tp + 2 * h;
  } else {
    layer_tp = (2 * h * h + 2 * h * kv) / tp + pc.router + 2 * (m.rmsnorm ? h : 2 * h);
    if (m.bias) layer_tp += (h + 2 * kv) / tp + h;
    expert_tp = E / epd * (pc.expert_matmul / tp + (m.bias ? (m.swiglu ? 2 * f : f) / tp + h : 0.0));
  }
  // One device holds both ends of the model with pp = 1 and under ZB-V's V (rank 0 runs the first
  // and the last chunk); there a tied head is the embedding itself. A tied head on a stage of its
  // own keeps a copy of the embedding (Megatron-LM's shared word embeddings).
  const bool vee = p > 1 && schedule_spec(l.schedule).placement == Placement::V;
  const bool both_ends = p == 1 || vee;
  const double emb_tp = pc.embedding / tp;
  const double head_tp = both_ends ? pc.head / tp : (m.tied ? pc.embedding : pc.head) / tp;
  const double first = L_first * layer_tp + emb_tp + pc.positions + (both_ends ? head_tp + pc.final_norm : 0);
  // the other end: pp > 1 the last stage; under ZB-V the turning rank p - 1, blocks only
  const double last = L_last * layer_tp + (both_ends ? 0 : head_tp + pc.final_norm);
  const double mid_params = L_mid * layer_tp;  // a middle stage: blocks only
  const StateBytes sb = state_bytes(t);

  // ---- activations per layer, bytes (Korthikanti et al. 2022, §4.1 and Table 2, generalised):
  // attention 2sbh (QKV input) + 2sbh (Q) + 4sb·kv (K, V) + 2sbh (projection input) [+ sbh dropout
  // mask] + per head 2s²b (softmax) [+ s²b mask + 2s²b dropout output]; MLP 2sbh (input) + 4sbf
  // (GELU input and output) [+ sbh mask] or, SwiGLU, 2sbh + 6sbf (gate, up, their product);
  // norms 4sbh. At f = 4h, kv = h with dropout: 34sbh + 5as²b.
  const double ab = detail::activation_element_bytes(t.recipe) / 2.0;  // the formulas count 2-byte elements
  const double sbh = s * b * h;
  // softmax (+ mask, dropout output) of this device's s queries against the S keys (S = s
  // without CP); a fused attention kernel (FlashAttention) stores none
  const double score = t.flash_attention ? 0.0 : (m.dropout ? 5.0 : 2.0) * a * s * S * b;
  // split by TP; all-gather CP keeps the gathered K and V of the other cp − 1 ranks for the backward
  const double kv_gathered = l.cp > 1 && l.cp_attention == "all_gather" ? 4 * (S - s) * b * kv : 0.0;
  // the MLP's activation (GELU input and output, or SwiGLU's gate, up and product) on the sb
  // tokens; with experts on the rows of the device's expert GEMMs instead
  const double mlp_rows = moe ? rows_dev : s * b;
  const double in_tp = 2 * sbh + 4 * s * b * kv + kv_gathered + 2 * sbh + (m.swiglu ? 6 : 4) * mlp_rows * f;
  const double replicated = 2 * sbh + 2 * sbh + 4 * sbh + (m.dropout ? 2 * sbh : 0);  // inputs, norms, masks
  // what an MoE layer keeps besides (core/models/moe's autograd, 2-byte elements): the dispatched
  // buffer, the experts' input 2·rows·h (replicated over TP: the column-parallel input), and the
  // combine's k gathered expert outputs per token 2·n·k·h; the router's fp32 probabilities 4·n·E
  // (in bytes, whatever the recipe) are added after the scaling below
  const double moe_kept = moe ? 2 * rows_dev * h + 2 * n_route * k * h : 0.0;
  double per_layer = 0;
  std::string act_formula;
  if (t.recompute == "full") {
    per_layer = 2 * sbh / sp;
    act_formula = "full recompute: the layer input, 2sbh" + std::string(l.sequence_parallel ? "/t" : "");
  } else {
    per_layer = in_tp / tp + replicated / sp + moe_kept;
    act_formula = l.sequence_parallel ? "(34sbh" : "sbh(10 + 24/t";
    if (t.recompute == "none" && !t.flash_attention) {
      per_layer += score / tp;
      act_formula += l.sequence_parallel ? " + 5as²b)/t" : " + 5as/(ht))";
      if (l.cp > 1) act_formula += ", the scores of s queries against all S keys";
    } else if (t.recompute == "none") {
      act_formula += l.sequence_parallel ? ")/t, attention fused (no s² scores)" : "), attention fused (no s² scores)";
    } else {
      act_formula += l.sequence_parallel ? ")/t, selective recompute" : "), selective recompute";
    }
    if (kv_gathered > 0) act_formula += " + the all-gathered K, V: 4(S - s)b·kv";
    act_formula += " (Korthikanti et al. 2022, Table 2; the shape's own terms)";
    if (l.cp > 1) act_formula += fmt::format(", s = S/cp = {:g} positions per device (context parallel)", s);
    if (moe)
      act_formula += fmt::format("; MoE: the experts' {}·rows·f/t on rows = {}E·cap = {:g} instead of the MLP's {}sbf/t, "
                                 "+ the dispatched buffer 2·rows·h, the combine's 2·n·k·h, the router's fp32 "
                                 "probabilities 4·n·E (n = {:g} tokens routed)",
                                 m.swiglu ? 6 : 4, l.sequence_parallel && l.tp > 1 ? "t·" : "", rows_dev,
                                 m.swiglu ? 6 : 4, n_route);
  }
  per_layer *= ab;
  if (moe && t.recompute != "full") per_layer += 4 * n_route * E;
  std::vector<int> held(static_cast<std::size_t>(p), 1);
  if (p > 1) held = detail::replayed_held_pairs(l.schedule, p, mb, v);

  // ---- the quantized copies of one block's matrices on one TP rank (fp8 and fp4 recipes):
  // [rows, cols] = [outputs, inputs] as Megatron-LM splits them: QKV [(h + 2kv)/t, h], the
  // projection [h, h/t], the MLP's fc1 [f/t, h] ([2f/t, h] with SwiGLU: gate and up fused) and fc2
  // [h, f/t]; with experts E/ep experts' fc1 and fc2 instead of the MLP's
  const bool fp4 = detail::fp4_recipe(t.recipe), quantized = fp4 || detail::fp8_recipe(t.recipe);
  auto add_copy = [&](detail::WeightCopy& to, double rows, double cols, double times) {
    const detail::WeightCopy c = detail::weight_copy_bytes(t.recipe, rows, cols);
    to.copies += times * c.copies;
    to.scales += times * c.scales;
  };
  const double fc1_rows = (m.swiglu ? 2 * f : f) / tp;
  auto layer_copy = [&] {
    detail::WeightCopy c;
    add_copy(c, (h + 2 * kv) / tp, h, 1);
    add_copy(c, h, h / tp, 1);
    if (!moe) {
      add_copy(c, fc1_rows, h, 1);
      add_copy(c, h, f / tp, 1);
    }
    return c;
  };
  auto expert_copy = [&] {
    detail::WeightCopy c;
    if (moe) {
      add_copy(c, fc1_rows, h, E / epd);
      add_copy(c, h, f / tp, E / epd);
    }
    return c;
  };
  const std::string mlp_s = fmt::format("[{:g}, {:g}], [{:g}, {:g}]", fc1_rows, h, h, f / tp);
  const std::string block_matrices_s = fmt::format("[{:g}, {:g}], [{:g}, {:g}]{}", (h + 2 * kv) / tp, h, h, h / tp,
                                                   moe ? "" : ", " + mlp_s);
  const std::string expert_matrices_s = mlp_s;

  // ---- memory terms, per stage
  // one stage of Ls layers holding `params` (dense) parameters and `held_pairs` (microbatch, chunk)
  // pairs at its peak; is_last: it holds the head (the logits)
  auto stage_memory = [&](double Ls, double params, int held_pairs, bool is_last) {
    std::vector<Term> mem;
    const double experts_dev = Ls * expert_tp, layers_per_chunk = Ls / v;
    const ModelStates ms = model_states(params, t, l.zero, l.dp * l.cp);
    const char* over = l.cp > 1 ? "dp·cp" : "dp";  // the ranks ZeRO shards over
    mem.push_back({"weights", ms.weights,
                   fmt::format("{} B/param{}", sb.weights, l.zero >= 3 ? fmt::format(" / {} (ZeRO-3)", over) : "")});
    mem.push_back({"gradients", ms.gradients,
                   fmt::format("{} B/param{}", sb.grads, l.zero >= 2 ? fmt::format(" / {} (ZeRO-2)", over) : "")});
    mem.push_back({"master weights", ms.master,
                   sb.master > 0 ? fmt::format("fp32 copy, 4 B/param{}", l.zero >= 1 ? fmt::format(" / {} (ZeRO-1)", over) : "")
                                 : std::string("none: the weights are fp32")});
    mem.push_back({"optimizer states", ms.optimizer,
                   fmt::format("{}: {} B/param{}", t.optimizer, sb.optimizer,
                               l.zero >= 1 ? fmt::format(" / {} (ZeRO-1)", over) : "")});
    if (moe) {
      // the dense parameters above; the E/ep experts of every block here, their states sharded
      // over the expert-data-parallel group (Megatron-core's distributed optimizer over it)
      for (std::size_t i = 0; i < 4; ++i) mem[mem.size() - 4 + i].formula += " (the dense parameters)";
      const ModelStates xs = model_states(experts_dev, t, l.zero, edp);
      const std::string eover = l.cp > 1 ? "dp·cp/ep" : "dp/ep";
      const std::string held_s =
          fmt::format("{:g} layers x {:g}/{} experts x {:g} params{}", Ls, E, l.ep,
                      pc.expert_matmul / tp + (m.bias ? (m.swiglu ? 2 * f : f) / tp + h : 0.0),
                      l.tp > 1 ? " (matrices and column-parallel biases / t: expert TP = TP)" : "");
      mem.push_back({"expert weights", xs.weights,
                     fmt::format("{} B/param of {}{}", sb.weights, held_s,
                                 l.zero >= 3 ? fmt::format(" / {} (ZeRO-3)", eover) : "")});
      mem.push_back({"expert gradients", xs.gradients,
                     fmt::format("{} B/param{}", sb.grads, l.zero >= 2 ? fmt::format(" / {} (ZeRO-2)", eover) : "")});
      mem.push_back({"expert master weights", xs.master,
                     sb.master > 0 ? fmt::format("fp32 copy, 4 B/param{}", l.zero >= 1 ? fmt::format(" / {} (ZeRO-1)", eover) : "")
                                   : std::string("none: the weights are fp32")});
      mem.push_back({"expert optimizer states", xs.optimizer,
                     fmt::format("{}: {} B/param{}", t.optimizer, sb.optimizer,
                                 l.zero >= 1 ? fmt::format(" / {} (ZeRO-1)", eover) : "")});
    }
    if (quantized) {
      // the GEMMs read a quantized copy of each block matrix (detail::weight_copy_bytes, per matrix
      // of one TP rank: partial blocks padded), not the biases, norms, router, embedding or head
      const detail::WeightCopy lc = layer_copy(), xc = expert_copy();
      const char* fmt_name = fp4 ? "fp4" : "fp8";
      const auto [copies_f, scales_f] = detail::weight_copy_formula(t.recipe);
      const std::string what = fmt::format("{:g} layers x ({}{})", Ls, block_matrices_s,
                                           moe ? fmt::format(" + {:g}/{} experts' {}", E, l.ep, expert_matrices_s) : "");
      mem.push_back({fmt::format("{} weight copies", fmt_name), Ls * (lc.copies + xc.copies),
                     fmt::format("{}; {}", copies_f, what)});
      mem.push_back({fmt::format("{} weight scales", fmt_name), Ls * (lc.scales + xc.scales),
                     fmt::format("{}; {}", scales_f, what)});
    }
    mem.push_back({"activations", per_layer * layers_per_chunk * held_pairs,
                   fmt::format("{} per layer x {:g} layers per chunk x {} (microbatch, chunk) pairs held{}", act_formula,
                               layers_per_chunk, held_pairs, p > 1 ? " (" + l.schedule + " replayed)" : "")});
    if (is_last)
      mem.push_back({"logits", 4 * s * b * V / tp, "fp32 logits of one microbatch for the loss, 4sbV/t"});
    double comm = 0;
    std::vector<std::string> parts;
    if (l.zero == 3 && l.dp > 1) {
      comm += 2 * (layer_tp + (edp > 1 ? expert_tp : 0.0)) * sb.weights;
      parts.push_back("ZeRO-3: two gathered layers (the one computing, the one prefetched)");
    }
    if (l.sequence_parallel && l.tp > 1) {
      comm += 2 * sbh * ab;
      parts.push_back("sequence parallel: the all-gathered layer input, 2sbh");
    }
    const std::string comm_formula = parts.empty() ? std::string("none") : fmt::format("{}", fmt::join(parts, "; "));
    mem.push_back({"communication buffers", comm, comm_formula});
    mem.push_back(detail::reserved_term(sys));
    return mem;
  };
  const auto total = detail::sum_terms;
  if (p == 1) {
    e.memory = stage_memory(L_first, first, 1, true);
    e.stage = "only";
  } else {
    auto mf = stage_memory(L_first, first, held.front(), vee);
    auto ml = stage_memory(L_last, last, held.back(), !vee);
    if (total(mf) >= total(ml)) {
      e.memory = std::move(mf);
      e.stage = "first";
    } else {
      e.memory = std::move(ml);
      e.stage = "last";
    }
    // the middle stages of a looped pipeline: blocks only, the same layers each; the one holding the
    // most pairs. With even stages never more than the first (the same layers without the
    // embedding, no more pairs held), with uneven ones (more layers than the ends) it may bind.
    if (!vee && p > 2) {
      std::size_t most = 1;
      for (std::size_t i = 2; i + 1 < held.size(); ++i)
        if (held[i] > held[most]) most = i;
      auto mm = stage_memory(L_mid, mid_params, held[most], false);
      if (total(mm) > total(e.memory)) {
        e.memory = std::move(mm);
        e.stage = "middle";
      }
    }
  }
  e.memory_bytes = total(e.memory);
  e.fits = e.memory_bytes <= sys.memory_bytes;

  // ---- FLOPs (Narayanan et al. 2021, §5.1): per token and layer 2·(matrix weights) for the
  // GEMMs and 4sh for attention's two batched products; logits 2Vh. Backward twice the forward.
  // Per microbatch of whole sequences; under CP each device does 1/cp of it (the balanced split
  // gives every rank the same causal share).
  // With experts the model FLOPs count each token's k experts and the router (the active
  // parameters); the device computes every expert on its E·cap padded rows: per microbatch the
  // cp·(t under SP) routing groups' E·cap rows each, cf·k times a dense MLP's tokens (up to the
  // ceiling and the cap at n), whatever the imbalance (drop-and-pad). The hardware FLOPs and the
  // compute time count those.
  const double tokens_mb = b * S;
  const double fwd_layer = 2 * pc.matmul_per_layer * tokens_mb + 4 * b * S * S * h;
  const double fwd_layer_hw =
      !moe ? fwd_layer
           : 2 * (pc.matmul_per_layer - k * pc.expert_matmul) * tokens_mb +
                 2 * pc.expert_matmul * rows * (tokens_mb / n_route) + 4 * b * S * S * h;
  const double fwd_logits = 2 * V * h * tokens_mb;
  double recompute_layer = 0;
  if (t.recompute == "full") recompute_layer = fwd_layer_hw;
  if (t.recompute == "selective") recompute_layer = 4 * b * S * S * h;
  const double samples = static_cast<double>(t.global_batch);
  e.model_flops = 3 * (static_cast<double>(m.layers) * fwd_layer + fwd_logits) * samples / b;
  e.hardware_flops = 3 * (static_cast<double>(m.layers) * fwd_layer_hw + fwd_logits) * samples / b +
                     static_cast<double>(m.layers) * recompute_layer * samples / b;

  // ---- time per microbatch on the slowest stage: with even stages the last (its layers and the
  // logits); with uneven ones (stage_layers) whichever of the first, the middle and the last
  // stages takes longest per microbatch, compute and communication (stage_times below)
  const double rate = peak * sys.gemm_efficiency;
  // a pipeline stage as a device: its layers, whether it holds the embedding (first_end) and the
  // head with the loss (last_end), its parameters
  struct StageDevice {
    std::string name;
    double layers = 0;
    bool first_end = false, last_end = false;
    double params = 0;
  };
  // its time per microbatch (s): GEMMs and elementwise passes forward (t_f) and backward (t_bw,
  // with the recompute), the elementwise share (t_mem), the forward FLOPs (fwd_stage), and its TP,
  // CP and EP collectives per microbatch forward and backward (TP's once per step, tp_step)
  struct StageTimes {
    double t_f = 0, t_bw = 0, t_mem = 0, fwd_stage = 0, tp_fwd = 0, tp_bwd = 0, tp_step = 0, cp_fwd = 0, cp_bwd = 0,
           ep_fwd = 0, ep_bwd = 0;
  };
  // Elementwise kernels, memory-bound: per layer and forward, in element passes (each element read
  // or written once is a pass): the attention scores a·s²·b/t (scale-mask-softmax: read, write;
  // dropout: read, write, mask) unless fused (FlashAttention); the MLP's f-wide activation (GELU
  // or SwiGLU: read, write, bias) sbf/t; the h-wide tensors sbh (two norms: read, write; two
  // residual adds: 2 reads, 1 write; two dropouts: read, write, mask), split by t with SP. With
  // experts the f-wide activation is on the device's expert rows, and the [E, cap, h] buffer is
  // written by the dispatch and read by the combine (2 passes). The backward streams twice the
  // forward's bytes; a full recompute adds a forward, a selective one the scores' passes again.
  const double eb = detail::activation_element_bytes(t.recipe);
  const double score_bytes = t.flash_attention ? 0.0 : (m.dropout ? 5.0 : 2.0) * a * s * S * b / tp * eb;
  const double other_bytes =
      (3.0 * mlp_rows * f / tp + (m.dropout ? 16.0 : 10.0) * sbh / sp + (moe ? 2.0 * rows * h : 0.0)) * eb;
  // ---- communication of one step on the modelled device (the last stage's; ZB-V's rank 0, which
  // holds the last chunk), per group and collective
  // (payload as nccl-tests and dist::Group count it); each call costs the link's latency plus the
  // ring's share of its payload. Phases: per microbatch forward, per microbatch backward, per step.
  const double mbd = static_cast<double>(mb);
  // `timed` false: a receive, whose time is its sender's send; while `recording` is false (a stage
  // timed only to find the slowest) nothing is added to the communication table
  bool recording = true;
  auto add_comm = [&](const std::string& group, const std::string& coll, double calls, double bytes_each,
                      const Link& lk, int64_t n, const std::string& what, bool timed = true) {
    return detail::add_comm(e.comm, recording, group, coll, calls, bytes_each, lk, n, what, timed);
  };
  // One stage's time per microbatch: its d.layers layers (and the logits where it holds the head,
  // d.last_end), the elementwise passes, and its TP, CP and EP collectives (the embedding's where it
  // holds the embedding, d.first_end; the head's and the cross-entropy's where it holds the head).
  auto stage_times = [&](const StageDevice& d) {
    StageTimes st;
    const double fwd_stage = (d.layers * fwd_layer_hw + (d.last_end ? fwd_logits : 0.0)) / tp / cpd;
    const double mem_fwd = d.layers * (score_bytes + other_bytes) / sys.memory_bandwidth;
    const double mem_recompute = t.recompute == "full" ? mem_fwd
                                 : t.recompute == "selective" ? d.layers * score_bytes / sys.memory_bandwidth
                                                              : 0.0;
    st.fwd_stage = fwd_stage;
    st.t_f = fwd_stage / rate + mem_fwd;
    st.t_bw = (2 * fwd_stage + d.layers * recompute_layer / tp / cpd) / rate + 2 * mem_fwd + mem_recompute;
    st.t_mem = mem_fwd * 3 + mem_recompute;
    double& tp_fwd = st.tp_fwd;
    double& tp_bwd = st.tp_bwd;
    double& tp_step = st.tp_step;
    // TP (Megatron-LM, Shoeybi et al. 2019, §3; the vocabulary-parallel embedding, head and
    // cross-entropy): without SP, per layer two all-reduces of the sbh activation in the forward
    // (after the attention and MLP projections) and two in the backward (before QKV and FC1); one
    // after the embedding (first stage), one before the head in the backward and three of 4sb for
    // the cross-entropy (max, target logit, sum of exponentials; last stage). With SP (Korthikanti et
    // al. 2022, §4.2.2) each all-reduce becomes an all-gather and a reduce-scatter of the same
    // payload, and the backward all-gathers each column-parallel GEMM's input again for its weight
    // gradient (the activations keep only the 1/t shard); the norms' and row-parallel biases'
    // gradients are all-reduced once per step. The embedding reduce-scatters its output, except with
    // learned positions: then it all-reduces and keeps its sequence shard, and its backward
    // all-gathers (Megatron-core's LanguageModelEmbedding). A full recompute runs the forward's
    // collectives again.
    // With experts (expert TP = TP) the MLP's collectives carry the device's expert rows, rows·h
    // instead of sbh: without SP the experts' row-parallel outputs all-reduced forward and their
    // column-parallel inputs' gradients backward (core/parallel/ep's TpMoeShards, one per expert of
    // ep·cap rows: E·cap·h per layer); with SP Megatron-core's all-to-all dispatcher all-gathers the
    // received rows over TP and reduce-scatters the outputs (t·E·cap·h), the backward the reverse,
    // and no re-gather of the experts' input (it keeps the gathered rows: the activations above).
    if (l.tp > 1 && moe) {
      const Link& lk = detail::group_link(sys, l.tp, 1);
      const double msg = sbh * eb, xmsg = rows_dev * h * eb, ce = 4 * s * b, Ls = d.layers,
                   emb = d.first_end ? 1.0 : 0.0, hd = d.last_end ? 1.0 : 0.0;
      const double emb_rs = m.learned_positions ? 0.0 : emb, emb_ar = m.learned_positions ? emb : 0.0;
      const double again = t.recompute == "full" ? Ls : 0.0;  // per layer and half (attention or experts)
      const std::string emb_s = d.first_end ? ", 1 after the embedding" : "", rc_s = again > 0 ? ", 1 per layer to recompute" : "";
      const std::string xs = l.sequence_parallel ? "t·E·cap·h" : "E·cap·h";
      if (!l.sequence_parallel) {
        tp_fwd += add_comm("tp", "all_reduce", mbd * (Ls + emb), msg, lk, l.tp,
                           fmt::format("sbh: 1 per layer forward (attention){}", emb_s)) / mbd;
        tp_fwd += add_comm("tp", "all_reduce", mbd * Ls, xmsg, lk, l.tp,
                           xs + ": the experts' outputs, 1 per layer forward") / mbd;
        tp_bwd += add_comm("tp", "all_reduce", mbd * (Ls + hd + again), msg, lk, l.tp,
                           fmt::format("sbh: 1 per layer backward (attention){}{}", d.last_end ? ", 1 before the head" : "",
                                       rc_s)) / mbd;
        tp_bwd += add_comm("tp", "all_reduce", mbd * (Ls + again), xmsg, lk, l.tp,
                           fmt::format("{}: the experts' input gradients, 1 per layer backward{}", xs, rc_s)) / mbd;
      } else {
        tp_fwd += add_comm("tp", "all_gather", mbd * (Ls + hd), msg, lk, l.tp,
                           std::string("sbh: 1 per layer forward (attention)") + (d.last_end ? ", 1 before the head" : "")) / mbd;
        tp_fwd += add_comm("tp", "all_gather", mbd * Ls, xmsg, lk, l.tp, xs + ": the received rows, 1 per layer forward") / mbd;
        tp_fwd += add_comm("tp", "reduce_scatter", mbd * (Ls + emb_rs), msg, lk, l.tp,
                           fmt::format("sbh: 1 per layer forward (attention){}", emb_rs > 0 ? emb_s : "")) / mbd;
        tp_fwd += add_comm("tp", "reduce_scatter", mbd * Ls, xmsg, lk, l.tp, xs + ": the experts' outputs, 1 per layer forward") / mbd;
        tp_fwd += add_comm("tp", "all_reduce", mbd * emb_ar, msg, lk, l.tp,
                           "sbh: 1 after the embedding (learned positions: all-reduced, then split)") / mbd;
        tp_bwd += add_comm("tp", "all_gather", mbd * (2 * Ls + hd + emb + again), msg, lk, l.tp,
                           fmt::format("1 per layer backward, 1 per layer{} re-gathering the GEMM inputs{}{}",
                                       d.last_end ? " + 1" : "", d.first_end ? ", 1 for the embedding" : "", rc_s)) / mbd;
        tp_bwd += add_comm("tp", "all_gather", mbd * (Ls + again), xmsg, lk, l.tp,
                           fmt::format("{}: the outputs' gradients, 1 per layer backward{}", xs, rc_s)) / mbd;
        tp_bwd += add_comm("tp", "reduce_scatter", mbd * (Ls + hd + again), msg, lk, l.tp,
                           fmt::format("1 per layer backward{}{}", d.last_end ? ", 1 after the head" : "", rc_s)) / mbd;
        tp_bwd += add_comm("tp", "reduce_scatter", mbd * (Ls + again), xmsg, lk, l.tp,
                           fmt::format("{}: the received rows' gradients, 1 per layer backward{}", xs, rc_s)) / mbd;
        // the norms, the attention's row-parallel bias and the router see 1/t of the tokens
        const double sp_params =
            Ls * (2 * (m.rmsnorm ? h : 2 * h) + (m.bias ? h : 0.0) + pc.router) + (d.last_end ? pc.final_norm : 0.0);
        tp_step += add_comm("tp", "all_reduce", 1, sp_params * sb.grads, lk, l.tp,
                            "once per step: the norms', the attention's row-parallel bias' and the router's gradients "
                            "(sequence parallel)");
      }
      tp_fwd += add_comm("tp", "all_reduce", mbd * 3 * hd, ce, lk, l.tp, "3 x 4sb: the vocabulary-parallel cross-entropy") / mbd;
    } else if (l.tp > 1) {
      const Link& lk = detail::group_link(sys, l.tp, 1);
      const double msg = sbh * eb, ce = 4 * s * b, Ls = d.layers, emb = d.first_end ? 1.0 : 0.0, hd = d.last_end ? 1.0 : 0.0;
      const double emb_rs = m.learned_positions ? 0.0 : emb, emb_ar = m.learned_positions ? emb : 0.0;
      const double again = t.recompute == "full" ? 2 * Ls : 0.0;
      const std::string emb_s = d.first_end ? ", 1 after the embedding" : "", rc_s = again > 0 ? ", 2 per layer to recompute" : "";
      if (!l.sequence_parallel) {
        tp_fwd += add_comm("tp", "all_reduce", mbd * (2 * Ls + emb), msg, lk, l.tp,
                           fmt::format("sbh: 2 per layer forward{}", emb_s)) / mbd;
        tp_bwd += add_comm("tp", "all_reduce", mbd * (2 * Ls + hd + again), msg, lk, l.tp,
                           fmt::format("2 per layer backward{}{}", d.last_end ? ", 1 before the head" : "", rc_s)) / mbd;
      } else {
        tp_fwd += add_comm("tp", "all_gather", mbd * (2 * Ls + hd), msg, lk, l.tp,
                           std::string("sbh: 2 per layer forward") + (d.last_end ? ", 1 before the head" : "")) / mbd;
        tp_fwd += add_comm("tp", "reduce_scatter", mbd * (2 * Ls + emb_rs), msg, lk, l.tp,
                           fmt::format("sbh: 2 per layer forward{}", emb_rs > 0 ? emb_s : "")) / mbd;
        tp_fwd += add_comm("tp", "all_reduce", mbd * emb_ar, msg, lk, l.tp,
                           "sbh: 1 after the embedding (learned positions: all-reduced, then split)") / mbd;
        tp_bwd += add_comm("tp", "all_gather", mbd * (4 * Ls + hd + emb + again), msg, lk, l.tp,
                           fmt::format("2 per layer backward, 2 per layer{} re-gathering the GEMM inputs{}{}",
                                       d.last_end ? " + 1" : "", d.first_end ? ", 1 for the embedding" : "", rc_s)) / mbd;
        tp_bwd += add_comm("tp", "reduce_scatter", mbd * (2 * Ls + hd + again), msg, lk, l.tp,
                           fmt::format("2 per layer backward{}{}", d.last_end ? ", 1 after the head" : "", rc_s)) / mbd;
        const double sp_params = Ls * (2 * (m.rmsnorm ? h : 2 * h) + (m.bias ? 2 * h : 0.0)) + (d.last_end ? pc.final_norm : 0.0);
        tp_step += add_comm("tp", "all_reduce", 1, sp_params * sb.grads, lk, l.tp,
                            "once per step: the norms' and row-parallel biases' gradients (sequence parallel)");
      }
      tp_fwd += add_comm("tp", "all_reduce", mbd * 3 * hd, ce, lk, l.tp, "3 x 4sb: the vocabulary-parallel cross-entropy") / mbd;
    }
    // CP (core/parallel/cp, `mpt contextparallel`): per layer and microbatch, this device's K and V
    // of s positions (kvb bytes each) and its q or output of sbh: ring, K/V sent cp − 1 times forward
    // and again backward, the dK/dV partials cp times (one message each, K with V); all-gather, K and
    // V all-gathered forward (output payload S) and their gradients reduce-scattered backward; Ulysses,
    // q, k, v all-to-all to head-sharded and the output back, the gradients the same way backward. A
    // full recompute runs the forward's again. Not overlapped with the attention here (ring attention
    // overlaps each step's send with the previous block: an upper bound).
    double& cp_fwd = st.cp_fwd;
    double& cp_bwd = st.cp_bwd;
    if (l.cp > 1) {
      const Link& lk = detail::group_link(sys, l.cp, l.tp);
      const double Ls = d.layers, kvb = s * b * kv / tp * eb, qb = sbh / tp * eb;
      const double fw = mbd * Ls * (t.recompute == "full" ? 2.0 : 1.0), bw = mbd * Ls;
      const int64_t n = l.cp;
      if (l.cp_attention == "ring") {
        cp_fwd += add_comm("cp", "send", fw * (cpd - 1), 2 * kvb, lk, n, "K and V: cp - 1 per layer forward") / mbd;
        cp_bwd += add_comm("cp", "send", bw * (2 * cpd - 1), 2 * kvb, lk, n,
                           "cp - 1 K/V and cp dK/dV per layer backward (the partials travel home)") / mbd;
        add_comm("cp", "recv", fw * (cpd - 1) + bw * (2 * cpd - 1), 2 * kvb, lk, n,
                 "as many as sent (timed as the peer's sends)", false);
      } else if (l.cp_attention == "all_gather") {
        cp_fwd += add_comm("cp", "all_gather", 2 * fw, kvb * cpd, lk, n, "K and V of all S positions, per layer") / mbd;
        cp_bwd += add_comm("cp", "reduce_scatter", 2 * bw, kvb * cpd, lk, n, "dK and dV, per layer") / mbd;
      } else {
        cp_fwd += add_comm("cp", "all_to_all", 2 * fw, qb, lk, n, "q and the output, per layer forward") / mbd;
        cp_fwd += add_comm("cp", "all_to_all", 2 * fw, kvb, lk, n, "k and v, per layer forward") / mbd;
        cp_bwd += add_comm("cp", "all_to_all", 2 * bw, qb, lk, n, "dq and the output's gradient, per layer backward") / mbd;
        cp_bwd += add_comm("cp", "all_to_all", 2 * bw, kvb, lk, n, "dk and dv, per layer backward") / mbd;
      }
    }
    // EP (core/parallel/ep, `mpt expertparallel`; Megatron-core's MoEAlltoAllTokenDispatcher with
    // the buffers padded to the capacity): per MoE layer and microbatch the [E, cap, h] buffer goes
    // out to the experts' owners (dispatch) and comes back (combine), and their gradients the same
    // way backward: 4 all-to-alls of E·cap·h elements each (the payload every rank hands its group;
    // (ep − 1)/ep of it leaves the rank). Without SP every TP rank exchanges its own copy of the same
    // tokens. A full recompute runs the forward's two again. Not overlapped with the experts.
    double& ep_fwd = st.ep_fwd;
    double& ep_bwd = st.ep_bwd;
    if (moe && l.ep > 1) {
      // the EP group: the same TP and CP coordinates, consecutive DP ones (tp·cp ranks apart)
      const Link& lk = detail::group_link(sys, l.ep, l.tp * l.cp);
      const double Ls = d.layers, buf = rows * h * eb;
      const double fw = mbd * Ls * (t.recompute == "full" ? 2.0 : 1.0), bw = mbd * Ls;
      ep_fwd += add_comm("ep", "all_to_all", 2 * fw, buf, lk, l.ep,
                         fmt::format("E·cap·h = {:g}·{:g}·{:g}: dispatch and combine, per layer forward{}", E, cap, h,
                                     t.recompute == "full" ? " (and again to recompute)" : "")) / mbd;
      ep_bwd += add_comm("ep", "all_to_all", 2 * bw, buf, lk, l.ep, "their gradients, per layer backward") / mbd;
    }
    return st;
  };
  // The modelled device: pp = 1 the only stage, ZB-V rank 0 (the first and the last chunk); looped
  // pipelines the slowest stage per microbatch, which sets the pipeline's pace (the step is m times
  // its time plus the schedule's bubble at its time). With even stages that is the last (the
  // others' layers plus the head, the logits and the cross-entropy); with uneven ones the first, the
  // middle and the last stages are timed and the slowest (the later on a tie) is taken.
  std::vector<StageDevice> devs;
  if (p == 1) {
    devs.push_back({"only stage", L_first, true, true, first});
  } else if (vee) {
    devs.push_back({"first stage (ZB-V: the first and last chunks)", L_first, true, true, first});
  } else if (!l.uneven()) {
    devs.push_back({"last stage", L_last, false, true, last});
  } else {
    devs.push_back({"first stage", L_first, true, false, first});
    if (p > 2) devs.push_back({"middle stage", L_mid, false, false, mid_params});
    devs.push_back({"last stage", L_last, false, true, last});
  }
  // TP collectives overlapped with their GEMMs (layout.overlap_tp): what exceeds the compute beside them
  auto exposed_tp = [&](double tp, double compute) { return l.overlap_tp ? std::max(0.0, tp - compute) : tp; };
  std::size_t pick = devs.size() - 1;
  if (devs.size() > 1) {
    recording = false;
    double slowest = -1;
    for (std::size_t i = 0; i < devs.size(); ++i) {
      const StageTimes x = stage_times(devs[i]);
      const double per_mb = x.t_f + x.t_bw + exposed_tp(x.tp_fwd, x.t_f) + exposed_tp(x.tp_bwd, x.t_bw) + x.cp_fwd +
                            x.cp_bwd + x.ep_fwd + x.ep_bwd;
      if (per_mb >= slowest) {
        slowest = per_mb;
        pick = i;
      }
    }
    recording = true;
  }
  const StageDevice& dev = devs[pick];
  e.comm_device = dev.name;
  if (l.uneven())
    e.comm_device += fmt::format(" ({:g} layers; uneven stages, the slowest per microbatch)", dev.layers);
  const StageTimes st = stage_times(dev);
  const double t_f = st.t_f, t_bw = st.t_bw, t_mem = st.t_mem, fwd_stage = st.fwd_stage, tp_fwd = st.tp_fwd,
               tp_bwd = st.tp_bwd, tp_step = st.tp_step, cp_fwd = st.cp_fwd, cp_bwd = st.cp_bwd, ep_fwd = st.ep_fwd,
               ep_bwd = st.ep_bwd;
  const double experts_dev = dev.layers * expert_tp;  // the experts' parameters on the modelled device
  const double tp_fwd_exposed = exposed_tp(tp_fwd, t_f), tp_bwd_exposed = exposed_tp(tp_bwd, t_bw);
  double f_op = t_f + tp_fwd_exposed + cp_fwd + ep_fwd, bw_op = t_bw + tp_bwd_exposed + cp_bwd + ep_bwd;
  // the bubble: the schedule's idle time per stage (core/pipeline's bubble_time_theory), B and W
  // each half of the backward; ZB-V's closed form wants F = B = W: a third of the microbatch each
  double idle = 0;
  if (p > 1) {
    const ScheduleSpec& spec = schedule_spec(l.schedule);
    double fo = f_op, bo = bw_op / 2, wo = bw_op / 2;
    if (spec.formula_needs_equal_fbw) fo = bo = wo = (f_op + bw_op) / 3;
    idle = bubble_time_theory(spec.kind, p, mb, fo, bo, wo, v);
  }
  const double pipe = static_cast<double>(mb) * (f_op + bw_op) + idle;
  e.bubble_fraction = pipe > 0 ? idle / pipe : 0;
  // PP: per microbatch each chunk boundary crossed between ranks carries an activation forward and
  // a gradient back; each TP rank sends the whole activation (Megatron-core), 1/t of it with SP
  // (split already) or with Megatron-LM 2021's scatter/gather (Narayanan et al. 2021 §4.1), where
  // the receiver then all-gathers it over TP. The last rank sends the gradients of its v chunks and
  // the activations of all but the model's last chunk, (2v - 1) per microbatch, and receives as many; in ZB-V's V rank 0 (the first and the last
  // chunk, the modelled device) sends and receives 2. A receive's time is its sender's send.
  // Tied weights on two stages: the head's gradient is all-reduced with the first stage's once per
  // step (Megatron-LM's embedding group).
  double t_pp = 0;
  // sends (and receives) per microbatch on the modelled rank: the first and the last 2v - 1, a
  // middle one 2v (every chunk's activation out and gradient back), ZB-V's rank 0 2
  const bool middle_dev = !dev.first_end && !dev.last_end;
  const double per_mb = vee ? 2.0 : middle_dev ? 2.0 * v : 2.0 * v - 1;
  if (p > 1) {
    const Link& lk = detail::group_link(sys, 2, l.tp * l.cp * l.dp);
    const bool split = l.sequence_parallel || l.pp_scatter_gather;
    const std::string msg_s = split ? "sbh/t" : "sbh";
    // gradients sent (= activations received) and activations sent (= gradients received) per microbatch
    const int grads_out = dev.first_end ? v - 1 : v, acts_out = dev.last_end ? v - 1 : v;
    const char* rank_s = dev.last_end ? "the last rank" : dev.first_end ? "the first rank" : "a middle rank";
    const std::string sends = vee ? msg_s + ": ZB-V's rank 0, the first chunk's activation and the last chunk's "
                                            "gradient per microbatch"
                                  : fmt::format("{}: {}, {} gradient(s) and {} activation(s) per microbatch "
                                                "({} chunk(s))", msg_s, rank_s, grads_out, acts_out, v);
    const std::string recvs = vee ? msg_s + ": ZB-V's rank 0, the last chunk's input activation and the first chunk's "
                                            "output gradient per microbatch"
                                  : fmt::format("{}: {}, {} activation(s) and {} gradient(s) per microbatch",
                                                msg_s, rank_s, grads_out, acts_out);
    const double pmsg = split ? sbh * eb / tp : sbh * eb;
    t_pp += add_comm("pp", "send", per_mb * mbd, pmsg, lk, 2, sends);
    add_comm("pp", "recv", per_mb * mbd, pmsg, lk, 2, recvs + " (timed as the peer's sends)", false);
    if (l.pp_scatter_gather && !l.sequence_parallel && l.tp > 1)
      t_pp += add_comm("tp", "all_gather", per_mb * mbd, sbh * eb, detail::group_link(sys, l.tp, 1), l.tp,
                       "sbh: each received pipeline message gathered (scatter/gather)");
    if (m.tied && !vee && !middle_dev)
      t_pp += add_comm("embedding", "all_reduce", 1, pc.embedding / tp * sb.grads, detail::group_link(sys, 2, (p - 1) * l.tp * l.cp * l.dp),
                       2, "once per step: the tied head's gradient with the first stage's embedding");
  }
  // DP / ZeRO over dp ranks `tp` apart, the gradients accumulated over the microbatches: ZeRO-0 one
  // all-reduce; ZeRO-1 a reduce-scatter and an all-gather of the updated weights; ZeRO-2 keeps only
  // its gradient shard, so it reduce-scatters every microbatch (DeepSpeed); ZeRO-3 also all-gathers
  // the weights for each microbatch's forward and backward (Rajbhandari et al. 2020, §7).
  // Under CP the group is the dp·cp ranks holding the same shards (Megatron's data-parallel group
  // with context parallelism): each CP rank's gradient covers its share of the tokens.
  double t_dp = 0;
  const double params_dev = dev.params;  // the modelled device's
  const int64_t dpc = l.dp * l.cp;
  if (dpc > 1) {
    const Link& lk = detail::group_link(sys, dpc, l.tp);
    const double g = params_dev * sb.grads, w = params_dev * sb.weights;
    // the step's mean loss for the log, on the last stage (Megatron-LM's train_step: 2 fp32 values)
    if (dev.last_end) t_dp += add_comm("dp", "all_reduce", 1, 8, lk, dpc, "the loss's mean for the log, 8 B");
    if (l.zero == 0) {
      t_dp += add_comm("dp", "all_reduce", 1, g, lk, dpc, "the gradients, once per step");
    } else {
      t_dp += add_comm("dp", "reduce_scatter", l.zero >= 2 ? mbd : 1.0, g, lk, dpc,
                       l.zero >= 2 ? "the gradients, every microbatch (only a shard is kept)" : "the gradients, once per step");
      t_dp += add_comm("dp", "all_gather", l.zero == 3 ? 2 * mbd : 1.0, w, lk, dpc,
                       l.zero == 3 ? "the weights, for every microbatch's forward and backward"
                                   : "the updated weights, once per step");
    }
  }
  // The experts' gradients, as the dense ones above but over the expert-data-parallel group of the
  // dp·cp/ep ranks holding the same experts (Megatron-core's expert_data_parallel group; `mpt
  // expertparallel`'s mesh "edp"): nothing to reduce when dp·cp/ep = 1. Its members:
  // every CP coordinate, DP coordinates ep apart (ranks tp fastest, then cp, then dp).
  if (moe && edp > 1) {
    const int64_t span = l.tp * ((l.cp - 1) + l.cp * (l.dp / l.ep - 1) * l.ep) + 1;
    const Link& lk = span <= sys.devices_per_node ? sys.intra : sys.inter;
    const double g = experts_dev * sb.grads, w = experts_dev * sb.weights;
    if (l.zero == 0) {
      t_dp += add_comm("edp", "all_reduce", 1, g, lk, edp, "the experts' gradients, once per step");
    } else {
      t_dp += add_comm("edp", "reduce_scatter", l.zero >= 2 ? mbd : 1.0, g, lk, edp,
                       l.zero >= 2 ? "the experts' gradients, every microbatch (only a shard is kept)"
                                   : "the experts' gradients, once per step");
      t_dp += add_comm("edp", "all_gather", l.zero == 3 ? 2 * mbd : 1.0, w, lk, edp,
                       l.zero == 3 ? "the experts' weights, for every microbatch's forward and backward"
                                   : "the experts' updated weights, once per step");
    }
  }
  // overlap: ZeRO 0-2 reduce during the last microbatch's backward (ZeRO-2's earlier ones during
  // theirs); ZeRO-3 gathers ahead of compute
  const double hide = !l.overlap_dp ? 0.0 : l.zero == 3 ? mb * (t_f + t_bw) : l.zero == 2 ? mb * t_bw : t_bw;
  const double t_dp_exposed = std::max(0.0, t_dp - hide);
  // optimizer: an elementwise pass reading and writing every state of this device once
  double state = 0;
  for (const auto& term : e.memory)
    for (const char* name : {"weights", "gradients", "master weights", "optimizer states"})
      if (term.name == name || term.name == std::string("expert ") + name) state += term.value;
  const double t_opt = 2 * state / sys.memory_bandwidth;

  std::string compute_formula =
      fmt::format("{:.3g} GFLOP per microbatch on the slowest stage at {:.0f}% of {:.4g} TFLOP/s, x{} microbatches",
                  (fwd_stage * 3 + dev.layers * recompute_layer / tp) / 1e9, sys.gemm_efficiency * 100,
                  peak / 1e12, mb);
  if (moe)
    compute_formula += fmt::format("; the experts' GEMMs on E·cap = {:g} padded rows per {:g} tokens routed (cf·k = "
                                   "{:g} times a dense MLP's tokens; drop-and-pad: fixed by the capacity, whatever "
                                   "the routing's imbalance, which moves only the drops and the padding)",
                                   rows, n_route, rows / n_route);
  if (l.uneven())
    compute_formula += fmt::format("; uneven stages: first {}{}, last {} layers, the {} the slowest (it sets the pace)",
                                   sl.front(), p > 2 ? fmt::format(", middle {}", sl[1]) : std::string(), sl.back(),
                                   dev.name);
  e.time.push_back({"compute", mb * (t_f + t_bw - t_mem), compute_formula});
  e.time.push_back({"elementwise", mb * t_mem,
                    fmt::format("{:.3g} GB per microbatch at {:.0f} GB/s: norms, activations, residuals{}{}",
                                t_mem * sys.memory_bandwidth / 1e9, sys.memory_bandwidth / 1e9,
                                m.dropout ? ", dropout" : "", t.flash_attention ? " (attention fused)" : ", softmax over a·s²·b scores")});
  e.time.push_back({"tp collectives", mb * (tp_fwd_exposed + tp_bwd_exposed) + tp_step,
                    l.tp > 1 ? fmt::format("{} per layer per microbatch{}{} (communication table){}",
                                           l.sequence_parallel ? (moe ? "5 AG + 4 RS" : "6 AG + 4 RS") : "4 all-reduces",
                                           t.recompute == "full" ? " (+2 to recompute)" : "",
                                           // even stages keep their words; an uneven stage names its own ends
                                           !l.uneven() || (dev.first_end && dev.last_end)
                                               ? ", the embedding's, head's and cross-entropy's"
                                               : dev.first_end ? ", the embedding's"
                                               : dev.last_end  ? ", the head's and cross-entropy's"
                                                               : ", no embedding's, head's or cross-entropy's (a middle stage)",
                                           l.overlap_tp ? fmt::format("; the per-microbatch ones overlapped with the GEMMs "
                                                                      "(overlap_tp): {:.3g} s in all, {:.3g} s of it "
                                                                      "exposed; {:.3g} s once per step",
                                                                      mb * (tp_fwd + tp_bwd),
                                                                      mb * (tp_fwd_exposed + tp_bwd_exposed), tp_step)
                                                        : std::string())
                             : std::string("none (tp = 1)")});
  if (l.cp > 1)  // a row only for a CP layout: the time tables of the others stay as they were
    e.time.push_back({"cp communication", mb * (cp_fwd + cp_bwd),
                      fmt::format("{} over cp = {} ranks, per layer per microbatch (communication table), not overlapped",
                                  l.cp_attention, l.cp)});
  if (moe && l.ep > 1)  // a row only for an expert-parallel layout
    e.time.push_back({"ep all-to-all", mb * (ep_fwd + ep_bwd),
                      fmt::format("4 per layer per microbatch of the [E, cap, h] buffer over ep = {} ranks, (ep - 1)/ep "
                                  "of it sent (communication table), not overlapped", l.ep)});
  e.time.push_back({"bubble", idle,
                    p > 1 ? fmt::format("{} idle time (core/pipeline bubble_time_theory), {:.1f}% of the pipeline",
                                        l.schedule, e.bubble_fraction * 100)
                          : std::string("none (pp = 1)")});
  e.time.push_back({"pp send/recv", t_pp,
                    p > 1 ? fmt::format("{:g} send(s) per microbatch x {} microbatches{}", per_mb, mb,
                                        m.tied && !vee && !middle_dev ? " + the tied embedding's all-reduce" : "")
                          : "none (pp = 1)"});
  e.time.push_back(detail::dp_exposed_term(l, t_dp, t_dp_exposed));
  e.time.push_back({"optimizer step", t_opt, "read and write every state of this device once at the memory bandwidth"});
  e.step_s = pipe + tp_step + t_pp + t_dp_exposed + t_opt;
  detail::set_rates(e, samples * S, l.devices(), peak, t.tokens);
  return e;
}

}  // namespace mpt::plan
