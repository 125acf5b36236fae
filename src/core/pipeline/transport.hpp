// Stage-to-stage transport of a pipeline (part of core/pipeline): activations forward,
// gradients backward. In one process a mailbox (QueueTransport, one thread per stage); across
// processes c10d point-to-point send/recv over a Gloo (CPU) or NCCL (CUDA) process group
// (ProcessGroupTransport, one process per stage), as torch.distributed.pipelining and
// Megatron-LM's p2p_communication move them. A message is what a SEND_F / RECV_F (activation)
// or SEND_B / RECV_B (gradient) action of core/pipeline/schedule.hpp carries.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "core/pipeline/schedule.hpp"

namespace mpt {

namespace dist {
class Group;
class Work;
}  // namespace dist


/// Point-to-point messages between stages: activations forward, gradients backward.
/// A message is named by (kind, microbatch, boundary) — 'F' for an activation, 'B' for a
/// gradient; `boundary` b is the cut between virtual stages b and b + 1 it crosses (−1:
/// min(src, dst), the only boundary between two stages when each has one chunk).
/// Implementations: QueueTransport (threads in one process); ProcessGroupTransport (one
/// process per stage, c10d send/recv).
class StageTransport {
 public:
  virtual ~StageTransport() = default;
  /// Sends `t` from stage `src` to stage `dst`. Must not block indefinitely.
  virtual void send(int src, int dst, char kind, int microbatch, const torch::Tensor& t, int boundary = -1) = 0;
  /// Receives the message (src → dst, kind, microbatch, boundary); blocks until it arrives.
  /// Throws RuntimeFailure after the timeout or when the transport was aborted.
  virtual torch::Tensor recv(int src, int dst, char kind, int microbatch, int boundary = -1) = 0;
  /// Makes every pending and future recv throw RuntimeFailure with `why` (a stage failed).
  virtual void abort(const std::string& why) = 0;
};

/// What a pipeline message carries: "activation" for kind 'F', "gradient" for 'B'.
inline const char* message_name(char kind) { return kind == 'F' ? "activation" : "gradient"; }

/// The error of a stage that waited `timeout_s` seconds for a message that never came: "stage
/// DST: no activation|gradient for microbatch J from stage SRC within T s" (QueueTransport::recv
/// and run_pipeline's workers, which wait for any of their stages' inputs, say it alike).
std::string recv_timeout_message(int dst, char kind, int microbatch, int src, double timeout_s);

/// In-process mailbox: send stores the tensor, recv waits for it — first polling for up to
/// kSpinUs, yielding the core between polls (sched_yield: a stage thread that waits lets the
/// one that will send run on its core, instead of a futex sleep and wake-up per message), then
/// blocked on a condition variable until the timeout. The spin-then-block wait of OpenMP's
/// waiters (GOMP_SPINCOUNT), bounded so that an idle stage gives its core back. Measured on 4
/// stage threads, 2 vCPUs (docs/pipeline.md): 1F1B m = 8 with no synthetic cost 11.1-12.2 ms
/// a step blocking at once, 10.7-12.3 polling 500 µs, 9.2-9.8 polling 1 000 µs.
class QueueTransport : public StageTransport {
 public:
  explicit QueueTransport(double timeout_s) : timeout_s_(timeout_s) {}
  void send(int src, int dst, char kind, int microbatch, const torch::Tensor& t, int boundary = -1) override;
  torch::Tensor recv(int src, int dst, char kind, int microbatch, int boundary = -1) override;
  void abort(const std::string& why) override;

  /// Whether recv(src, dst, kind, microbatch, boundary) would return at once: the message is
  /// stored, or the transport was aborted (recv throws). For an executor that runs several
  /// stages on one thread and picks a stage whose input is there (run_pipeline, workers < p).
  bool ready(int src, int dst, char kind, int microbatch, int boundary = -1);
  /// Messages stored so far, aborts included: the count wait_for_send watches.
  uint64_t sent() const { return sent_.load(std::memory_order_acquire); }
  /// Waits until sent() differs from `seen` (a message stored since, or an abort): polls for
  /// kSpinUs yielding the core, as recv, then blocks. Returns false when none came within the
  /// timeout.
  bool wait_for_send(uint64_t seen);
  /// The timeout given to the constructor, seconds.
  double timeout_s() const { return timeout_s_; }

 private:
  using Key = std::tuple<int, int, char, int, int>;
  /// How long recv polls before it blocks, in microseconds.
  static constexpr double kSpinUs = 1000;
  double timeout_s_;
  std::atomic<uint64_t> sent_{0};  // messages stored so far (and aborts): what a polling recv watches
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<Key, torch::Tensor> box_;
  std::string aborted_;
};

/// Stage-to-stage messages between processes over c10d process groups (Gloo on CPU, NCCL on CUDA):
/// stage s is rank s of `group`, and each process is one stage. An activation goes forward
/// with ProcessGroupGloo::send/recv, a gradient comes back the same way, as
/// torch.distributed.pipelining (PipelineStage's isend/irecv) and Megatron-LM
/// (core/pipeline_parallel/p2p_communication.py) move them.
///
///  - Tag = 2·microbatch + (kind == 'B') + 2^20·⌊b / p⌋ for boundary b: forward and backward
///    messages of every microbatch are told apart between the same two ranks, and so are the
///    laps of an interleaved schedule (boundaries b and b + p join the same two stages). A
///    step ends with flush() and a collective, so tags can be reused by the next step.
///  - Shapes are known from the model, not sent (Megatron's fixed tensor_shape): the tensor
///    crossing boundary b (virtual stage b → b+1 forward, b+1 → b backward) has shape
///    `boundary_shapes[b]` ([microbatch rows, width at the cut]) and dtype float32. With v
///    chunks per stage there are p·v − 1 boundaries and stage p − 1 sends forward to stage 0.
///  - send() posts the send and returns (Gloo moves the data once the receiver posts its
///    recv): a blocking send would deadlock 1F1B, where both neighbours send before they
///    receive. flush() waits for every posted send.
///  - Every recv and flush is bounded by the group's timeout. A peer process that dies
///    closes its connections, and the pending recv fails at once with a RuntimeFailure
///    naming the peer stage (= rank); a silent peer fails it after the timeout.
class ProcessGroupTransport : public StageTransport {
 public:
  /// `group`: the stages' process group (size = stages, this process = stage group->rank());
  /// it carries the activations. `boundary_shapes[b]`: shape of the message across boundary
  /// b, b = 0 .. stages − 2. `backward_group` (same ranks; null: `group`) carries the
  /// gradients. With NCCL it must be a second group: ProcessGroupNCCL runs the send and the
  /// recv between two ranks on one stream in posting order, so in 1F1B's steady state (each
  /// neighbour sends before it receives) one group would deadlock; with a group per
  /// direction each stream carries one direction only (torch.distributed.pipelining batches
  /// the send with the next recv instead, batch_isend_irecv). Tensors live on the group's
  /// device (CPU for Gloo, the rank's GPU for NCCL). Throws std::invalid_argument when there
  /// are not p·v − 1 shapes for some v ≥ 1 (V: 2p − 1) or the two groups differ in ranks or device.
  /// `placement`: which rank holds virtual stage c (stage_rank: loop c mod p; V, ZB-V's, c or
  /// 2p − 1 − c), so which two ranks boundary b joins.
  ProcessGroupTransport(std::shared_ptr<dist::Group> group, std::vector<std::vector<int64_t>> boundary_shapes,
                        std::shared_ptr<dist::Group> backward_group = nullptr, Placement placement = Placement::Loop);
  /// Aborts sends still in flight (after a failure) so that nothing waits on them.
  ~ProcessGroupTransport() override;

  /// Posts a send of `t` (float32 on the group's device, the crossed boundary's shape) from this
  /// process's stage `src` to its neighbour `dst` = src ± 1 (mod p with chunks) and returns
  /// without waiting. Throws std::invalid_argument when src is not this rank, dst is no
  /// neighbour of it, the boundary does not join them, or the shape differs from the
  /// boundary's; RuntimeFailure when the backend cannot post the send.
  void send(int src, int dst, char kind, int microbatch, const torch::Tensor& t, int boundary = -1) override;
  /// Receives the activation ('F', from src = dst − 1) or gradient ('B', from src = dst + 1)
  /// of `microbatch` into a new float32 tensor of the boundary's shape on the group's device.
  /// Returns once the data is there (on CUDA: after synchronising the device, so that the
  /// caller's wait time is the real one). Blocks at most the group's timeout (NCCL: its
  /// watchdog). Throws RuntimeFailure "stage D: no activation|gradient for microbatch
  /// J from stage S (rank S): ..." when the peer died, timed out or abort() was called.
  torch::Tensor recv(int src, int dst, char kind, int microbatch, int boundary = -1) override;
  /// Makes the pending and every later recv throw RuntimeFailure with `why`.
  void abort(const std::string& why) override;
  /// The job's rank of each stage (size = stages), which keys the timeline's send/recv flows
  /// (trace_p2p_annotate): needed where several pipelines share a job (a DP x TP x PP mesh).
  /// Empty (the default): the stage numbers. Throws std::invalid_argument on a wrong size.
  void set_job_ranks(std::vector<int> ranks);
  /// Waits until every posted send has been received. Throws RuntimeFailure naming the
  /// receiving stage when one fails (the peer died) or the group's timeout passes.
  void flush();

  /// The tag of a message: 2·microbatch + (kind == 'B') + 2^20·lap, lap = ⌊boundary / p⌋
  /// (0 with one chunk per stage).
  static int tag(char kind, int microbatch, int lap = 0) {
    return (lap << 20) + 2 * microbatch + (kind == 'B' ? 1 : 0);
  }

 private:
  std::vector<int> job_ranks_;  // set_job_ranks (empty: the stage numbers)
  int job_rank(int stage) const { return job_ranks_.empty() ? -1 : job_ranks_[static_cast<std::size_t>(stage)]; }
  struct Pending {
    std::shared_ptr<dist::Work> work;  // keeps the tensor alive until received
    int dst = 0;
    char kind = 'F';
    int microbatch = 0;
  };
  std::shared_ptr<dist::Group> group_;           // activations (and rank, size, device)
  std::shared_ptr<dist::Group> backward_group_;  // gradients (may be group_)
  std::vector<std::vector<int64_t>> shapes_;
  Placement placement_ = Placement::Loop;
  std::vector<Pending> sends_;
  std::mutex mu_;                               // guards recv_ and aborted_ (abort may come from another thread)
  std::shared_ptr<dist::Work> recv_;            // the recv being waited on, for abort()
  std::string aborted_;
  /// The boundary a message crosses (resolving −1) and its lap; checks that it joins src and dst.
  std::pair<int, int> boundary_of(int src, int dst, int boundary) const;
};

}  // namespace mpt
