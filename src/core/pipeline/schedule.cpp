// Pipeline schedules as data: programs, the bubble theory, the replay. See schedule.hpp.
#include "core/pipeline/schedule.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>

#include <fmt/format.h>

namespace mpt {

// ----------------------------------------------------------------------------
// Schedules
// ----------------------------------------------------------------------------

ScheduleKind parse_schedule(const std::string& name) { return schedule_spec(name).kind; }

std::string schedule_name(ScheduleKind k) { return schedule_spec(k).name; }

Placement schedule_placement(ScheduleKind k) { return schedule_spec(k).placement; }

int virtual_stage(int s, int k, int p, Placement placement) {
  if (placement == Placement::Loop) return k * p + s;
  if (k != 0 && k != 1)
    throw std::invalid_argument(fmt::format("virtual_stage: the V placement has chunks 0 and 1, got {}", k));
  return k == 0 ? s : 2 * p - 1 - s;
}

int stage_rank(int c, int p, Placement placement) {
  if (placement == Placement::Loop) return c % p;
  if (c < 0 || c >= 2 * p)
    throw std::invalid_argument(fmt::format("stage_rank: the V placement has virtual stages 0 .. {}, got {}", 2 * p - 1, c));
  return c < p ? c : 2 * p - 1 - c;
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

// ----------------------------------------------------------------------------
// The programs, one builder per schedule: rank s's ops for p ranks, m microbatches, v chunks
// ----------------------------------------------------------------------------

namespace {

// GPipe: every forward, then every backward (in microbatch order, as Megatron's
// "all-forward all-backward" and torch.distributed.pipelining do).
std::vector<PipeOp> gpipe_program(int, int, int m, int) {
  std::vector<PipeOp> ops;
  for (int j = 0; j < m; ++j) ops.push_back({'F', j});
  for (int j = 0; j < m; ++j) ops.push_back({'B', j});
  return ops;
}

// PipeDream-flush (Megatron-LM forward_backward_pipelining_without_interleaving).
std::vector<PipeOp> one_f_one_b_program(int s, int p, int m, int) {
  std::vector<PipeOp> ops;
  const int warmup = std::min(p - s - 1, m);
  const int steady = m - warmup;
  int f = 0, b = 0;
  for (int i = 0; i < warmup; ++i) ops.push_back({'F', f++});
  for (int i = 0; i < steady; ++i) {
    ops.push_back({'F', f++});
    ops.push_back({'B', b++});
  }
  while (b < m) ops.push_back({'B', b++});
  return ops;
}

// Megatron-LM core/pipeline_parallel/schedules.py, forward_backward_pipelining_with_interleaving:
// the k-th forward (backward) of a stage runs chunk (k mod pv)/p (reversed for backwards)
// of microbatch ⌊k/pv⌋·p + k mod p.
std::vector<PipeOp> interleaved_program(int s, int p, int m, int v) {
  std::vector<PipeOp> ops;
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
  return ops;
}

// ZB-H1 (Qi et al. 2023, Fig. 3; torch.distributed.pipelining _get_1f1b_rank_ops with
// enable_zero_bubble): 1F1B's order of F and B (B = input gradient), and after the i-th
// B the oldest pending W once i >= s; the rest of the W's at the end. W's run in B's
// order, so every weight gradient accumulates its microbatches in the order 0, 1, ...
std::vector<PipeOp> zbh1_program(int s, int p, int m, int) {
  std::vector<PipeOp> ops;
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
  return ops;
}

// ZB-V (Qi et al. 2023 §6), as torch.distributed.pipelining builds it:
// ScheduleZBVZeroBubble._calculate_single_rank_operations (torch/distributed/pipelining/
// schedules.py). Chunk 0 is virtual stage s, chunk 1 virtual stage 2p - 1 - s. torch runs
// n = max(2p - 1, m) microbatches' worth of slots and turns those of microbatches >= m
// into None (an idle slot); here they are left out.
std::vector<PipeOp> zbv_program(int s, int p, int m, int) {
  const int n = std::max(2 * p - 1, m);
  std::vector<PipeOp> all;
  int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
  auto F = [&](int k) { all.push_back({'F', k == 0 ? f0++ : f1++, k}); };
  auto B = [&](int k) { all.push_back({'B', k == 0 ? b0++ : b1++, k}); };
  auto W = [&](int k, int j) { all.push_back({'W', j, k}); };
  for (int i = 0; i < 2 * (p - s) - 1; ++i) F(0);  // warm-up 1: chunk 0 only
  for (int i = 0; i < s; ++i) {                     // warm-up 2: F1 F0
    F(1);
    F(0);
  }
  for (int i = 0; i < p - s; ++i) {  // warm-up 3: F1 B1 W1 (the turn reached)
    F(1);
    B(1);
    W(1, b1 - 1);
  }
  while (f1 < f0 || f0 < n) {  // steady: F0 B0 W0 F1 B1 W1
    if (f0 < n) F(0);
    B(0);
    W(0, b0 - 1);
    F(1);
    B(1);
    W(1, b1 - 1);
  }
  int w0 = b0, w1 = b1;
  for (int i = 0; i < s; ++i) {  // cool-down: B0 B1, W's postponed
    B(0);
    B(1);
  }
  for (int i = 0; i < p - s; ++i) {  // B0 and the oldest pending W0
    B(0);
    W(0, w0++);
  }
  while (w1 < b1) W(1, w1++);
  while (w0 < b0) W(0, w0++);
  std::vector<PipeOp> ops;
  for (const auto& op : all)
    if (op.microbatch < m) ops.push_back(op);
  return ops;
}

// Megatron's requirements for the interleaved schedule: chunks spread over >= 2 stages, and
// microbatches that go through the chunks in groups of p.
void check_interleaved(int p, int m, int v) {
  if (p < 2) throw std::invalid_argument("make_schedule: interleaved-1f1b needs >= 2 stages");
  if (v < 2)
    throw std::invalid_argument(fmt::format("make_schedule: interleaved-1f1b needs >= 2 model chunks per stage, "
                                            "got {}", v));
  if (m % p != 0)
    throw std::invalid_argument(fmt::format("make_schedule: interleaved-1f1b needs the microbatches to be a "
                                            "multiple of the stages (microbatches go through the chunks in groups "
                                            "of p = {}), got m = {}", p, m));
}

// Idle time per stage (bubble_time_theory). B and W fused: (p − 1)(F + B + W) (GPipe, 1F1B).
double fused_idle(int p, int, double f, double b, double w, int) { return (p - 1) * (f + b + w); }

// Interleaved: the fill and drain take p − 1 chunk times, 1/v of a stage's.
double interleaved_idle(int p, int m, double f, double b, double w, int v) { return fused_idle(p, m, f, b, w, v) / v; }

// ZB-H1: W fills the cool-down, (p − 1)(F + B) − (min(m, p) − 1)W.
double zbh1_idle(int p, int m, double f, double b, double w, int) {
  if (w > f + b)
    throw std::invalid_argument(fmt::format("bubble_time_theory: ZB-H1's (p-1)(F+B-W) assumes W <= F + B, got F = "
                                            "{}, B = {}, W = {}", f, b, w));
  return (p - 1) * (f + b) - (std::min(m, p) - 1) * w;
}

// ZB-V, F = B = W only: max(p − 1, 4p − 2 − 2m) chunk times.
double zbv_idle(int p, int m, double f, double b, double w, int) {
  if (f != b || b != w)
    throw std::invalid_argument(fmt::format("bubble_time_theory: zb-v's closed form holds for F = B = W, got F = {}, "
                                            "B = {}, W = {} (replay the programs: simulate_schedule)", f, b, w));
  return std::max(p - 1, 4 * p - 2 - 2 * m) * (f / 2);  // a chunk takes half a stage's time
}

// Peak (microbatch, chunk) pairs a stage may hold. GPipe holds all m; 1F1B and ZB-H1 at most p
// (a microbatch is held until its W); interleaved at most its warm-up + 1 pairs on stage 0:
// 2(p−1) + (v−1)p + 1, or all m·v when m = p; ZB-V at most 2p (1F1B's p stages).
int all_held(int, int m, int) { return m; }
int one_f_one_b_held(int p, int m, int) { return std::min(p, m); }
int interleaved_held(int p, int m, int v) { return std::min(m * v, 2 * (p - 1) + (v - 1) * p + 1); }
int zbv_held(int p, int m, int) { return std::min(2 * p, 2 * m); }

// The table. Each row: kind, name, chunks, placement, splits_w, one_microbatch,
// microbatches_in_groups, gradient_reference, matches_reference, zero_bubble_table, step_sync,
// formula_needs_equal_fbw, check, program, idle_time, peak_bound, rank_peak.
std::vector<ScheduleSpec> make_table() {
  using K = ScheduleKind;
  using P = Placement;
  return {
      {K::Naive, "naive", 1, P::Loop, false, true, false, false, false, false, false, false, nullptr, gpipe_program,
       fused_idle, all_held, nullptr},
      {K::GPipe, "gpipe", 1, P::Loop, false, false, false, true, false, false, true, false, nullptr, gpipe_program,
       fused_idle, all_held, nullptr},
      {K::OneFOneB, "1f1b", 1, P::Loop, false, false, false, false, true, true, true, false, nullptr,
       one_f_one_b_program, fused_idle, one_f_one_b_held, nullptr},
      {K::Interleaved1F1B, "interleaved-1f1b", 0, P::Loop, false, false, true, false, true, false, false, false,
       check_interleaved, interleaved_program, interleaved_idle, interleaved_held, nullptr},
      {K::ZBH1, "zb-h1", 1, P::Loop, true, false, false, false, true, true, true, false, nullptr, zbh1_program,
       zbh1_idle, one_f_one_b_held, nullptr},
      {K::ZBV, "zb-v", 2, P::V, true, false, false, false, true, true, true, true, nullptr, zbv_program, zbv_idle,
       zbv_held, zbv_peak_theory},
  };
}

}  // namespace

const std::vector<ScheduleSpec>& schedule_table() {
  static const std::vector<ScheduleSpec> table = make_table();
  return table;
}

const ScheduleSpec& schedule_spec(ScheduleKind kind) {
  for (const auto& spec : schedule_table())
    if (spec.kind == kind) return spec;
  throw std::invalid_argument(fmt::format("schedule_spec: no row for schedule kind {}", static_cast<int>(kind)));
}

const ScheduleSpec& schedule_spec(const std::string& name) {
  for (const auto& spec : schedule_table())
    if (name == spec.name) return spec;
  const auto names = schedule_names();
  throw std::invalid_argument(fmt::format("unknown schedule '{}' (expected {} or {})", name,
                                          fmt::join(names.begin(), names.end() - 1, ", "), names.back()));
}

std::vector<std::string> schedule_names() {
  std::vector<std::string> names;
  for (const auto& spec : schedule_table()) names.emplace_back(spec.name);
  return names;
}

std::vector<std::vector<PipeOp>> make_schedule(ScheduleKind kind, int p, int m, int v) {
  if (p < 1) throw std::invalid_argument("make_schedule: stages must be >= 1");
  if (m < 1) throw std::invalid_argument("make_schedule: microbatches must be >= 1");
  const ScheduleSpec& spec = schedule_spec(kind);
  if (spec.chunks == 1 && v != 1)
    throw std::invalid_argument(fmt::format("make_schedule: {} runs one model chunk per stage, got {}", spec.name, v));
  if (spec.chunks > 1 && v != spec.chunks)
    throw std::invalid_argument(fmt::format("make_schedule: {} runs exactly {} model chunks per stage{}, got {}",
                                            spec.name, spec.chunks, spec.placement == Placement::V ? " (a V)" : "", v));
  if (spec.check) spec.check(p, m, v);
  if (spec.one_microbatch) m = 1;
  std::vector<std::vector<PipeOp>> out;
  for (int s = 0; s < p; ++s) out.push_back(spec.program(s, p, m, v));
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

int zbv_peak_theory(int p, int m, int s) {
  if (p < 1 || m < 1 || s < 0 || s >= p)
    throw std::invalid_argument(fmt::format("zbv_peak_theory: expected stages >= 1, microbatches >= 1 and a rank 0 .. "
                                            "stages - 1, got {}, {}, {}", p, m, s));
  return std::min({2 * p, 2 * m, m + 1 + s});
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
  return schedule_spec(kind).idle_time(p, m, f, b, w, v);
}

PipelineRun simulate_schedule(const std::vector<std::vector<PipeOp>>& schedule, const std::vector<double>& f,
                              const std::vector<double>& b, const std::vector<double>& w, Placement placement) {
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
        const int c = virtual_stage(s, op.chunk, p, placement);
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

std::vector<std::vector<PipeAction>> to_actions(const std::vector<std::vector<PipeOp>>& schedule, int v,
                                                Placement placement) {
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
      const int c = virtual_stage(s, op.chunk, p, placement);
      const int j = op.microbatch;
      // A neighbour on this rank (V's turn) is handed the tensor locally: no SEND/RECV (torch's _has_comms).
      const bool prev_remote = c > 0 && stage_rank(c - 1, p, placement) != s;
      const bool next_remote = c < last && stage_rank(c + 1, p, placement) != s;
      using CT = ComputationType;
      if (op.kind == 'F') {
        if (prev_remote) acts.push_back({c, CT::RECV_F, j});
        acts.push_back({c, CT::FORWARD, j});
        if (next_remote) acts.push_back({c, CT::SEND_F, j});
      } else if (op.kind == 'B') {
        if (next_remote) acts.push_back({c, CT::RECV_B, j});
        acts.push_back({c, split ? CT::BACKWARD_INPUT : CT::FULL_BACKWARD, j});
        if (prev_remote) acts.push_back({c, CT::SEND_B, j});
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
