// Pipeline timelines. See pipeline_trace.hpp.
#include "core/pipeline_trace.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include "core/trace.hpp"

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
  // Args as text (trace::ArgsText): a step records one slice per microbatch and kind.
  for (const auto& e : events)
    trace::complete(trace::Track::Compute, op_name(e.op.kind, e.op.microbatch, e.op.chunk), base + e.start_s * 1e6,
                    base + e.end_s * 1e6,
                    trace::ArgsText()
                        .add("stage", e.stage)
                        .add("microbatch", e.op.microbatch)
                        .add("chunk", e.op.chunk)
                        .add("virtual_stage", virtual_stage(e.stage, e.op.chunk, stages, placement))
                        .add("kind", std::string(1, e.op.kind))
                        .add("schedule", schedule)
                        .add("step", step)
                        .add("wait_us", e.wait_s * 1e6),
                    lane);
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
                     double begin_us, double end_us) {
  if (!trace::enabled()) return;
  // The args of annotation(), as text (trace::ArgsText: two messages per microbatch and stage).
  trace::P2P p = message(send, src, dst, kind, microbatch, boundary, /*in_process=*/true);
  trace::ArgsText args;
  args.add("kind", std::string(1, kind))
      .add("microbatch", microbatch)
      .add("boundary", boundary)
      .add("src_stage", src)
      .add("dst_stage", dst)
      .add("bytes", bytes)
      .add("peer", send ? dst : src);
  const int lane = (send ? src : dst) + 1;
  const double d = end_us - begin_us;
  trace::flow(p, trace::Track::Comm, send ? begin_us : end_us - std::min(1.0, d / 2), lane);
  trace::complete(trace::Track::Comm, std::move(p.name), begin_us, end_us, std::move(args), lane);
}

}  // namespace mpt
