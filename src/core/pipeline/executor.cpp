// The pipeline executor: runs a step's stage programs, one thread or one process per stage.
// See executor.hpp.
#include "core/pipeline/executor.hpp"
#include "core/pipeline/stage_threads.hpp"
#include "core/pipeline/trace.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <stdexcept>
#include <thread>

#include <pthread.h>
#include <sched.h>
#include <time.h>

#include <fmt/format.h>

#include "core/dist/dist.hpp"
#include "core/errors.hpp"
#include "core/models/mlp.hpp"
#include "core/runtime/runtime.hpp"
#include "core/runtime/trace.hpp"

namespace mpt {

// ----------------------------------------------------------------------------
// Executor: one stage
// ----------------------------------------------------------------------------

namespace {

using Clock = std::chrono::steady_clock;

void synthetic_wait(double us, bool spin) {
  if (us <= 0) return;
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::micro>(us));
  if (spin) {
    while (Clock::now() < until) {
    }
  } else {
    std::this_thread::sleep_until(until);
  }
}


/// Every stage's part of a step -> one PipelineRun: times shifted so that the first
/// operation starts at 0, busy time per stage, loss = Σ_j loss_j / m in microbatch order.
PipelineRun assemble_run(const std::vector<StageRun>& parts, std::vector<torch::Tensor> grads) {
  PipelineRun run;
  double first_start = 1e300, last_end = 0;
  for (const auto& part : parts) {
    double busy = 0;
    for (const auto& ev : part.events) {
      busy += ev.end_s - ev.start_s;
      first_start = std::min(first_start, ev.start_s);
      last_end = std::max(last_end, ev.end_s);
      run.events.push_back(ev);
    }
    run.busy_s.push_back(busy);
    run.peak_held.push_back(part.peak_held);
    run.peak_bytes.push_back(part.peak_bytes);
  }
  if (run.events.empty()) first_start = 0;
  for (auto& ev : run.events) {
    ev.start_s -= first_start;
    ev.end_s -= first_start;
  }
  run.step_s = last_end - first_start;
  for (const auto& part : parts)  // the rank holding the last virtual stage (loop: p - 1; V: 0)
    for (double l : part.losses) run.loss += l;
  run.grads = std::move(grads);
  return run;
}

}  // namespace

namespace {

/// One stage's program, op by op: run_stage's loop body with its state (the activations held
/// for each microbatch's backward, the local hand-overs, the events), so that one thread can
/// run several stages' programs interleaved (run_pipeline with workers < stages) as well as
/// one stage's straight through (run_stage).
class StageExecutor {
 public:
  StageExecutor(int s, int p, const PipelineStage& model, const std::vector<PipeOp>& ops, int m,
                const std::vector<torch::Tensor>& xs, const std::vector<torch::Tensor>& ys, const SyntheticCost& cost,
                StageTransport& transport, Clock::time_point t0, const std::function<void(int)>& after_op,
                Placement placement)
      : s(s), p(p), model(model), ops(ops), m(m), xs(xs), ys(ys), cost(cost), transport(transport), t0(t0),
        after_op(after_op), placement(placement), virtual_stages(model.chunks()),
        factor(cost.stage_factor.empty() ? 1.0 : cost.stage_factor[static_cast<std::size_t>(s)]),
        split(splits_backward(ops)) {
    // On CUDA an op's end is when its kernels are done (sync_device), not when they were queued.
    device = [&] {
      if (s < virtual_stages) {
        const auto ps = model.parameters(s);
        if (!ps.empty()) return ps.front().device();
      }
      return xs.empty() ? torch::Device(torch::kCPU) : xs.front().device();
    }();
    if (placement == Placement::V && virtual_stages != 2 * p)
      throw std::logic_error(fmt::format("stage {}: the V placement needs 2 chunks per stage ({} virtual stages), the "
                                         "model has {}", s, 2 * p, virtual_stages));
    if (stage_rank(virtual_stages - 1, p, placement) == s) out.losses.assign(static_cast<std::size_t>(m), 0.0);
  }

  /// Whether every op of the program has run.
  bool finished() const { return next_op >= ops.size(); }

  /// The transport message the next op waits for (its source stage, kind, microbatch and
  /// boundary), or nothing when it needs none: the first chunk's F (the batch), the last
  /// chunk's B (the loss), a W, a local hand-over (V's turn) or an op that will throw.
  std::optional<std::tuple<int, char, int, int>> next_input() const {
    if (finished()) return std::nullopt;
    const PipeOp& op = ops[next_op];
    if (op.chunk < 0 || op.chunk * p + s >= virtual_stages || (op.kind != 'F' && op.kind != 'B')) return std::nullopt;
    const int c = virtual_stage(s, op.chunk, p, placement);
    if (op.kind == 'F') {
      if (c == 0) return std::nullopt;
      const int prev = stage_rank(c - 1, p, placement);
      if (prev == s) return std::nullopt;
      return std::make_tuple(prev, 'F', op.microbatch, c - 1);
    }
    if (c == virtual_stages - 1) return std::nullopt;
    const int next = stage_rank(c + 1, p, placement);
    if (next == s) return std::nullopt;
    return std::make_tuple(next, 'B', op.microbatch, c);
  }

  /// The stage the next op's output goes to through the transport (F: the next virtual stage's,
  /// B: the previous one's), or nothing: no op left, a W, the model's ends, a local hand-over.
  std::optional<int> next_output_stage() const {
    if (finished()) return std::nullopt;
    const PipeOp& op = ops[next_op];
    if (op.chunk < 0 || op.chunk * p + s >= virtual_stages || (op.kind != 'F' && op.kind != 'B')) return std::nullopt;
    const int c = virtual_stage(s, op.chunk, p, placement);
    const int to = op.kind == 'F' ? c + 1 : c - 1;
    if (to < 0 || to >= virtual_stages) return std::nullopt;
    const int dst = stage_rank(to, p, placement);
    if (dst == s) return std::nullopt;
    return dst;
  }

  /// Runs the program's next op; `wait0`: when the stage began waiting for it (the op's wait_s
  /// is from there to the start of its compute). Throws what run_stage throws.
  void run_next(Clock::time_point wait0) { run(ops[next_op++], wait0); }

  /// The stage's part of the step, its events recorded on the timeline (when tracing).
  StageRun finish() {
    trace_stage_events(out.events, t0, s, p, placement, dynamic_cast<QueueTransport*>(&transport) != nullptr);  // timeline
    return std::move(out);
  }

 private:
  struct Held {
    torch::Tensor input, output;
    std::vector<WeightRoot> roots;     // split backward: W's roots (none named: the output, every parameter)
    std::vector<torch::Tensor> d_root; // split backward: their gradients, kept by B for W
    bool backward_done = false;
    int64_t bytes = 0;
  };

  double since(Clock::time_point t) const { return std::chrono::duration<double>(t - t0).count(); }

  // Tensors between two virtual stages of this rank (V's turn): handed over here, not through
  // the transport (torch.distributed.pipelining: no SEND/RECV where _has_comms is false, the
  // stage's set_local_fwd_input). Key: (kind, microbatch, boundary).
  torch::Tensor take_local(char kind, int j, int boundary) {
    auto it = local.find({kind, j, boundary});
    if (it == local.end())
      throw std::logic_error(fmt::format("stage {}: the {} of microbatch {} across boundary {} (this rank's own) is not "
                                         "there yet: the program runs its consumer before its producer", s,
                                         message_name(kind), j, boundary));
    torch::Tensor t = it->second;
    local.erase(it);
    return t;
  }

  void run(const PipeOp& op, Clock::time_point wait0) {
    if (op.chunk < 0 || op.chunk * p + s >= virtual_stages)
      throw std::logic_error(fmt::format("stage {}: chunk {} is outside the model ({} virtual stages)", s, op.chunk,
                                         virtual_stages));
    const int c = virtual_stage(s, op.chunk, p, placement);  // the virtual stage this op runs
    const double fwd_us = cost.forward_us * factor * model.cost_units(c);
    const double w_us = fwd_us * cost.weight_factor;
    // Fused backward: the whole backward_factor; split: B its input-gradient part, W the rest.
    const double bwd_us = fwd_us * cost.backward_factor - (split ? w_us : 0.0);
    const bool first = c == 0, last = c == virtual_stages - 1;
    // The stages of virtual stages c − 1 and c + 1 (this one: a local hand-over).
    const int prev = first ? -1 : stage_rank(c - 1, p, placement), next = last ? -1 : stage_rank(c + 1, p, placement);
    PipeEvent ev;
    ev.stage = s;
    ev.op = op;
    if (op.kind == 'F') {
      torch::Tensor in = first       ? xs[static_cast<std::size_t>(op.microbatch)]
                         : prev == s ? take_local('F', op.microbatch, c - 1)
                                     : transport.recv(prev, s, 'F', op.microbatch, c - 1);
      const auto c0 = Clock::now();
      ev.wait_s = std::chrono::duration<double>(c0 - wait0).count();
      ev.start_s = since(c0);
      // The boundary: a leaf that requires grad, so backward stops here and its .grad
      // is what the previous stage needs.
      if (!first) in = in.detach().requires_grad_(true);
      ChunkSaved saved;
      torch::Tensor o = model.forward(c, in, &saved);
      synthetic_wait(fwd_us, cost.spin);
      int64_t bytes = first ? 0 : in.nbytes();
      for (auto& k : saved.activations) bytes += static_cast<int64_t>(k.nbytes());
      Held h{in, o, {}, {}, false, bytes};
      if (split) h.roots = std::move(saved.weight_roots);
      if (last) {
        // Mean loss over the whole batch: each microbatch's loss is divided by m once.
        o = model.loss(o, ys[static_cast<std::size_t>(op.microbatch)]) / m;
        out.losses[static_cast<std::size_t>(op.microbatch)] = o.item<double>();
        h.output = o;
      } else if (next == s) {
        local[{'F', op.microbatch, c}] = o.detach();
      } else {
        transport.send(s, next, 'F', op.microbatch, o.detach(), c);
      }
      if (split && h.roots.empty()) h.roots.push_back({h.output, model.parameters(c)});  // the generic root
      held[{op.chunk, op.microbatch}] = std::move(h);
      held_bytes += bytes;
      out.peak_held = std::max(out.peak_held, static_cast<int>(held.size()));
      out.peak_bytes = std::max(out.peak_bytes, held_bytes);
    } else if (op.kind == 'B') {
      torch::Tensor g = last        ? torch::Tensor()
                        : next == s ? take_local('B', op.microbatch, c)
                                    : transport.recv(next, s, 'B', op.microbatch, c);
      const auto c0 = Clock::now();
      ev.wait_s = std::chrono::duration<double>(c0 - wait0).count();
      ev.start_s = since(c0);
      auto it = held.find({op.chunk, op.microbatch});
      if (it == held.end() || it->second.backward_done)
        throw std::logic_error(fmt::format("stage {}: backward of microbatch {} (chunk {}) before its forward", s,
                                           op.microbatch, op.chunk));
      Held& h = it->second;
      torch::Tensor input_grad;
      if (!split) {
        if (last)
          h.output.backward();
        else
          h.output.backward(g);
        if (!first) input_grad = h.input.grad();
      } else {
        // B: the gradients w.r.t. the chunk input and each weight-gradient root only; autograd
        // runs no weight-gradient kernel of a root's node (AddmmBackward computes only the
        // outputs asked for). The graph is kept (retain_graph) for W, which starts at the roots.
        // The generic root, the output itself, needs nothing computed: its gradient is g.
        const bool generic = h.roots.size() == 1 && h.roots.front().output.is_same(h.output);
        std::vector<torch::Tensor> wrt;
        if (!first) wrt.push_back(h.input);
        if (!generic)
          for (auto& r : h.roots) wrt.push_back(r.output);
        std::vector<torch::Tensor> seed;
        if (!last) seed.push_back(g);  // last: d(loss) = 1
        std::vector<torch::Tensor> grads;
        if (!wrt.empty())
          grads = torch::autograd::grad({h.output}, wrt, seed, /*retain_graph=*/true, /*create_graph=*/false);
        if (!first) input_grad = grads.front();
        if (generic)
          h.d_root = {g};  // undefined for the last chunk: W seeds d(loss) = 1
        else
          h.d_root.assign(grads.begin() + (first ? 0 : 1), grads.end());
        for (auto& d : h.d_root) {
          const int64_t nb = d.defined() ? static_cast<int64_t>(d.nbytes()) : 0;
          h.bytes += nb;
          held_bytes += nb;
        }
        out.peak_bytes = std::max(out.peak_bytes, held_bytes);
      }
      synthetic_wait(bwd_us, cost.spin);
      if (!first) {
        if (prev == s)
          local[{'B', op.microbatch, c - 1}] = input_grad;
        else
          transport.send(s, prev, 'B', op.microbatch, input_grad, c - 1);
      }
      h.backward_done = true;
      if (!split) {
        held_bytes -= h.bytes;
        held.erase(it);  // activations of this microbatch are released
      }
    } else if (op.kind == 'W') {
      const auto c0 = Clock::now();
      ev.start_s = since(c0);
      auto it = held.find({op.chunk, op.microbatch});
      if (!split || it == held.end() || !it->second.backward_done)
        throw std::logic_error(fmt::format("stage {}: weight gradient of microbatch {} (chunk {}) before its "
                                           "backward", s, op.microbatch, op.chunk));
      Held& h = it->second;
      for (std::size_t k = 0; k < h.roots.size(); ++k) {
        const auto& params = h.roots[k].params;
        if (params.empty()) continue;
        // W: from the root with B's kept gradient to its parameters (the MLP: a Linear's output
        // to its weight and bias, the AddmmBackward node of the forward, its mat2 and self
        // outputs only).
        std::vector<torch::Tensor> seed;
        if (h.d_root[k].defined()) seed.push_back(h.d_root[k]);
        auto gw = torch::autograd::grad({h.roots[k].output}, params, seed, /*retain_graph=*/false,
                                        /*create_graph=*/false, /*allow_unused=*/true);
        // Accumulate as AccumulateGrad does: the first gradient taken, the later ones added.
        torch::NoGradGuard no_grad;
        for (std::size_t q = 0; q < params.size(); ++q) {
          if (!gw[q].defined()) continue;  // a parameter the output does not depend on
          auto& slot = params[q].mutable_grad();
          if (slot.defined())
            slot.add_(gw[q]);
          else  // AccumulateGrad's layout contract: strides of the parameter (gw of a weight is a transposed view)
            slot = gw[q].is_contiguous() ? gw[q] : gw[q].contiguous();
        }
      }
      synthetic_wait(w_us, cost.spin);
      held_bytes -= h.bytes;
      held.erase(it);  // inputs, output gradients and graph of this microbatch are released
    } else {
      throw std::logic_error(fmt::format("stage {}: unknown op kind '{}'", s, op.kind));
    }
    sync_device(device);
    ev.end_s = since(Clock::now());
    out.events.push_back(ev);
    if (after_op) after_op(++done);
  }

  const int s, p;
  const PipelineStage& model;
  const std::vector<PipeOp>& ops;
  const int m;
  const std::vector<torch::Tensor>& xs;
  const std::vector<torch::Tensor>& ys;
  const SyntheticCost& cost;
  StageTransport& transport;
  const Clock::time_point t0;
  const std::function<void(int)> after_op;  // a copy: callers pass temporaries
  const Placement placement;
  const int virtual_stages;  // p · v
  const double factor;
  // B/W split (zero-bubble schedules): B computes only the input gradient, W the weights'.
  const bool split;
  torch::Device device{torch::kCPU};
  StageRun out;
  std::map<std::tuple<char, int, int>, torch::Tensor> local;
  std::map<std::pair<int, int>, Held> held;  // (chunk, microbatch) -> activations kept for its backward
  int64_t held_bytes = 0;
  int done = 0;
  std::size_t next_op = 0;
};

}  // namespace

StageRun run_stage(int s, int p, const PipelineStage& model, const std::vector<PipeOp>& ops, int m,
                   const std::vector<torch::Tensor>& xs, const std::vector<torch::Tensor>& ys, const SyntheticCost& cost,
                   StageTransport& transport, Clock::time_point t0, const std::function<void(int)>& after_op,
                   Placement placement) {
  StageExecutor stage(s, p, model, ops, m, xs, ys, cost, transport, t0, after_op, placement);
  while (!stage.finished()) stage.run_next(Clock::now());
  return stage.finish();
}

namespace {

/// Every parameter of every chunk, chunk by chunk (PipelineRun::grads' order).
std::vector<torch::Tensor> all_parameters(const PipelineStage& model) {
  std::vector<torch::Tensor> ps;
  for (int c = 0; c < model.chunks(); ++c)
    for (auto& prm : model.parameters(c)) ps.push_back(prm);
  return ps;
}

}  // namespace

// ----------------------------------------------------------------------------
// Executor: one thread per stage (on the kept, bound threads of core/pipeline/stage_threads)
// ----------------------------------------------------------------------------


PipelineRun run_pipeline(const PipelineStage& model, const std::vector<std::vector<PipeOp>>& schedule, int m,
                         const torch::Tensor& x, const torch::Tensor& y, const SyntheticCost& cost,
                         StageTransport& transport, Placement placement, int workers) {
  const int p = static_cast<int>(schedule.size());
  if (p < 1 || model.chunks() % p != 0)
    throw std::invalid_argument(fmt::format("run_pipeline: {} stage programs for {} virtual stages (expected a "
                                            "multiple: v chunks per stage)", p, model.chunks()));
  if (placement == Placement::V && model.chunks() != 2 * p)
    throw std::invalid_argument(fmt::format("run_pipeline: the V placement needs 2 chunks per stage, {} virtual stages "
                                            "for {} stages", model.chunks(), p));
  if (m < 1 || x.size(0) % m != 0)
    throw std::invalid_argument(fmt::format("run_pipeline: batch {} is not divisible into {} microbatches", x.size(0), m));
  if (workers < 0) throw std::invalid_argument(fmt::format("run_pipeline: workers must be >= 0, got {}", workers));
  const auto params = all_parameters(model);
  clear_grads(params);

  const auto xs = x.chunk(m, 0);
  const auto ys = y.chunk(m, 0);
  std::vector<StageRun> parts(static_cast<std::size_t>(p));
  std::vector<std::string> errors(static_cast<std::size_t>(p));
  const auto t0 = Clock::now();
  std::vector<std::function<void()>> tasks;  // one per thread
  if (workers == 0 || workers >= p) {
    for (int s = 0; s < p; ++s) {
      tasks.emplace_back([&, s] {
        try {
          parts[static_cast<std::size_t>(s)] = run_stage(s, p, model, schedule[static_cast<std::size_t>(s)], m, xs,
                                                         ys, cost, transport, t0, {}, placement);
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(s)] = e.what();
          transport.abort(fmt::format("stage {} failed: {}", s, e.what()));
        }
      });
    }
  } else {
    // Fewer threads than stages: worker w runs its contiguous stages interleaved, each time the
    // next op of the first of them (round robin) whose input message is there, so no more
    // threads compute than there are cores and a stage waiting for its input costs no
    // context switch. Every stage still runs its own program in order: the same arithmetic.
    auto* queue = dynamic_cast<QueueTransport*>(&transport);
    if (queue == nullptr)
      throw std::invalid_argument("run_pipeline: several stages per thread (workers < stages) need a QueueTransport");
    for (int w = 0; w < workers; ++w) {
      tasks.emplace_back([&, w, queue] {  // queue: a pointer of this block, which the tasks outlive
        int current = -1;  // the stage whose op runs (or was last tried), for the error's name
        try {
          std::vector<int> mine;
          std::vector<std::unique_ptr<StageExecutor>> stages;
          for (int s = w * p / workers; s < (w + 1) * p / workers; ++s) {
            current = s;
            mine.push_back(s);
            stages.push_back(std::make_unique<StageExecutor>(s, p, model, schedule[static_cast<std::size_t>(s)], m, xs,
                                                             ys, cost, transport, t0, std::function<void(int)>{},
                                                             placement));
          }
          std::vector<Clock::time_point> waiting_since(stages.size(), t0);
          std::size_t left = 0, turn = 0;
          for (auto& st : stages) left += st->finished() ? 0 : 1;
          while (left > 0) {
            const uint64_t seen = queue->sent();  // before looking: a message stored after it wakes the wait
            bool ran = false;
            // Two passes over the stages: first an op whose output another thread's stage waits
            // for (it keeps that thread busy: round robin alone let a thread idle while its
            // neighbour ran an op nobody waited for, 1F1B m = 8 on 2 threads: 1.4-1.6 or 2.4-2.5 ms
            // a step from run to run), then any op whose input is there, round robin.
            auto is_mine = [&](int stage) { return std::find(mine.begin(), mine.end(), stage) != mine.end(); };
            for (std::size_t k = 0; k < 2 * stages.size() && !ran; ++k) {
              const std::size_t i = (turn + k) % stages.size();
              auto& st = *stages[i];
              if (st.finished()) continue;
              if (k < stages.size()) {
                const auto to = st.next_output_stage();
                if (!to || is_mine(*to)) continue;
              }
              const auto in = st.next_input();
              if (in && !queue->ready(std::get<0>(*in), mine[i], std::get<1>(*in), std::get<2>(*in), std::get<3>(*in)))
                continue;
              current = mine[i];
              st.run_next(waiting_since[i]);
              waiting_since[i] = Clock::now();
              if (st.finished()) {
                parts[static_cast<std::size_t>(mine[i])] = st.finish();
                --left;
              }
              turn = i + 1;
              ran = true;
            }
            if (!ran && !queue->wait_for_send(seen)) {
              // As recv's timeout: the first of this worker's stages still waiting, and for what.
              for (std::size_t i = 0; i < stages.size(); ++i) {
                const auto in = stages[i]->finished() ? std::nullopt : stages[i]->next_input();
                if (!in) continue;
                current = mine[i];
                throw RuntimeFailure(recv_timeout_message(mine[i], std::get<1>(*in), std::get<2>(*in),
                                                          std::get<0>(*in), queue->timeout_s()));
              }
            }
          }
        } catch (const std::exception& e) {
          const int s = current >= 0 ? current : w;
          errors[static_cast<std::size_t>(s)] = e.what();
          transport.abort(fmt::format("stage {} failed: {}", s, e.what()));
        }
      });
    }
  }
  run_on_stage_threads(tasks);
  for (int s = 0; s < p; ++s)
    if (!errors[static_cast<std::size_t>(s)].empty()) {
      // Report the stage that failed first, not the ones that were woken by the abort.
      const auto& e = errors[static_cast<std::size_t>(s)];
      if (e.find("failed:") == std::string::npos) throw RuntimeFailure(fmt::format("stage {} failed: {}", s, e));
    }
  for (int s = 0; s < p; ++s)
    if (!errors[static_cast<std::size_t>(s)].empty()) throw RuntimeFailure(errors[static_cast<std::size_t>(s)]);
  return assemble_run(parts, clone_grads(params));
}

// ----------------------------------------------------------------------------
// Executor: one process per stage
// ----------------------------------------------------------------------------

PipelineRun run_pipeline_process(const std::shared_ptr<dist::Group>& group, const PipelineStage& model,
                                 const std::vector<std::vector<PipeOp>>& schedule, int m, const torch::Tensor& x,
                                 const torch::Tensor& y, const SyntheticCost& cost,
                                 const ProcessPipelineOptions& opts) {
  const int p = static_cast<int>(schedule.size());
  const int vs = model.chunks();
  if (p < 1 || vs % p != 0)
    throw std::invalid_argument(fmt::format("run_pipeline_process: {} stage programs for {} virtual stages (expected "
                                            "a multiple: v chunks per stage)", p, vs));
  const Placement placement = opts.placement;
  if (placement == Placement::V && vs != 2 * p)
    throw std::invalid_argument(fmt::format("run_pipeline_process: the V placement needs 2 chunks per stage, {} virtual "
                                            "stages for {} stages", vs, p));
  if (!group || group->size() != p)
    throw std::invalid_argument(fmt::format("run_pipeline_process: {} stages need a group of {} processes, got {}", p,
                                            p, group ? group->size() : 0));
  if (m < 1 || x.size(0) % m != 0)
    throw std::invalid_argument(
        fmt::format("run_pipeline_process: batch {} is not divisible into {} microbatches", x.size(0), m));
  const int r = group->rank();
  const auto params = all_parameters(model);
  for (int c = 0; c < vs; ++c) {
    if (stage_rank(c, p, placement) != r) continue;  // not this rank's chunk
    for (const auto& prm : model.parameters(c))
      if (prm.device() != group->device())
        throw std::invalid_argument(fmt::format("run_pipeline_process: the model and batch must be on the group's "
                                                "device ({}), got {} and {}", group->device().str(),
                                                prm.device().str(), x.device().str()));
  }
  if (x.device() != group->device())
    throw std::invalid_argument(fmt::format("run_pipeline_process: the batch must be on the group's device ({}), got "
                                            "{}", group->device().str(), x.device().str()));
  clear_grads(params);
  const auto xs = x.chunk(m, 0);
  const auto ys = y.chunk(m, 0);
  // Boundary b carries chunk b's output for one microbatch (the MLP: [batch/m, out features of
  // its last layer]), both directions.
  std::vector<std::vector<int64_t>> shapes;
  for (int b = 0; b + 1 < vs; ++b) shapes.push_back(model.output_shape(b, xs.front().sizes().vec()));

  // --- this rank's stage ---
  StageRun mine;
  double base_s = 0;
  {
    ProcessGroupTransport transport(group, shapes, opts.backward_group, placement);
    transport.set_job_ranks(opts.job_ranks);
    group->barrier();  // every stage starts together; the step's clock starts here
    const auto t0 = Clock::now();
    // t0 on rank 0's clock, in seconds: added to this rank's event times below, so that the
    // stages' events share one time axis (not each rank's own exit from the barrier).
    base_s = (trace::to_us(t0) + opts.clock_offset_us) / 1e6;
    try {
      // After every op the job's peers see this process work, even with a sleeping cost.
      const auto after_op = [&](int done) { group->job()->note_progress(); if (opts.after_op) opts.after_op(done); };
      mine = run_stage(r, p, model, schedule[static_cast<std::size_t>(r)], m, xs, ys, cost, transport, t0, after_op,
                       placement);
      transport.flush();
    } catch (const std::exception& e) {
      throw RuntimeFailure(fmt::format("stage {} (rank {} of {}) failed: {}", r, r, p, e.what()));
    }
  }

  // --- every stage's part to every rank: sums where each value has one contributor ---
  // Layout: per stage s, [peak held, peak bytes, (start, end, wait) per op], then the m
  // microbatch losses (last stage).
  std::vector<int64_t> offset(static_cast<std::size_t>(p) + 1, 0);
  for (std::size_t s = 0; s < schedule.size(); ++s)
    offset[s + 1] = offset[s] + 2 + 3 * static_cast<int64_t>(schedule[s].size());
  auto stats = torch::zeros({offset.back() + m}, torch::kFloat64);
  {
    auto a = stats.accessor<double, 1>();
    int64_t at = offset[static_cast<std::size_t>(r)];
    a[at++] = mine.peak_held;
    a[at++] = static_cast<double>(mine.peak_bytes);
    for (const auto& ev : mine.events) {
      a[at++] = base_s + ev.start_s;  // assemble_run shifts the first start to 0
      a[at++] = base_s + ev.end_s;
      a[at++] = ev.wait_s;
    }
    for (std::size_t j = 0; j < mine.losses.size(); ++j) a[offset.back() + static_cast<int64_t>(j)] = mine.losses[j];
  }
  int64_t numel = 0;
  for (auto& prm : params) numel += prm.numel();
  auto flat = torch::zeros({numel}, torch::TensorOptions().dtype(torch::kFloat32).device(group->device()));
  {
    torch::NoGradGuard ng;
    int64_t at = 0;
    for (int c = 0; c < vs; ++c)
      for (const auto& prm : model.parameters(c)) {
        // This rank's chunks (loop: virtual stages r, r + p, ...; V: r and 2p - 1 - r) fill their
        // gradients; a gradient left undefined (a parameter the loss does not depend on) stays zero.
        if (stage_rank(c, p, placement) == r && prm.grad().defined())
          flat.narrow(0, at, prm.numel()).copy_(prm.grad().reshape({-1}));
        at += prm.numel();
      }
  }
  try {
    // On the group's device (NCCL reduces CUDA tensors only); float64 sums stay exact.
    stats = stats.to(group->device());
    group->allreduce(stats);
    group->allreduce(flat);
    stats = stats.cpu();
  } catch (const RuntimeFailure& e) {
    throw RuntimeFailure(fmt::format("stage {} (rank {} of {}): gathering the step's results failed: {}", r, r, p,
                                     e.what()));
  }

  std::vector<StageRun> parts(static_cast<std::size_t>(p));
  auto a = stats.accessor<double, 1>();
  for (int s = 0; s < p; ++s) {
    auto& part = parts[static_cast<std::size_t>(s)];
    int64_t at = offset[static_cast<std::size_t>(s)];
    part.peak_held = static_cast<int>(a[at++]);
    part.peak_bytes = static_cast<int64_t>(a[at++]);
    for (const auto& op : schedule[static_cast<std::size_t>(s)]) {
      PipeEvent ev;
      ev.stage = s;
      ev.op = op;
      ev.start_s = a[at++];
      ev.end_s = a[at++];
      ev.wait_s = a[at++];
      part.events.push_back(ev);
    }
  }
  auto& loss_part = parts[static_cast<std::size_t>(stage_rank(vs - 1, p, placement))];  // the last virtual stage's rank
  for (int j = 0; j < m; ++j) loss_part.losses.push_back(a[offset.back() + j]);
  std::vector<torch::Tensor> grads;
  int64_t at = 0;
  for (auto& prm : params) {
    grads.push_back(flat.narrow(0, at, prm.numel()).view(prm.sizes()).clone());
    at += prm.numel();
  }
  return assemble_run(parts, std::move(grads));
}

}  // namespace mpt
