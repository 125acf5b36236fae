// Distributed processes through PyTorch's own engine (c10d): launch, rendezvous,
// process groups, collectives, and a DDP-style gradient reducer.
//
//  - Launch: `mpt <experiment> --nproc N` makes the harness spawn N workers of mpt
//    itself (/proc/self/exe, same argv) with MPT_RANK / MPT_WORLD_SIZE / MASTER_ADDR /
//    MASTER_PORT set (127.0.0.1, a free port). The same binary also runs under an
//    existing launcher: torchrun --no-python (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
//    MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE) or SLURM (SLURM_PROCID, SLURM_NTASKS,
//    SLURM_LOCALID; MASTER_ADDR/MASTER_PORT from the job script).
//  - Rendezvous: a c10d::TCPStore hosted by rank 0 (or by the torchrun agent).
//  - Collectives: c10d::ProcessGroupGloo on CPU (a Gloo TCP device on the master's
//    interface), every call bounded by a timeout, so no rank waits forever.
//  - Point to point: send/recv between two ranks (pipeline stages), same timeout.
//  - Reducer: gradients bucketed in reverse parameter order (first bucket 1 MB, then
//    25 MB caps), each bucket flattened and all-reduced (sum), launched from gradient
//    hooks during backward (overlap) or after it, as torch.nn.parallel.DistributedDataParallel
//    does (Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel Training").
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace mpt::dist {

// ----------------------------------------------------------------------------
// Launch
// ----------------------------------------------------------------------------

/// Where this process sits in a job, as read from its environment.
struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string launcher = "none";  ///< "none", "mpt" (--nproc), "torchrun", "slurm"
  bool agent_store = false;       ///< torchrun's agent hosts the TCPStore (TORCHELASTIC_USE_AGENT_STORE=True)
  std::string store_prefix;       ///< key prefix inside the agent's store ("/worker/attempt_K")
  std::string world_size_var;     ///< the variable the world size came from (MPT_WORLD_SIZE, WORLD_SIZE, SLURM_NTASKS)
};

/// Reads the launcher environment: MPT_RANK/MPT_WORLD_SIZE (mpt --nproc), then torchrun's
/// RANK/WORLD_SIZE/LOCAL_RANK, then SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID. nullopt when
/// none is set (a plain single process). MASTER_ADDR/MASTER_PORT are required for
/// world_size > 1. Throws RuntimeFailure for malformed or inconsistent values.
std::optional<LaunchInfo> launch_from_environment();

/// Exit code of a worker stopped on purpose by the /fault config keys (tests of failure
/// handling): distinct from 3, which a rank uses when it stops because a peer failed.
inline constexpr int kExitInjectedFault = 86;

/// Spawns `nproc` workers running `argv` again (the executable is /proc/self/exe) with
/// MPT_RANK=i, MPT_WORLD_SIZE=nproc, MPT_LOCAL_RANK=i, MASTER_ADDR=127.0.0.1,
/// MASTER_PORT=<port> and MPT_AGENT_STORE=1: this process hosts the job's TCPStore (as
/// torchrun's agent does), so the store outlives any worker. Waits for all. When a worker
/// fails (non-zero exit or a signal), the others get `grace_s` seconds to end on their own
/// (they notice through their collective timeouts) and are then killed. Returns 0 when all
/// succeed; else logs "rank R of N failed: ..." naming the failed rank and returns its exit
/// code if it is 1, 2 or 3, else 3. Blame: ranks that fail within 0.2 s of each other are
/// weighed together; a rank that failed on its own (a signal, or an exit code other than 3)
/// is named first; else a rank that the failed ranks reported as not answering (see Group)
/// and that is still running: it is hung, and is killed as soon as the other ranks have
/// exited (at most min(grace_s, 10 s) later); else the first failure. Workers get SIGKILL
/// if this process dies.
int spawn_local(int nproc, const std::vector<std::string>& argv, double grace_s);

// ----------------------------------------------------------------------------
// Process groups
// ----------------------------------------------------------------------------

// ----------------------------------------------------------------------------
// Heartbeats
// ----------------------------------------------------------------------------
// Every rank of a multi-process job publishes a heartbeat in the job's store from a thread of
// its own (started by connect_store): "mpt/heartbeat/<rank>" = "<beat> <process CPU ms>
// <waiting> <progress>", every heartbeat_interval(). A rank that waits for its peers reads
// theirs: a stopped (SIGSTOP) or dead rank stops beating; a hung rank beats but neither uses
// CPU nor calls note_progress(); a busy rank does one or the other; a rank that itself waits
// says for whom (<waiting>: -1 none, a global rank, or -2 a whole group). Waits that the protocol makes
// long (Group::create, Group::barrier) extend their deadline while the awaited peers make
// progress; a failed wait names the rank that is late, following "waiting for" links.

/// Beat period for a job whose collectives time out after `timeout`: timeout/20, between
/// 20 ms and 500 ms.
std::chrono::milliseconds heartbeat_interval(std::chrono::milliseconds timeout);

/// Tells the peers (through the heartbeat) that this rank is working although it may use
/// little CPU (e.g. a pipeline stage sleeping a synthetic cost). Call once per unit of work
/// (a training step, a pipeline operation); cheap (an atomic increment), thread-safe.
void note_progress();

/// Marks the calling thread's rank as waiting for rank `global_rank` (-2: a whole group) in
/// the heartbeat while in scope (RAII; restores the previous value).
class WaitingFor {
 public:
  explicit WaitingFor(int global_rank);
  ~WaitingFor();
  WaitingFor(const WaitingFor&) = delete;
  WaitingFor& operator=(const WaitingFor&) = delete;

 private:
  int previous_;
};

/// A handle on one asynchronous collective (c10d::Work).
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<void> impl) : impl_(std::move(impl)) {}
  /// Blocks until done; throws RuntimeFailure when the collective failed or timed out.
  void wait();
  /// Makes a pending wait() of a send/recv return early (c10d Work::abort; Gloo aborts the
  /// UnboundBuffer's waitRecv/waitSend). wait() then throws RuntimeFailure. No-op when empty.
  void abort();
  bool valid() const { return impl_ != nullptr; }

 private:
  std::shared_ptr<void> impl_;
};

enum class ReduceOp { Sum, Min, Max };

/// A group of processes that run collectives together: c10d::ProcessGroupGloo for CPU tensors,
/// c10d::ProcessGroupNCCL for CUDA tensors (compiled only against a CUDA LibTorch), as
/// torch.distributed.init_process_group("gloo" | "nccl") gives.
/// Every collective is bounded by the group's timeout; a failure or timeout throws
/// RuntimeFailure ("<op> failed on rank R of N: ...; a peer process failed or timed out;
/// rank Q did not answer (...)"). To name Q, a rank whose collective fails posts a report in
/// the group's store and waits a short window (timeout/4, between 1 and 5 s) for its peers'
/// reports; peers that send none are dead or hung. They are also posted under
/// "mpt/unresponsive/<rank>" in the job's store, where spawn_local reads them. A failed
/// send/recv names the late rank from the heartbeats (the peer, or the rank the peer waits
/// for) and posts it the same way.
class Group {
 public:
  /// Connects rank `rank` of `size` through `info`'s store; `prefix` separates groups that
  /// share the store (e.g. "n2/"). Ranks ≥ size must not call this. `device` chooses the
  /// backend: CPU → Gloo; CUDA → NCCL (one GPU per rank: the caller sets the current CUDA device
  /// first). Every member first waits for the others in the store (as barrier() does: the
  /// deadline moves on while a missing peer makes progress, so an idle rank waits for a busy
  /// one). Throws RuntimeFailure when the master cannot be reached, a peer makes no progress
  /// and does not show up within `timeout` (naming it), or a CUDA group is asked of a CPU-only build.
  static std::shared_ptr<Group> create(const LaunchInfo& info, int rank, int size, const std::string& prefix,
                                       std::chrono::milliseconds timeout, torch::Device device = torch::kCPU);
  ~Group();

  int rank() const { return rank_; }
  int size() const { return size_; }
  /// "gloo" or "nccl".
  const std::string& backend() const { return backend_; }
  /// Where this group's tensors live (CPU for Gloo, a CUDA device for NCCL).
  torch::Device device() const { return device_; }

  /// In-place all-reduce of a contiguous tensor on device() (any floating dtype the backend
  /// supports, incl. fp16).
  Work allreduce_async(torch::Tensor t, ReduceOp op = ReduceOp::Sum);
  void allreduce(torch::Tensor t, ReduceOp op = ReduceOp::Sum) { allreduce_async(std::move(t), op).wait(); }
  /// In-place broadcast from `root`.
  void broadcast(torch::Tensor t, int root = 0);
  /// Waits until every rank of the group has called barrier(). Built for ranks that the
  /// protocol leaves idle while others work (e.g. rank 0 training alone): it waits in the
  /// store, and its deadline is `timeout` after the last progress (heartbeat with main-thread
  /// CPU time) of a rank that has not arrived, so a busy peer is waited for and a stopped, dead
  /// or hung one is named (RuntimeFailure, also posted for spawn_local) about `timeout` after
  /// its last sign of work. Then a one-element all-reduce lets every rank leave together.
  void barrier();

  /// Point-to-point send of a contiguous CPU tensor to rank `dst` (c10d ProcessGroupGloo::send,
  /// the call under torch.distributed.isend). Returns at once; the Work keeps the tensor alive
  /// until the receiver has it, so keep the Work and wait() on it before reusing or dropping
  /// the tensor. Gloo moves the data only once `dst` has posted the matching recv (same tag),
  /// so a send is never complete before its recv. `tag` >= 0 tells apart messages between
  /// the same pair of ranks. Throws RuntimeFailure when the send cannot be posted.
  Work send_async(torch::Tensor t, int dst, int tag);
  /// Point-to-point receive into the contiguous CPU tensor `t` (same shape and dtype as the
  /// sender's) from rank `src` with `tag` (ProcessGroupGloo::recv, torch.distributed.irecv).
  /// wait() blocks at most the group's timeout and throws RuntimeFailure when it expires or
  /// the connection to `src` breaks (the peer process died).
  Work recv_async(torch::Tensor t, int src, int tag);

 private:
  Group() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, size_ = 1;
  std::string backend_ = "gloo";
  torch::Device device_ = torch::kCPU;
};

/// The store connection of this job, shared by the groups created from it.
/// Rank 0 hosts the TCPStore unless a torchrun agent does. Waits for the master at most
/// `timeout` (milliseconds honoured: LibTorch's own connect timeout has whole seconds),
/// then starts this rank's heartbeat thread. Throws RuntimeFailure (naming address, port
/// and timeout) when the master is unreachable or does not speak the store's protocol.
void connect_store(const LaunchInfo& info, std::chrono::milliseconds timeout);

// ----------------------------------------------------------------------------
// DDP-style reducer
// ----------------------------------------------------------------------------

/// Options of the Reducer (names as in torch.nn.parallel.DistributedDataParallel).
struct ReducerOptions {
  double bucket_cap_mb = 25.0;        ///< cap of every bucket but the first (MB = 2^20 bytes)
  double first_bucket_cap_mb = 1.0;   ///< DDP's smaller first bucket, so communication starts early
  bool overlap = true;                ///< launch a bucket's all-reduce from the gradient hooks
  bool divide_before = true;          ///< divide by world size before the sum (DDP) or after it
};

/// dtype of the flattened buckets on the wire: the parameters' own (mpt's models train in fp32).
inline constexpr torch::ScalarType kBucketDtype = torch::kFloat32;

/// One bucket: parameter indices (into the parameter list), their sizes and offsets.
struct Bucket {
  std::vector<std::size_t> params;
  std::vector<int64_t> offsets;  ///< element offset of each parameter in the flat buffer
  int64_t numel = 0;
  int64_t bytes = 0;
};

/// Groups parameters into buckets in reverse order (the order backward produces their
/// gradients): a bucket is closed when adding the next parameter would exceed its cap
/// (first bucket `first_cap_bytes`, the rest `cap_bytes`); a parameter larger than the cap
/// gets a bucket of its own. Mirrors DDP's compute_bucket_assignment_by_size.
std::vector<Bucket> assign_buckets(const std::vector<torch::Tensor>& params, int64_t first_cap_bytes,
                                   int64_t cap_bytes, int64_t element_bytes);

/// Averages gradients across a Group the way DDP does.
/// Usage per step: prepare(); forward; backward; finalize(). With sync(false) the hooks
/// leave gradients to accumulate locally (DDP's no_sync) and finalize() does nothing.
class Reducer {
 public:
  /// Broadcasts rank 0's parameters to every rank, builds the buckets and registers
  /// the gradient hooks. `params` must be leaf tensors that require grad.
  /// The hooks point at this object: it must outlive every backward through `params`.
  Reducer(std::vector<torch::Tensor> params, std::shared_ptr<Group> group, ReducerOptions opts);
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  /// Whether the next backward communicates (false: DDP's no_sync, local accumulation).
  void set_sync(bool on) { sync_ = on; }
  /// Call before each backward that communicates.
  void prepare();
  /// Waits for the all-reduces (launching any not yet launched), unflattens into .grad.
  /// Returns the seconds spent here (the all-reduce time not hidden behind backward).
  double finalize();

  const std::vector<Bucket>& buckets() const { return buckets_; }
  int64_t total_bytes() const;
  /// Synchronous all-reduce of every bucket as it would be sent (for bandwidth): returns seconds.
  double time_allreduce(int iters);

 private:
  void on_grad(std::size_t param, const torch::Tensor& grad);
  void launch(std::size_t bucket);
  std::vector<torch::Tensor> params_;
  std::shared_ptr<Group> group_;
  ReducerOptions opts_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_, slot_of_;
  std::vector<torch::Tensor> flat_;
  std::vector<int> pending_;
  std::vector<Work> works_;
  std::vector<bool> launched_;
  std::vector<bool> filled_;
  std::size_t next_launch_ = 0;
  bool sync_ = true;
};

}  // namespace mpt::dist
