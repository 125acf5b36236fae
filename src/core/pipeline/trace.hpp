// Pipeline timelines (core/runtime/trace): a stage's executed operations (PipeEvent: F, B and W of a
// microbatch) as compute slices, and each stage-to-stage message as a send → recv flow
// arrow. Kept apart from core/pipeline so the executor's own code stays about scheduling:
// pipeline.cpp calls these from run_stage and from its transports' send()/recv().
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "core/pipeline/schedule.hpp"
#include "core/runtime/trace.hpp"

namespace mpt {

/// Records the operations `events` of stage `stage` of `stages` in one step (times in seconds
/// since `t0`, the step's steady-clock start) as trace::Track::Compute slices named "F3" ("F3.1"
/// for chunk 1), args stage, microbatch, chunk, virtual_stage (virtual_stage(stage, chunk,
/// stages, placement): torch.distributed.pipelining's stage_index; V: chunk 1 of rank s is 2p − 1
/// − s), kind, schedule (the PipelineTraceRun's; "" outside one), step (this stage's step count
/// since the process started tracing, from 0) and wait_us (PipeEvent::wait_s: time blocked in
/// recv before the op; several stages per thread: since the stage's previous op ended);
/// args.run is the PipelineTraceRun's run. `threaded`: the stages are threads of one process
/// (QueueTransport): stage s goes to the tracks of lane s + 1; otherwise this process is the
/// stage (lane 0). Any op kind ('F', 'B', 'W', ...) is recorded the same way. No-op when off.
void trace_stage_events(const std::vector<PipeEvent>& events, std::chrono::steady_clock::time_point t0, int stage,
                        int stages, Placement placement, bool threaded);

/// The sweep's metadata, otherData.pipeline of the trace file: executor ("threads" or
/// "processes"), stages p and the schedules asked for (/pipeline/schedules); the runs
/// (PipelineTraceRun) are added to it. Nothing when tracing is off.
void trace_pipeline_sweep(const std::string& executor, int stages, const std::vector<std::string>& schedules);

/// RAII: the steps run while it lives belong to `run` (a row name of the experiment's tables,
/// e.g. "zb-v.m4") of schedule `schedule` (a /pipeline/schedules name, e.g. "zb-v"): every event
/// recorded meanwhile gets args.run = run (trace::set_run_label), every compute slice of
/// trace_stage_events args.schedule, and the file's otherData.pipeline.runs gets {run, schedule,
/// microbatches, chunks (per stage), placement ("loop" or "v")}, so a trace of a sweep tells its
/// schedules apart. Runs do not nest (the label is process-wide). Nothing when tracing is off.
class PipelineTraceRun {
 public:
  PipelineTraceRun(const std::string& run, const std::string& schedule, int microbatches, int chunks,
                   Placement placement);
  ~PipelineTraceRun();
  PipelineTraceRun(const PipelineTraceRun&) = delete;
  PipelineTraceRun& operator=(const PipelineTraceRun&) = delete;

 private:
  bool on_ = false;
};

/// Annotates the next send or recv of this thread (dist::Group::send_async / recv_async) with the
/// message (src → dst, kind, microbatch, boundary): slice name ("send F3 → 1", "recv F3 ← 0"),
/// args and the flow id shared by the send and its recv (trace::flow_id). `src_rank`, `dst_rank`:
/// the two stages' ranks in the job, which key the flow id (stage numbers repeat in every
/// pipeline of a DP x TP x PP mesh: keyed by stage alone, replicas shared ids); -1: the stage
/// numbers (the pipeline is the whole job). No-op when off.
void trace_p2p_annotate(bool send, int src, int dst, char kind, int microbatch, int boundary, int src_rank = -1,
                        int dst_rank = -1);

/// Records one message of an in-process pipeline (QueueTransport) as a slice [begin_us,
/// end_us] on the communication track of the sending (`send`) or receiving stage's lane,
/// with its flow start or finish at `flow_us` (begin_us <= flow_us <= end_us): for a send, a
/// time before the message was stored; for a recv, a time after it was found. Both on one
/// steady clock, so a recv's flow never precedes its send's (a recv that polls finds a message
/// within a microsecond of its store: a flow put a fixed 1 µs inside the recv's end could precede
/// the send's start). `bytes`: the tensor's size. No-op when off.
void trace_queue_p2p(bool send, int src, int dst, char kind, int microbatch, int boundary, int64_t bytes,
                     double begin_us, double end_us, double flow_us);

}  // namespace mpt
