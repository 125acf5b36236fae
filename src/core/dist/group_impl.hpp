// core/dist internals: what a Group holds (Group::Impl) and what its collectives, point-to-point
// messages and ring collectives share — posting a collective (post_collective), its failure
// (collective_failed), and its record on the timeline (TraceOp, TraceLane). Private to
// src/core/dist (group.cpp, ring.cpp): not part of mpt's API. Its includer gets c10d's Gloo
// classes (USE_C10D_GLOO: a compile definition of mptcore, so no include order matters) and
// compat::C10dBackend.
#pragma once


#include <algorithm>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "core/dist/detail.hpp"
#include "core/dist/group.hpp"
#include "core/dist/job_state.hpp"
#include "core/errors.hpp"
#include "core/runtime/compat.hpp"
#include "core/runtime/compat_c10d.hpp"
#include "core/runtime/trace.hpp"

namespace mpt::dist {

// Named, not anonymous: Group::Impl (a member of an exported class) holds a TraceLane (and a
// detail::Monitor), and GCC warns (-Wsubobject-linkage) when such a type has internal linkage in
// a file that is not the main one, as in the unity build's batches.
namespace group_detail {

using namespace detail;

// What the timeline (core/runtime/trace, --trace) records of one posted operation: a slice on the
// communication track with bytes and peer, and the flow of a pipeline message.
struct TraceOp {
  std::string name;
  trace::json args;
  double post_us = 0;  // when the caller posted it (now_us)
  trace::P2P p2p;      // the transport's annotation (flow id, kind, microbatch)
};

// Starts the record of an operation when tracing is on (null otherwise: one branch).
inline std::shared_ptr<TraceOp> trace_begin(const char* name, int64_t bytes, int group_size, int peer_global = -1) {
  if (!trace::enabled()) return nullptr;
  auto op = std::make_shared<TraceOp>();
  op->name = name;
  op->post_us = trace::now_us();
  op->args = {{"bytes", bytes}, {"group_size", group_size}};
  if (peer_global >= 0) op->args["peer"] = peer_global;
  op->p2p = trace::take_annotation();
  if (!op->p2p.name.empty()) op->name = op->p2p.name;
  if (op->p2p.args.is_object())
    for (auto it = op->p2p.args.begin(); it != op->p2p.args.end(); ++it) op->args[it.key()] = it.value();
  return op;
}

// Records `op` as the slice [begin_us, end_us]; a flow start binds to the slice's start, a flow
// finish (bp "e") to a point inside the slice just before its end (when the data had arrived).
inline void trace_end(const TraceOp& op, double begin_us, double end_us) {
  trace::complete(trace::Track::Comm, op.name, begin_us, end_us, op.args);
  if (op.p2p.flow == 0) return;
  const double d = end_us - begin_us;
  trace::flow(op.p2p, trace::Track::Comm, op.p2p.out ? begin_us : end_us - std::min(1.0, d / 2));
}

// The completion time of the last traced collective of this process: Gloo (one thread per
// group) and NCCL (one stream) run a group's collectives in posting order, so one starts when
// both it was posted and the previous one was done. Shared by the process's groups (of any
// Job: the timeline of core/runtime/trace, like its communication track, is the process's), so that
// the slices of one communication track do not overlap (Trace Event slices of a thread nest).
struct TraceLane {
  std::mutex mu;
  double last_done_us = 0;
};
/// The process's one TraceLane.
inline std::shared_ptr<TraceLane> process_trace_lane() {
  static auto lane = std::make_shared<TraceLane>();
  return lane;
}

/// What a Work holds: LibTorch's Work and how to diagnose its failure.
struct WorkImpl {
  c10::intrusive_ptr<c10d::Work> w;
  std::string what;
  std::shared_ptr<Job> job;  // whose heartbeat says what wait() waits for
  std::shared_ptr<Monitor> monitor;
  int peer_global = -1;  // send/recv: the peer's rank in the job
  std::shared_ptr<TraceOp> trace;  // recorded when wait() returns (recv; collectives without a future)
};

// `m` may be null: point-to-point work (send/recv) is diagnosed from `job`'s heartbeats instead
// (blame_late: the peer, or the rank it waits for), as a collective diagnosis would wrongly
// name healthy ranks that are still waiting elsewhere.
[[noreturn]] inline void collective_failed(const std::string& what, const std::exception& e, Monitor* m,
                                    JobState* job = nullptr, int peer_global = -1) {
  const std::string cause = first_line(e.what());  // before diagnose() waits
  throw RuntimeFailure(fmt::format("{}: {}; a peer process failed or timed out{}", what, cause,
                                   m ? m->diagnose()
                                     : job && peer_global >= 0 ? blame_late(*job, peer_global) : std::string()));
}

// Posts one collective: `post` returns LibTorch's Work; a failure to post is diagnosed like a
// failed wait (the ranks that did not answer are named).
// `op` (tracing on): recorded as the slice from the collective's start — when it was posted
// and the group's previous one was done (`lane`) — to its completion, taken in the callback
// of the Work's future (c10d marks it completed in Gloo's worker thread, or when NCCL's
// kernels end); where a Work has no future, from posting to the return of wait().
template <class Post>
Work post_collective(std::string what, const std::shared_ptr<Job>& job, const std::shared_ptr<Monitor>& monitor,
                     Post&& post, std::shared_ptr<TraceOp> op = nullptr, std::shared_ptr<TraceLane> lane = nullptr) {
  auto impl = std::make_shared<WorkImpl>();
  impl->what = std::move(what);
  impl->job = job;
  impl->monitor = monitor;
  try {
    impl->w = post();
  } catch (const std::exception& e) {
    collective_failed(impl->what, e, monitor.get());
  }
  if (op) {
    try {
      impl->w->getFuture()->addCallback([op, lane](c10::ivalue::Future&) {
        const double done = trace::now_us();
        double begin = op->post_us;
        if (lane) {
          std::lock_guard<std::mutex> lock(lane->mu);
          begin = std::max(begin, std::min(done, lane->last_done_us));
          lane->last_done_us = done;
        }
        op->args["posted_us_before_start"] = begin - op->post_us;
        trace_end(*op, begin, done);
      });
    } catch (const std::exception&) {
      impl->trace = op;  // no future: recorded by wait()
    }
  }
  return Work(impl);
}

// The first dimension of `big` is size times that of `part`, both contiguous, same dtype and
// device (all_gather's output, reduce_scatter's input, all_to_all's chunks). Throws std::invalid_argument.
inline void check_chunks(const char* op, const torch::Tensor& big, const torch::Tensor& part, int size) {
  if (!big.is_contiguous() || !part.is_contiguous() || big.dim() == 0 || big.dim() != part.dim() ||
      big.size(0) != size * part.size(0) || big.numel() != size * part.numel() || big.scalar_type() != part.scalar_type() ||
      big.device() != part.device())
    throw std::invalid_argument(fmt::format("{}: expected contiguous tensors of one dtype and device, the larger with "
                                            "{} x the first dimension of the other ({} vs {})", op, size,
                                            c10::str(big.sizes()), c10::str(part.sizes())));
}

/// mpt's ReduceOp as c10d's.
inline c10d::ReduceOp to_c10d(ReduceOp op) {
  return op == ReduceOp::Sum ? c10d::ReduceOp::SUM : op == ReduceOp::Min ? c10d::ReduceOp::MIN : c10d::ReduceOp::MAX;
}

/// The bytes of `t`'s elements.
inline int64_t nbytes_of(const torch::Tensor& t) { return static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size()); }
// (N−1)/N of `bytes`: what one rank sends in a ring all-gather / reduce-scatter of that payload.
inline double ring_share(int64_t bytes, int n) { return static_cast<double>(bytes) * (n - 1) / n; }

}  // namespace group_detail

/// What a Group holds: its process groups, store, monitor and the ranks' places in the job.
struct Group::Impl {
  c10::intrusive_ptr<compat::C10dBackend> pg;  // ProcessGroupGloo or ProcessGroupNCCL
  // Gloo, N = 2: the ring's messages from rank 1 to rank 0 go through a second ProcessGroupGloo
  // on the same device (made at the first ring call: ring_pg), so that no Gloo pair carries both
  // directions of a ring step (why: ring_pg).
  c10::intrusive_ptr<compat::C10dBackend> pg_down;
  c10::intrusive_ptr<c10d::ProcessGroupGloo::Options> gloo_options;  // pg's, reused by pg_down
  std::mutex pg_down_mu;

  /// The process group that carries the ring's messages from group rank `from` to `to`: pg when
  /// from < to, on NCCL or at N != 2; else pg_down, made at the first call (both ranks reach it
  /// in the same ring call). Throws RuntimeFailure when pg_down cannot be formed.
  compat::C10dBackend& ring_pg(int from, int to, int rank, int size);
  std::string where;                           // "rank R of N" for messages
  std::shared_ptr<detail::Monitor> monitor;
  c10::intrusive_ptr<c10d::Store> store;       // the group's (prefixed) store
  std::vector<int> global;                     // rank in the job of each group rank
  std::chrono::milliseconds timeout{30000};
  int barriers = 0;                            // barrier() calls so far (unique store keys)
  std::shared_ptr<group_detail::TraceLane> trace_lane = group_detail::process_trace_lane();
};

}  // namespace mpt::dist
