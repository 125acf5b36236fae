// Pipeline timelines. See trace.hpp.
#include "core/pipeline/trace.hpp"

#include <map>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include "core/runtime/trace.hpp"

namespace mpt {

namespace {

std::mutex g_mu;
std::map<int, int64_t> g_steps;  // lane -> steps recorded so far
std::string g_schedule;          // the live PipelineTraceRun's schedule ("" : none)

std::string op_name(char kind, int microbatch, int chunk) {
  return chunk > 0 ? fmt::format("{}{}.{}", kind, microbatch, chunk) : fmt::format("{}{}", kind, microbatch);
}

/// A message's slice name, flow and direction (no args).
trace::P2P message(bool send, int src, int dst, char kind, int microbatch, int boundary, bool in_process,
                   int src_rank = -1, int dst_rank = -1) {
  trace::P2P p;
  p.name = send ? fmt::format("send {}{} -> {}", kind, microbatch, dst) : fmt::format("recv {}{} <- {}", kind, microbatch, src);
  const bool ranks = src_rank >= 0 && dst_rank >= 0;
  p.flow = trace::flow_id(send, ranks ? src_rank : src, ranks ? dst_rank : dst, kind, microbatch, boundary, in_process);
  p.out = send;
  return p;
}

trace::P2P annotation(bool send, int src, int dst, char kind, int microbatch, int boundary, bool in_process,
                      int src_rank = -1, int dst_rank = -1) {
  trace::P2P p = message(send, src, dst, kind, microbatch, boundary, in_process, src_rank, dst_rank);
  const bool ranks = src_rank >= 0 && dst_rank >= 0;
  p.args = {{"kind", std::string(1, kind)}, {"microbatch", microbatch}, {"boundary", boundary},
            {"src_stage", src}, {"dst_stage", dst}};
  if (ranks) {
    p.args["src_rank"] = src_rank;
    p.args["dst_rank"] = dst_rank;
  }
  return p;
}

/// trace_stage_events' Deferred: i = {kind, microbatch, chunk, stage, virtual_stage,
/// schedule (intern id), step}, d = wait_us.
void render_op(const trace::Deferred& d, trace::Event& e) {
  const char kind = static_cast<char>(d.i[0]);
  e.name = op_name(kind, static_cast<int>(d.i[1]), static_cast<int>(d.i[2]));
  e.args = {{"stage", d.i[3]},        {"microbatch", d.i[1]}, {"chunk", d.i[2]},
            {"virtual_stage", d.i[4]}, {"kind", std::string(1, kind)}, {"schedule", trace::interned(d.i[5])},
            {"step", d.i[6]},          {"wait_us", d.d}};
}

/// trace_queue_p2p's Deferred: i = {send, src, dst, kind, microbatch, boundary, bytes}.
void render_queue_p2p(const trace::Deferred& d, trace::Event& e) {
  const bool send = d.i[0] != 0;
  const int src = static_cast<int>(d.i[1]), dst = static_cast<int>(d.i[2]);
  const char kind = static_cast<char>(d.i[3]);
  const int microbatch = static_cast<int>(d.i[4]);
  e.name = send ? fmt::format("send {}{} -> {}", kind, microbatch, dst) : fmt::format("recv {}{} <- {}", kind, microbatch, src);
  e.args = {{"kind", std::string(1, kind)}, {"microbatch", microbatch}, {"boundary", d.i[5]}, {"src_stage", src},
            {"dst_stage", dst},             {"bytes", d.i[6]},          {"peer", send ? dst : src}};
}

}  // namespace

void trace_stage_events(const std::vector<PipeEvent>& events, std::chrono::steady_clock::time_point t0, int stage,
                        int stages, Placement placement, bool threaded) {
  if (!trace::enabled()) return;
  const int lane = threaded ? stage + 1 : 0;
  int64_t step = 0;
  std::string schedule;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    step = g_steps[lane]++;
    schedule = g_schedule;
  }
  const double base = trace::to_us(t0);
  const int64_t schedule_id = trace::intern(schedule);
  // Numbers only (trace::Deferred): a step records one slice per microbatch and kind; the name
  // and args are made by render_op when the events are read.
  trace::Deferred d;
  d.render = render_op;
  for (const auto& e : events) {
    d.i = {e.op.kind, e.op.microbatch, e.op.chunk, e.stage, virtual_stage(e.stage, e.op.chunk, stages, placement),
           schedule_id, step, 0};
    d.d = e.wait_s * 1e6;
    trace::complete(trace::Track::Compute, d, base + e.start_s * 1e6, base + e.end_s * 1e6, lane);
  }
}

void trace_pipeline_sweep(const std::string& executor, int stages, const std::vector<std::string>& schedules) {
  if (!trace::enabled()) return;
  trace::set_metadata("pipeline", {{"executor", executor}, {"stages", stages}, {"schedules", schedules},
                                   {"runs", trace::json::array()}});
}

PipelineTraceRun::PipelineTraceRun(const std::string& run, const std::string& schedule, int microbatches, int chunks,
                                   Placement placement) {
  if (!trace::enabled()) return;
  on_ = true;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_schedule = schedule;
  }
  trace::set_run_label(run);
  trace::json pipe = trace::metadata().value("pipeline", trace::json::object());
  pipe["runs"].push_back({{"run", run}, {"schedule", schedule}, {"microbatches", microbatches}, {"chunks", chunks},
                          {"placement", placement == Placement::V ? "v" : "loop"}});
  trace::set_metadata("pipeline", std::move(pipe));
}

PipelineTraceRun::~PipelineTraceRun() {
  if (!on_) return;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_schedule.clear();
  }
  trace::set_run_label("");
}

void trace_p2p_annotate(bool send, int src, int dst, char kind, int microbatch, int boundary, int src_rank,
                        int dst_rank) {
  if (!trace::enabled()) return;
  trace::annotate_next(annotation(send, src, dst, kind, microbatch, boundary, /*in_process=*/false, src_rank, dst_rank));
}

void trace_queue_p2p(bool send, int src, int dst, char kind, int microbatch, int boundary, int64_t bytes,
                     double begin_us, double end_us, double flow_us) {
  if (!trace::enabled()) return;
  // Numbers only (trace::Deferred, two messages per microbatch and stage): the slice's name,
  // the args of annotation() plus bytes and peer, and the flow, made by render_queue_p2p.
  trace::Deferred d;
  d.render = render_queue_p2p;
  d.i = {send ? 1 : 0, src, dst, kind, microbatch, boundary, bytes, 0};
  d.flow = trace::flow_id(send, src, dst, kind, microbatch, boundary, /*in_process=*/true);
  d.flow_out = send;
  d.flow_ts_us = flow_us;
  trace::complete(trace::Track::Comm, d, begin_us, end_us, (send ? src : dst) + 1);
}

}  // namespace mpt
