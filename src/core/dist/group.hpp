// core/dist, groups: the job's store, heartbeats, process groups (Gloo on CPU, NCCL on CUDA)
// with their collectives and point-to-point messages, every call bounded by a timeout. See
// dist.hpp for the whole module.
#pragma once

#include <array>
#include <chrono>
#include <map>
#include <mutex>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "core/dist/launch.hpp"

namespace mpt::dist {

// ----------------------------------------------------------------------------
// The job's connection and its heartbeat
// ----------------------------------------------------------------------------
// Every rank of a multi-process job publishes a heartbeat in the job's store from a thread of
// its own (started by connect_store, owned by the Job): "mpt/heartbeat/<rank>" = "<beat>
// <process CPU ms> <waiting> <progress>", every heartbeat_interval(). A rank that waits for its
// peers reads theirs: a stopped (SIGSTOP) or dead rank stops beating; a hung rank beats but
// neither uses CPU nor calls Job::note_progress(); a busy rank does one or the other; a rank that
// itself waits says for whom (<waiting>: -1 none, a global rank, -2 a whole group, or -3 none any
// more: a wait failed and it is finding out whom to blame). Waits that the protocol makes
// long (Group::create, Group::barrier) extend their deadline while the awaited peers make
// progress; a failed wait names the rank that is late, following "waiting for" links and the
// verdicts that ranks which gave up posted ("mpt/unresponsive/<rank>": a rank that gave up on
// rank 3 and ended is not blamed for its stopped heartbeat), and says it cannot tell when every
// rank followed waits in a collective.

/// Beat period for a job whose collectives time out after `timeout`: timeout/20, between
/// 20 ms and 500 ms.
std::chrono::milliseconds heartbeat_interval(std::chrono::milliseconds timeout);

namespace detail {
struct JobState;  // job_state.hpp: the store and the heartbeat thread
}

/// This process's connection to its job, as torch.distributed's default store is for
/// init_process_group: the job's store (a c10d::TCPStore, hosted by rank 0 or by the launcher;
/// a c10d::HashStore for one process without a launcher), the timeout of its operations, this
/// process's place in the job (LaunchInfo: global rank, world size, master address) and, in a
/// job of several ranks, the heartbeat thread with what it publishes (the progress count, what
/// the main thread waits for). Made by connect_store; every Group created from it keeps a
/// shared_ptr to it, so the store outlives the groups; the harness's World owns the process's
/// one. Destruction joins the heartbeat thread first, then closes the store. Independent of
/// any other Job in the same process (the unit tests play several jobs, or ranks, in one).
/// Thread-safe: groups of one job may run on several threads.
class Job {
 public:
  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  /// This process's place in the job, as connect_store received it.
  const LaunchInfo& launch() const;
  /// This process's rank in the job (global rank), 0 .. world_size() − 1.
  int rank() const { return launch().rank; }
  int world_size() const { return launch().world_size; }
  /// The bound of every store operation and of the waits that read the heartbeats.
  std::chrono::milliseconds timeout() const;

  /// Tells the peers (through the heartbeat) that this rank is working although it may use
  /// little CPU (e.g. a pipeline stage sleeping a synthetic cost). Call once per unit of work
  /// (a training step, a pipeline operation); cheap (an atomic increment), thread-safe.
  void note_progress();
  /// The count note_progress() has reached (published as <progress>; starts at 0).
  long long progress() const;
  /// What this rank's heartbeat says it waits for: −1 nothing, a global rank, −2 a whole group
  /// (set by WaitingFor).
  int waiting_on() const;

  /// Clock exchanges with rank 0 through the job's store, for trace::clock_from_exchanges (the
  /// NTP-style offset of --trace timelines): on rank r > 0, `rounds` exchanges {t0, t1, t2, t3}
  /// in microseconds of trace::now_us() (t0, t3 this rank's clock, t1, t2 rank 0's: rank r sets
  /// "mpt/clock/ping/r/k" = t0, rank 0 reads it at t1 and sets ".../pong/r/k" = "t1 t2" at t2,
  /// rank r reads it at t3); rank 0 answers every rank in turn and returns no exchanges. Every
  /// rank of the job calls it once per `tag` (keys "mpt/clock/<tag>ping/r/k": the harness's
  /// --trace exchange and an experiment's own do not meet). Throws RuntimeFailure when a peer
  /// does not answer within the store's timeout.
  std::vector<std::array<double, 4>> clock_exchanges(int rounds, const std::string& tag = "");

  /// Gathers one string per rank on rank 0 through the job's store (key "mpt/gather/<key>/<r>"):
  /// rank 0 gets every rank's `mine` in rank order, the others an empty vector (they only set
  /// theirs). Any length: a value travels in pieces of 1 MiB ("<key>/<r>/piece/<i>", then the
  /// header "<pieces> <bytes>" under "<key>/<r>"), under the 8 MiB a message of LibTorch's
  /// libuv TCPStore may carry; rank 0 deletes the keys it has read. Memory: rank 0 holds every
  /// rank's value. Throws RuntimeFailure when a rank's value does not come within the store's
  /// timeout or its pieces do not add up.
  std::vector<std::string> gather_on_rank0(const std::string& key, const std::string& mine);

  /// Checks that this process and rank 0 run the same job; called once per rank right after
  /// connecting (World::job() does). Claims this rank's number in the store (key
  /// "mpt/launch/claim/<r>"): a second process started with the same rank is refused. Then rank
  /// 0 posts `fingerprint` (a JSON object: the experiment, its resolved config, the versions —
  /// whatever must agree across ranks; in pieces, as gather_on_rank0's values travel, so a config
  /// of any size fits), and every other rank waits for it (as long as rank 0's
  /// heartbeat shows progress; a rank 0 not yet seen under mpt's own launcher: 60 s) and
  /// compares its own, naming the first JSON pointer where they differ and both values. A
  /// launch mistake under torchrun or SLURM (ranks given different configs or --set, two
  /// processes with one RANK) otherwise ends as a collective timeout in which each rank blames
  /// the other. Throws ConfigError (a usage error: exit 2) for a mismatch or a duplicate rank,
  /// RuntimeFailure when rank 0's fingerprint does not come within that bound. Not a Python
  /// torch.distributed feature: mpt's own check.
  void check_same_launch(const std::string& fingerprint);

 private:
  explicit Job(std::unique_ptr<detail::JobState> state);
  friend std::shared_ptr<Job> connect_store(const LaunchInfo& info, std::chrono::milliseconds timeout);
  friend class Group;
  friend class Work;
  friend class WaitingFor;
  std::unique_ptr<detail::JobState> state_;
};

/// Connects this process to its job's store (see Job). Rank 0 hosts the TCPStore unless a
/// launcher's agent does (torchrun; mpt --nproc's parent); one process without a launcher gets a
/// HashStore. Waits for the master at most `timeout` (milliseconds honoured: LibTorch's own
/// connect timeout has whole seconds), then starts this rank's heartbeat thread (jobs of more
/// than one rank). Each call makes a new, independent Job. Throws RuntimeFailure (naming
/// address, port and timeout) when the master is unreachable or does not speak the store's protocol.
std::shared_ptr<Job> connect_store(const LaunchInfo& info, std::chrono::milliseconds timeout);

/// Marks `job`'s rank as waiting for rank `global_rank` (-2: a whole group) in its heartbeat
/// while in scope (RAII; restores the previous value). The job must outlive it.
class WaitingFor {
 public:
  WaitingFor(Job& job, int global_rank);
  ~WaitingFor();
  WaitingFor(const WaitingFor&) = delete;
  WaitingFor& operator=(const WaitingFor&) = delete;

 private:
  Job& job_;
  int previous_;
};

// ----------------------------------------------------------------------------
// Process groups
// ----------------------------------------------------------------------------

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

/// What one kind of collective of a Group has cost so far (Group::comm_counts()).
/// `payload_bytes` is the size of the tensor the caller hands over, as nccl-tests counts it: the
/// buffer of an all-reduce or broadcast, the *output* of an all-gather, the *input* of a
/// reduce-scatter, `in` of an all-to-all, the tensor of a send or recv. `sent_bytes` is what
/// this rank puts on the wire under the ring algorithm (NCCL's ring; Gloo's ring / ring-chunked
/// all-reduce; mpt's own ring_reduce_scatter / ring_all_gather, which send exactly this), from
/// the payload S and the group size N:
///   all-reduce 2(N−1)/N·S (reduce-scatter then all-gather), all-gather (N−1)/N·S,
///   reduce-scatter (N−1)/N·S, broadcast and all-to-all (N−1)/N·S, send S, recv 0.
/// The ring's own point-to-point steps are counted under its collective's kind, not as
/// "send"/"recv". One rank: nothing is sent (0).
struct CommCount {
  int64_t calls = 0;
  int64_t payload_bytes = 0;
  double sent_bytes = 0;
};

/// How a Gloo group carries out reduce_scatter and all_gather (the `dist.gloo_algorithm` key of
/// `mpt shard` and `mpt collectives`). NCCL groups ignore it: they always run NCCL's own.
///   Native: c10d ProcessGroupGloo's _reduce_scatter_base and _allgather_base (the flat forms
///           under torch.distributed.reduce_scatter_tensor / all_gather_into_tensor; 1.13: the
///           list allgather). LibTorch 1.13's Gloo has no reduce_scatter, so there Native runs
///           reduce-scatter as the Ring (all-gather native).
///   Ring:   Group::ring_reduce_scatter and Group::ring_all_gather (send/recv, mpt's own).
enum class GlooAlgorithm { Native, Ring };

/// Why Gloo's native reduce-scatter costs about an all-reduce, in words for env.dist and the
/// tables' notes: LibTorch 2.x's ProcessGroupGloo has no reduce-scatter algorithm, and its
/// reduce_scatter_tensor all-reduces the whole input and keeps this rank's chunk
/// (pytorch/pytorch#118911, "still 2x communication than a real reduce-scatter"; the list form
/// runs one all-reduce per rank, #149869), so it sends 2(N−1)/N of the payload, twice a ring's.
inline constexpr const char* kGlooNativeReduceScatter =
    "Gloo's native reduce_scatter is an all-reduce of the whole input with this rank's chunk kept (Gloo has no "
    "reduce-scatter algorithm): it sends 2(N-1)/N of the payload, twice a ring's, and costs about an all-reduce";

/// "native" | "ring" -> the value; throws std::invalid_argument naming the expected values.
GlooAlgorithm gloo_algorithm_from_name(const std::string& name);
/// The name gloo_algorithm_from_name reads: "native" or "ring".
std::string gloo_algorithm_name(GlooAlgorithm a);

/// What `kind` ("reduce_scatter" or "all_gather") runs on a group of `backend` ("gloo" or
/// "nccl") configured with `a`, in words, with the reason where it is not what was asked:
/// "gloo native (c10d ProcessGroupGloo::_reduce_scatter_base (reduce_scatter_tensor))", "ring (send/recv, mpt) ...",
/// "nccl native ...". For the result file's env.dist. Throws std::invalid_argument for another kind.
std::string collective_algorithm(const std::string& backend, GlooAlgorithm a, const std::string& kind);

/// Tags at or above this value are reserved for Group's ring collectives; send_async and
/// recv_async refuse them (std::invalid_argument).
inline constexpr int kRingTagBase = 1 << 30;

/// A group of processes that run collectives together: c10d::ProcessGroupGloo for CPU tensors,
/// c10d::ProcessGroupNCCL for CUDA tensors (compiled only against a CUDA LibTorch), as
/// torch.distributed.init_process_group("gloo" | "nccl") gives.
/// Every collective is bounded by the group's timeout; a failure or timeout throws
/// RuntimeFailure ("<op> failed on rank R of N: ...; a peer process failed or timed out;
/// rank Q did not answer (...)"). To name Q, a rank whose collective fails posts a report in
/// the group's store and waits a short window (timeout/4, between 1 and 5 s) for its peers'
/// reports; of the peers that send none it names the ones to blame, read from the job's
/// heartbeats and verdicts: a peer that is dead, stopped or hung, not one that gave up on a
/// third rank (it is followed to that rank) or waits for one ("; cannot tell which rank (...)"
/// when every peer followed waits in a collective). Whom a rank blames, or that it cannot
/// tell, is posted under "mpt/unresponsive/<rank>" in the job's store before it ends, where
/// spawn_local and the other ranks read it; while it finds out, its heartbeat says it is giving
/// up. A failed send/recv names the late rank the same way (the peer, the rank the peer waits
/// for, or the rank the peer gave up on) and posts it the same way.
class Group {
 public:
  /// Connects rank `rank` of `size` through `job`'s store (the group keeps `job` alive);
  /// `prefix` separates groups that share the store (e.g. "n2/"). Ranks ≥ size must not call this. `device` chooses the
  /// backend: CPU → Gloo; CUDA → NCCL (one GPU per rank: the caller sets the current CUDA device
  /// first). Every member first waits for the others in the store (as barrier() does: the
  /// deadline moves on while a missing peer makes progress, so an idle rank waits for a busy
  /// one). Throws RuntimeFailure when the master cannot be reached, a peer makes no progress
  /// and does not show up within `timeout` (naming it), or a CUDA group is asked of a CPU-only
  /// build; std::invalid_argument when `job` is null.
  static std::shared_ptr<Group> create(std::shared_ptr<Job> job, int rank, int size, const std::string& prefix,
                                       std::chrono::milliseconds timeout, torch::Device device = torch::kCPU);
  ~Group();

  int rank() const { return rank_; }
  int size() const { return size_; }
  /// "gloo" or "nccl".
  const std::string& backend() const { return backend_; }
  /// Where this group's tensors live (CPU for Gloo, a CUDA device for NCCL).
  torch::Device device() const { return device_; }
  /// The job this group was created from (never null): for Job::note_progress() and more groups.
  const std::shared_ptr<Job>& job() const { return job_; }

  /// In-place all-reduce of a contiguous tensor on device() (any floating dtype the backend
  /// supports, incl. fp16).
  Work allreduce_async(torch::Tensor t, ReduceOp op = ReduceOp::Sum);
  void allreduce(torch::Tensor t, ReduceOp op = ReduceOp::Sum) { allreduce_async(std::move(t), op).wait(); }
  /// In-place broadcast from `root`.
  void broadcast(torch::Tensor t, int root = 0);
  /// All-gather (torch.distributed.all_gather_into_tensor): `out`, contiguous with size() x the
  /// first dimension of `in` and otherwise its shape, receives every rank's `in`, in rank order
  /// along dimension 0. Blocks. NCCL runs its own; Gloo runs c10d's _allgather_base (1.13: allgather), or
  /// ring_all_gather when gloo_algorithm() is Ring. Throws std::invalid_argument for mismatched
  /// shapes, RuntimeFailure when a peer fails or times out.
  void all_gather(const torch::Tensor& in, torch::Tensor out);
  /// Reduce-scatter (torch.distributed.reduce_scatter_tensor): `in` is size() chunks along
  /// dimension 0; `out` (the shape of one chunk) receives chunk rank() reduced over the ranks
  /// with `op`. Blocks. NCCL runs its own; Gloo runs c10d's _reduce_scatter_base on LibTorch 2.x with
  /// gloo_algorithm() Native, and ring_reduce_scatter otherwise (always on LibTorch 1.13, whose
  /// Gloo has none). Throws as all_gather.
  void reduce_scatter(const torch::Tensor& in, torch::Tensor out, ReduceOp op = ReduceOp::Sum);

  /// Ring reduce-scatter built from this group's point-to-point messages (Patarasuk & Yuan 2009,
  /// "Bandwidth optimal all-reduce algorithms for clusters of workstations", its first phase; the
  /// reduce-scatter half of NCCL's ring all-reduce). Shapes as reduce_scatter: `in` [N·c, ...]
  /// contiguous, `out` [c, ...] contiguous, one dtype and device (N = size(); chunk j = rows
  /// j·c .. (j+1)·c − 1 of `in`). N − 1 steps; at step s = 0 .. N−2 rank r sends to r+1 (mod N)
  /// the partial of chunk (r − s − 1) mod N — at s = 0 its own chunk of `in` — and receives from
  /// r−1 the partial of chunk (r − s − 2) mod N, which it combines with its own chunk of `in`
  /// (received ⊕ own). Rank r ends with chunk r. Summation order, hence the exact value: chunk j
  /// is reduced in rank order starting after j, left to right,
  ///   out_j = (((in_{j+1}[j] ⊕ in_{j+2}[j]) ⊕ in_{j+3}[j]) ⊕ ... ) ⊕ in_j[j]   (ranks mod N),
  /// each ⊕ one elementwise op of the dtype (torch's add / minimum / maximum: rounded to the
  /// dtype per element). Min and max are exact in any order; a sum equals another order's bit
  /// for bit at N = 2 (a ⊕ b = b ⊕ a) but in general not at N > 2. Sends (N−1)/N of `in`'s bytes
  /// per rank (counted as "reduce_scatter"); receives as much. Tags kRingTagBase and up, one
  /// per call and step. On Gloo at N = 2, rank 1's messages to rank 0 go through a second
  /// ProcessGroupGloo on the same device, formed at the group's first ring call, so that each
  /// direction has its own TCP pair (Gloo's device thread spins while a write holds its pair;
  /// docs/shard.md). At N > 2 the two neighbours are different pairs already. Every rank of the group must call it in the same order with
  /// the other collectives. Throws std::invalid_argument for mismatched shapes; RuntimeFailure
  /// when a step fails or times out (the group's timeout per step; the rank that did not answer
  /// named as for the other collectives) or the second group cannot be formed. One rank: `out` = `in`.
  void ring_reduce_scatter(const torch::Tensor& in, torch::Tensor out, ReduceOp op = ReduceOp::Sum);
  /// Ring all-gather from point-to-point messages (Patarasuk & Yuan 2009's second phase; NCCL's
  /// ring all-gather). Shapes as all_gather: `in` [c, ...], `out` [N·c, ...], contiguous, one
  /// dtype and device. Rank r first copies `in` into chunk r of `out` (nothing to copy when `in`
  /// is that chunk: the in-place form, as NCCL allows); at step s = 0 .. N−2 it
  /// sends chunk (r − s) mod N of `out` to r+1 and receives chunk (r − s − 1) mod N from r−1
  /// straight into `out`. Copies only, so the result is exact. Sends (N−1)/N of `out`'s bytes
  /// per rank (counted as "all_gather"). Throws as ring_reduce_scatter.
  void ring_all_gather(const torch::Tensor& in, torch::Tensor out);

  /// Chooses how reduce_scatter and all_gather run on Gloo (GlooAlgorithm; ignored by NCCL).
  /// Every rank of the group must choose the same. Default Native. Not thread-safe against
  /// collectives running on other threads.
  void set_gloo_algorithm(GlooAlgorithm a) { gloo_algorithm_ = a; }
  GlooAlgorithm gloo_algorithm() const { return gloo_algorithm_; }
  /// Whether reduce_scatter (`kind` "reduce_scatter") or all_gather ("all_gather") of this group
  /// runs the ring: Gloo with Ring, or reduce_scatter on LibTorch 1.13's Gloo.
  bool uses_ring(const std::string& kind) const;
  /// All-to-all with equal splits (torch.distributed.all_to_all_single): `in` and `out` have one
  /// shape, dimension 0 divisible by size(); chunk j of `in` goes to rank j, and chunk i of `out`
  /// comes from rank i (c10d alltoall_base; Gloo on CPU, NCCL on CUDA, both versions). Blocks.
  /// Throws as all_gather.
  void all_to_all(const torch::Tensor& in, torch::Tensor out);
  /// Waits until every rank of the group has called barrier(). Built for ranks that the
  /// protocol leaves idle while others work (e.g. rank 0 training alone): it waits in the
  /// store, and its deadline is `timeout` after the last progress (heartbeat with main-thread
  /// CPU time) of a rank that has not arrived, so a busy peer is waited for and a stopped, dead
  /// or hung one is named (RuntimeFailure, also posted for spawn_local) about `timeout` after
  /// its last sign of work. Then a one-element all-reduce lets every rank leave together.
  void barrier();

  /// Bytes and calls per collective kind since creation or reset_comm_counts(), keyed
  /// "all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "send", "recv"
  /// (kinds never called are absent). Counted when the call is posted, at the collective layer
  /// (CommCount says how); barrier()'s one-element all-reduce counts as an all-reduce. Thread-safe.
  std::map<std::string, CommCount> comm_counts() const;
  /// Sets every counter of comm_counts() back to zero.
  void reset_comm_counts();

  /// Point-to-point send of a contiguous CPU tensor to rank `dst` (c10d ProcessGroupGloo::send,
  /// the call under torch.distributed.isend). Returns at once; the Work keeps the tensor alive
  /// until the receiver has it, so keep the Work and wait() on it before reusing or dropping
  /// the tensor. Gloo moves the data only once `dst` has posted the matching recv (same tag),
  /// so a send is never complete before its recv. `tag` >= 0 tells apart messages between
  /// the same pair of ranks; tags kRingTagBase (2^30) and up belong to the ring collectives and
  /// are refused (std::invalid_argument naming the range). Throws RuntimeFailure when the send
  /// cannot be posted.
  Work send_async(torch::Tensor t, int dst, int tag);
  /// Point-to-point receive into the contiguous CPU tensor `t` (same shape and dtype as the
  /// sender's) from rank `src` with `tag` (ProcessGroupGloo::recv, torch.distributed.irecv).
  /// wait() blocks at most the group's timeout and throws RuntimeFailure when it expires or
  /// the connection to `src` breaks (the peer process died). Tags as send_async (the ring's
  /// range refused with std::invalid_argument).
  Work recv_async(torch::Tensor t, int src, int tag);

 private:
  Group() = default;
  void count(const char* kind, int64_t payload_bytes, double sent_bytes);
  // One point-to-point step of a ring collective: posted and diagnosed as a collective (the
  // group's monitor), neither counted nor traced on its own.
  Work ring_step(bool send, torch::Tensor t, int peer, int tag, const std::string& what);
  std::shared_ptr<Job> job_;  // before impl_: the store outlives the process group
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, size_ = 1;
  std::string backend_ = "gloo";
  torch::Device device_ = torch::kCPU;
  mutable std::mutex count_mu_;
  std::map<std::string, CommCount> counts_;
  GlooAlgorithm gloo_algorithm_ = GlooAlgorithm::Native;
  int64_t ring_calls_ = 0;  // ring collectives so far (their tags); every rank counts alike
};

/// Returns once `group`'s worker thread has let go of every earlier collective's tensors, so that
/// a count of live bytes (core/runtime/memory) taken next includes none of them: mpt's Gloo groups
/// run one collective at a time on one worker thread, which drops a finished collective's
/// tensors only when it takes the next, so this all-reduces `token` (one element, which the
/// caller keeps alive across its readings so that the worker's hold on it changes no count).
/// Throws what allreduce throws.
void settle(Group& group, torch::Tensor& token);

/// The largest of every rank's `x` (float64), NaN if any rank's is NaN, on every rank: what a
/// check of the worst rank needs, which a MAX all-reduce cannot give (Gloo's max, like
/// std::max, drops a NaN met second). An all-gather of one value per rank. Throws what
/// all_gather throws.
double max_over(Group& group, double x);

}  // namespace mpt::dist
