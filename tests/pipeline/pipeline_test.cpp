// Pipeline schedules (core/pipeline/schedule), stage splitting (core/models/mlp), transports
// (core/pipeline/transport) and the executor with its stage functions (core/pipeline).
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include <sched.h>

#include "catch.hpp"

#include "core/dist/dist.hpp"
#include "core/errors.hpp"
#include "core/models/gpt.hpp"
#include "core/models/mlp.hpp"
#include "core/pipeline/executor.hpp"
#include "core/pipeline/stage_threads.hpp"
#include "core/runtime/runtime.hpp"

using namespace mpt;

namespace {

std::vector<torch::Tensor> full_batch_grads(const std::vector<torch::nn::Linear>& layers, const torch::Tensor& x,
                                            const torch::Tensor& y) {
  for (auto& l : layers)
    for (auto& p : l->parameters()) p.mutable_grad() = torch::Tensor();
  torch::mse_loss(stage_forward(layers, 0, static_cast<int>(layers.size()), x), y).backward();
  std::vector<torch::Tensor> g;
  for (auto& l : layers)
    for (auto& p : l->parameters()) g.push_back(p.grad().clone());
  return g;
}

bool all_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i], b[i])) return false;
  return true;
}

double max_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, (a[i] - b[i]).abs().max().item<double>());
  return d;
}

}  // namespace

TEST_CASE("GPipe for p=4, m=8: every forward, then every backward, on every stage", "[pipeline]") {
  const auto s = make_schedule(ScheduleKind::GPipe, 4, 8);
  REQUIRE(s.size() == 4);
  for (const auto& stage : s)
    CHECK(schedule_string(stage) == "F0 F1 F2 F3 F4 F5 F6 F7 B0 B1 B2 B3 B4 B5 B6 B7");
  CHECK(peak_in_flight(s) == std::vector<int>{8, 8, 8, 8});
}

TEST_CASE("the schedule table: one row per ScheduleKind, looked up by kind and by name", "[pipeline]") {
  const auto& table = schedule_table();
  REQUIRE(table.size() == 6);
  CHECK(schedule_names() == std::vector<std::string>{"naive", "gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v"});
  for (std::size_t i = 0; i < table.size(); ++i) {
    const auto& row = table[i];
    CHECK(static_cast<std::size_t>(row.kind) == i);  // in ScheduleKind's order
    CHECK(&schedule_spec(row.kind) == &row);
    CHECK(&schedule_spec(std::string(row.name)) == &row);
    CHECK(parse_schedule(row.name) == row.kind);
    CHECK(schedule_name(row.kind) == row.name);
    REQUIRE(row.program != nullptr);
    REQUIRE(row.idle_time != nullptr);
    REQUIRE(row.peak_bound != nullptr);
    // Every program of the row splits the backward exactly when the row says so.
    const int v = row.chunks_for(2);
    const auto sched = make_schedule(row.kind, 2, 2, v);
    for (const auto& ops : sched) CHECK(splits_backward(ops) == row.splits_w);
    CHECK(peak_in_flight(sched)[0] <= row.peak_bound(2, row.one_microbatch ? 1 : 2, v));
  }
  CHECK(schedule_spec(ScheduleKind::ZBV).chunks_for(5) == 2);
  CHECK(schedule_spec(ScheduleKind::Interleaved1F1B).chunks_for(3) == 3);
  CHECK_THROWS_WITH(schedule_spec(std::string("zb")),
                    "unknown schedule 'zb' (expected naive, gpipe, 1f1b, interleaved-1f1b, zb-h1 or zb-v)");
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::ZBV, 2, 4, 3),
                    "make_schedule: zb-v runs exactly 2 model chunks per stage (a V), got 3");
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::ZBH1, 2, 4, 2), "make_schedule: zb-h1 runs one model chunk per stage, got 2");
}

TEST_CASE("1F1B for p=4, m=8: warm-up p-s-1 forwards, steady 1F1B, cool-down", "[pipeline]") {
  const auto s = make_schedule(ScheduleKind::OneFOneB, 4, 8);
  REQUIRE(s.size() == 4);
  CHECK(schedule_string(s[0]) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  CHECK(schedule_string(s[1]) == "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
  CHECK(schedule_string(s[2]) == "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7");
  CHECK(schedule_string(s[3]) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  CHECK(schedule_string(s[3]).substr(0, 11) == "F0 B0 F1 B1");
  CHECK(peak_in_flight(s) == std::vector<int>{4, 3, 2, 1});
}

TEST_CASE("1F1B never holds more than p microbatches, every schedule runs each F and B once", "[pipeline]") {
  for (int p = 1; p <= 6; ++p)
    for (int m = 1; m <= 12; ++m) {
      for (auto kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB}) {
        const auto s = make_schedule(kind, p, m);
        const auto peaks = peak_in_flight(s);
        for (int st = 0; st < p; ++st) {
          const auto& prog = s[static_cast<std::size_t>(st)];
          REQUIRE(prog.size() == static_cast<std::size_t>(2 * m));
          std::vector<int> f(static_cast<std::size_t>(m), 0), b(static_cast<std::size_t>(m), 0);
          for (const auto& op : prog) {
            if (op.kind == 'F') ++f[static_cast<std::size_t>(op.microbatch)];
            else {
              REQUIRE(f[static_cast<std::size_t>(op.microbatch)] == 1);  // B after its F
              ++b[static_cast<std::size_t>(op.microbatch)];
            }
          }
          CHECK(std::count(f.begin(), f.end(), 1) == m);
          CHECK(std::count(b.begin(), b.end(), 1) == m);
          if (kind == ScheduleKind::OneFOneB) {
            CHECK(peaks[static_cast<std::size_t>(st)] <= p);
            CHECK(peaks[static_cast<std::size_t>(st)] == std::min(p - st, m));
          } else {
            CHECK(peaks[static_cast<std::size_t>(st)] == m);
          }
        }
      }
    }
  CHECK(schedule_string(make_schedule(ScheduleKind::Naive, 3, 8)[0]) == "F0 B0");
  CHECK_THROWS_AS(make_schedule(ScheduleKind::GPipe, 4, 0), std::invalid_argument);
  CHECK_THROWS_AS(parse_schedule("zb"), std::invalid_argument);
  CHECK(parse_schedule("1f1b") == ScheduleKind::OneFOneB);
}

namespace {

/// Executes per-stage programs as independent workers would: a stage runs its next op once
/// its input exists (F of virtual stage c needs F of c − 1; B needs the F of its own
/// (microbatch, chunk) and the B of c + 1). Returns true when every program runs to the end
/// (no deadlock), false when the stages wait on each other forever.
bool runs_without_deadlock(const std::vector<std::vector<PipeOp>>& sched, int chunks) {
  const int p = static_cast<int>(sched.size());
  const int last = p * chunks - 1;
  std::set<std::tuple<char, int, int>> done;  // (kind, microbatch, virtual stage)
  std::vector<std::size_t> pc(sched.size(), 0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      auto& i = pc[static_cast<std::size_t>(s)];
      const auto& prog = sched[static_cast<std::size_t>(s)];
      while (i < prog.size()) {
        const auto& op = prog[i];
        const int c = op.chunk * p + s;
        const bool ready = op.kind == 'F' ? (c == 0 || done.count({'F', op.microbatch, c - 1}))
                                          : (done.count({'F', op.microbatch, c}) &&
                                             (c == last || done.count({'B', op.microbatch, c + 1})));
        if (!ready) break;
        done.insert({op.kind, op.microbatch, c});
        ++i;
        progress = true;
      }
    }
  }
  for (std::size_t s = 0; s < sched.size(); ++s)
    if (pc[s] != sched[s].size()) return false;
  return true;
}

}  // namespace

TEST_CASE("interleaved 1F1B (Megatron-LM): chunks in groups of p, warm-up 2(p-s-1)+(v-1)p, no deadlock",
          "[pipeline]") {
  // p = 4, m = 8, v = 2: stage 0 runs microbatches 0-3 through chunk 0, then 0-3 through chunk 1,
  // then 4-7; 2*3 + 1*4 = 10 warm-up forwards, then F/B pairs, backwards through the chunks reversed.
  const auto s = make_schedule(ScheduleKind::Interleaved1F1B, 4, 8, 2);
  CHECK(schedule_string(s[0]).substr(0, 69) ==
        "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 F4.0 F5.0 F6.0 B0.1 F7.0 B1.1");
  CHECK(schedule_string(s[3]).substr(0, 29) == "F0.0 F1.0 F2.0 F3.0 F0.1 B0.1");  // 2*0 + 4 warm-up
  CHECK(peak_in_flight(s) == std::vector<int>{11, 9, 7, 5});
  for (int p = 2; p <= 5; ++p)
    for (int v = 2; v <= 4; ++v)
      for (int m = p; m <= 3 * p; m += p) {
        INFO("p=" << p << " v=" << v << " m=" << m);
        const auto sched = make_schedule(ScheduleKind::Interleaved1F1B, p, m, v);
        CHECK(runs_without_deadlock(sched, v));
        const auto peaks = peak_in_flight(sched);
        for (int st = 0; st < p; ++st) {
          const auto& prog = sched[static_cast<std::size_t>(st)];
          REQUIRE(prog.size() == static_cast<std::size_t>(2 * m * v));
          // Each (microbatch, chunk) forward and backward once; every chunk's microbatches in order.
          std::set<std::tuple<char, int, int>> seen;
          std::vector<int> next_f(static_cast<std::size_t>(v), 0), next_b(static_cast<std::size_t>(v), 0);
          for (const auto& op : prog) {
            CHECK(seen.insert({op.kind, op.microbatch, op.chunk}).second);
            auto& next = op.kind == 'F' ? next_f : next_b;
            CHECK(op.microbatch == next[static_cast<std::size_t>(op.chunk)]++);
          }
          const int bound = m == p ? m * v : std::min(m * v, 2 * (p - st - 1) + (v - 1) * p + 1);
          CHECK(peaks[static_cast<std::size_t>(st)] == bound);
        }
      }
  // GPipe and 1F1B also pass the deadlock check; a program in the wrong order does not.
  CHECK(runs_without_deadlock(make_schedule(ScheduleKind::OneFOneB, 4, 8), 1));
  CHECK_FALSE(runs_without_deadlock({{{'B', 0, 0}, {'F', 0, 0}}, {{'F', 0, 0}, {'B', 0, 0}}}, 1));
  CHECK(bubble_theory(4, 8, 2) == Approx(3.0 / 19.0));
  CHECK(parse_schedule("interleaved-1f1b") == ScheduleKind::Interleaved1F1B);
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::Interleaved1F1B, 4, 6, 2), Catch::Contains("multiple of the stages"));
  CHECK_THROWS_AS(make_schedule(ScheduleKind::Interleaved1F1B, 4, 8, 1), std::invalid_argument);
  CHECK_THROWS_AS(make_schedule(ScheduleKind::Interleaved1F1B, 1, 8, 2), std::invalid_argument);
  CHECK_THROWS_AS(make_schedule(ScheduleKind::OneFOneB, 4, 8, 2), std::invalid_argument);
}

TEST_CASE("stage ranges and balanced cuts", "[pipeline]") {
  CHECK(stage_ranges(4, {2}) == std::vector<std::pair<int, int>>{{0, 2}, {2, 4}});
  CHECK(stage_ranges(4, {1, 3}) == std::vector<std::pair<int, int>>{{0, 1}, {1, 3}, {3, 4}});
  CHECK_THROWS_WITH(stage_ranges(4, {4}), Catch::Contains("outside the model"));
  CHECK_THROWS_WITH(stage_ranges(4, {0}), Catch::Contains("outside the model"));
  CHECK_THROWS_WITH(stage_ranges(4, {2, 2}), Catch::Contains("strictly increasing"));
  CHECK(balanced_cuts(8, 4) == std::vector<int64_t>{2, 4, 6});
  CHECK(balanced_cuts(4, 3) == std::vector<int64_t>{2, 3});
  CHECK(balanced_cuts(5, 1).empty());
  CHECK_THROWS_WITH(balanced_cuts(3, 4), Catch::Contains("4 stages but only 3 layers"));
  CHECK(bubble_theory(4, 8) == Approx(3.0 / 11.0));
  // The MLP as a stage function: chunks = ranges, each chunk's layers, shapes at the cuts.
  seed_all(0);
  const MlpStage mlp(mlp_layers({6, 12, 10, 1}), stage_ranges(3, {1}));
  CHECK(mlp.chunks() == 2);
  CHECK(mlp.cost_units(1) == 2);
  CHECK(mlp.parameters(1).size() == 4);  // L2 and L3: weight, bias each
  CHECK(mlp.output_shape(0, {4, 6}) == std::vector<int64_t>{4, 12});
  ChunkSaved saved;
  const auto out = mlp.forward(1, torch::randn({4, 12}), &saved);
  CHECK(out.sizes() == torch::IntArrayRef({4, 1}));
  CHECK(saved.activations.size() == 3);    // z2, relu(z2), z3 (no ReLU after the model's last layer)
  REQUIRE(saved.weight_roots.size() == 2);  // z2 with {W2, b2}, z3 with {W3, b3}
  CHECK(saved.weight_roots[1].output.is_same(out));
  CHECK_THROWS_AS(MlpStage(mlp_layers({6, 12, 1}), {{0, 1}}), std::invalid_argument);          // layer 1 left out
  CHECK_THROWS_AS(MlpStage(mlp_layers({6, 12, 1}), {{0, 1}, {2, 2}}), std::invalid_argument);  // a gap
}

TEST_CASE("executor: microbatched gradients equal the full-batch gradient for every schedule", "[pipeline]") {
  seed_all(3);
  const auto layers = mlp_layers({6, 12, 12, 12, 12, 1});
  const auto x = torch::randn({16, 6});
  const auto y = torch::randn({16, 1});
  const auto full = full_batch_grads(layers, x, y);
  const auto ranges = stage_ranges(5, balanced_cuts(5, 3));
  std::vector<torch::Tensor> gpipe4;
  for (auto kind : {ScheduleKind::Naive, ScheduleKind::GPipe, ScheduleKind::OneFOneB})
    for (int m : {1, 2, 4, 8}) {
      QueueTransport tr(10);
      const auto run = run_pipeline(MlpStage(layers, ranges), make_schedule(kind, 3, m), kind == ScheduleKind::Naive ? 1 : m, x, y,
                                    SyntheticCost{}, tr);
      INFO(schedule_name(kind) << " m=" << m);
      CHECK(max_diff(full, run.grads) < 1e-6);
      CHECK(run.events.size() == static_cast<std::size_t>(3 * 2 * (kind == ScheduleKind::Naive ? 1 : m)));
      CHECK(run.peak_held == peak_in_flight(make_schedule(kind, 3, m)));
      if (kind == ScheduleKind::GPipe && m == 4) gpipe4 = run.grads;
      if (kind == ScheduleKind::OneFOneB && m == 4) CHECK(max_diff(gpipe4, run.grads) == 0.0);
    }
  // Interleaved on a 6-layer model, 2 stages x 3 chunks and 3 stages x 2 chunks: the full-batch
  // gradient, and (m = 4) GPipe's bit for bit (every layer adds its microbatches in the same order).
  {
    seed_all(4);
    const auto deep = mlp_layers({6, 12, 12, 12, 12, 12, 1});
    const auto x12 = torch::randn({12, 6});  // divisible into m = 4 and m = 6
    const auto y12 = torch::randn({12, 1});
    const auto full6 = full_batch_grads(deep, x12, y12);
    QueueTransport trg(10);
    const auto gpipe = run_pipeline(MlpStage(deep, stage_ranges(6, balanced_cuts(6, 2))), make_schedule(ScheduleKind::GPipe, 2, 4),
                                    4, x12, y12, SyntheticCost{}, trg);
    for (auto [p, v] : {std::pair{2, 3}, std::pair{3, 2}}) {
      INFO("interleaved p=" << p << " v=" << v);
      const auto sched = make_schedule(ScheduleKind::Interleaved1F1B, p, p * 2, v);
      QueueTransport tri2(10);
      const auto run = run_pipeline(MlpStage(deep, stage_ranges(6, balanced_cuts(6, p * v))), sched, p * 2, x12, y12,
                                    SyntheticCost{}, tri2);
      CHECK(max_diff(full6, run.grads) < 1e-6);
      CHECK(run.events.size() == static_cast<std::size_t>(p * 2 * (p * 2) * v));  // p stages x 2mv ops
      CHECK(run.peak_held == peak_in_flight(sched));
      if (p * 2 == 4) CHECK(max_diff(gpipe.grads, run.grads) == 0.0);
    }
  }
  // m = 1 is the whole model on the whole batch, stage by stage: bitwise equal.
  QueueTransport tr(10);
  const auto one = run_pipeline(MlpStage(layers, ranges), make_schedule(ScheduleKind::GPipe, 3, 1), 1, x, y, SyntheticCost{}, tr);
  CHECK(max_diff(full, one.grads) == 0.0);
  QueueTransport tr2(10);
  CHECK_THROWS_AS(run_pipeline(MlpStage(layers, ranges), make_schedule(ScheduleKind::GPipe, 3, 3), 3, x, y, SyntheticCost{}, tr2),
                  std::invalid_argument);
}

TEST_CASE("executor: measured bubble within 0.05 of (p-1)/(m+p-1) with a synthetic cost", "[pipeline][timing]") {
  seed_all(0);
  const auto layers = mlp_layers({8, 8, 8, 8, 8});
  const auto x = torch::randn({8, 8});
  const auto y = torch::randn({8, 8});
  const auto ranges = stage_ranges(4, balanced_cuts(4, 4));
  SyntheticCost cost;
  cost.forward_us = 10000;  // per layer: one layer per stage, F = 10 ms, B = 20 ms
  for (auto kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB}) {
    // Three steps, the median one judged (as the experiment does): a late thread wake-up on a
    // busy machine shows up as idle time in one step, rarely in the median.
    std::vector<PipelineRun> steps;
    for (int i = 0; i < 3; ++i) {
      QueueTransport tr(10);
      steps.push_back(run_pipeline(MlpStage(layers, ranges), make_schedule(kind, 4, 4), 4, x, y, cost, tr));
    }
    std::sort(steps.begin(), steps.end(), [](const auto& a, const auto& b) { return a.step_s < b.step_s; });
    const auto& run = steps[1];
    INFO(schedule_name(kind) << ": measured " << measured_bubble(run) << ", theory " << bubble_theory(4, 4));
    CHECK(std::fabs(measured_bubble(run) - bubble_theory(4, 4)) < 0.05);
    const auto chart = render_gantt(run, 4, 60);
    CHECK(chart.find("stage 3 |") != std::string::npos);
    CHECK(chart.find("F0") != std::string::npos);
  }
  // Interleaved, v = 2 chunks of one layer on 8 layers: (p-1)/(v*m+p-1) = 3/11 at m = 4
  // (against 3/7 for 1F1B with the same work per stage).
  const auto deep = mlp_layers({8, 8, 8, 8, 8, 8, 8, 8, 8});
  const auto chunks = stage_ranges(8, balanced_cuts(8, 8));
  std::vector<PipelineRun> steps;
  for (int i = 0; i < 3; ++i) {
    QueueTransport tr(10);
    steps.push_back(run_pipeline(MlpStage(deep, chunks), make_schedule(ScheduleKind::Interleaved1F1B, 4, 4, 2), 4, x, y, cost, tr));
  }
  std::sort(steps.begin(), steps.end(), [](const auto& a, const auto& b) { return a.step_s < b.step_s; });
  INFO("interleaved-1f1b: measured " << measured_bubble(steps[1]) << ", theory " << bubble_theory(4, 4, 2));
  CHECK(std::fabs(measured_bubble(steps[1]) - bubble_theory(4, 4, 2)) < 0.05);
  CHECK(render_gantt(steps[1], 4, 60).find('f') != std::string::npos);  // odd chunks in lower case
}

TEST_CASE("a failing stage makes the others stop with its name, no hang", "[pipeline]") {
  QueueTransport tr(5);
  tr.abort("stage 1 failed: boom");
  CHECK_THROWS_WITH(tr.recv(0, 1, 'F', 0), Catch::Contains("stage 1 failed"));
  QueueTransport slow(0.05);
  CHECK_THROWS_WITH(slow.recv(2, 1, 'B', 3), Catch::Contains("no gradient for microbatch 3 from stage 2"));
  // Shape mismatch between stages: stage 1 throws; stage 0 is woken and the run fails.
  seed_all(0);
  std::vector<torch::nn::Linear> bad = {torch::nn::Linear(4, 4), torch::nn::Linear(5, 1)};
  QueueTransport tr3(5);
  CHECK_THROWS_AS(run_pipeline(MlpStage(bad, stage_ranges(2, {1})), make_schedule(ScheduleKind::GPipe, 2, 2), 2,
                               torch::randn({4, 4}), torch::randn({4, 1}), SyntheticCost{}, tr3),
                  RuntimeFailure);
}

// ----------------------------------------------------------------------------
// One process per stage: ranks of a Gloo group played by threads of this process
// (an in-process HashStore for the rendezvous), as c10d's own ProcessGroupGloo tests do.
// The multi-process runs themselves go through ctest's CLI cases (tests/cli).
// ----------------------------------------------------------------------------
namespace {

using namespace std::chrono_literals;

/// Creates ranks 0 .. n-1 of a group (each constructor waits for the others: one thread each).
std::vector<std::shared_ptr<dist::Group>> thread_groups(int n, const std::string& prefix,
                                                        std::chrono::milliseconds timeout) {
  const auto job = dist::connect_store(dist::LaunchInfo{}, timeout);  // one process, no launcher: a HashStore
  std::vector<std::shared_ptr<dist::Group>> groups(static_cast<std::size_t>(n));
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] { groups[static_cast<std::size_t>(r)] = dist::Group::create(job, r, n, prefix, timeout); });
  for (auto& t : ts) t.join();
  return groups;
}

/// One step of run_pipeline_process on every rank of `groups` (a thread each), rank r with its
/// own model copy copies[r] and, when given, backward_groups[r] for the gradients. Requires
/// every rank to succeed (REQUIRE on the error messages) and returns their runs.
std::vector<PipelineRun> run_ranks(const std::vector<std::shared_ptr<dist::Group>>& groups,
                                   const std::vector<std::shared_ptr<dist::Group>>& backward_groups,
                                   const std::vector<std::vector<torch::nn::Linear>>& copies,
                                   const std::vector<std::pair<int, int>>& ranges,
                                   const std::vector<std::vector<PipeOp>>& sched, int m, const torch::Tensor& x,
                                   const torch::Tensor& y, Placement placement = Placement::Loop) {
  const std::size_t p = groups.size();
  std::vector<PipelineRun> runs(p);
  std::vector<std::string> errors(p);
  std::vector<std::thread> ts;
  for (std::size_t r = 0; r < p; ++r)
    ts.emplace_back([&, r] {
      try {
        ProcessPipelineOptions opts;
        if (!backward_groups.empty()) opts.backward_group = backward_groups[r];
        opts.placement = placement;
        runs[r] = run_pipeline_process(groups[r], MlpStage(copies[r], ranges), sched, m, x, y, SyntheticCost{}, opts);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (const auto& e : errors) REQUIRE(e.empty());
  return runs;
}

}  // namespace

TEST_CASE("one process per stage: Gloo send/recv gives the threaded executor's gradients bitwise (zb-h1: GPipe's)",
          "[pipeline][dist]") {
  const int p = 3;
  const std::vector<int64_t> widths = {6, 12, 12, 12, 1};
  // Every rank builds its own copy of the model from the same seed, as separate processes do.
  std::vector<std::vector<torch::nn::Linear>> copies;
  for (int r = 0; r <= p; ++r) {
    seed_all(11);
    copies.push_back(mlp_layers(widths));
  }
  const auto x = torch::randn({8, 6});
  const auto y = torch::randn({8, 1});
  const auto full = full_batch_grads(copies[p], x, y);
  const auto ranges = stage_ranges(4, balanced_cuts(4, p));
  auto groups = thread_groups(p, "ut_pipe/", 10000ms);
  // Gradients on the same group (tags tell them apart), or on a group of their own (what the
  // experiment does: NCCL needs one stream per direction).
  auto backward_groups = thread_groups(p, "ut_pipe_bwd/", 10000ms);
  std::map<int, std::vector<torch::Tensor>> gpipe_grads;  // per m, for zb-h1's bitwise check
  for (bool own_backward_group : {false, true})
  for (auto kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::ZBH1})
    for (int m : {1, 4}) {
      const auto sched = make_schedule(kind, p, m);
      INFO(schedule_name(kind) << " m=" << m << " own backward group: " << own_backward_group);
      const auto runs = run_ranks(groups, own_backward_group ? backward_groups : decltype(backward_groups){}, copies,
                                  ranges, sched, m, x, y);
      QueueTransport tr(10);
      const auto threaded = run_pipeline(MlpStage(copies[p], ranges), sched, m, x, y, SyntheticCost{}, tr);
      for (const auto& run : runs) {  // every rank ends with the whole step's result
        CHECK(max_diff(threaded.grads, run.grads) == 0.0);
        CHECK(max_diff(full, run.grads) < 1e-6);
        CHECK(run.loss == threaded.loss);
        CHECK(run.peak_held == peak_in_flight(sched));
        CHECK(run.peak_bytes == threaded.peak_bytes);
        REQUIRE(run.events.size() == static_cast<std::size_t>(p * (kind == ScheduleKind::ZBH1 ? 3 : 2) * m));
        if (kind == ScheduleKind::GPipe) gpipe_grads[m] = run.grads;
        // B/W split on processes: GPipe's gradients, torch::equal on every parameter.
        if (kind == ScheduleKind::ZBH1) CHECK(all_equal(gpipe_grads.at(m), run.grads));
        CHECK(run.events.front().stage == 0);
        CHECK(run.events.back().stage == p - 1);
        CHECK(run.step_s > 0);
      }
    }
  // The group size must be the stage count.
  CHECK_THROWS_AS(run_pipeline_process(groups[0], MlpStage(copies[0], stage_ranges(4, {2})),
                                       make_schedule(ScheduleKind::GPipe, 2, 1), 1, x, y, SyntheticCost{}),
                  std::invalid_argument);
  // The backward group must be the same ranks: rank 1's group is not rank 0's.
  CHECK_THROWS_AS(ProcessGroupTransport(groups[0], {{4, 12}, {4, 12}}, backward_groups[1]), std::invalid_argument);
}

TEST_CASE("one process per stage, interleaved 1F1B: stage 1 sends forward to stage 0 (wrap-around), gradients as "
          "threads give them", "[pipeline][dist]") {
  const int p = 2, v = 2, m = 4;
  std::vector<std::vector<torch::nn::Linear>> copies;
  for (int r = 0; r <= p; ++r) {
    seed_all(12);
    copies.push_back(mlp_layers({6, 12, 12, 12, 1}));
  }
  const auto x = torch::randn({8, 6});
  const auto y = torch::randn({8, 1});
  const auto ranges = stage_ranges(4, balanced_cuts(4, p * v));
  const auto sched = make_schedule(ScheduleKind::Interleaved1F1B, p, m, v);
  auto groups = thread_groups(p, "ut_pipe_il/", 10000ms);
  auto backward_groups = thread_groups(p, "ut_pipe_il_bwd/", 10000ms);
  const auto runs = run_ranks(groups, backward_groups, copies, ranges, sched, m, x, y);
  QueueTransport tr(10);
  const auto threaded = run_pipeline(MlpStage(copies[p], ranges), sched, m, x, y, SyntheticCost{}, tr);
  for (const auto& run : runs) {
    CHECK(max_diff(threaded.grads, run.grads) == 0.0);
    CHECK(run.loss == threaded.loss);
    CHECK(run.peak_held == peak_in_flight(sched));
    CHECK(run.peak_bytes == threaded.peak_bytes);
  }
  // A boundary the model does not have (3 boundaries: 0 .. 2) is refused.
  ProcessGroupTransport t0(groups[0], {{4, 12}, {4, 12}, {4, 12}});
  CHECK_THROWS_WITH(t0.send(0, 1, 'F', 0, torch::zeros({4, 12}), 3), Catch::Contains("does not join"));
}

TEST_CASE("process-group transport: a silent peer times out naming it, abort wakes a recv, shapes are checked",
          "[pipeline][dist]") {
  auto groups = thread_groups(2, "ut_pipe_fail/", 1000ms);
  ProcessGroupTransport t0(groups[0], {{4, 3}});
  ProcessGroupTransport t1(groups[1], {{4, 3}});
  CHECK(ProcessGroupTransport::tag('F', 3) == 6);
  CHECK(ProcessGroupTransport::tag('B', 3) == 7);
  // A message crosses both ways.
  auto a = torch::arange(12, torch::kFloat32).reshape({4, 3});
  t0.send(0, 1, 'F', 2, a);
  CHECK(torch::equal(t1.recv(0, 1, 'F', 2), a));
  t1.send(1, 0, 'B', 2, a * 2);
  CHECK(torch::equal(t0.recv(1, 0, 'B', 2), a * 2));
  t0.flush();
  t1.flush();
  // Wrong shape, or a stage that is not this rank's neighbour: a programming error.
  CHECK_THROWS_AS(t0.send(0, 1, 'F', 0, torch::zeros({4, 2})), std::invalid_argument);
  CHECK_THROWS_AS(t0.send(1, 0, 'B', 0, a), std::invalid_argument);
  // abort() from another thread ends a pending recv at once with the reason.
  std::thread waker([&] {
    std::this_thread::sleep_for(100ms);
    t1.abort("stage 0 failed: boom");
  });
  const double start2 = now_seconds();
  CHECK_THROWS_WITH(t1.recv(0, 1, 'F', 5), Catch::Contains("stage 0 failed: boom"));
  waker.join();
  CHECK(now_seconds() - start2 < 0.9);
  CHECK_THROWS_WITH(t1.recv(0, 1, 'F', 6), Catch::Contains("stage 0 failed: boom"));  // and every later one
  // Stage 1 never sends: stage 0's recv fails after the group's timeout (1 s), naming stage 1.
  // (Last: a Gloo timeout closes every connection of the group.)
  const double start = now_seconds();
  CHECK_THROWS_WITH(t0.recv(1, 0, 'B', 3),
                    Catch::Contains("stage 0: no gradient for microbatch 3 from stage 1 (rank 1)"));
  const double took = now_seconds() - start;
  CHECK(took > 0.9);  // it waited for the timeout...
  CHECK(took < 5.0);  // ...and not much longer
}

// ----------------------------------------------------------------------------
// Zero bubble: B/W split and ZB-H1 (Qi et al. 2023)
// ----------------------------------------------------------------------------
namespace {


/// F, B, W costs, the same on each of `n` virtual stages.
std::vector<double> costs(int n, double c) { return std::vector<double>(static_cast<std::size_t>(n), c); }

double mean_idle(const PipelineRun& run) {
  double idle = 0;  // summed, then divided once: exact for integer costs when the mean is an integer
  for (double b : run.busy_s) idle += run.step_s - b;
  return idle / static_cast<double>(run.busy_s.size());
}

}  // namespace

TEST_CASE("ZB-H1 for p=4, m=8: 1F1B's F/B order, stage s postpones its W's by s microbatches", "[pipeline][zb]") {
  const auto s = make_schedule(ScheduleKind::ZBH1, 4, 8);
  REQUIRE(s.size() == 4);
  CHECK(parse_schedule("zb-h1") == ScheduleKind::ZBH1);
  CHECK(schedule_name(ScheduleKind::ZBH1) == "zb-h1");
  // Stage 0: W right after each B; stage 3 (last): its first W after B3.
  CHECK(schedule_string(s[0]) == "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7");
  CHECK(schedule_string(s[3]) == "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7");
  // Without the W's, each program is 1F1B's.
  const auto one = make_schedule(ScheduleKind::OneFOneB, 4, 8);
  for (int st = 0; st < 4; ++st) {
    std::vector<PipeOp> fb;
    for (const auto& op : s[static_cast<std::size_t>(st)])
      if (op.kind != 'W') fb.push_back(op);
    CHECK(schedule_string(fb) == schedule_string(one[static_cast<std::size_t>(st)]));
  }
  // Held until W: p on every stage, 1F1B's peak (its stage 0); 1F1B's later stages hold less.
  CHECK(peak_in_flight(s) == std::vector<int>{4, 4, 4, 4});
  CHECK(splits_backward(s[0]));
  CHECK_FALSE(splits_backward(one[0]));
}

TEST_CASE("ZB-H1: each F, B, W once, F < B < W per microbatch, peak <= 1F1B's, no deadlock, for p <= 6, m <= 12",
          "[pipeline][zb]") {
  for (int p = 1; p <= 6; ++p)
    for (int m = 1; m <= 12; ++m) {
      INFO("p=" << p << " m=" << m);
      const auto s = make_schedule(ScheduleKind::ZBH1, p, m);
      const auto one_peaks = peak_in_flight(make_schedule(ScheduleKind::OneFOneB, p, m));
      const int one_peak = *std::max_element(one_peaks.begin(), one_peaks.end());
      for (const auto& ops : s) {
        REQUIRE(ops.size() == static_cast<std::size_t>(3 * m));
        std::map<std::pair<char, int>, int> at;  // (kind, microbatch) -> position
        for (std::size_t i = 0; i < ops.size(); ++i) {
          CHECK(at.count({ops[i].kind, ops[i].microbatch}) == 0);  // once
          at[{ops[i].kind, ops[i].microbatch}] = static_cast<int>(i);
        }
        int last_w = -1;
        for (int j = 0; j < m; ++j) {
          REQUIRE(at.count({'F', j}) == 1);
          REQUIRE(at.count({'B', j}) == 1);
          REQUIRE(at.count({'W', j}) == 1);
          CHECK(at[{'F', j}] < at[{'B', j}]);
          CHECK(at[{'B', j}] < at[{'W', j}]);
          CHECK(at[{'W', j}] > last_w);  // W's in microbatch order: gradients accumulate as GPipe's
          last_w = at[{'W', j}];
        }
      }
      for (int peak : peak_in_flight(s)) CHECK(peak <= one_peak);
      // Cross-stage order: F(j) on stage s needs F(j) of s-1, B(j) needs B(j) of s+1; the
      // replay runs every op or throws on a deadlock.
      const auto sim = simulate_schedule(s, costs(p, 1), costs(p, 1), costs(p, 1));
      CHECK(sim.events.size() == static_cast<std::size_t>(3 * m * p));
    }
}

TEST_CASE("time model: 1F1B idles (p-1)(F+B+W) per stage, ZB-H1 (p-1)(F+B-W) for m >= p (Qi et al. 2023)",
          "[pipeline][zb]") {
  // Integer costs: the replay's sums are exact in double, so equality is exact.
  for (auto [f, b, w] : {std::tuple{1.0, 1.0, 1.0}, std::tuple{2.0, 2.0, 1.0}, std::tuple{1.0, 2.0, 1.0}})
    for (int p : {2, 3, 4, 6})
      for (int m : {1, 2, p, p + 1, 2 * p, 16}) {
        INFO("F=" << f << " B=" << b << " W=" << w << " p=" << p << " m=" << m);
        const auto one = simulate_schedule(make_schedule(ScheduleKind::OneFOneB, p, m), costs(p, f), costs(p, b),
                                           costs(p, w));
        const auto zb = simulate_schedule(make_schedule(ScheduleKind::ZBH1, p, m), costs(p, f), costs(p, b),
                                          costs(p, w));
        CHECK(mean_idle(one) == bubble_time_theory(ScheduleKind::OneFOneB, p, m, f, b, w));
        CHECK(mean_idle(zb) == bubble_time_theory(ScheduleKind::ZBH1, p, m, f, b, w));
        if (m >= p) CHECK(mean_idle(zb) == (p - 1) * (f + b - w));  // the paper's formula
        CHECK(zb.step_s == m * (f + b + w) + mean_idle(zb));
      }
  // F = B = W: the bubble is a third of 1F1B's.
  CHECK(bubble_time_theory(ScheduleKind::ZBH1, 4, 8, 1, 1, 1) * 3 == bubble_time_theory(ScheduleKind::OneFOneB, 4, 8, 1, 1, 1));
  CHECK_THROWS_AS(bubble_time_theory(ScheduleKind::ZBH1, 4, 8, 1, 1, 3), std::invalid_argument);
  CHECK_THROWS_AS(simulate_schedule(make_schedule(ScheduleKind::ZBH1, 2, 2), costs(1, 1), costs(2, 1), costs(2, 1)),
                  std::invalid_argument);
  // A program that waits on an op never run: the replay says so instead of looping.
  std::vector<std::vector<PipeOp>> bad = {{{'F', 0}, {'B', 0}}, {{'B', 0}, {'F', 0}}};
  CHECK_THROWS_AS(simulate_schedule(bad, costs(2, 1), costs(2, 1), costs(2, 1)), std::logic_error);
}

TEST_CASE("step-end barrier: free for GPipe and 1F1B (stage 0 ends last), not for ZB-H1 with a slow later stage",
          "[pipeline][zb]") {
  // repeat_steps: step t's microbatches renamed j + t*m, each stage's programs back to back.
  const auto one = make_schedule(ScheduleKind::OneFOneB, 2, 2);
  const auto two = repeat_steps(one, 2, 2);
  REQUIRE(two[1].size() == 2 * one[1].size());
  CHECK(two[1][one[1].size()] == PipeOp{one[1][0].kind, one[1][0].microbatch + 2, 0});
  CHECK_THROWS_AS(repeat_steps(one, 0, 2), std::invalid_argument);
  // Integer costs: the replay's sums are exact in double, so the equalities are exact.
  for (int p : {2, 3, 4})
    for (int m : {1, p, 2 * p})
      for (double slow : {1.0, 3.0}) {  // stage 1's cost factor: equal stages, then a slow one
        INFO("p=" << p << " m=" << m << " stage 1 x" << slow);
        auto stage_costs = [&](double c) {
          std::vector<double> v(static_cast<std::size_t>(p), c);
          v[1] *= slow;
          return v;
        };
        for (auto kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::ZBH1}) {
          const auto s = make_schedule(kind, p, m);
          const auto step = simulate_schedule(s, stage_costs(1), stage_costs(1), stage_costs(1));
          const auto both = simulate_schedule(repeat_steps(s, 2, m), stage_costs(1), stage_costs(1), stage_costs(1));
          CHECK(both.events.size() == 2 * step.events.size());
          // Without a barrier two steps never take longer than with one (2 x one step).
          CHECK(both.step_s <= 2 * step.step_s);
          // Fused backward: every stage's last op is a B fed by the next stage: stage 0 ends last.
          if (kind != ScheduleKind::ZBH1) CHECK(both.step_s == 2 * step.step_s);
        }
      }
  // ZB-H1, p = 4, m = 8, stage 1 three times slower: stage 1's trailing W's end after stage 0,
  // so without the barrier stage 0's next forwards overlap them: the barrier costs time.
  std::vector<double> c = {1, 3, 1, 1};
  const auto zb = make_schedule(ScheduleKind::ZBH1, 4, 8);
  const auto step = simulate_schedule(zb, c, c, c);
  const auto both = simulate_schedule(repeat_steps(zb, 2, 8), c, c, c);
  CHECK(both.step_s < 2 * step.step_s);
}

TEST_CASE("B/W split: ZB-H1's gradients are GPipe's bit for bit (torch::equal), threads", "[pipeline][zb]") {
  seed_all(5);
  const auto layers = mlp_layers({6, 12, 12, 12, 12, 12, 1});
  const auto x = torch::randn({16, 6});
  const auto y = torch::randn({16, 1});
  const auto full = full_batch_grads(layers, x, y);
  for (int p : {1, 2, 3, 6})
    for (int m : {1, 2, 4, 8}) {
      INFO("p=" << p << " m=" << m);
      const auto ranges = stage_ranges(6, balanced_cuts(6, p));
      QueueTransport trg(10), trz(10);
      const auto gpipe = run_pipeline(MlpStage(layers, ranges), make_schedule(ScheduleKind::GPipe, p, m), m, x, y,
                                      SyntheticCost{}, trg);
      const auto sched = make_schedule(ScheduleKind::ZBH1, p, m);
      const auto zb = run_pipeline(MlpStage(layers, ranges), sched, m, x, y, SyntheticCost{}, trz);
      CHECK(all_equal(gpipe.grads, zb.grads));
      CHECK(zb.loss == gpipe.loss);
      CHECK(max_diff(full, zb.grads) < 1e-6);
      CHECK(zb.events.size() == static_cast<std::size_t>(3 * m * p));
      CHECK(zb.peak_held == peak_in_flight(sched));
    }
  // A W before its B is an error of the program, not a silent wrong gradient.
  const auto ranges = stage_ranges(6, balanced_cuts(6, 1));
  QueueTransport tr(10);
  CHECK_THROWS_AS(run_pipeline(MlpStage(layers, ranges), {{{'F', 0}, {'W', 0}, {'B', 0}}}, 1, x, y, SyntheticCost{}, tr),
                  RuntimeFailure);
}

TEST_CASE("executor: ZB-H1's measured idle per stage is 1/3 of 1F1B's with F = B = W (within 0.05 of the bubble)",
          "[pipeline][timing][zb]") {
  seed_all(0);
  const auto layers = mlp_layers({8, 8, 8, 8, 8});
  const auto x = torch::randn({8, 8});
  const auto y = torch::randn({8, 8});
  const auto ranges = stage_ranges(4, balanced_cuts(4, 4));
  SyntheticCost cost;
  cost.forward_us = 10000;  // one layer per stage: F = B = W = 10 ms
  cost.backward_factor = 2;
  cost.weight_factor = 1;
  for (auto kind : {ScheduleKind::OneFOneB, ScheduleKind::ZBH1}) {
    const auto sched = make_schedule(kind, 4, 4);
    std::vector<PipelineRun> steps;
    for (int i = 0; i < 3; ++i) {
      QueueTransport tr(10);
      steps.push_back(run_pipeline(MlpStage(layers, ranges), sched, 4, x, y, cost, tr));
    }
    std::sort(steps.begin(), steps.end(), [](const auto& a, const auto& b) { return a.step_s < b.step_s; });
    const auto& run = steps[1];
    // The time model in seconds: 1F1B (3m + 3(p-1))·10 ms, idle 9·10 ms; ZB-H1 (3m + p-1)·10 ms, idle 3·10 ms.
    const auto sim = simulate_schedule(sched, costs(4, 0.01), costs(4, 0.01), costs(4, 0.01));
    INFO(schedule_name(kind) << ": measured bubble " << measured_bubble(run) << ", model " << measured_bubble(sim)
                             << "; idle " << mean_idle(run) << " s, model " << mean_idle(sim));
    CHECK(std::fabs(measured_bubble(run) - measured_bubble(sim)) < 0.05);
    if (kind == ScheduleKind::ZBH1) CHECK(render_gantt(run, 4, 60).find('W') != std::string::npos);
  }
}

// ----------------------------------------------------------------------------
// The explicit form of a schedule (torch.distributed.pipelining's _Action)
// ----------------------------------------------------------------------------
namespace {

std::string actions_string(const std::vector<PipeAction>& acts) {
  std::string s;
  for (const auto& a : acts) s += (s.empty() ? "" : " ") + action_string(a);
  return s;
}

/// A QueueTransport that records, per stage, every message it sends or receives as the
/// _Action it is (the virtual stage doing it: F crosses boundary b from b to b + 1, B from
/// b + 1 to b).
class RecordingTransport : public StageTransport {
 public:
  explicit RecordingTransport(int stages) : inner_(10), log_(static_cast<std::size_t>(stages)) {}
  void send(int src, int dst, char kind, int j, const torch::Tensor& t, int b) override {
    note(src, {kind == 'F' ? b : b + 1, kind == 'F' ? ComputationType::SEND_F : ComputationType::SEND_B, j});
    inner_.send(src, dst, kind, j, t, b);
  }
  torch::Tensor recv(int src, int dst, char kind, int j, int b) override {
    note(dst, {kind == 'F' ? b + 1 : b, kind == 'F' ? ComputationType::RECV_F : ComputationType::RECV_B, j});
    return inner_.recv(src, dst, kind, j, b);
  }
  void abort(const std::string& why) override { inner_.abort(why); }
  std::vector<std::vector<PipeAction>> log() const { return log_; }

 private:
  void note(int stage, PipeAction a) {
    std::lock_guard<std::mutex> lock(mu_);
    log_[static_cast<std::size_t>(stage)].push_back(a);
  }
  QueueTransport inner_;
  std::mutex mu_;
  std::vector<std::vector<PipeAction>> log_;
};

bool is_comm(const PipeAction& a) {
  return a.type == ComputationType::SEND_F || a.type == ComputationType::RECV_F || a.type == ComputationType::SEND_B ||
         a.type == ComputationType::RECV_B;
}

}  // namespace

TEST_CASE("to_actions: _Action's explicit send/recv; the executor sends and receives exactly those, in order",
          "[pipeline]") {
  const auto one = to_actions(make_schedule(ScheduleKind::OneFOneB, 2, 2));
  CHECK(actions_string(one[0]) == "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1");
  CHECK(actions_string(one[1]) == "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1");
  // Split backward: B is BACKWARD_INPUT ("I"), W is BACKWARD_WEIGHT with no message (stage 1 postpones
  // its W's by one microbatch: F0 B0 F1 B1 W0 W1).
  const auto zb = to_actions(make_schedule(ScheduleKind::ZBH1, 2, 2));
  CHECK(actions_string(zb[1]) == "1RECV_F0 1F0 1I0 1SEND_B0 1RECV_F1 1F1 1I1 1SEND_B1 1W0 1W1");
  // Interleaved: stage_index is the virtual stage k*p + s; rank 1's chunk 0 sends on to rank 0's chunk 1.
  const auto il = to_actions(make_schedule(ScheduleKind::Interleaved1F1B, 2, 2, 2), 2);
  CHECK(actions_string(il[1]).substr(0, 35) == "1RECV_F0 1F0 1SEND_F0 1RECV_F1 1F1 ");
  CHECK(actions_string(il[0]).find("2RECV_F0 2F0 2SEND_F0") != std::string::npos);
  CHECK_THROWS_AS(to_actions({{{'F', 0, 1}}}, 1), std::invalid_argument);
  // The executor's messages per stage are the lowered form's SEND/RECV, in the same order.
  seed_all(6);
  const auto layers = mlp_layers({6, 12, 12, 12, 12, 1});
  const auto x = torch::randn({8, 6});
  const auto y = torch::randn({8, 1});
  for (auto [kind, p, v] : {std::tuple{ScheduleKind::GPipe, 3, 1}, std::tuple{ScheduleKind::OneFOneB, 3, 1},
                            std::tuple{ScheduleKind::ZBH1, 3, 1}, std::tuple{ScheduleKind::Interleaved1F1B, 2, 2}}) {
    INFO(schedule_name(kind) << " p=" << p);
    const auto sched = make_schedule(kind, p, 4, v);
    RecordingTransport tr(p);
    run_pipeline(MlpStage(layers, stage_ranges(5, balanced_cuts(5, p * v))), sched, 4, x, y, SyntheticCost{}, tr);
    const auto lowered = to_actions(sched, v);
    for (int s = 0; s < p; ++s) {
      std::vector<PipeAction> comm;
      for (const auto& a : lowered[static_cast<std::size_t>(s)])
        if (is_comm(a)) comm.push_back(a);
      CHECK(actions_string(tr.log()[static_cast<std::size_t>(s)]) == actions_string(comm));
    }
  }
}

TEST_CASE("executor: fewer threads than stages (workers) run the same programs, bit for bit", "[pipeline][workers]") {
  // Each stage's program in order whichever thread runs it: every loss, gradient, op order,
  // peak held and peak byte count equals one thread per stage's, for every schedule kind and
  // every way of grouping 4 stages onto 1, 2 or 3 threads (3: stages {0}, {1}, {2, 3}).
  seed_all(8);
  const auto layers = mlp_layers({6, 12, 12, 12, 12, 12, 12, 12, 1});  // 8 layers: 4 stages x 2 chunks
  const auto x = torch::randn({16, 6});
  const auto y = torch::randn({16, 1});
  for (auto [kind, v] : {std::pair{ScheduleKind::GPipe, 1}, std::pair{ScheduleKind::OneFOneB, 1},
                         std::pair{ScheduleKind::Interleaved1F1B, 2}, std::pair{ScheduleKind::ZBH1, 1},
                         std::pair{ScheduleKind::ZBV, 2}}) {
    const auto sched = make_schedule(kind, 4, 8, v);
    const auto ranges = stage_ranges(8, balanced_cuts(8, 4 * v));
    const auto placement = schedule_placement(kind);
    QueueTransport t0(10);
    const auto base = run_pipeline(MlpStage(layers, ranges), sched, 8, x, y, SyntheticCost{}, t0, placement);
    for (int workers : {1, 2, 3}) {
      INFO(schedule_name(kind) << " workers=" << workers);
      QueueTransport tr(10);
      const auto run = run_pipeline(MlpStage(layers, ranges), sched, 8, x, y, SyntheticCost{}, tr, placement, workers);
      CHECK(run.loss == base.loss);
      CHECK(max_diff(base.grads, run.grads) == 0.0);
      CHECK(run.peak_held == base.peak_held);
      CHECK(run.peak_bytes == base.peak_bytes);
      REQUIRE(run.events.size() == base.events.size());
      for (std::size_t i = 0; i < run.events.size(); ++i) {  // stage-major, program order
        CHECK(run.events[i].stage == base.events[i].stage);
        CHECK(run.events[i].op.kind == base.events[i].op.kind);
        CHECK(run.events[i].op.microbatch == base.events[i].op.microbatch);
        CHECK(run.events[i].op.chunk == base.events[i].op.chunk);
        CHECK(run.events[i].wait_s >= 0.0);
        CHECK(run.events[i].end_s >= run.events[i].start_s);
      }
    }
  }
  // Failures end the step with the failing stage named, as with one thread per stage.
  seed_all(0);
  std::vector<torch::nn::Linear> bad = {torch::nn::Linear(4, 4), torch::nn::Linear(5, 1), torch::nn::Linear(1, 1)};
  for (int workers : {1, 2}) {
    QueueTransport tr(5);
    CHECK_THROWS_WITH(run_pipeline(MlpStage(bad, stage_ranges(3, {1, 2})), make_schedule(ScheduleKind::GPipe, 3, 2), 2,
                                   torch::randn({4, 4}), torch::randn({4, 1}), SyntheticCost{}, tr, Placement::Loop,
                                   workers),
                      Catch::Contains("stage 1 failed"));
  }
  // A message that never comes: the thread's waiting stage times out, named with what it waits for.
  const auto two = mlp_layers({4, 4, 1});
  QueueTransport slow(0.05);
  CHECK_THROWS_WITH(run_pipeline(MlpStage(two, stage_ranges(2, {1})), {{}, {{'F', 0}, {'B', 0}}}, 1,
                                 torch::randn({2, 4}), torch::randn({2, 1}), SyntheticCost{}, slow, Placement::Loop, 1),
                    Catch::Contains("stage 1: no activation for microbatch 0 from stage 0 within 0.05 s"));
  // Several stages on one thread need the mailbox's non-blocking look (QueueTransport); workers >= 0.
  RecordingTransport rec(2);
  CHECK_THROWS_AS(run_pipeline(MlpStage(two, stage_ranges(2, {1})), make_schedule(ScheduleKind::GPipe, 2, 1), 1,
                               torch::randn({2, 4}), torch::randn({2, 1}), SyntheticCost{}, rec, Placement::Loop, 1),
                  std::invalid_argument);
  QueueTransport tq(5);
  CHECK_THROWS_AS(run_pipeline(MlpStage(two, stage_ranges(2, {1})), make_schedule(ScheduleKind::GPipe, 2, 1), 1,
                               torch::randn({2, 4}), torch::randn({2, 1}), SyntheticCost{}, tq, Placement::Loop, -1),
                  std::invalid_argument);
}

TEST_CASE("stage_thread_cpus: distinct CPUs of this process's affinity, or none", "[pipeline][workers]") {
  const int cores = usable_cores();
  for (int threads = 1; threads <= cores; ++threads) {
    const auto cpus = stage_thread_cpus(threads);
    INFO("threads=" << threads << " usable cores=" << cores);
    if (cores < 2) {
      CHECK(cpus.empty());
      continue;
    }
    REQUIRE(cpus.size() == static_cast<std::size_t>(threads));
    CHECK(std::set<int>(cpus.begin(), cpus.end()).size() == cpus.size());
    cpu_set_t set;
    CPU_ZERO(&set);
    REQUIRE(sched_getaffinity(0, sizeof(set), &set) == 0);
    for (int c : cpus) CHECK(CPU_ISSET(c, &set));
  }
  CHECK(stage_thread_cpus(cores + 1).empty());  // more threads than CPUs: none bound
  CHECK(stage_thread_cpus(0).empty());
}

TEST_CASE("executor: bound stage threads let their CPUs go once they do not get them", "[pipeline][workers]") {
  // Two stages that sleep 3 ms an op (a synthetic cost): two threads, bound when there are 2+
  // usable CPUs, each with almost none of its CPU's time over the step: the binding is dropped
  // for the rest of the process and the reason named.
  seed_all(1);
  const auto layers = mlp_layers({4, 4, 1});
  SyntheticCost sleepy;
  sleepy.forward_us = 3000;
  QueueTransport tr(10);
  run_pipeline(MlpStage(layers, stage_ranges(2, {1})), make_schedule(ScheduleKind::GPipe, 2, 1), 1, torch::randn({2, 4}),
               torch::randn({2, 1}), sleepy, tr);
  const std::string after = stage_threads_binding();
  INFO(after);
  if (usable_cores() < 2)
    CHECK(after == "not bound (more threads than usable CPUs, or one CPU)");
  else
    CHECK_THAT(after, Catch::Matches("not bound: unbound after step [0-9]+ of this process: thread [01] had [0-9]+ % of "
                                     "CPU [0-9]+ over [0-9.]+ ms \\(it waited: for a message, a synthetic sleep or another process "
                                     "on that CPU\\)"));
  // From then on no step binds: the next one reports the reason again.
  QueueTransport tr2(10);
  run_pipeline(MlpStage(layers, stage_ranges(2, {1})), make_schedule(ScheduleKind::GPipe, 2, 1), 1, torch::randn({2, 4}),
               torch::randn({2, 1}), SyntheticCost{}, tr2);
  CHECK(stage_threads_binding() == after);
}

TEST_CASE("stage threads compute with the process's intra-op threads", "[pipeline][workers]") {
  // LibTorch's thread counts are per thread (OpenMP's ICV, MKL's local count): a stage thread
  // that never set them ran MKL on every core. Each of W stage threads gets the caller's T (the
  // same reduction order as one thread over the whole model).
  const int was = at::get_num_threads();
  for (const int t : {1, 2, 4}) {
    at::set_num_threads(t);
    for (const std::size_t w : {1u, 2u, 3u}) {
      CHECK(stage_thread_intra_op() == t);
      std::vector<int> seen(w, 0);
      std::vector<std::function<void()>> tasks;
      for (std::size_t i = 0; i < w; ++i) tasks.emplace_back([&seen, i] { seen[i] = at::get_num_threads(); });
      run_on_stage_threads(tasks);
      for (const int n : seen) CHECK(n == t);
    }
  }
  at::set_num_threads(was);
}

// ----------------------------------------------------------------------------
// A transformer on the executor: the tiny GPT cut into two stages
// ----------------------------------------------------------------------------
namespace {

/// The tiny GPT (core/models/gpt.hpp) as a pipeline stage function: chunk 0 = the embeddings (wte +
/// wpe) and blocks [0, cut); chunk 1 = blocks [cut, L), ln_f and lm_head; the loss gpt_loss
/// (cross-entropy). The same modules and the same operations as TinyGptImpl::forward, in the
/// same order. No weight-gradient roots: the split backward takes the generic path.
class GptStages : public PipelineStage {
 public:
  GptStages(TinyGpt model, int cut) : m_(std::move(model)), cut_(cut) {}
  int chunks() const override { return 2; }
  torch::Tensor forward(int chunk, const torch::Tensor& x, ChunkSaved* saved) const override {
    GptHook keep;  // every intermediate the forward names is an activation kept for backward
    if (saved)
      keep = [saved](const torch::Tensor& t, const std::string&) {
        saved->activations.push_back(t);
        return t;
      };
    auto site = [&](const torch::Tensor& t) { return keep ? keep(t, "") : t; };
    const int L = static_cast<int>(m_->blocks.size());
    torch::Tensor h;
    if (chunk == 0) {
      auto pos = torch::arange(x.size(1), torch::TensorOptions().dtype(torch::kLong).device(x.device()));
      h = site(m_->wte->forward(x) + m_->wpe->forward(pos));
      for (int i = 0; i < cut_; ++i) h = m_->blocks[static_cast<std::size_t>(i)]->forward(h, keep);
      return h;
    }
    h = x;
    for (int i = cut_; i < L; ++i) h = m_->blocks[static_cast<std::size_t>(i)]->forward(h, keep);
    h = site(m_->ln_f->forward(h));
    return site(torch::linear(h, m_->lm_head->weight, m_->lm_head->bias));
  }
  std::vector<torch::Tensor> parameters(int chunk) const override {
    std::vector<torch::Tensor> ps;
    auto add = [&](const torch::nn::Module& mod) {
      for (const auto& p : mod.parameters()) ps.push_back(p);
    };
    const int L = static_cast<int>(m_->blocks.size());
    if (chunk == 0) {
      add(*m_->wte);
      add(*m_->wpe);
    }
    for (int i = chunk == 0 ? 0 : cut_; i < (chunk == 0 ? cut_ : L); ++i) add(*m_->blocks[static_cast<std::size_t>(i)]);
    if (chunk == 1) {
      add(*m_->ln_f);
      add(*m_->lm_head);
    }
    return ps;
  }
  torch::Tensor loss(const torch::Tensor& y, const torch::Tensor& target) const override { return gpt_loss(y, target); }
  std::vector<int64_t> output_shape(int, const std::vector<int64_t>& mb) const override {
    return {mb.at(0), mb.at(1), m_->cfg.width};  // [rows, T, C]: the residual stream
  }

 private:
  mutable TinyGpt m_;  // forward() of the modules is not const; the chunks touch disjoint modules
  int cut_;
};

GptConfig pipe_gpt() {
  GptConfig c;
  c.vocab = 11;
  c.context = 8;
  c.width = 16;
  c.heads = 4;
  c.layers = 4;
  return c;
}

/// The unpipelined GPT's gradients, accumulated microbatch by microbatch in `order`: for each
/// j, gpt_loss(model(x_j), y_j) / m, backward (AccumulateGrad adds into .grad); returned in the
/// stage function's parameter order.
std::vector<torch::Tensor> gpt_microbatch_grads(TinyGpt model, const GptStages& stages, const torch::Tensor& x,
                                                const torch::Tensor& y, int m, const std::vector<int>& order) {
  std::vector<torch::Tensor> params;
  for (int c = 0; c < stages.chunks(); ++c)
    for (auto& p : stages.parameters(c)) params.push_back(p);
  clear_grads(params);
  const auto xs = x.chunk(m, 0), ys = y.chunk(m, 0);
  for (int j : order)
    (gpt_loss(model->forward(xs[static_cast<std::size_t>(j)]), ys[static_cast<std::size_t>(j)]) / m).backward();
  return clone_grads(params);
}

}  // namespace

TEST_CASE("a transformer on the executor: the tiny GPT in 2 stages gives the unpipelined microbatch gradients bitwise "
          "(GPipe, 1F1B, ZB-H1)", "[pipeline][gpt]") {
  seed_all(21);
  TinyGpt model(pipe_gpt());
  const GptStages stages(model, /*cut=*/2);
  const auto x = torch::randint(11, {8, 8}, torch::kLong);  // 8 sequences of 8 tokens
  const auto y = torch::randint(11, {8, 8}, torch::kLong);
  for (int m : {1, 2, 4}) {
    std::vector<int> order(static_cast<std::size_t>(m));
    for (int j = 0; j < m; ++j) order[static_cast<std::size_t>(j)] = j;
    const auto ref = gpt_microbatch_grads(model, stages, x, y, m, order);
    for (auto kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::ZBH1}) {
      INFO(schedule_name(kind) << " m=" << m);
      const auto sched = make_schedule(kind, 2, m);
      QueueTransport tr(10);
      const auto run = run_pipeline(stages, sched, m, x, y, SyntheticCost{}, tr);
      REQUIRE(run.grads.size() == ref.size());
      CHECK(all_equal(ref, run.grads));
      CHECK(max_diff(ref, run.grads) == 0.0);
      CHECK(run.peak_held == peak_in_flight(sched));
      CHECK(run.events.size() == static_cast<std::size_t>(2 * m * (kind == ScheduleKind::ZBH1 ? 3 : 2)));
    }
    // The check can fail: the same microbatches accumulated in reverse order round differently.
    if (m == 4) {
      const auto reversed = gpt_microbatch_grads(model, stages, x, y, m, {3, 2, 1, 0});
      CHECK_FALSE(all_equal(ref, reversed));
    }
  }
  // One process per stage (Gloo send/recv of the [2, 8, 16] residual stream): the same gradients.
  using namespace std::chrono_literals;
  auto groups = thread_groups(2, "ut_pipe_gpt/", 10000ms);
  std::vector<TinyGpt> copies;
  for (int r = 0; r < 2; ++r) {
    seed_all(21);
    copies.emplace_back(pipe_gpt());
  }
  const auto sched = make_schedule(ScheduleKind::ZBH1, 2, 4);
  QueueTransport tr(10);
  const auto threaded = run_pipeline(stages, sched, 4, x, y, SyntheticCost{}, tr);
  std::vector<PipelineRun> runs(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> ts;
  for (std::size_t r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      try {
        runs[r] = run_pipeline_process(groups[r], GptStages(copies[r], 2), sched, 4, x, y, SyntheticCost{});
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (std::size_t r = 0; r < 2; ++r) {
    REQUIRE(errors[r].empty());
    CHECK(all_equal(threaded.grads, runs[r].grads));
    CHECK(runs[r].loss == threaded.loss);
  }
}

// ----------------------------------------------------------------------------
// ZB-V: two chunks per rank in a V (Qi et al. 2023 §6; torch's ScheduleZBVZeroBubble)
// ----------------------------------------------------------------------------

TEST_CASE("ZB-V: torch's ScheduleZBVZeroBubble programs (p=2, m=4; p=3, m=2), the V placement", "[pipeline][zb]") {
  CHECK(parse_schedule("zb-v") == ScheduleKind::ZBV);
  CHECK(schedule_name(ScheduleKind::ZBV) == "zb-v");
  CHECK(schedule_placement(ScheduleKind::ZBV) == Placement::V);
  CHECK(schedule_placement(ScheduleKind::ZBH1) == Placement::Loop);
  // Printed by torch 2.15's ScheduleZBVZeroBubble._calculate_single_rank_operations (rank, stage
  // index -> chunk 0 when it is the rank's own index, else 1; I as B), Nones dropped.
  const auto two = make_schedule(ScheduleKind::ZBV, 2, 4, 2);
  CHECK(schedule_string(two[0]) == "F0.0 F1.0 F2.0 F0.1 B0.1 W0.1 F1.1 B1.1 W1.1 F3.0 B0.0 W0.0 F2.1 B2.1 W2.1 B1.0 "
                                   "W1.0 F3.1 B3.1 W3.1 B2.0 W2.0 B3.0 W3.0");
  CHECK(schedule_string(two[1]) == "F0.0 F0.1 F1.0 F1.1 B0.1 W0.1 F2.0 B0.0 W0.0 F2.1 B1.1 W1.1 F3.0 B1.0 W1.0 F3.1 "
                                   "B2.1 W2.1 B2.0 B3.1 B3.0 W2.0 W3.1 W3.0");
  const auto three = make_schedule(ScheduleKind::ZBV, 3, 2, 2);  // m < 2p - 1: torch's padding dropped
  CHECK(schedule_string(three[0]) == "F0.0 F1.0 F0.1 B0.1 W0.1 F1.1 B1.1 W1.1 B0.0 W0.0 B1.0 W1.0");
  CHECK(schedule_string(three[1]) == "F0.0 F1.0 F0.1 F1.1 B0.1 W0.1 B1.1 W1.1 B0.0 W0.0 B1.0 W1.0");
  CHECK(schedule_string(three[2]) == "F0.0 F0.1 F1.0 F1.1 B0.1 W0.1 B0.0 W0.0 B1.1 W1.1 B1.0 W1.0");
  // V: rank s holds virtual stages s and 2p - 1 - s; loop: s, s + p.
  for (int s = 0; s < 4; ++s) {
    CHECK(virtual_stage(s, 0, 4, Placement::V) == s);
    CHECK(virtual_stage(s, 1, 4, Placement::V) == 7 - s);
    CHECK(virtual_stage(s, 1, 4, Placement::Loop) == 4 + s);
    for (int k = 0; k < 2; ++k)
      for (auto pl : {Placement::Loop, Placement::V}) CHECK(stage_rank(virtual_stage(s, k, 4, pl), 4, pl) == s);
  }
  CHECK_THROWS_AS(virtual_stage(0, 2, 4, Placement::V), std::invalid_argument);
  CHECK_THROWS_AS(stage_rank(8, 4, Placement::V), std::invalid_argument);
  CHECK_THROWS_AS(make_schedule(ScheduleKind::ZBV, 2, 4), std::invalid_argument);  // chunks 1
  CHECK_THROWS_AS(make_schedule(ScheduleKind::ZBV, 2, 4, 3), std::invalid_argument);
  // The turn has no SEND/RECV (torch's _has_comms): rank 1 (p = 2) hands virtual stage 1's output
  // to virtual stage 2 locally, and its gradient back.
  const auto acts = to_actions(make_schedule(ScheduleKind::ZBV, 2, 1, 2), 2, Placement::V);
  CHECK(actions_string(acts[1]) == "1RECV_F0 1F0 2F0 2SEND_F0 2RECV_B0 2I0 2W0 1I0 1SEND_B0 1W0");
  CHECK(actions_string(acts[0]) == "0F0 0SEND_F0 3RECV_F0 3F0 3I0 3SEND_B0 3W0 0RECV_B0 0I0 0W0");
}

TEST_CASE("ZB-V: each F, B, W once per chunk, F < B < W, no deadlock, peak min(2p, 2m, m+1+s) <= 1F1B's, p <= 6, "
          "m <= 16", "[pipeline][zb]") {
  for (int p = 1; p <= 6; ++p)
    for (int m = 1; m <= 16; ++m) {
      INFO("p=" << p << " m=" << m);
      const auto sched = make_schedule(ScheduleKind::ZBV, p, m, 2);
      for (int s = 0; s < p; ++s) {
        std::map<std::tuple<char, int, int>, int> seen;  // (kind, microbatch, chunk) -> position
        const auto& ops = sched[static_cast<std::size_t>(s)];
        for (std::size_t i = 0; i < ops.size(); ++i) {
          CHECK(seen.count({ops[i].kind, ops[i].microbatch, ops[i].chunk}) == 0);
          seen[{ops[i].kind, ops[i].microbatch, ops[i].chunk}] = static_cast<int>(i);
        }
        CHECK(ops.size() == static_cast<std::size_t>(6 * m));
        for (int j = 0; j < m; ++j)
          for (int k = 0; k < 2; ++k) {
            REQUIRE(seen.count({'W', j, k}) == 1);
            CHECK(seen.at({'F', j, k}) < seen.at({'B', j, k}));
            CHECK(seen.at({'B', j, k}) < seen.at({'W', j, k}));
            if (j > 0) CHECK(seen.at({'W', j - 1, k}) < seen.at({'W', j, k}));  // GPipe's accumulation order
          }
      }
      // The replay under the V placement runs to the end (throws on a deadlock).
      const auto sim = simulate_schedule(sched, costs(2 * p, 1), costs(2 * p, 1), costs(2 * p, 1), Placement::V);
      CHECK(sim.events.size() == static_cast<std::size_t>(6 * m * p));
      const auto peaks = peak_in_flight(sched);
      for (int s = 0; s < p; ++s) {
        CHECK(peaks[static_cast<std::size_t>(s)] == zbv_peak_theory(p, m, s));
        // 2p chunk activations = p stages': 1F1B's peak (stage 0 holds min(p, m) microbatches).
        CHECK(peaks[static_cast<std::size_t>(s)] <= 2 * std::min(p, m));
      }
    }
  CHECK_THROWS_AS(zbv_peak_theory(2, 4, 2), std::invalid_argument);
}

TEST_CASE("time model: ZB-V idles max(p-1, 4p-2-2m) chunk times per rank with F = B = W (1F1B 9x, ZB-H1 3x more at "
          "m = 2p)", "[pipeline][zb]") {
  for (int p = 1; p <= 6; ++p)
    for (int m = 1; m <= 16; ++m) {
      INFO("p=" << p << " m=" << m);
      const double t = 2;  // per chunk: a stage (2 chunks) takes F = B = W = 4
      const auto sim = simulate_schedule(make_schedule(ScheduleKind::ZBV, p, m, 2), costs(2 * p, t), costs(2 * p, t),
                                         costs(2 * p, t), Placement::V);
      CHECK(mean_idle(sim) == bubble_time_theory(ScheduleKind::ZBV, p, m, 2 * t, 2 * t, 2 * t));
      CHECK(sim.step_s == 6 * m * t + mean_idle(sim));  // every rank is busy 6m chunk times
      if (m >= 2 * p - 1)
        for (double busy : sim.busy_s) CHECK(sim.step_s - busy == (p - 1) * t);  // the same on every rank
    }
  // Per stage F = B = W = 1 at p = 4, m = 8: 1F1B 9, ZB-H1 3, ZB-V 1.5 (3 chunk forwards of 0.5).
  CHECK(bubble_time_theory(ScheduleKind::OneFOneB, 4, 8, 1, 1, 1) == 9);
  CHECK(bubble_time_theory(ScheduleKind::ZBH1, 4, 8, 1, 1, 1) == 3);
  CHECK(bubble_time_theory(ScheduleKind::ZBV, 4, 8, 1, 1, 1) == 1.5);
  CHECK_THROWS_AS(bubble_time_theory(ScheduleKind::ZBV, 4, 8, 1, 1, 0.5), std::invalid_argument);
  // The V placement is needed: the programs under the loop placement wait on each other.
  CHECK_THROWS_AS(simulate_schedule(make_schedule(ScheduleKind::ZBV, 3, 6, 2), costs(6, 1), costs(6, 1), costs(6, 1)),
                  std::logic_error);
}

TEST_CASE("B/W split in a V: ZB-V's gradients are GPipe's bit for bit (torch::equal), threads; the turn is local",
          "[pipeline][zb]") {
  seed_all(5);
  const auto layers = mlp_layers({6, 12, 12, 12, 12, 12, 1});
  const auto x = torch::randn({16, 6});
  const auto y = torch::randn({16, 1});
  const auto full = full_batch_grads(layers, x, y);
  for (int p : {1, 2, 3})
    for (int m : {1, 2, 4, 8}) {
      INFO("p=" << p << " m=" << m);
      QueueTransport trg(10);
      const auto gpipe = run_pipeline(MlpStage(layers, stage_ranges(6, balanced_cuts(6, p))),
                                      make_schedule(ScheduleKind::GPipe, p, m), m, x, y, SyntheticCost{}, trg);
      const auto sched = make_schedule(ScheduleKind::ZBV, p, m, 2);
      const auto v_ranges = stage_ranges(6, balanced_cuts(6, 2 * p));  // 2p chunks: rank s runs s and 2p-1-s
      RecordingTransport tr(p);
      const auto zb = run_pipeline(MlpStage(layers, v_ranges), sched, m, x, y, SyntheticCost{}, tr, Placement::V);
      CHECK(all_equal(gpipe.grads, zb.grads));
      CHECK(zb.loss == gpipe.loss);  // on rank 0, which holds the last virtual stage
      CHECK(max_diff(full, zb.grads) < 1e-6);
      CHECK(zb.events.size() == static_cast<std::size_t>(6 * m * p));
      CHECK(zb.peak_held == peak_in_flight(sched));
      // The messages are the lowered form's, none at the turn (rank p-1 keeps its own tensors).
      const auto lowered = to_actions(sched, 2, Placement::V);
      for (int s = 0; s < p; ++s) {
        std::vector<PipeAction> comm;
        for (const auto& a : lowered[static_cast<std::size_t>(s)])
          if (is_comm(a)) comm.push_back(a);
        CHECK(actions_string(tr.log()[static_cast<std::size_t>(s)]) == actions_string(comm));
        for (const auto& a : comm) CHECK_FALSE(((a.stage == p - 1 && (a.type == ComputationType::SEND_F ||
                                                                      a.type == ComputationType::RECV_B)) ||
                                                (a.stage == p && (a.type == ComputationType::RECV_F ||
                                                                  a.type == ComputationType::SEND_B))));
      }
    }
  // A V needs 2 chunks per stage.
  QueueTransport tr(10);
  CHECK_THROWS_AS(run_pipeline(MlpStage(layers, stage_ranges(6, balanced_cuts(6, 3))),
                               make_schedule(ScheduleKind::ZBV, 1, 1, 2), 1, x, y, SyntheticCost{}, tr, Placement::V),
                  std::invalid_argument);
}

TEST_CASE("ZB-V on the tiny GPT: one rank, both chunks (the whole V local), GPipe's microbatch gradients bitwise",
          "[pipeline][gpt][zb]") {
  seed_all(21);
  TinyGpt model(pipe_gpt());
  const GptStages stages(model, /*cut=*/2);
  const auto x = torch::randint(11, {8, 8}, torch::kLong);
  const auto y = torch::randint(11, {8, 8}, torch::kLong);
  for (int m : {1, 4}) {
    std::vector<int> order(static_cast<std::size_t>(m));
    for (int j = 0; j < m; ++j) order[static_cast<std::size_t>(j)] = j;
    const auto ref = gpt_microbatch_grads(model, stages, x, y, m, order);
    const auto sched = make_schedule(ScheduleKind::ZBV, 1, m, 2);
    QueueTransport tr(10);
    const auto run = run_pipeline(stages, sched, m, x, y, SyntheticCost{}, tr, Placement::V);
    CHECK(all_equal(ref, run.grads));
    CHECK(run.peak_held == peak_in_flight(sched));
  }
}

TEST_CASE("one process per stage, ZB-V over Gloo: the threaded executor's gradients bitwise, GPipe's",
          "[pipeline][dist][zb]") {
  const int p = 2;
  const std::vector<int64_t> widths = {6, 12, 12, 12, 1};  // 4 layers: 2p = 4 chunks of one
  std::vector<std::vector<torch::nn::Linear>> copies;
  for (int r = 0; r <= p; ++r) {
    seed_all(11);
    copies.push_back(mlp_layers(widths));
  }
  const auto x = torch::randn({8, 6});
  const auto y = torch::randn({8, 1});
  const auto v_ranges = stage_ranges(4, balanced_cuts(4, 2 * p));
  auto groups = thread_groups(p, "ut_pipe_zbv/", 10000ms);
  auto backward_groups = thread_groups(p, "ut_pipe_zbv_bwd/", 10000ms);
  for (int m : {1, 4}) {
    INFO("m=" << m);
    const auto sched = make_schedule(ScheduleKind::ZBV, p, m, 2);
    const auto runs = run_ranks(groups, backward_groups, copies, v_ranges, sched, m, x, y, Placement::V);
    QueueTransport trg(10), trv(10);
    const auto gpipe = run_pipeline(MlpStage(copies[p], stage_ranges(4, balanced_cuts(4, p))),
                                    make_schedule(ScheduleKind::GPipe, p, m), m, x, y, SyntheticCost{}, trg);
    const auto threaded = run_pipeline(MlpStage(copies[p], v_ranges), sched, m, x, y, SyntheticCost{}, trv, Placement::V);
    for (const auto& run : runs) {
      CHECK(all_equal(threaded.grads, run.grads));
      CHECK(all_equal(gpipe.grads, run.grads));
      CHECK(run.loss == threaded.loss);
      CHECK(run.peak_held == peak_in_flight(sched));
      CHECK(run.events.size() == static_cast<std::size_t>(6 * m * p));
    }
  }
  // The transport knows the V: boundary 1 (the turn) joins rank 1 to itself, not to rank 0.
  CHECK_THROWS_AS(ProcessGroupTransport(groups[0], {{4, 12}, {4, 12}, {4, 12}}, nullptr, Placement::V).send(
                      0, 1, 'F', 0, torch::zeros({4, 12}), 1),
                  std::invalid_argument);
}

TEST_CASE("executor: ZB-V's measured bubble within 0.05 of the time model's with F = B = W", "[pipeline][timing][zb]") {
  seed_all(0);
  const auto layers = mlp_layers({8, 8, 8, 8, 8, 8, 8, 8, 8});
  const auto x = torch::randn({8, 8});
  const auto y = torch::randn({8, 8});
  const auto v_ranges = stage_ranges(8, balanced_cuts(8, 8));  // p = 4: 8 chunks of one layer
  SyntheticCost cost;
  cost.forward_us = 10000;  // F = B = W = 10 ms per chunk
  cost.backward_factor = 2;
  cost.weight_factor = 1;
  const auto sched = make_schedule(ScheduleKind::ZBV, 4, 4, 2);
  std::vector<PipelineRun> steps;
  for (int i = 0; i < 3; ++i) {
    QueueTransport tr(10);
    steps.push_back(run_pipeline(MlpStage(layers, v_ranges), sched, 4, x, y, cost, tr, Placement::V));
  }
  std::sort(steps.begin(), steps.end(), [](const auto& a, const auto& b) { return a.step_s < b.step_s; });
  const auto& run = steps[1];
  // The time model: 6m = 24 chunk times busy, idle max(p-1, 4p-2-2m) = 6: step 30 x 10 ms, bubble 0.2.
  const auto sim = simulate_schedule(sched, costs(8, 0.01), costs(8, 0.01), costs(8, 0.01), Placement::V);
  INFO("measured bubble " << measured_bubble(run) << ", model " << measured_bubble(sim) << "; idle " << mean_idle(run)
                          << " s, model " << mean_idle(sim));
  CHECK(std::fabs(measured_bubble(run) - measured_bubble(sim)) < 0.05);
  CHECK(std::fabs(mean_idle(sim) - bubble_time_theory(ScheduleKind::ZBV, 4, 4, 0.02, 0.02, 0.02)) < 1e-12);
}
