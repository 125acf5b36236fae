// Pipeline schedules, stage splitting, transport and executor. See pipeline.hpp.
#include "core/pipeline.hpp"
#include "core/pipeline_trace.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include <spdlog/spdlog.h>

#include "core/dist.hpp"
#include "core/errors.hpp"
#include "core/runtime.hpp"

namespace mpt {

// ----------------------------------------------------------------------------
// Schedules
// ----------------------------------------------------------------------------

ScheduleKind parse_schedule(const std::string& name) {
  if (name == "naive") return ScheduleKind::Naive;
  if (name == "gpipe") return ScheduleKind::GPipe;
  if (name == "1f1b") return ScheduleKind::OneFOneB;
  if (name == "interleaved-1f1b") return ScheduleKind::Interleaved1F1B;
  if (name == "zb-h1") return ScheduleKind::ZBH1;
  throw std::invalid_argument("unknown schedule '" + name +
                              "' (expected naive, gpipe, 1f1b, interleaved-1f1b or zb-h1)");
}

std::string schedule_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::Naive: return "naive";
    case ScheduleKind::GPipe: return "gpipe";
    case ScheduleKind::OneFOneB: return "1f1b";
    case ScheduleKind::Interleaved1F1B: return "interleaved-1f1b";
    case ScheduleKind::ZBH1: return "zb-h1";
  }
  return "?";
}

std::vector<std::vector<PipeOp>> repeat_steps(const std::vector<std::vector<PipeOp>>& schedule, int steps,
                                              int microbatches) {
  if (steps < 1 || microbatches < 1)
    throw std::invalid_argument(
        fmt::format("repeat_steps: expected steps >= 1 and microbatches >= 1, got {} and {}", steps, microbatches));
  std::vector<std::vector<PipeOp>> out(schedule.size());
  for (std::size_t s = 0; s < schedule.size(); ++s)
    for (int t = 0; t < steps; ++t)
      for (PipeOp op : schedule[s]) {
        op.microbatch += t * microbatches;
        out[s].push_back(op);
      }
  return out;
}

std::vector<std::vector<PipeOp>> make_schedule(ScheduleKind kind, int p, int m, int v) {
  if (p < 1) throw std::invalid_argument("make_schedule: stages must be >= 1");
  if (m < 1) throw std::invalid_argument("make_schedule: microbatches must be >= 1");
  if (kind == ScheduleKind::Interleaved1F1B) {
    if (p < 2) throw std::invalid_argument("make_schedule: interleaved-1f1b needs >= 2 stages");
    if (v < 2)
      throw std::invalid_argument(fmt::format("make_schedule: interleaved-1f1b needs >= 2 model chunks per stage, "
                                              "got {}", v));
    if (m % p != 0)
      throw std::invalid_argument(fmt::format("make_schedule: interleaved-1f1b needs the microbatches to be a "
                                              "multiple of the stages (microbatches go through the chunks in groups "
                                              "of p = {}), got m = {}", p, m));
  } else if (v != 1) {
    throw std::invalid_argument(fmt::format("make_schedule: {} runs one model chunk per stage, got {}",
                                            schedule_name(kind), v));
  }
  if (kind == ScheduleKind::Naive) m = 1;
  std::vector<std::vector<PipeOp>> out(static_cast<std::size_t>(p));
  for (int s = 0; s < p; ++s) {
    auto& ops = out[static_cast<std::size_t>(s)];
    if (kind == ScheduleKind::Interleaved1F1B) {
      // Megatron-LM core/pipeline_parallel/schedules.py, forward_backward_pipelining_with_interleaving:
      // the k-th forward (backward) of a stage runs chunk (k mod pv)/p (reversed for backwards)
      // of microbatch ⌊k/pv⌋·p + k mod p.
      const int total = m * v;
      const int warmup = m == p ? total : std::min(2 * (p - s - 1) + (v - 1) * p, total);
      auto op = [&](char kind_, int k) {
        const int in_group = k % (p * v);
        int chunk = in_group / p;
        if (kind_ == 'B') chunk = v - 1 - chunk;
        return PipeOp{kind_, k / (p * v) * p + in_group % p, chunk};
      };
      int f = 0, b = 0;
      for (; f < warmup; ++f) ops.push_back(op('F', f));
      while (f < total) {
        ops.push_back(op('F', f++));
        ops.push_back(op('B', b++));
      }
      while (b < total) ops.push_back(op('B', b++));
    } else if (kind == ScheduleKind::ZBH1) {
      // ZB-H1 (Qi et al. 2023, Fig. 3; torch.distributed.pipelining _get_1f1b_rank_ops with
      // enable_zero_bubble): 1F1B's order of F and B (B = input gradient), and after the i-th
      // B the oldest pending W once i >= s; the rest of the W's at the end. W's run in B's
      // order, so every weight gradient accumulates its microbatches in the order 0, 1, ...
      const int warmup = std::min(p - s - 1, m);
      int f = 0, b = 0, w = 0;
      auto backward = [&] {
        ops.push_back({'B', b});
        if (b++ >= s) ops.push_back({'W', w++});
      };
      while (f < warmup) ops.push_back({'F', f++});
      while (f < m) {
        ops.push_back({'F', f++});
        backward();
      }
      while (b < m) backward();
      while (w < m) ops.push_back({'W', w++});
    } else if (kind != ScheduleKind::OneFOneB) {
      // GPipe: every forward, then every backward (in microbatch order, as
      // Megatron's "all-forward all-backward" and torch.distributed.pipelining do).
      for (int j = 0; j < m; ++j) ops.push_back({'F', j});
      for (int j = 0; j < m; ++j) ops.push_back({'B', j});
    } else {
      // PipeDream-flush (Megatron-LM forward_backward_pipelining_without_interleaving).
      const int warmup = std::min(p - s - 1, m);
      const int steady = m - warmup;
      int f = 0, b = 0;
      for (int i = 0; i < warmup; ++i) ops.push_back({'F', f++});
      for (int i = 0; i < steady; ++i) {
        ops.push_back({'F', f++});
        ops.push_back({'B', b++});
      }
      while (b < m) ops.push_back({'B', b++});
    }
  }
  return out;
}

bool splits_backward(const std::vector<PipeOp>& ops) {
  return std::any_of(ops.begin(), ops.end(), [](const PipeOp& op) { return op.kind == 'W'; });
}

std::vector<int> peak_in_flight(const std::vector<std::vector<PipeOp>>& schedule) {
  std::vector<int> peaks;
  for (const auto& ops : schedule) {
    // Split backward: a microbatch is released by its W (it keeps the layer inputs and
    // output gradients W needs); fused: by its B.
    const char release = splits_backward(ops) ? 'W' : 'B';
    int held = 0, peak = 0;
    for (const auto& op : ops) {
      if (op.kind == 'F') ++held;
      if (op.kind == release) --held;
      peak = std::max(peak, held);
    }
    peaks.push_back(peak);
  }
  return peaks;
}

std::string schedule_string(const std::vector<PipeOp>& ops) {
  const bool chunked = std::any_of(ops.begin(), ops.end(), [](const PipeOp& op) { return op.chunk != 0; });
  std::string s;
  for (const auto& op : ops) {
    if (!s.empty()) s += ' ';
    s += chunked ? fmt::format("{}{}.{}", op.kind, op.microbatch, op.chunk) : fmt::format("{}{}", op.kind, op.microbatch);
  }
  return s;
}

double bubble_theory(int p, int m, int v) {
  return static_cast<double>(p - 1) / static_cast<double>(v * m + p - 1);
}

double bubble_time_theory(ScheduleKind kind, int p, int m, double f, double b, double w, int v) {
  if (kind == ScheduleKind::ZBH1) {
    if (w > f + b)
      throw std::invalid_argument(fmt::format("bubble_time_theory: ZB-H1's (p-1)(F+B-W) assumes W <= F + B, got F = "
                                              "{}, B = {}, W = {}", f, b, w));
    return (p - 1) * (f + b) - (std::min(m, p) - 1) * w;
  }
  const double fused = (p - 1) * (f + b + w);
  return kind == ScheduleKind::Interleaved1F1B ? fused / v : fused;
}

PipelineRun simulate_schedule(const std::vector<std::vector<PipeOp>>& schedule, const std::vector<double>& f,
                              const std::vector<double>& b, const std::vector<double>& w) {
  const int p = static_cast<int>(schedule.size());
  int v = 1;  // chunks: the largest chunk index + 1
  for (const auto& ops : schedule)
    for (const auto& op : ops) v = std::max(v, op.chunk + 1);
  const int vs = p * v;
  if (static_cast<int>(f.size()) != vs || static_cast<int>(b.size()) != vs || static_cast<int>(w.size()) != vs)
    throw std::invalid_argument(fmt::format("simulate_schedule: {} virtual stages need {} costs each, got F {}, B {}, "
                                            "W {}", vs, vs, f.size(), b.size(), w.size()));
  // End time of (kind, microbatch, virtual stage), once run.
  std::map<std::tuple<char, int, int>, double> done;
  std::vector<std::size_t> next(static_cast<std::size_t>(p), 0);
  std::vector<double> free_at(static_cast<std::size_t>(p), 0.0);
  std::vector<StageRun> parts(static_cast<std::size_t>(p));
  std::size_t left = 0;
  for (const auto& ops : schedule) left += ops.size();
  while (left > 0) {
    bool progressed = false;
    for (int s = 0; s < p; ++s) {
      auto& i = next[static_cast<std::size_t>(s)];
      const auto& ops = schedule[static_cast<std::size_t>(s)];
      const bool split = splits_backward(ops);
      while (i < ops.size()) {
        const PipeOp& op = ops[i];
        const int c = op.chunk * p + s;
        // What the op waits for: the activation from c - 1, the gradient from c + 1, its own B.
        std::tuple<char, int, int> dep{' ', op.microbatch, 0};
        if (op.kind == 'F' && c > 0) dep = {'F', op.microbatch, c - 1};
        if (op.kind == 'B' && c < vs - 1) dep = {'B', op.microbatch, c + 1};
        if (op.kind == 'W') dep = {'B', op.microbatch, c};
        double ready = 0;
        if (std::get<0>(dep) != ' ') {
          auto it = done.find(dep);
          if (it == done.end()) break;  // not yet: another stage first
          ready = it->second;
        }
        // A backward needs its own forward on this stage (the executor throws otherwise; here
        // a B before its F can never run: reported as a deadlock).
        if (op.kind == 'B' && done.find({'F', op.microbatch, c}) == done.end()) break;
        const auto cc = static_cast<std::size_t>(c);
        const double cost = op.kind == 'F' ? f[cc] : op.kind == 'W' ? w[cc] : split ? b[cc] : b[cc] + w[cc];
        PipeEvent ev;
        ev.stage = s;
        ev.op = op;
        ev.start_s = std::max(ready, free_at[static_cast<std::size_t>(s)]);
        ev.end_s = ev.start_s + cost;
        ev.wait_s = ev.start_s - free_at[static_cast<std::size_t>(s)];
        free_at[static_cast<std::size_t>(s)] = ev.end_s;
        done[{op.kind, op.microbatch, c}] = ev.end_s;
        parts[static_cast<std::size_t>(s)].events.push_back(ev);
        ++i;
        --left;
        progressed = true;
      }
    }
    if (!progressed) throw std::logic_error("simulate_schedule: the stage programs deadlock");
  }
  PipelineRun run;
  double end = 0;
  for (const auto& part : parts) {
    double busy = 0;
    for (const auto& ev : part.events) {
      busy += ev.end_s - ev.start_s;
      end = std::max(end, ev.end_s);
      run.events.push_back(ev);
    }
    run.busy_s.push_back(busy);
  }
  run.step_s = end;
  run.peak_held = peak_in_flight(schedule);
  return run;
}

// ----------------------------------------------------------------------------
// Models cut into stages
// ----------------------------------------------------------------------------

std::vector<torch::nn::Linear> mlp_layers(const std::vector<int64_t>& widths) {
  if (widths.size() < 2) throw std::invalid_argument("mlp_layers: need at least 2 widths (input and output)");
  for (auto w : widths)
    if (w < 1) throw std::invalid_argument("mlp_layers: widths must be >= 1");
  std::vector<torch::nn::Linear> layers;
  for (std::size_t i = 0; i + 1 < widths.size(); ++i) layers.emplace_back(widths[i], widths[i + 1]);
  return layers;
}

std::vector<std::pair<int, int>> stage_ranges(int layers, const std::vector<int64_t>& cuts) {
  std::vector<std::pair<int, int>> r;
  int begin = 0;
  for (std::size_t i = 0; i < cuts.size(); ++i) {
    const auto c = cuts[i];
    if (c < 1 || c > layers - 1)
      throw std::invalid_argument(fmt::format("cut {} at layer {} is outside the model (a cut must lie between "
                                              "layers, 1 .. {} for {} layers)", i, c, layers - 1, layers));
    if (c <= begin)
      throw std::invalid_argument(fmt::format("cut {} at layer {} is not after the previous cut {} (cuts must be "
                                              "strictly increasing)", i, c, begin));
    r.emplace_back(begin, static_cast<int>(c));
    begin = static_cast<int>(c);
  }
  r.emplace_back(begin, layers);
  return r;
}

std::vector<int64_t> balanced_cuts(int layers, int stages) {
  if (stages < 1) throw std::invalid_argument("balanced_cuts: stages must be >= 1");
  if (stages > layers)
    throw std::invalid_argument(fmt::format("{} stages but only {} layers: every stage needs at least one layer",
                                            stages, layers));
  std::vector<int64_t> cuts;
  int at = 0;
  for (int s = 0; s + 1 < stages; ++s) {
    at += layers / stages + (s < layers % stages ? 1 : 0);
    cuts.push_back(at);
  }
  return cuts;
}

torch::Tensor stage_forward(const std::vector<torch::nn::Linear>& layers, int begin, int end, torch::Tensor x,
                            std::vector<torch::Tensor>* kept) {
  const int total = static_cast<int>(layers.size());
  for (int i = begin; i < end; ++i) {
    torch::nn::Linear lin = layers[static_cast<std::size_t>(i)];  // holders share the module
    x = lin->forward(x);
    if (kept) kept->push_back(x);
    if (i != total - 1) {
      x = torch::relu(x);
      if (kept) kept->push_back(x);
    }
  }
  return x;
}

std::vector<torch::Tensor> param_grads(const std::vector<torch::nn::Linear>& layers) {
  std::vector<torch::Tensor> g;
  for (auto& l : layers)
    for (auto& prm : l->parameters()) g.push_back(prm.grad().detach().clone());
  return g;
}

void reset_grads(const std::vector<torch::nn::Linear>& layers) {
  for (auto& l : layers)
    for (auto& prm : l->parameters()) prm.mutable_grad() = torch::Tensor();
}

// ----------------------------------------------------------------------------
// Transport
// ----------------------------------------------------------------------------

void QueueTransport::send(int src, int dst, char kind, int microbatch, const torch::Tensor& t, int boundary) {
  const double trace_t0 = trace::enabled() ? trace::now_us() : 0;  // timeline (pipeline_trace.hpp)
  {
    std::lock_guard<std::mutex> lock(mu_);
    box_[Key{src, dst, kind, microbatch, boundary < 0 ? std::min(src, dst) : boundary}] = t;
  }
  cv_.notify_all();
  if (trace::enabled())
    trace_queue_p2p(true, src, dst, kind, microbatch, boundary < 0 ? std::min(src, dst) : boundary,
                    static_cast<int64_t>(t.nbytes()), trace_t0, trace::now_us());
}

torch::Tensor QueueTransport::recv(int src, int dst, char kind, int microbatch, int boundary) {
  const double trace_t0 = trace::enabled() ? trace::now_us() : 0;  // timeline (pipeline_trace.hpp)
  std::unique_lock<std::mutex> lock(mu_);
  const Key key{src, dst, kind, microbatch, boundary < 0 ? std::min(src, dst) : boundary};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
  while (true) {
    if (!aborted_.empty()) throw RuntimeFailure(aborted_);
    auto it = box_.find(key);
    if (it != box_.end()) {
      torch::Tensor t = std::move(it->second);
      box_.erase(it);
      if (trace::enabled())
        trace_queue_p2p(false, src, dst, kind, microbatch, std::get<4>(key), static_cast<int64_t>(t.nbytes()), trace_t0,
                        trace::now_us());
      return t;
    }
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && box_.find(key) == box_.end())
      throw RuntimeFailure(fmt::format("stage {}: no {} for microbatch {} from stage {} within {} s", dst,
                                       kind == 'F' ? "activation" : "gradient", microbatch, src, timeout_s_));
  }
}

void QueueTransport::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_.empty()) aborted_ = why;
  }
  cv_.notify_all();
}

// ----------------------------------------------------------------------------
// Transport between processes (c10d point to point)
// ----------------------------------------------------------------------------

ProcessGroupTransport::ProcessGroupTransport(std::shared_ptr<dist::Group> group,
                                             std::vector<std::vector<int64_t>> boundary_shapes,
                                             std::shared_ptr<dist::Group> backward_group)
    : group_(std::move(group)), backward_group_(std::move(backward_group)), shapes_(std::move(boundary_shapes)) {
  if (!group_) throw std::invalid_argument("ProcessGroupTransport: no process group");
  if (!backward_group_) backward_group_ = group_;
  if (backward_group_->size() != group_->size() || backward_group_->rank() != group_->rank() ||
      backward_group_->device() != group_->device())
    throw std::invalid_argument(fmt::format("ProcessGroupTransport: the backward group (rank {} of {} on {}) is not "
                                            "the forward group's ranks and device (rank {} of {} on {})",
                                            backward_group_->rank(), backward_group_->size(),
                                            backward_group_->device().str(), group_->rank(), group_->size(),
                                            group_->device().str()));
  const int p = group_->size();
  if (static_cast<int>(shapes_.size()) < p - 1 || (static_cast<int>(shapes_.size()) + 1) % p != 0)
    throw std::invalid_argument(fmt::format("ProcessGroupTransport: {} stages need p*v - 1 boundary shapes ({} with "
                                            "one chunk per stage), got {}", p, p - 1, shapes_.size()));
}

ProcessGroupTransport::~ProcessGroupTransport() {
  // Only after a failure are sends still pending: nobody will receive them.
  for (auto& p : sends_) p.work->abort();
}

namespace {
const char* message_name(char kind) { return kind == 'F' ? "activation" : "gradient"; }
}  // namespace

std::pair<int, int> ProcessGroupTransport::boundary_of(int src, int dst, int boundary) const {
  const int p = group_->size();
  const int b = boundary < 0 ? std::min(src, dst) : boundary;
  // Boundary b joins the stages of virtual stages b and b + 1: b mod p and (b + 1) mod p.
  const bool joins = b >= 0 && b < static_cast<int>(shapes_.size()) &&
                     std::min(src, dst) == std::min(b % p, (b + 1) % p) &&
                     std::max(src, dst) == std::max(b % p, (b + 1) % p) && src != dst;
  if (!joins)
    throw std::invalid_argument(fmt::format("ProcessGroupTransport on rank {}: boundary {} does not join stages {} "
                                            "and {} ({} stages, {} boundaries)", group_->rank(), b, src, dst, p,
                                            shapes_.size()));
  return {b, b / p};
}

void ProcessGroupTransport::send(int src, int dst, char kind, int microbatch, const torch::Tensor& t, int boundary) {
  const int me = group_->rank();
  if (src != me)
    throw std::invalid_argument(fmt::format("ProcessGroupTransport on rank {}: cannot send from stage {} to stage {} "
                                            "(only from this rank's stage)", me, src, dst));
  const auto [b, lap] = boundary_of(src, dst, boundary);
  const auto& shape = shapes_[static_cast<std::size_t>(b)];
  if (t.sizes().vec() != shape)
    throw std::invalid_argument(fmt::format("stage {}: the {} of microbatch {} for stage {} has shape [{}], the "
                                            "boundary's is [{}]", src, message_name(kind), microbatch, dst,
                                            fmt::join(t.sizes().vec(), ", "), fmt::join(shape, ", ")));
  // Not copied: the activation (a detached output kept for backward) and the input gradient
  // are not written again, and the Work keeps them alive until the receiver has them.
  auto buf = t.detach().to(group_->device(), torch::kFloat32).contiguous();
  auto& g = kind == 'F' ? group_ : backward_group_;
  trace_p2p_annotate(true, src, dst, kind, microbatch, b);  // timeline: the send's flow (pipeline_trace.hpp)
  sends_.push_back({std::make_shared<dist::Work>(g->send_async(buf, dst, tag(kind, microbatch, lap))), dst, kind,
                    microbatch});
}

torch::Tensor ProcessGroupTransport::recv(int src, int dst, char kind, int microbatch, int boundary) {
  const int me = group_->rank();
  if (dst != me)
    throw std::invalid_argument(fmt::format("ProcessGroupTransport on rank {}: cannot receive {} {} from stage {} "
                                            "at stage {}", me, kind, microbatch, src, dst));
  const auto [b, lap] = boundary_of(src, dst, boundary);
  // Forward messages come from the stage of virtual stage b, gradients from that of b + 1.
  const int p = group_->size();
  if (src != (kind == 'F' ? b % p : (b + 1) % p))
    throw std::invalid_argument(fmt::format("ProcessGroupTransport on rank {}: {} {} across boundary {} does not come "
                                            "from stage {}", me, kind, microbatch, b, src));
  auto t = torch::empty(shapes_[static_cast<std::size_t>(b)],
                        torch::TensorOptions().dtype(torch::kFloat32).device(group_->device()));
  auto& g = kind == 'F' ? group_ : backward_group_;
  std::shared_ptr<dist::Work> work;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!aborted_.empty()) throw RuntimeFailure(aborted_);
    trace_p2p_annotate(false, src, dst, kind, microbatch, b);  // timeline: the recv's flow (pipeline_trace.hpp)
    work = std::make_shared<dist::Work>(g->recv_async(t, src, tag(kind, microbatch, lap)));
    recv_ = work;
  }
  try {
    work->wait();
    // NCCL's wait only orders the current stream after the recv; the host waits here so
    // that the stage's measured wait is the time until the data is there.
    sync_device(t.device());
  } catch (const RuntimeFailure& e) {
    std::lock_guard<std::mutex> lock(mu_);
    recv_.reset();
    if (!aborted_.empty()) throw RuntimeFailure(aborted_);
    throw RuntimeFailure(fmt::format("stage {}: no {} for microbatch {} from stage {} (rank {}): {}", dst,
                                     message_name(kind), microbatch, src, src, e.what()));
  }
  std::lock_guard<std::mutex> lock(mu_);
  recv_.reset();
  return t;
}

void ProcessGroupTransport::abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_.empty()) aborted_ = why;
  if (recv_) recv_->abort();
}

void ProcessGroupTransport::flush() {
  for (const auto& p : sends_) {
    try {
      p.work->wait();
    } catch (const RuntimeFailure& e) {
      throw RuntimeFailure(fmt::format("stage {}: the {} of microbatch {} did not reach stage {} (rank {}): {}",
                                       group_->rank(), message_name(p.kind), p.microbatch, p.dst, p.dst, e.what()));
    }
  }
  sends_.clear();
}

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
  if (!parts.empty())
    for (double l : parts.back().losses) run.loss += l;
  run.grads = std::move(grads);
  return run;
}

}  // namespace

StageRun run_stage(int s, int p, const std::vector<torch::nn::Linear>& layers,
                   const std::vector<std::pair<int, int>>& ranges, const std::vector<PipeOp>& ops, int m,
                   const std::vector<torch::Tensor>& xs, const std::vector<torch::Tensor>& ys, const SyntheticCost& cost,
                   StageTransport& transport, Clock::time_point t0, const std::function<void(int)>& after_op) {
  const int virtual_stages = static_cast<int>(ranges.size());  // p · v
  auto since = [&](Clock::time_point t) { return std::chrono::duration<double>(t - t0).count(); };
  const double factor = cost.stage_factor.empty() ? 1.0 : cost.stage_factor[static_cast<std::size_t>(s)];
  // On CUDA an op's end is when its kernels are done (sync_device), not when they were queued.
  const torch::Device device = layers[static_cast<std::size_t>(ranges[static_cast<std::size_t>(s)].first)]->weight.device();
  StageRun out;
  const bool has_last = (virtual_stages - 1) % p == s;
  if (has_last) out.losses.assign(static_cast<std::size_t>(m), 0.0);
  struct Held {
    torch::Tensor input, output;
    std::vector<torch::Tensor> pre;    // split backward: each Linear's output (pre-activation), W's roots
    std::vector<torch::Tensor> d_pre;  // split backward: their gradients, kept by B for W
    bool backward_done = false;
    int64_t bytes = 0;
  };
  // B/W split (zero-bubble schedules): B computes only the input gradient, W the weights'.
  const bool split = splits_backward(ops);
  std::map<std::pair<int, int>, Held> held;  // (chunk, microbatch) -> activations kept for its backward
  int64_t held_bytes = 0;
  int done = 0;
  for (const auto& op : ops) {
    const int c = op.chunk * p + s;  // the virtual stage this op runs
    if (op.chunk < 0 || c >= virtual_stages)
      throw std::logic_error(fmt::format("stage {}: chunk {} is outside the model ({} virtual stages)", s, op.chunk,
                                         virtual_stages));
    const auto [begin, end] = ranges[static_cast<std::size_t>(c)];
    const double fwd_us = cost.forward_us * factor * (end - begin);
    const double w_us = fwd_us * cost.weight_factor;
    // Fused backward: the whole backward_factor; split: B its input-gradient part, W the rest.
    const double bwd_us = fwd_us * cost.backward_factor - (split ? w_us : 0.0);
    const bool first = c == 0, last = c == virtual_stages - 1;
    const int prev = (s + p - 1) % p, next = (s + 1) % p;  // the stages of virtual stages c − 1 and c + 1
    PipeEvent ev;
    ev.stage = s;
    ev.op = op;
    const auto wait0 = Clock::now();
    if (op.kind == 'F') {
      torch::Tensor in = first ? xs[static_cast<std::size_t>(op.microbatch)]
                               : transport.recv(prev, s, 'F', op.microbatch, c - 1);
      const auto c0 = Clock::now();
      ev.wait_s = std::chrono::duration<double>(c0 - wait0).count();
      ev.start_s = since(c0);
      // The boundary: a leaf that requires grad, so backward stops here and its .grad
      // is what the previous stage needs.
      if (!first) in = in.detach().requires_grad_(true);
      std::vector<torch::Tensor> kept;
      torch::Tensor o = stage_forward(layers, begin, end, in, &kept);
      synthetic_wait(fwd_us, cost.spin);
      int64_t bytes = first ? 0 : in.nbytes();
      for (auto& k : kept) bytes += static_cast<int64_t>(k.nbytes());
      Held h{in, o, {}, {}, false, bytes};
      if (split) {
        // kept = z_begin, relu(z_begin), z_begin+1, ...: a Linear's output, then its ReLU but
        // after the model's last layer.
        std::size_t at = 0;
        for (int i = begin; i < end; ++i) {
          h.pre.push_back(kept[at]);
          at += i == static_cast<int>(layers.size()) - 1 ? 1 : 2;
        }
      }
      if (last) {
        // Mean loss over the whole batch: each microbatch's loss is divided by m once.
        o = torch::mse_loss(o, ys[static_cast<std::size_t>(op.microbatch)]) / m;
        out.losses[static_cast<std::size_t>(op.microbatch)] = o.item<double>();
        h.output = o;
      } else {
        transport.send(s, next, 'F', op.microbatch, o.detach(), c);
      }
      held[{op.chunk, op.microbatch}] = std::move(h);
      held_bytes += bytes;
      out.peak_held = std::max(out.peak_held, static_cast<int>(held.size()));
      out.peak_bytes = std::max(out.peak_bytes, held_bytes);
    } else if (op.kind == 'B') {
      torch::Tensor g = last ? torch::Tensor() : transport.recv(next, s, 'B', op.microbatch, c);
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
        // B: the gradients w.r.t. the stage input and each Linear's output only; autograd
        // runs no weight-gradient kernel (AddmmBackward computes only the outputs asked for).
        // The graph is kept (retain_graph) for W, which starts at the same nodes.
        std::vector<torch::Tensor> wrt;
        if (!first) wrt.push_back(h.input);
        for (auto& z : h.pre) wrt.push_back(z);
        std::vector<torch::Tensor> seed;
        if (!last) seed.push_back(g);  // last: d(loss) = 1
        auto grads = torch::autograd::grad({h.output}, wrt, seed, /*retain_graph=*/true, /*create_graph=*/false);
        if (!first) input_grad = grads.front();
        h.d_pre.assign(grads.begin() + (first ? 0 : 1), grads.end());
        for (auto& d : h.d_pre) {
          h.bytes += static_cast<int64_t>(d.nbytes());
          held_bytes += static_cast<int64_t>(d.nbytes());
        }
        out.peak_bytes = std::max(out.peak_bytes, held_bytes);
      }
      synthetic_wait(bwd_us, cost.spin);
      if (!first) transport.send(s, prev, 'B', op.microbatch, input_grad, c - 1);
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
      for (int i = begin; i < end; ++i) {
        torch::nn::Linear lin = layers[static_cast<std::size_t>(i)];
        const std::size_t k = static_cast<std::size_t>(i - begin);
        // W: from the Linear's output with B's kept gradient to its weight and bias: the
        // AddmmBackward node of the forward, its mat2 and self outputs only.
        std::vector<torch::Tensor> params{lin->weight};
        if (lin->bias.defined()) params.push_back(lin->bias);
        auto gw = torch::autograd::grad({h.pre[k]}, params, {h.d_pre[k]}, /*retain_graph=*/false);
        // Accumulate as AccumulateGrad does: the first gradient taken, the later ones added.
        torch::NoGradGuard no_grad;
        for (std::size_t q = 0; q < params.size(); ++q) {
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
  trace_stage_events(out.events, t0, s, dynamic_cast<QueueTransport*>(&transport) != nullptr);  // timeline
  return out;
}

// ----------------------------------------------------------------------------
// Executor: one thread per stage
// ----------------------------------------------------------------------------

PipelineRun run_pipeline(const std::vector<torch::nn::Linear>& layers, const std::vector<std::pair<int, int>>& ranges,
                         const std::vector<std::vector<PipeOp>>& schedule, int m, const torch::Tensor& x,
                         const torch::Tensor& y, const SyntheticCost& cost, StageTransport& transport) {
  const int p = static_cast<int>(schedule.size());
  if (p < 1 || ranges.size() % schedule.size() != 0)
    throw std::invalid_argument(fmt::format("run_pipeline: {} stage programs for {} virtual stages (expected a "
                                            "multiple: v chunks per stage)", p, ranges.size()));
  if (m < 1 || x.size(0) % m != 0)
    throw std::invalid_argument(fmt::format("run_pipeline: batch {} is not divisible into {} microbatches", x.size(0), m));
  reset_grads(layers);

  const auto xs = x.chunk(m, 0);
  const auto ys = y.chunk(m, 0);
  std::vector<StageRun> parts(static_cast<std::size_t>(p));
  std::vector<std::string> errors(static_cast<std::size_t>(p));
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int s = 0; s < p; ++s) {
    threads.emplace_back([&, s] {
      try {
        parts[static_cast<std::size_t>(s)] = run_stage(s, p, layers, ranges, schedule[static_cast<std::size_t>(s)],
                                                       m, xs, ys, cost, transport, t0);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(s)] = e.what();
        transport.abort(fmt::format("stage {} failed: {}", s, e.what()));
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int s = 0; s < p; ++s)
    if (!errors[static_cast<std::size_t>(s)].empty()) {
      // Report the stage that failed first, not the ones that were woken by the abort.
      const auto& e = errors[static_cast<std::size_t>(s)];
      if (e.find("failed:") == std::string::npos) throw RuntimeFailure(fmt::format("stage {} failed: {}", s, e));
    }
  for (int s = 0; s < p; ++s)
    if (!errors[static_cast<std::size_t>(s)].empty()) throw RuntimeFailure(errors[static_cast<std::size_t>(s)]);
  return assemble_run(parts, param_grads(layers));
}

// ----------------------------------------------------------------------------
// Executor: one process per stage
// ----------------------------------------------------------------------------

PipelineRun run_pipeline_process(const std::shared_ptr<dist::Group>& group,
                                 const std::vector<torch::nn::Linear>& layers,
                                 const std::vector<std::pair<int, int>>& ranges,
                                 const std::vector<std::vector<PipeOp>>& schedule, int m, const torch::Tensor& x,
                                 const torch::Tensor& y, const SyntheticCost& cost,
                                 const ProcessPipelineOptions& opts) {
  const int p = static_cast<int>(schedule.size());
  if (p < 1 || ranges.size() % schedule.size() != 0)
    throw std::invalid_argument(fmt::format("run_pipeline_process: {} stage programs for {} virtual stages (expected "
                                            "a multiple: v chunks per stage)", p, ranges.size()));
  if (!group || group->size() != p)
    throw std::invalid_argument(fmt::format("run_pipeline_process: {} stages need a group of {} processes, got {}", p,
                                            p, group ? group->size() : 0));
  if (m < 1 || x.size(0) % m != 0)
    throw std::invalid_argument(
        fmt::format("run_pipeline_process: batch {} is not divisible into {} microbatches", x.size(0), m));
  if (x.device() != group->device() || layers.front()->weight.device() != group->device())
    throw std::invalid_argument(fmt::format("run_pipeline_process: the model and batch must be on the group's device "
                                            "({}), got {} and {}", group->device().str(),
                                            layers.front()->weight.device().str(), x.device().str()));
  reset_grads(layers);
  const int r = group->rank();
  const auto xs = x.chunk(m, 0);
  const auto ys = y.chunk(m, 0);
  // Boundary b carries [batch/m, out features of virtual stage b's last layer], both directions.
  std::vector<std::vector<int64_t>> shapes;
  for (int b = 0; b + 1 < static_cast<int>(ranges.size()); ++b)
    shapes.push_back({x.size(0) / m, layers[static_cast<std::size_t>(ranges[static_cast<std::size_t>(b)].second - 1)]
                                         ->weight.size(0)});

  // --- this rank's stage ---
  StageRun mine;
  {
    ProcessGroupTransport transport(group, shapes, opts.backward_group);
    group->barrier();  // every stage starts together; the step's clock starts here
    const auto t0 = Clock::now();
    try {
      // After every op the job's peers see this process work, even with a sleeping cost.
      const auto after_op = [&](int done) { group->job()->note_progress(); if (opts.after_op) opts.after_op(done); };
      mine = run_stage(r, p, layers, ranges, schedule[static_cast<std::size_t>(r)], m, xs, ys, cost, transport, t0,
                       after_op);
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
      a[at++] = ev.start_s;
      a[at++] = ev.end_s;
      a[at++] = ev.wait_s;
    }
    for (std::size_t j = 0; j < mine.losses.size(); ++j) a[offset.back() + static_cast<int64_t>(j)] = mine.losses[j];
  }
  std::vector<torch::Tensor> params;
  for (auto& l : layers)
    for (auto& prm : l->parameters()) params.push_back(prm);
  int64_t numel = 0;
  for (auto& prm : params) numel += prm.numel();
  auto flat = torch::zeros({numel}, torch::TensorOptions().dtype(torch::kFloat32).device(group->device()));
  {
    torch::NoGradGuard ng;
    auto mine_has = [&](int layer) {  // this rank's chunks: virtual stages r, r + p, ...
      for (std::size_t c = static_cast<std::size_t>(r); c < ranges.size(); c += static_cast<std::size_t>(p))
        if (layer >= ranges[c].first && layer < ranges[c].second) return true;
      return false;
    };
    int64_t at = 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const int layer = static_cast<int>(i / 2);  // weight, bias per layer
      if (mine_has(layer)) flat.narrow(0, at, params[i].numel()).copy_(params[i].grad().reshape({-1}));
      at += params[i].numel();
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
  for (int j = 0; j < m; ++j) parts.back().losses.push_back(a[offset.back() + j]);
  std::vector<torch::Tensor> grads;
  int64_t at = 0;
  for (auto& prm : params) {
    grads.push_back(flat.narrow(0, at, prm.numel()).view(prm.sizes()).clone());
    at += prm.numel();
  }
  return assemble_run(parts, std::move(grads));
}

double measured_bubble(const PipelineRun& run) {
  if (run.busy_s.empty() || run.step_s <= 0) return 0;
  double sum = 0;
  for (double b : run.busy_s) sum += 1.0 - b / run.step_s;
  return sum / static_cast<double>(run.busy_s.size());
}

std::string render_gantt(const PipelineRun& run, int stages, int width) {
  if (run.step_s <= 0 || width < 1) return "";
  const double col = run.step_s / width;
  std::vector<std::string> rows(static_cast<std::size_t>(stages), std::string(static_cast<std::size_t>(width), '.'));
  const char* digits = "0123456789abcdefghijklmnopqrstuvwxyz";
  for (const auto& ev : run.events) {
    int a = static_cast<int>(ev.start_s / col + 0.5), b = static_cast<int>(ev.end_s / col + 0.5);
    a = std::clamp(a, 0, width - 1);
    b = std::clamp(b, a + 1, width);
    auto& row = rows[static_cast<std::size_t>(ev.stage)];
    const char fill = ev.op.kind == 'F' ? '-' : ev.op.kind == 'W' ? '~' : '=';
    for (int c = a; c < b; ++c) row[static_cast<std::size_t>(c)] = fill;
    // Odd model chunks (interleaved 1F1B) in lower case: F/B/W chunk 0, 2, ...; f/b/w chunk 1, 3, ...
    row[static_cast<std::size_t>(a)] = ev.op.chunk % 2 == 1 ? static_cast<char>(ev.op.kind - 'A' + 'a') : ev.op.kind;
    if (b - a >= 2) row[static_cast<std::size_t>(a + 1)] = digits[ev.op.microbatch % 36];
  }
  std::string out;
  for (int s = 0; s < stages; ++s) out += fmt::format("stage {} |{}|\n", s, rows[static_cast<std::size_t>(s)]);
  out += fmt::format("         0{:>{}}\n", fmt::format("{:.1f} ms", run.step_s * 1e3), width);
  return out;
}

}  // namespace mpt
