// Pipeline schedules as data: programs, the bubble theory, the replay. See pipeline_schedule.hpp.
#include "core/pipeline_schedule.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>

#include <fmt/format.h>

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
  std::vector<std::vector<PipeEvent>> parts(static_cast<std::size_t>(p));  // per stage, in program order
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
        parts[static_cast<std::size_t>(s)].push_back(ev);
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
    for (const auto& ev : part) {
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
// The explicit form (torch.distributed.pipelining's _Action)
// ----------------------------------------------------------------------------

std::vector<std::vector<PipeAction>> to_actions(const std::vector<std::vector<PipeOp>>& schedule, int v) {
  const int p = static_cast<int>(schedule.size());
  const int last = p * v - 1;  // the last virtual stage
  std::vector<std::vector<PipeAction>> out(schedule.size());
  for (int s = 0; s < p; ++s) {
    const auto& ops = schedule[static_cast<std::size_t>(s)];
    const bool split = splits_backward(ops);
    auto& acts = out[static_cast<std::size_t>(s)];
    for (const auto& op : ops) {
      if (op.chunk < 0 || op.chunk >= v)
        throw std::invalid_argument(fmt::format("to_actions: stage {}: chunk {} outside 0 .. {}", s, op.chunk, v - 1));
      const int c = op.chunk * p + s;
      const int j = op.microbatch;
      using CT = ComputationType;
      if (op.kind == 'F') {
        if (c > 0) acts.push_back({c, CT::RECV_F, j});
        acts.push_back({c, CT::FORWARD, j});
        if (c < last) acts.push_back({c, CT::SEND_F, j});
      } else if (op.kind == 'B') {
        if (c < last) acts.push_back({c, CT::RECV_B, j});
        acts.push_back({c, split ? CT::BACKWARD_INPUT : CT::FULL_BACKWARD, j});
        if (c > 0) acts.push_back({c, CT::SEND_B, j});
      } else if (op.kind == 'W') {
        acts.push_back({c, CT::BACKWARD_WEIGHT, j});
      } else {
        throw std::invalid_argument(fmt::format("to_actions: stage {}: unknown op kind '{}'", s, op.kind));
      }
    }
  }
  return out;
}

std::string action_string(const PipeAction& a) {
  const char* t = "?";
  switch (a.type) {
    case ComputationType::FORWARD: t = "F"; break;
    case ComputationType::FULL_BACKWARD: t = "B"; break;
    case ComputationType::BACKWARD_INPUT: t = "I"; break;
    case ComputationType::BACKWARD_WEIGHT: t = "W"; break;
    case ComputationType::SEND_F: t = "SEND_F"; break;
    case ComputationType::RECV_F: t = "RECV_F"; break;
    case ComputationType::SEND_B: t = "SEND_B"; break;
    case ComputationType::RECV_B: t = "RECV_B"; break;
  }
  return fmt::format("{}{}{}", a.stage, t, a.microbatch);
}

}  // namespace mpt
