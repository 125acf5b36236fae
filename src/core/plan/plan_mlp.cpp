// The planner's MLP (ModelShape::widths, `model.style` mlp): the Linear + ReLU networks of mpt's
// own experiments (core/models/mlp: accumulate, checkpoint, dataparallel, pipeline, fp8, fp4),
// planned term by term as plan.cpp plans the GPT. Its layers differ in width, so each pipeline
// stage is planned with its own layers (docs/plan.md, "The MLP").
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/pipeline/schedule.hpp"
#include "core/plan/plan.hpp"
#include "core/plan/plan_detail.hpp"

namespace mpt::plan {

namespace {

using detail::activation_element_bytes;

double width(const ModelShape& m, int64_t k) { return static_cast<double>(m.widths[static_cast<std::size_t>(k)]); }

int64_t mlp_layers(const ModelShape& m) { return static_cast<int64_t>(m.widths.size()) - 1; }

// Linear layer k (0-based): w_k·w_k+1 weights; with its w_k+1 biases.
double layer_matrix(const ModelShape& m, int64_t k) { return width(m, k) * width(m, k + 1); }
double layer_params(const ModelShape& m, int64_t k) { return layer_matrix(m, k) + width(m, k + 1); }

// "2-3" for layers [2, 4), "2" for [2, 3).
std::string layer_range(int64_t begin, int64_t end) {
  return end - begin == 1 ? fmt::format("{}", begin) : fmt::format("{}-{}", begin, end - 1);
}

}  // namespace

std::string mlp_layout_error(const ModelShape& m, const Training& t, const Layout& l) {
  const int64_t L = mlp_layers(m);
  if (L < 1)
    return fmt::format("/model/widths: expected at least 2 widths (the input and the output of a Linear layer), got {}",
                       m.widths.size());
  for (std::size_t k = 0; k < m.widths.size(); ++k)
    if (m.widths[k] < 1) return fmt::format("/model/widths/{}: expected a width >= 1, got {}", k, m.widths[k]);
  if (l.tp != 1)
    return fmt::format("/layout/tp = {}: the MLP model is planned without tensor parallelism (expected 1)", l.tp);
  if (l.cp != 1) return fmt::format("/layout/cp = {}: an MLP has no sequence to split (expected 1)", l.cp);
  if (l.ep != 1)
    return fmt::format("/layout/ep = {}: expert parallelism needs a mixture of experts (expected 1 for an MLP)", l.ep);
  if (l.uneven())
    return "/layout/first_stage_layers, /layout/last_stage_layers, /layout/account_for_embedding, "
           "/layout/account_for_loss: the MLP model splits its layers evenly over the stages (expected 0 and false)";
  if (L % (l.pp * l.virtual_stages) != 0)
    return fmt::format("/model/widths: the MLP's {} Linear layers are not a multiple of /layout/pp · "
                       "/layout/virtual_stages = {} · {}", L, l.pp, l.virtual_stages);
  // The rules that hold for any model (the batch over dp·microbatch, ZeRO-2/3 with pipelining, the
  // virtual stages and the schedule's own) are layout_error's: asked of a transformer shape with
  // the MLP's layer count and no constraint of its own (one head of width 1, tp = cp = 1).
  ModelShape shape;
  shape.layers = L;
  shape.hidden = shape.heads = shape.kv_heads = shape.ffn = shape.vocab = shape.sequence = 1;
  return layout_error(shape, t, l);
}

double mlp_activation_bytes(const ModelShape& m, const Training& t, int64_t microbatch, int64_t begin, int64_t end) {
  const int64_t L = mlp_layers(m);
  if (begin < 0 || end > L || begin >= end)
    throw std::invalid_argument(fmt::format("mlp_activation_bytes: layers [{}, {}) outside the MLP's {}", begin, end, L));
  const double eb = activation_element_bytes(t.recipe), b = static_cast<double>(microbatch);
  const bool full = t.recompute == "full";
  double bytes = 0;
  for (int64_t k = begin; k < end; ++k) {
    bytes += eb * b * width(m, k);  // the Linear's input (addmm keeps mat1)
    if (full) continue;             // full recompute: a layer keeps its input only
    const bool hidden = k < L - 1;  // followed by a ReLU
    if (hidden && m.dropout)
      bytes += (eb + 1) * b * width(m, k + 1);  // the ReLU output and dropout's 1-byte mask
    else if (hidden && k == end - 1)
      bytes += eb * b * width(m, k + 1);  // the range's last ReLU output (the next stage keeps a copy)
  }
  if (end == L) bytes += 4 * b * width(m, L);  // the loss's fp32 input
  return bytes;
}

MlpOperators mlp_operators(const ModelShape& m, const Training& t, int64_t microbatch, int64_t begin, int64_t end,
                           const System& s) {
  const int64_t L = mlp_layers(m);
  if (begin < 0 || end > L || begin >= end)
    throw std::invalid_argument(fmt::format("mlp_operators: layers [{}, {}) outside the MLP's {}", begin, end, L));
  const double b = static_cast<double>(microbatch);
  MlpOperators o;
  for (int64_t k = begin; k < end; ++k) {
    const bool hidden = k < L - 1;  // followed by a ReLU (and dropout)
    const double g = s.gemm_seconds(t.recipe, b, width(m, k + 1), width(m, k));  // [b, w_k] x [w_k, w_k+1]
    o.forward += 1 + (hidden ? 1 + (m.dropout ? 2 : 0) : 0);
    o.gemm_forward_s += g;
    // dW = dY^T X and the bias's sum always; dX = dY W unless k = 0 (the data needs no gradient)
    o.backward += 2 + (k > 0 ? 1 : 0) + (hidden ? 1 + (m.dropout ? 1 : 0) : 0);
    o.gemm_backward_s += (k > 0 ? 2 : 1) * g;
  }
  if (end == L) {  // cross entropy: log_softmax, nll_loss and the loss's scaling, forward and backward
    o.forward += 3;
    o.backward += 3;
  }
  if (t.recompute == "full") {  // the forward runs again inside the backward
    o.backward += o.forward;
    o.gemm_backward_s += o.gemm_forward_s;
  }
  return o;
}

Estimate estimate_mlp(const ModelShape& m, const Training& t, const Layout& l, const System& sys) {
  Estimate e;
  const double peak = sys.peak_for(t.recipe);
  if (peak <= 0) throw std::invalid_argument(fmt::format("the system '{}' has no {} peak", sys.name, t.recipe));
  const int64_t L = mlp_layers(m);
  const int p = static_cast<int>(l.pp);
  const int v = static_cast<int>(l.pp > 1 ? l.virtual_stages : 1);
  const int64_t V = static_cast<int64_t>(p) * v, per_chunk = L / V;
  const ScheduleSpec& spec = schedule_spec(l.schedule);
  const Placement placement = p > 1 ? spec.placement : Placement::Loop;
  e.microbatches = t.global_batch / (l.dp * t.microbatch);
  const int mb = static_cast<int>(e.microbatches);
  const double mbd = static_cast<double>(mb), b = static_cast<double>(t.microbatch);
  const double eb = activation_element_bytes(t.recipe);
  const ModelStates per_param = model_states(1.0, t, 0, 1);  // bytes per parameter of each state
  std::vector<int> held(static_cast<std::size_t>(p), 1);
  if (p > 1) held = detail::replayed_held_pairs(l.schedule, p, mb, v);
  const bool full = t.recompute == "full";

  // ---- every stage: its chunks' layers, parameters, activations and forward cost
  struct StageWork {
    std::vector<int64_t> chunks;
    double matrices = 0, mem_fwd_s = 0, t_f = 0, t_bw = 0, t_mem = 0, t_ops = 0, ops = 0, t_gemm = 0;
  };
  std::vector<StageWork> work(static_cast<std::size_t>(p));
  for (int64_t c = 0; c < V; ++c) work[static_cast<std::size_t>(stage_rank(static_cast<int>(c), p, placement))].chunks.push_back(c);
  e.stages.resize(static_cast<std::size_t>(p));
  for (int s = 0; s < p; ++s) {
    auto& w = work[static_cast<std::size_t>(s)];
    auto& st = e.stages[static_cast<std::size_t>(s)];
    st.stage = s;
    st.held = held[static_cast<std::size_t>(s)];
    std::vector<std::string> ranges;
    double elementwise = 0;  // bytes streamed by one microbatch's forward (ReLU, dropout)
    MlpOperators ops;        // its operators and their GEMMs' time
    for (int64_t c : w.chunks) {
      const int64_t lo = c * per_chunk, hi = lo + per_chunk;
      ranges.push_back(layer_range(lo, hi));
      const MlpOperators co = mlp_operators(m, t, t.microbatch, lo, hi, sys);
      ops.forward += co.forward;
      ops.backward += co.backward;
      ops.gemm_forward_s += co.gemm_forward_s;
      ops.gemm_backward_s += co.gemm_backward_s;
      st.per_microbatch = std::max(st.per_microbatch, mlp_activation_bytes(m, t, t.microbatch, lo, hi));
      for (int64_t k = lo; k < hi; ++k) {
        st.params += layer_params(m, k);
        w.matrices += layer_matrix(m, k);
        // ReLU reads and writes its b·w_k+1 elements; dropout reads, writes and keeps its mask
        if (k < L - 1) elementwise += (m.dropout ? 5.0 : 2.0) * b * width(m, k + 1) * eb;
      }
    }
    st.layers = fmt::format("{}", fmt::join(ranges, ", "));
    st.activations = st.per_microbatch * st.held;
    // FLOPs as Narayanan et al. 2021 §5.1 count them (2 per weight and sample forward, backward
    // twice) for MFU; time from the GEMMs the step runs (mlp_operators: no input gradient for layer
    // 0; a full recompute runs the forward again), the elementwise passes at the memory bandwidth
    // and, where the system measured it, each operator's dispatch
    st.forward_flops = 2 * w.matrices * b;
    w.mem_fwd_s = elementwise / sys.memory_bandwidth;
    w.ops = ops.forward + ops.backward;
    w.t_ops = w.ops * sys.op_overhead_s + sys.pass_overhead_s;  // the pass's once per microbatch and stage
    w.t_gemm = ops.gemm_forward_s + ops.gemm_backward_s;       // kept apart: a difference of sums loses it
    w.t_f = ops.gemm_forward_s + w.mem_fwd_s + ops.forward * sys.op_overhead_s;
    w.t_bw = ops.gemm_backward_s + (2 + (full ? 1.0 : 0.0)) * w.mem_fwd_s + ops.backward * sys.op_overhead_s +
             sys.pass_overhead_s;
    w.t_mem = (3 + (full ? 1.0 : 0.0)) * w.mem_fwd_s;
  }

  // ---- memory per stage (as plan.cpp's terms); the stage that needs most is reported
  const bool fp4 = detail::fp4_recipe(t.recipe), quantized = fp4 || detail::fp8_recipe(t.recipe);
  auto stage_memory = [&](int s) {
    const auto& st = e.stages[static_cast<std::size_t>(s)];
    const auto& w = work[static_cast<std::size_t>(s)];
    std::vector<Term> mem;
    const ModelStates ms = model_states(st.params, t, l.zero, l.dp);
    mem.push_back({"weights", ms.weights,
                   fmt::format("{:g} B/param of {:g} (layers {}){}", per_param.weights, st.params, st.layers,
                               l.zero >= 3 ? " / dp (ZeRO-3)" : "")});
    mem.push_back({"gradients", ms.gradients,
                   fmt::format("{:g} B/param{}", per_param.gradients, l.zero >= 2 ? " / dp (ZeRO-2)" : "")});
    mem.push_back({"master weights", ms.master,
                   per_param.master > 0 ? fmt::format("fp32 copy, 4 B/param{}", l.zero >= 1 ? " / dp (ZeRO-1)" : "")
                                        : std::string("none: the weights are fp32")});
    mem.push_back({"optimizer states", ms.optimizer,
                   fmt::format("{}: {:g} B/param{}", t.optimizer, per_param.optimizer, l.zero >= 1 ? " / dp (ZeRO-1)" : "")});
    if (quantized) {
      // the GEMMs read a quantized copy of each weight matrix (not the biases), with its scales
      // (detail::weight_copy_bytes: per layer, partial blocks padded)
      detail::WeightCopy wc;
      for (int64_t c : w.chunks)
        for (int64_t k = c * per_chunk; k < (c + 1) * per_chunk; ++k) {
          const detail::WeightCopy lc = detail::weight_copy_bytes(t.recipe, width(m, k + 1), width(m, k));
          wc.copies += lc.copies;
          wc.scales += lc.scales;
        }
      const char* fmt_name = fp4 ? "fp4" : "fp8";
      const auto [copies_f, scales_f] = detail::weight_copy_formula(t.recipe);
      mem.push_back({fmt::format("{} weight copies", fmt_name), wc.copies,
                     fmt::format("{} of {:g} (layers {}; not the biases)", copies_f, w.matrices, st.layers)});
      mem.push_back({fmt::format("{} weight scales", fmt_name), wc.scales, scales_f});
    }
    mem.push_back({"activations", st.activations,
                   fmt::format("{:g} B per microbatch of {} (each Linear's input, the last ReLU output{}{}{}) x {} "
                               "(microbatch, chunk) pairs held{}",
                               st.per_microbatch, t.microbatch, m.dropout ? ", every ReLU output and 1-byte dropout mask" : "",
                               s == stage_rank(static_cast<int>(V - 1), p, placement) ? ", the fp32 loss input 4·b·w_L" : "",
                               full ? "; full recompute: the inputs only" : "", st.held,
                               p > 1 ? fmt::format(" ({} replayed{})", l.schedule, v > 1 ? ", each at the largest chunk" : "")
                                     : std::string())});
    double comm = 0;
    if (l.zero == 3 && l.dp > 1) {
      double largest = 0;
      for (int64_t c : w.chunks)
        for (int64_t k = c * per_chunk; k < (c + 1) * per_chunk; ++k) largest = std::max(largest, layer_params(m, k));
      comm = 2 * largest * per_param.weights;
    }
    mem.push_back({"communication buffers", comm,
                   comm > 0 ? "ZeRO-3: two gathered layers (the one computing, the one prefetched)" : "none"});
    mem.push_back(detail::reserved_term(sys));
    return mem;
  };
  const auto total = detail::sum_terms;
  int worst = 0;
  for (int s = 0; s < p; ++s) {
    const auto mem = stage_memory(s);
    e.stages[static_cast<std::size_t>(s)].memory = total(mem);
    if (s == 0 || total(mem) > e.memory_bytes) {
      e.memory = mem;
      e.memory_bytes = total(mem);
      worst = s;
    }
  }
  e.stage = p == 1 ? "only" : worst == 0 ? "first" : worst == p - 1 ? "last" : "middle";
  e.fits = e.memory_bytes <= sys.memory_bytes;

  // ---- FLOPs per step, all devices: 3 passes of 2·Σ w_k·w_k+1 per sample; the recompute's forward
  double matrices = 0;
  for (int64_t k = 0; k < L; ++k) matrices += layer_matrix(m, k);
  const double samples = static_cast<double>(t.global_batch);
  e.model_flops = 3 * 2 * matrices * samples;
  e.hardware_flops = e.model_flops + (full ? 2 * matrices * samples : 0.0);

  // ---- the slowest stage sets the pace (its F and B per microbatch; of equal ones the later, so
  // that equal stages model the last, as plan.cpp does); its communication is the one modelled
  // (ZB-V: rank 0, which runs the first and the last chunk)
  int slow = 0;
  for (int s = 1; s < p; ++s) {
    const auto& w = work[static_cast<std::size_t>(s)];
    const auto& ws = work[static_cast<std::size_t>(slow)];
    if (w.t_f + w.t_bw >= ws.t_f + ws.t_bw) slow = s;
  }
  const int rank = placement == Placement::V ? 0 : slow;
  const bool holds_loss = rank == stage_rank(static_cast<int>(V - 1), p, placement);
  e.comm_device = p == 1 ? "only stage"
                  : placement == Placement::V ? "first stage (ZB-V: the first and last chunks)"
                  : rank == p - 1 ? "last stage"
                  : fmt::format("{} stage (stage {}, layers {})", rank == 0 ? "first" : "middle", rank,
                                e.stages[static_cast<std::size_t>(rank)].layers);
  auto add_comm = [&](const std::string& group, const std::string& coll, double calls, double bytes_each, const Link& lk,
                      int64_t n, const std::string& what, bool timed = true) {
    return detail::add_comm(e.comm, true, group, coll, calls, bytes_each, lk, n, what, timed);
  };
  // PP: per microbatch each chunk boundary between the modelled rank and another carries the
  // activation forward (b·w elements of the boundary's width) and its gradient back
  double t_pp = 0, sends_per_mb = 0;
  if (p > 1) {
    const Link& lk = detail::group_link(sys, 2, l.dp);
    for (int64_t c : work[static_cast<std::size_t>(rank)].chunks) {
      const int64_t lo = c * per_chunk, hi = lo + per_chunk;
      if (c > 0 && stage_rank(static_cast<int>(c - 1), p, placement) != rank) {
        const double bytes = b * width(m, lo) * eb;
        add_comm("pp", "recv", mbd, bytes, lk, 2,
                 fmt::format("b·w_{} = {:g}·{}: the input of layer {} per microbatch (timed as the peer's sends)", lo, b,
                             m.widths[static_cast<std::size_t>(lo)], lo), false);
        t_pp += add_comm("pp", "send", mbd, bytes, lk, 2,
                         fmt::format("b·w_{}: its gradient back per microbatch", lo));
        sends_per_mb += 1;
      }
      if (c < V - 1 && stage_rank(static_cast<int>(c + 1), p, placement) != rank) {
        const double bytes = b * width(m, hi) * eb;
        t_pp += add_comm("pp", "send", mbd, bytes, lk, 2,
                         fmt::format("b·w_{} = {:g}·{}: the output of layer {} per microbatch", hi, b,
                                     m.widths[static_cast<std::size_t>(hi)], hi - 1));
        add_comm("pp", "recv", mbd, bytes, lk, 2, fmt::format("b·w_{}: its gradient per microbatch", hi), false);
        sends_per_mb += 1;
      }
    }
  }
  // DP / ZeRO over the dp ranks (plan.cpp's terms): the loss's mean for the log (on the stage that
  // holds the loss), the gradients of the modelled device's parameters once per step (ZeRO-1: reduce-scatter and all-gather; ZeRO-2
  // every microbatch; ZeRO-3 the weights gathered for every microbatch's forward and backward)
  double t_dp = 0;
  const double params_dev = e.stages[static_cast<std::size_t>(rank)].params;
  if (l.dp > 1) {
    const Link& lk = detail::group_link(sys, l.dp, 1);
    const double g = params_dev * per_param.gradients, wb = params_dev * per_param.weights;
    if (holds_loss) t_dp += add_comm("dp", "all_reduce", 1, 8, lk, l.dp, "the loss's mean for the log, 8 B");
    if (l.zero == 0) {
      t_dp += add_comm("dp", "all_reduce", 1, g, lk, l.dp, "the gradients, once per step");
    } else {
      t_dp += add_comm("dp", "reduce_scatter", l.zero >= 2 ? mbd : 1.0, g, lk, l.dp,
                       l.zero >= 2 ? "the gradients, every microbatch (only a shard is kept)" : "the gradients, once per step");
      t_dp += add_comm("dp", "all_gather", l.zero == 3 ? 2 * mbd : 1.0, wb, lk, l.dp,
                       l.zero == 3 ? "the weights, for every microbatch's forward and backward" : "the updated weights, once per step");
    }
  }

  // ---- time: the slowest stage's microbatches and the schedule's idle time at its F and B
  const auto& ws = work[static_cast<std::size_t>(slow)];
  double idle = 0;
  if (p > 1) {
    double fo = ws.t_f, bo = ws.t_bw / 2, wo = ws.t_bw / 2;
    if (spec.formula_needs_equal_fbw) fo = bo = wo = (ws.t_f + ws.t_bw) / 3;
    idle = bubble_time_theory(spec.kind, p, mb, fo, bo, wo, v);
  }
  const double pipe = mbd * (ws.t_f + ws.t_bw) + idle;
  e.bubble_fraction = pipe > 0 ? idle / pipe : 0;
  const double hide = !l.overlap_dp ? 0.0 : l.zero == 3 ? mbd * (ws.t_f + ws.t_bw) : l.zero == 2 ? mbd * ws.t_bw : ws.t_bw;
  const double t_dp_exposed = std::max(0.0, t_dp - hide);
  double state = 0;
  for (const auto& term : e.memory)
    for (const char* name : {"weights", "gradients", "master weights", "optimizer states"})
      if (term.name == name) state += term.value;
  const double t_opt = 2 * state / sys.memory_bandwidth;
  // gradient accumulation: from the second microbatch on, autograd adds each weight's and bias's new
  // gradient into the one it holds (AccumulateGrad; the first is taken as it is, gradients set to
  // None before the step as PyTorch's zero_grad does): 2 operators a layer and 3 passes over the
  // gradients (read both, write one) per microbatch
  const double slow_layers = static_cast<double>(ws.chunks.size() * static_cast<std::size_t>(per_chunk));
  const double t_acc = (mbd - 1) * (2 * slow_layers * sys.op_overhead_s +
                                     3 * e.stages[static_cast<std::size_t>(slow)].params * per_param.gradients /
                                         sys.memory_bandwidth);
  const std::string stage_name = p == 1 ? "the only stage" : fmt::format("stage {} (layers {})", slow,
                                                                          e.stages[static_cast<std::size_t>(slow)].layers);
  const bool measured_rates = !sys.rates_for(t.recipe).empty();
  e.time.push_back({"compute", mbd * ws.t_gemm,
                    fmt::format("the GEMMs of {}: {:.3g} GFLOP per microbatch (2 per weight and sample forward, "
                                "backward 2x{}; layer 0 computes no input gradient), {}, x{} microbatches",
                                stage_name,
                                (3 + (full ? 1.0 : 0.0)) * e.stages[static_cast<std::size_t>(slow)].forward_flops / 1e9,
                                full ? ", recompute 1x" : "",
                                measured_rates ? std::string("each at the measured rate of its size (gemm_tflops_by_n)")
                                               : fmt::format("at {:.0f}% of {:.4g} TFLOP/s", sys.gemm_efficiency * 100, peak / 1e12),
                                mb)});
  e.time.push_back({"elementwise", mbd * ws.t_mem,
                    fmt::format("{:.3g} GB per microbatch at {:.0f} GB/s: ReLU{}", ws.t_mem * sys.memory_bandwidth / 1e9,
                                sys.memory_bandwidth / 1e9, m.dropout ? " and dropout" : "")});
  e.time.push_back({"dispatch", mbd * ws.t_ops,
                    sys.op_overhead_s > 0 || sys.pass_overhead_s > 0
                        ? fmt::format("({:g} operators per microbatch forward and backward x {:.3g} us (op_overhead_us) "
                                      "+ {:.3g} us for the pass (pass_overhead_us)) x{} microbatches", ws.ops,
                                      sys.op_overhead_s * 1e6, sys.pass_overhead_s * 1e6, mb)
                        : std::string("not modelled (the system has no op_overhead_us)")});
  e.time.push_back({"tp collectives", 0.0, "none (tp = 1)"});
  e.time.push_back({"bubble", idle,
                    p > 1 ? fmt::format("{} idle time (core/pipeline bubble_time_theory) at the slowest stage's F and B, "
                                        "{:.1f}% of the pipeline", l.schedule, e.bubble_fraction * 100)
                          : std::string("none (pp = 1)")});
  e.time.push_back({"pp send/recv", t_pp,
                    p > 1 ? fmt::format("{:g} send(s) per microbatch x {} microbatches", sends_per_mb, mb) : "none (pp = 1)"});
  e.time.push_back(detail::dp_exposed_term(l, t_dp, t_dp_exposed));
  e.time.push_back({"gradient accumulation", t_acc,
                    mb > 1 ? fmt::format("{} microbatches after the first: each adds {:g} gradients into the held ones (3 "
                                         "passes at the memory bandwidth){}", mb - 1,
                                         e.stages[static_cast<std::size_t>(slow)].params,
                                         sys.op_overhead_s > 0 ? fmt::format(", {:g} operators", 2 * slow_layers) : "")
                           : std::string("none (one microbatch)")});
  e.time.push_back({"optimizer step", t_opt, "read and write every state of this device once at the memory bandwidth"});
  e.step_s = pipe + t_pp + t_dp_exposed + t_acc + t_opt;
  detail::set_rates(e, samples, l.devices(), peak, t.tokens);  // a sample is one row of the MLP: "tokens" are samples
  return e;
}

}  // namespace mpt::plan
