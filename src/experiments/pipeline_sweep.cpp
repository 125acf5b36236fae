// `mpt pipeline`'s sweep (sections 3 and 4 of src/experiments/pipeline.cpp's comment): every
// schedule run for real on the bench, the measured bubble next to the theory and the time model,
// the step-end barrier, and the processes' gradients against the threads'. Every schedule trait
// used here is read from its row of the schedule table (core/pipeline/schedule.hpp).
#include <algorithm>
#include <functional>

#include "core/dist/dist.hpp"
#include "core/errors.hpp"
#include "core/models/mlp.hpp"
#include "core/pipeline/trace.hpp"
#include "core/runtime/runtime.hpp"
#include "core/runtime/trace.hpp"
#include "core/runtime/timing.hpp"
#include "experiments/pipeline_parts.hpp"

namespace mpt::pipe {

namespace {

constexpr double kMicrobatchTol = 1e-6;  // microbatched vs full-batch gradient: fp32 roundoff

// When each stage's last op ends, in ms: "27,27,27,27". `per_ms`: the run's time unit per ms
// (1e3 for the time model in µs, 1e-3 for a measured run in seconds).
std::string stage_ends_ms(const PipelineRun& run, int p, double per_ms = 1e3) {
  std::vector<double> ends(static_cast<std::size_t>(p), 0.0);
  for (const auto& e : run.events) ends[static_cast<std::size_t>(e.stage)] = std::max(ends[static_cast<std::size_t>(e.stage)], e.end_s);
  std::vector<std::string> parts;
  for (double e : ends) parts.push_back(fmt::format("{:.3g}", e / per_ms));
  return fmt::format("{}", fmt::join(parts, ","));
}

// F, B (input gradient), W (weight gradient) of each virtual stage of `r`, µs, from the
// synthetic cost (the heavy stage's factor on the rank that holds it).
struct OpCosts {
  std::vector<double> f, b, w;
};
OpCosts op_costs(const Bench& bench, const Ranges& r, Placement placement) {
  const auto& cost = bench.cost;
  OpCosts out;
  for (std::size_t c = 0; c < r.size(); ++c) {
    const auto [lo, hi] = r[c];
    const double fc = cost.forward_us *
                      cost.stage_factor[static_cast<std::size_t>(stage_rank(static_cast<int>(c), bench.p, placement))] *
                      (hi - lo);
    out.f.push_back(fc);
    out.b.push_back(fc * (cost.backward_factor - cost.weight_factor));
    out.w.push_back(fc * cost.weight_factor);
  }
  return out;
}

// One point of the sweep: schedule `spec` (config name k) at m microbatches.
struct Point {
  const ScheduleSpec& spec;
  std::string k, name;
  int m, chunks;
  Placement placement;
  const Ranges& ranges;
  std::vector<std::vector<PipeOp>> sched;
  bool chunked() const { return chunks > 1; }  // more than one model chunk per stage
};

// Several identical steps; timings from the median one (the machine may be shared), numbers
// checked to be bitwise the same in every step (check_gradients).
std::vector<PipelineRun> timed_steps(Bench& bench, const Point& pt) {
  std::vector<PipelineRun> steps;
  PipelineTraceRun traced(pt.name, pt.k, pt.m, pt.chunks, pt.placement);
  for (int i = 0; i < bench.n_steps; ++i)
    steps.push_back(bench.step(pt.sched, pt.m, pt.ranges, bench.x, bench.y, pt.placement));
  return steps;
}

const PipelineRun& median_step(const std::vector<PipelineRun>& steps) {
  std::vector<std::size_t> order(steps.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return steps[a].step_s < steps[b].step_s; });
  return steps[order[order.size() / 2]];
}

// The gradient checks: against the full batch, step against step, against gpipe's. Returns the
// max abs difference to the full batch.
double check_gradients(const Bench& bench, const Point& pt, const std::vector<PipelineRun>& steps,
                       const PipelineRun& run, SweepTables& st, Report& report) {
  const auto& full = bench.full;
  double gdiff = 0;
  for (std::size_t i = 0; i < full.size(); ++i) gdiff = nan_max(gdiff, max_abs_diff(full[i], run.grads[i]));
  report.check(pt.name + ": microbatched == full-batch gradient, max abs diff", gdiff, kMicrobatchTol);
  double repeat = 0;
  for (const auto& s : steps)
    for (std::size_t i = 0; i < full.size(); ++i) repeat = nan_max(repeat, max_abs_diff(steps[0].grads[i], s.grads[i]));
  report.check(pt.name + ": every step gives the same gradient (bitwise)", repeat, 0.0);
  if (bench.processes) st.process_grads.push_back({pt.name, pt.spec.kind, pt.m, run.grads});
  if (pt.spec.gradient_reference) st.reference_grads[pt.m] = run.grads;
  if (pt.spec.matches_reference && st.reference_grads.count(pt.m)) {
    // Every layer accumulates its microbatch gradients in the same order (B0, B1, ...;
    // zb-h1, zb-v: W0, W1, ... per chunk) in every schedule, and a cut (interleaved and zb-v cut
    // into more chunks than gpipe's stages) changes no arithmetic, so the
    // results are bitwise identical. zb-h1's W runs the fused backward's weight-gradient
    // kernels (the same AddmmBackward node) on the same numbers.
    double d = 0;
    for (std::size_t i = 0; i < full.size(); ++i)
      d = nan_max(d, max_abs_diff(st.reference_grads[pt.m][i], run.grads[i]));
    report.check(pt.name + fmt::format(": {} gradient == gpipe gradient (bitwise)", pt.k), d, 0.0);
  }
  return gdiff;
}

// Peak activations: the measured count must equal the schedule's, and obey the row's bound
// (and its exact per-rank peak where it has one: zb-v). Returns the largest stage's peak
// (microbatch, chunk) pairs and bytes.
std::pair<int, int64_t> check_peaks(const Bench& bench, const Point& pt, const PipelineRun& run, Report& report) {
  const int p = bench.p, m = pt.m;
  const auto expect = peak_in_flight(pt.sched);
  int mismatch = 0, peak = 0;
  int64_t peak_bytes = 0;  // measured: the most activation bytes a stage held at once
  for (int s = 0; s < p; ++s) {
    mismatch += run.peak_held[static_cast<std::size_t>(s)] != expect[static_cast<std::size_t>(s)];
    peak = std::max(peak, run.peak_held[static_cast<std::size_t>(s)]);
    peak_bytes = std::max(peak_bytes, run.peak_bytes[static_cast<std::size_t>(s)]);
  }
  report.check(pt.name + ": stages whose measured peak differs from the schedule's", mismatch, 0.0);
  const int bound = pt.spec.peak_bound(p, m, bench.v);
  if (pt.spec.rank_peak) {
    int off = 0;  // ranks whose measured peak is not the theory's
    for (int s = 0; s < p; ++s) off += run.peak_held[static_cast<std::size_t>(s)] != pt.spec.rank_peak(p, m, s);
    report.check(pt.name + ": ranks whose measured peak differs from min(2p, 2m, m+1+s)", off, 0.0);
  }
  report.check(pt.name + fmt::format(": peak {} held - bound ({})",
                                     pt.chunked() ? "(microbatch, chunk) pairs" : "microbatches", bound),
               std::max(0, peak - bound), 0.0);
  return {peak, peak_bytes};
}

// The step model of one point: the op costs, the programs replayed (simulate_schedule), the
// model's step and the bubble theory of the sweep table.
struct StepModel {
  OpCosts c;
  PipelineRun sim;
  double sim_idle_us = 0;  // per stage, mean
  double model_ms = 0;
  json sim_bubble, theory;
};
StepModel step_model(const Bench& bench, const Point& pt) {
  const auto& cost = bench.cost;
  const int p = bench.p;
  // Time model from the synthetic cost alone: the first microbatch crosses the first p
  // virtual stages, then the slowest (virtual) stage adds one F+B per further microbatch
  // and chunk: Σ_{c<p} t_c + (m·v − 1)·max_c t_c — (m + p − 1)·t for p equal stages,
  // (m·v + p − 1)·t/v interleaved.
  double sum_us = 0, max_us = 0;
  for (std::size_t c = 0; c < pt.ranges.size(); ++c) {
    const auto [b, e] = pt.ranges[c];
    const double us = cost.forward_us *
                      cost.stage_factor[static_cast<std::size_t>(stage_rank(static_cast<int>(c), p, pt.placement))] *
                      (e - b) * (1 + cost.backward_factor);
    if (c < static_cast<std::size_t>(p)) sum_us += us;
    max_us = std::max(max_us, us);
  }
  // The executor's time model (simulate_schedule: the programs replayed with the synthetic
  // cost of each op, communication free). A split backward's step is not the formula above (W
  // fills the cool-down), so its model is the simulation; F, B, W per virtual stage in µs.
  StepModel sm;
  sm.c = op_costs(bench, pt.ranges, pt.placement);
  sm.sim = simulate_schedule(pt.sched, sm.c.f, sm.c.b, sm.c.w, pt.placement);
  for (double busy : sm.sim.busy_s) sm.sim_idle_us += (sm.sim.step_s - busy) / p;
  const bool zb = pt.spec.splits_w;
  sm.model_ms = zb ? sm.sim.step_s / 1e3 : (sum_us + (pt.m * pt.chunks - 1) * max_us) / 1e3;
  // With no synthetic cost (/cost/forward_us = 0) the model's step is 0 s and its bubble has no value.
  sm.sim_bubble = sm.sim.step_s > 0 ? json(sm.sim_idle_us / sm.sim.step_s) : json(nullptr);
  sm.theory = zb ? sm.sim_bubble : json(bubble_theory(p, pt.m, pt.chunks));
  return sm;
}

// The zero_bubble rows of one point: Qi et al. 2023's per-stage bubble, for the slowest stage's
// F, B, W (equal stages: every stage's); with chunks, F, B, W of a whole rank (its chunks).
void zero_bubble_rows(const Bench& bench, const Point& pt, const StepModel& sm, const PipelineRun& run,
                      std::pair<int, int64_t> peak, SweepTables& st) {
  const int p = bench.p;
  const auto& c = sm.c;
  std::vector<double> fs = c.f, bs = c.b, ws = c.w;
  if (pt.chunked()) {
    fs.assign(static_cast<std::size_t>(p), 0.0);
    bs = ws = fs;
    for (int vc = 0; vc < p * pt.chunks; ++vc) {
      const auto r = static_cast<std::size_t>(stage_rank(vc, p, pt.placement));
      fs[r] += c.f[static_cast<std::size_t>(vc)];
      bs[r] += c.b[static_cast<std::size_t>(vc)];
      ws[r] += c.w[static_cast<std::size_t>(vc)];
    }
  }
  const std::size_t slow = static_cast<std::size_t>(std::max_element(fs.begin(), fs.end()) - fs.begin());
  // Equal stages only: under /cost/heavy_stage the formula does not apply ("-"); a closed form
  // for F = B = W only (zb-v) needs equal chunks too (else "-": the idle model replays it).
  const bool equal_chunks = std::adjacent_find(c.f.begin(), c.f.end(), std::not_equal_to<>()) == c.f.end();
  const bool formula_ok = bench.heavy < 0 && (!pt.spec.formula_needs_equal_fbw ||
                                              (equal_chunks && fs[slow] == bs[slow] && bs[slow] == ws[slow]));
  const json formula_ms =
      !formula_ok ? json(nullptr) : json(bubble_time_theory(pt.spec.kind, p, pt.m, fs[slow], bs[slow], ws[slow]) / 1e3);
  st.zero_bubble.rows.push_back({{"name", pt.name}, {"schedule", pt.k}, {"microbatches", pt.m},
                                 {"f_ms", fs[slow] / 1e3}, {"b_ms", bs[slow] / 1e3}, {"w_ms", ws[slow] / 1e3},
                                 {"idle_formula_ms", formula_ms}, {"idle_model_ms", sm.sim_idle_us / 1e3},
                                 {"step_model_ms", sm.sim.step_s / 1e3}, {"bubble_model", sm.sim_bubble},
                                 {"peak_held", peak.first}, {"peak_bytes", peak.second},
                                 {"stage_ends_model_ms", stage_ends_ms(sm.sim, p)}});
  double idle = 0;
  for (double busy : run.busy_s) idle += (run.step_s - busy) / p;
  st.zero_bubble_measured.rows.push_back({{"name", pt.name}, {"idle_formula_ms", formula_ms},
                                          {"idle_model_ms", sm.sim_idle_us / 1e3}, {"idle_ms", idle * 1e3},
                                          {"step_ms", run.step_s * 1e3}, {"bubble", measured_bubble(run)},
                                          {"stage_ends_ms", stage_ends_ms(run, p, 1e-3)}});
}

// The sweep and measured rows of one point, and its events (timings.events).
void sweep_rows(const Point& pt, const StepModel& sm, const PipelineRun& run, double gdiff, std::pair<int, int64_t> peak,
                SweepTables& st) {
  st.sweep.rows.push_back({{"name", pt.name}, {"schedule", pt.k}, {"microbatches", pt.m},
                           {"step_model_ms", sm.model_ms}, {"bubble_theory", sm.theory}, {"peak_held", peak.first},
                           {"peak_held_per_stage", fmt::format("{}", fmt::join(run.peak_held, ","))},
                           {"peak_bytes", peak.second}, {"grad_max_abs_diff", gdiff}, {"loss", run.loss}});
  double slowest = 0, wait = 0;
  for (double b : run.busy_s) slowest = std::max(slowest, b);
  json ev = json::array();
  for (const auto& e : run.events) {
    wait += e.wait_s;
    ev.push_back({{"stage", e.stage},
                  {"op", pt.chunked() ? fmt::format("{}{}.{}", e.op.kind, e.op.microbatch, e.op.chunk)
                                      : fmt::format("{}{}", e.op.kind, e.op.microbatch)},
                  {"start_s", e.start_s}, {"end_s", e.end_s}, {"wait_s", e.wait_s}});
  }
  st.events[pt.name] = ev;
  st.measured.rows.push_back({{"name", pt.name}, {"step_ms", run.step_s * 1e3}, {"step_model_ms", sm.model_ms},
                              {"bubble", measured_bubble(run)}, {"bubble_theory", sm.theory},
                              {"slowest_stage_busy_ms", slowest * 1e3}, {"wait_ms", wait * 1e3}});
}

// The Gantt chart of one point.
TextBlock gantt_chart(const Bench& bench, const Point& pt, const PipelineRun& run) {
  const std::string chunk_text =
      pt.chunked() ? fmt::format(", v = {}; {}", pt.chunks,
                                 pt.placement == Placement::V ? "f/b/w: chunk 1 = virtual stage 2p-1-s" : "f/b: odd chunks")
                   : "";
  return {fmt::format("Timeline {} (p = {}, m = {}{}): {} + microbatch, '.' idle", pt.name, bench.p, pt.m, chunk_text,
                      pt.spec.splits_w ? "F/B/W (B input gradient, W weight gradient)" : "F/B"),
          render_gantt(run, bench.p, static_cast<int>(bench.cfg->integer("/gantt/width")))};
}

// One point: run, check, fill the tables.
void run_point(Bench& bench, const Point& pt, bool wants_zb, SweepTables& st, Report& report) {
  const auto steps = timed_steps(bench, pt);
  const PipelineRun& run = median_step(steps);
  const double gdiff = check_gradients(bench, pt, steps, run, st, report);
  const auto peak = check_peaks(bench, pt, run, report);
  const StepModel sm = step_model(bench, pt);
  if (wants_zb && pt.spec.zero_bubble_table) zero_bubble_rows(bench, pt, sm, run, peak, st);
  sweep_rows(pt, sm, run, gdiff, peak, st);
  if (pt.spec.one_microbatch || pt.m == bench.gantt_m) st.charts.push_back(gantt_chart(bench, pt, run));
}

// The sweep's tables, empty.
SweepTables sweep_tables(const Bench& bench) {
  const auto& cfg = *bench.cfg;
  const int p = bench.p;
  SweepTables st;
  st.sweep = {"sweep", fmt::format("Microbatched step on {} stages ({} layers, batch {}): gradients and memory", p,
                                   bench.layers_n, cfg.integer("/pipeline/batch")),
              {text_col("name", "name"), text_col("schedule", "schedule"), int_col("microbatches", "m"),
               pct_col("bubble_theory", "bubble theory", 1), float_col("step_model_ms", "step model", "ms"),
               int_col("peak_held", "peak held", "mb"),
               text_col("peak_held_per_stage", "per stage"), int_col("peak_bytes", "peak act", "bytes"),
               sci_col("grad_max_abs_diff", "max|g-g_full|"), sci_col("loss", "loss")}};
  const std::string runs_on = bench.processes         ? "one process per stage"
                              : bench.workers >= p    ? "one thread per stage"
                                                      : fmt::format("{} threads for the {} stages", bench.workers, p);
  const std::string cost_text = cfg.number("/cost/forward_us") > 0 ? "synthetic cost" : "no synthetic cost";
  st.measured = {"measured", fmt::format("Measured ({}, {}): bubble = idle / step time, per stage mean", runs_on,
                                         cost_text),
                 {text_col("name", "name"), float_col("step_ms", "step", "ms"), float_col("step_model_ms", "model", "ms"),
                  pct_col("bubble", "bubble", 1),
                  pct_col("bubble_theory", "theory", 1), float_col("slowest_stage_busy_ms", "slowest busy", "ms"),
                  float_col("wait_ms", "total wait", "ms")}};
  // Zero bubble (zb-h1 next to 1f1b): Qi et al.'s per-stage bubble formula, the executor's time
  // model, and (timings) the measured idle time per stage.
  st.zero_bubble = {"zero_bubble", fmt::format("Zero bubble: {} against 1F1B on {} stages, per-stage bubble (idle "
                                               "time) from the formula and from the time model",
                                               wants(cfg, "zb-v") ? "ZB-H1 and ZB-V" : "ZB-H1", p),
                    {text_col("name", "name"), text_col("schedule", "schedule"), int_col("microbatches", "m"),
                     float_col("f_ms", "F", "ms"), float_col("b_ms", "B", "ms"), float_col("w_ms", "W", "ms"),
                     float_col("idle_formula_ms", "idle formula", "ms"), float_col("idle_model_ms", "idle model", "ms"),
                     float_col("step_model_ms", "step model", "ms"), pct_col("bubble_model", "bubble model", 1),
                     int_col("peak_held", "peak held", "mb"), int_col("peak_bytes", "peak act", "bytes"),
                     text_col("stage_ends_model_ms", "stage ends ms")}};
  st.zero_bubble_measured = {"zero_bubble_measured", "Zero bubble, measured: idle time per stage (mean over stages of "
                                                     "step - busy) against the formula and the time model",
                             {text_col("name", "name"), float_col("idle_formula_ms", "formula", "ms"),
                              float_col("idle_model_ms", "model", "ms"), float_col("idle_ms", "idle", "ms"),
                              float_col("step_ms", "step", "ms"), pct_col("bubble", "bubble", 1),
                              text_col("stage_ends_ms", "stage ends ms")}};
  return st;
}

// Whether /pipeline/schedules has a schedule that splits B and W (the zero_bubble tables).
bool wants_zero_bubble(const Config& cfg) {
  for (const auto& k : cfg.strings("/pipeline/schedules"))
    if (schedule_spec(k).splits_w) return true;
  return false;
}

}  // namespace

const Ranges& Bench::ranges(int chunks) {
  auto it = cut.find(chunks);
  if (it == cut.end()) it = cut.emplace(chunks, stage_ranges(layers_n, balanced_cuts(layers_n, p * chunks))).first;
  return it->second;
}

PipelineRun Bench::step(const std::vector<std::vector<PipeOp>>& sched, int m, const Ranges& step_ranges,
                        const torch::Tensor& xx, const torch::Tensor& yy, Placement placement) {
  if (!processes) {
    QueueTransport transport(timeout_s);
    ++step_index;
    return run_pipeline(MlpStage(layers, step_ranges), sched, m, xx, yy, cost, transport, placement, workers);
  }
  popts.placement = placement;
  const int64_t step = step_index++;
  World* w = world;
  popts.after_op = [w, step](int done) {
    if (done >= 1) w->fault_point(step);  // /fault/rank stops in the middle of step /fault/step
  };
  return run_pipeline_process(group, MlpStage(layers, step_ranges), sched, m, xx, yy, cost, popts);
}

SweepTables run_sweep(Bench& bench, Report& report) {
  const auto& cfg = *bench.cfg;
  SweepTables st = sweep_tables(bench);
  const bool wants_zb = wants_zero_bubble(cfg);
  for (const auto& k : cfg.strings("/pipeline/schedules")) {
    const ScheduleSpec& spec = schedule_spec(k);
    const int chunks = spec.chunks_for(bench.v);
    std::vector<long long> mlist = cfg.integers("/pipeline/microbatches");
    if (spec.one_microbatch) mlist = {1};
    for (auto m64 : mlist) {
      const int m = static_cast<int>(m64);
      if (spec.microbatches_in_groups && m % bench.p != 0) {  // Megatron's requirement: microbatches in groups of p
        st.skipped_m.push_back(m);
        continue;
      }
      const Point pt{spec, k, spec.one_microbatch ? k : fmt::format("{}.m{}", k, m), m, chunks, spec.placement,
                     bench.ranges(chunks), make_schedule(spec.kind, bench.p, m, chunks)};
      run_point(bench, pt, wants_zb, st, report);
    }
  }
  return st;
}

// ----------------------------------------------------------------------------
// 4. The step-end synchronisation (Qi et al. 2023, §4)
// ----------------------------------------------------------------------------
// Two steps back to back. With a barrier between them (an all-reduce over the stages before the
// optimizer step: gradient-norm clipping, GradScaler's inf-check), no stage starts step 2 before
// every stage ended step 1: two steps take twice one step. Without one, each stage starts step 2
// as soon as its own step 1 is done (repeat_steps): what the barrier costs is the difference.
namespace {

std::pair<Table, Table> empty_sync_tables(const Bench& bench) {
  Table sync{"step_sync",
             fmt::format("Step-end synchronisation (time model): two steps at m = {} with a barrier between them (a "
                         "gradient-norm or inf-check all-reduce over the stages) and without",
                         bench.gantt_m),
             {text_col("name", "name"), text_col("schedule", "schedule"), int_col("microbatches", "m"),
              float_col("step_model_ms", "one step", "ms"), float_col("barrier_ms", "2 steps, barrier", "ms"),
              float_col("free_ms", "2 steps, none", "ms"), float_col("sync_cost_ms", "cost/step", "ms"),
              pct_col("sync_cost", "of a step", 1), text_col("stage_ends_model_ms", "stage ends ms")}};
  Table sync_measured{"step_sync_measured",
                      fmt::format("Step-end synchronisation, measured (median of {} runs): two steps with a barrier "
                                  "(two separate steps, first start to last end each) and without (one run of both "
                                  "steps' programs)",
                                  bench.n_steps),
                      {text_col("name", "name"), float_col("barrier_ms", "2 steps, barrier", "ms"),
                       float_col("free_ms", "2 steps, none", "ms"), float_col("sync_cost_ms", "cost/step", "ms"),
                       float_col("sync_cost_model_ms", "model", "ms")}};
  return {std::move(sync), std::move(sync_measured)};
}

// The median step time of /pipeline/steps runs of `sched`.
double median_step_s(Bench& bench, const std::vector<std::vector<PipeOp>>& sched, int m, const torch::Tensor& xx,
                     const torch::Tensor& yy, const Ranges& step_ranges, Placement placement) {
  std::vector<double> t;
  for (int i = 0; i < bench.n_steps; ++i) t.push_back(bench.step(sched, m, step_ranges, xx, yy, placement).step_s);
  return median_of(t);
}

// One schedule's rows: the time model's one step and two steps with and without the barrier,
// then the same measured.
void sync_rows(Bench& bench, const ScheduleSpec& spec, const torch::Tensor& x2, const torch::Tensor& y2,
               std::pair<Table, Table>& tables) {
  const int m = bench.gantt_m, p = bench.p, chunks = spec.chunks_for(bench.v);
  const std::string k = spec.name;
  const Placement placement = spec.placement;
  const auto& sync_ranges = bench.ranges(chunks);  // zb-v: 2p chunks in a V
  const auto one = make_schedule(spec.kind, p, m, chunks);
  const auto two = repeat_steps(one, 2, m);
  const OpCosts c = op_costs(bench, sync_ranges, placement);  // as in the zero-bubble table
  const PipelineRun sim1 = simulate_schedule(one, c.f, c.b, c.w, placement),
                    sim2 = simulate_schedule(two, c.f, c.b, c.w, placement);
  const double barrier_us = 2 * sim1.step_s, free_us = sim2.step_s, cost_us = (barrier_us - free_us) / 2;
  const std::string name = fmt::format("{}.m{}", k, m);
  tables.first.rows.push_back({{"name", name}, {"schedule", k}, {"microbatches", m},
                               {"step_model_ms", sim1.step_s / 1e3}, {"barrier_ms", barrier_us / 1e3},
                               {"free_ms", free_us / 1e3}, {"sync_cost_ms", cost_us / 1e3},
                               {"sync_cost", sim1.step_s > 0 ? json(cost_us / sim1.step_s) : json(nullptr)},
                               {"stage_ends_model_ms", stage_ends_ms(sim1, p)}});
  double barrier_s = 0, free_s = 0;
  {
    PipelineTraceRun traced("step_sync." + name + ".barrier", k, m, chunks, placement);
    barrier_s = 2 * median_step_s(bench, one, m, bench.x, bench.y, sync_ranges, placement);
  }
  {
    PipelineTraceRun traced("step_sync." + name + ".free", k, 2 * m, chunks, placement);
    free_s = median_step_s(bench, two, 2 * m, x2, y2, sync_ranges, placement);
  }
  tables.second.rows.push_back({{"name", name}, {"barrier_ms", barrier_s * 1e3}, {"free_ms", free_s * 1e3},
                                {"sync_cost_ms", (barrier_s - free_s) / 2 * 1e3},
                                {"sync_cost_model_ms", cost_us / 1e3}});
}

void add_sync_notes(Table& sync) {
  sync.notes.push_back("cost/step = (barrier - none) / 2: the idle time a step-end all-reduce over the stages adds "
                       "to each step, its own latency not counted (communication free in the model)");
  sync.notes.push_back("gpipe, 1f1b: 0 - every stage's last op is a backward whose gradient came from the stage "
                       "after it, so stage 0 ends last and no stage could start step 2 earlier anyway; zb-h1: the "
                       "last ops are W's, which wait for nothing: a stage that ends later than stage 0 (unequal "
                       "stages, /cost/heavy_stage) holds every stage at the barrier, while without it stage 0 "
                       "starts step 2's forwards during that stage's W's");
  sync.notes.push_back("zb-v: rank s ends (p-1-s) chunk times before the last rank (rank 0 first), and without a "
                       "barrier it starts step 2's forwards then, the V's fill overlapping the other ranks' last "
                       "W's; the barrier takes that back. ZB-H2 and ZB-V start step 2's warm-up during step 1's "
                       "cool-down by design, so Qi et al. 2023 (§4) replace the barrier with post-validation: each "
                       "stage steps at once and a later all-reduce of the gradient norm and inf/nan flag rolls the "
                       "step back when it fails");
}

}  // namespace

std::pair<Table, Table> step_sync_tables(Bench& bench, const std::vector<std::string>& kinds, Table& measured) {
  auto tables = empty_sync_tables(bench);
  if (!bench.cfg->boolean("/sync/enabled")) return tables;
  const auto x2 = torch::cat({bench.x, bench.x}), y2 = torch::cat({bench.y, bench.y});  // step 2: the same microbatches
  for (const auto& k : kinds)
    if (schedule_spec(k).step_sync) sync_rows(bench, schedule_spec(k), x2, y2, tables);
  if (tables.first.rows.empty())
    measured.notes.push_back("step_sync: not timed, /pipeline/schedules has none of gpipe, 1f1b, zb-h1, zb-v (the schedules "
                             "it compares); /sync/enabled has no effect");
  add_sync_notes(tables.first);
  return tables;
}

void check_processes_against_threads(Bench& bench, const std::vector<ProcessGrads>& runs, Report& report) {
  // The same steps with one thread per stage (no synthetic cost: only the gradients
  // matter here): the two executors run the same stage code in the same order.
  SyntheticCost no_cost;
  for (const auto& [name, kind, m, grads] : runs) {
    const ScheduleSpec& spec = schedule_spec(kind);
    const int chunks = spec.chunks_for(bench.v);
    QueueTransport transport(bench.timeout_s);
    const auto& rr = bench.ranges(chunks);
    // On rank 0's timeline these steps are the threads of lanes 1..p: named as a run of their own.
    PipelineTraceRun traced("threads_check." + name, spec.name, m, chunks, spec.placement);
    const auto threaded = run_pipeline(MlpStage(bench.layers, rr), make_schedule(kind, bench.p, m, chunks), m, bench.x,
                                       bench.y, no_cost, transport, spec.placement);
    double d = 0;
    for (std::size_t i = 0; i < grads.size(); ++i) d = nan_max(d, max_abs_diff(threaded.grads[i], grads[i]));
    report.check(name + ": processes gradient == threads gradient (bitwise)", d, 0.0,
                 fmt::format("{} processes, c10d send/recv over {}", bench.p, bench.group->backend()));
  }
}

void add_sweep_notes(const Bench& bench, SweepTables& st) {
  const int p = bench.p, layers_n = bench.layers_n, v = bench.v;
  if (!st.skipped_m.empty())
    st.sweep.notes.push_back(fmt::format("interleaved-1f1b skipped for m = {}: not a multiple of p = {} (Megatron-LM "
                                         "runs microbatches through the chunks in groups of p)",
                                         fmt::join(st.skipped_m, ", "), p));
  if (wants(*bench.cfg, "zb-v"))
    st.sweep.notes.push_back(fmt::format("zb-v: the {} layers cut evenly into 2p = {} virtual stages placed in a V, rank s "
                                         "runs s and {}-s (the turn p-1 -> p inside rank {}, the loss on rank 0); peak "
                                         "held counts (microbatch, chunk) pairs, at most 2p = {} (1F1B's p stages)",
                                         layers_n, 2 * p, 2 * p - 1, p - 1, 2 * p));
  if (wants(*bench.cfg, "interleaved-1f1b"))
    st.sweep.notes.push_back(fmt::format("interleaved-1f1b: the {} layers cut evenly into p*v = {} virtual stages, stage "
                                         "s runs chunks s, s+{}, ...; peak held counts (microbatch, chunk) pairs; bubble "
                                         "theory (p-1)/(v*m+p-1)", layers_n, p * v, p));
}

namespace {

void add_zero_bubble_notes(const Bench& bench, SweepTables& st) {
  auto& notes = st.zero_bubble.notes;
  notes.push_back("formula (Qi et al. 2023): 1f1b (p-1)(F+B+W), zb-h1 (p-1)(F+B-W) idle per stage for "
                  "m >= p ((p-1)(F+B) - (m-1)W for m < p: fewer W's to fill the cool-down); idle model: mean over stages of step - busy when the programs are replayed with "
                  "the synthetic cost (simulate_schedule, communication free)");
  if (bench.heavy >= 0)
    notes.push_back(fmt::format("idle formula '-': the formula assumes equal stages, and stage {} costs {}x "
                                "(/cost/heavy_stage); the idle model replays the unequal costs",
                                bench.heavy, bench.cfg->number("/cost/heavy_factor")));
  if (wants(*bench.cfg, "zb-v"))
    notes.push_back("zb-v (Qi et al. 2023 section 6; torch's ScheduleZBVZeroBubble): F, B, W of a whole stage "
                    "(its 2 chunks). The authors give a bubble rate of 0 for F = B = W; the construction "
                    "replayed leaves the fill of the V's first leg, max(p-1, 4p-2-2m) x F/2 per rank (rank "
                    "s waits s chunk forwards for its first input, then never idles); formula '-' unless "
                    "the chunks are equal and F = B = W (no closed form: the idle model replays it)");
  notes.push_back("B = input gradient (backward_factor - weight_factor) x F, W = weight gradient "
                  "(weight_factor x F); 1f1b runs B and W fused, zb-h1 apart (autograd::grad on the stage "
                  "input and each Linear's output, then on each Linear's weight and bias)");
  notes.push_back("peak held: microbatches whose F ran and whose W (1f1b: fused B) did not; zb-h1 holds p "
                  "on every stage, 1f1b p - s on stage s: the same peak, p");
  notes.push_back("stage ends (model): when each stage's last op ends; with F = B = W zb-h1's stages end "
                  "together, so a step-end synchronisation (grad-norm or inf-check all-reduce) adds no "
                  "idle time to it; it does to schedules whose next step starts before the last stage "
                  "ends (ZB-H2, ZB-V: Qi et al. 2023 §4, post-validation)");
  st.zero_bubble_measured.notes.push_back("measured idle = step - busy per stage, mean over stages; formula and model "
                                          "as in zero_bubble; stage ends: when each stage's last op ended (a step-end "
                                          "all-reduce waits for the latest)");
}

}  // namespace

void add_sweep_report(const Bench& bench, SweepTables& st, std::pair<Table, Table>& sync, Report& report) {
  const auto& cfg = *bench.cfg;
  const int p = bench.p;
  const bool interleaved = wants(cfg, "interleaved-1f1b"), wants_zb = wants_zero_bubble(cfg);
  if (bench.processes)
    st.sweep.notes.push_back(fmt::format("executor: {} processes, one per stage; activations and gradients sent with "
                                         "c10d send/recv ({}; gradients on a second group), tag = 2*microbatch + "
                                         "(backward)", p, bench.group->backend()));
  st.sweep.notes.push_back("each microbatch loss is divided by m once: the sum of microbatch gradients is the "
                           "mean-loss gradient of the full batch (differences are fp32 roundoff)");
  st.sweep.notes.push_back(interleaved ? "step model: sum over the first p virtual stages of F+B (synthetic cost) + "
                                         "(m*v-1) x the slowest virtual stage's F+B (v = 1 but for interleaved-1f1b)"
                                       : "step model: sum over stages of F+B (synthetic cost) + (m-1) x the slowest "
                                         "stage's F+B");
  st.sweep.notes.push_back(fmt::format("peak act: the most activation bytes a stage held at once, measured (largest "
                                       "stage); gpipe holds m microbatches, 1f1b at most p = {}", p));
  st.measured.notes.push_back(fmt::format("median of {} steps after one warm-up step; theory (p-1)/(m+p-1){} assumes "
                                          "equal stages and free communication{}", bench.n_steps,
                                          interleaved ? ", interleaved (p-1)/(v*m+p-1)," : "",
                                          wants_zb ? "; zb-h1, zb-v: the time model's idle / step (zero_bubble)" : ""));
  if (bench.heavy >= 0)
    st.measured.notes.push_back(fmt::format("stage {} costs {}x: the slowest stage sets the pace of every other stage",
                                            bench.heavy, cfg.number("/cost/heavy_factor")));
  report.add(std::move(st.sweep));
  if (wants_zb) {
    add_zero_bubble_notes(bench, st);
    report.add(std::move(st.zero_bubble));
    report.add(std::move(st.zero_bubble_measured), Store::Timings);
  }
  if (!sync.first.rows.empty()) {
    report.add(std::move(sync.first));
    report.add(std::move(sync.second), Store::Timings);
  }
  // Measured values vary run to run: printed, and stored under timings (not results).
  report.timings["events"] = st.events;
  // The charts are drawn at m = /gantt/microbatches only: say so when the sweep has no such m.
  const auto sweep_ms = cfg.integers("/pipeline/microbatches");
  if (std::find(sweep_ms.begin(), sweep_ms.end(), static_cast<long long>(bench.gantt_m)) == sweep_ms.end())
    st.measured.notes.push_back(fmt::format("no Gantt chart for the schedules but naive: they are drawn at "
                                            "/gantt/microbatches = {}, which /pipeline/microbatches does not hold",
                                            bench.gantt_m));
  report.add(std::move(st.measured), Store::Timings);
  for (auto& c : st.charts) report.add(std::move(c));
}

}  // namespace mpt::pipe
