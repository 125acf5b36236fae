// Pipeline timelines (core/trace): a stage's executed operations (PipeEvent: F, B and W of a
// microbatch) as compute slices, and each stage-to-stage message as a send → recv flow
// arrow. Kept apart from core/pipeline so the executor's own code stays about scheduling:
// pipeline.cpp calls these from run_stage and from its transports' send()/recv().
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "core/pipeline_schedule.hpp"
#include "core/trace.hpp"

namespace mpt {

/// Records the operations `events` of stage `stage` in one step (times in seconds since `t0`,
/// the step's steady-clock start) as trace::Track::Compute slices named "F3" ("F3.1" for
/// chunk 1), args stage, microbatch, chunk, kind, step (this stage's step count since the
/// process started tracing, from 0) and wait_us (time blocked in recv before the op).
/// `threaded`: the stages are threads of one process (QueueTransport): stage s goes to the
/// tracks of lane s + 1; otherwise this process is the stage (lane 0). Any op kind ('F', 'B',
/// 'W', ...) is recorded the same way. No-op when tracing is off.
void trace_stage_events(const std::vector<PipeEvent>& events, std::chrono::steady_clock::time_point t0, int stage,
                        bool threaded);

/// Annotates the next send or recv of this thread (dist::Group::send_async / recv_async) with the
/// message (src → dst, kind, microbatch, boundary): slice name ("send F3 → 1", "recv F3 ← 0"),
/// args and the flow id shared by the send and its recv (trace::flow_id). No-op when off.
void trace_p2p_annotate(bool send, int src, int dst, char kind, int microbatch, int boundary);

/// Records one message of an in-process pipeline (QueueTransport) as a slice [begin_us,
/// end_us] on the communication track of the sending (`send`) or receiving stage's lane,
/// with its flow start or finish. `bytes`: the tensor's size. No-op when off.
void trace_queue_p2p(bool send, int src, int dst, char kind, int microbatch, int boundary, int64_t bytes,
                     double begin_us, double end_us);

}  // namespace mpt
