// The processes of a multi-process run as the harness sets them up (docs/architecture.md, "Adding a multi-process experiment"): this
// rank's place in the job (from --nproc, torchrun or SLURM), the job's connection (dist::Job:
// store and heartbeat), the world group, the rank's device and the one fault-injection point. Experiments receive it in their Context
// and never launch, connect or create groups through core/dist themselves.
//
//   World& w = *ctx.world;
//   auto g = w.new_group("train_n2/", 2, w.device());   // ranks 0, 1 on Gloo (CPU) or NCCL (CUDA)
//   w.fault_point(step);                               // tests of failure handling stop a rank here
//   w.note_progress();                                 // peers waiting for this rank see it work
//   w.group()->barrier();                              // every rank, Gloo
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "core/dist/dist.hpp"

namespace mpt {

/// Where a test of failure handling stops a rank (the /fault/* keys of an experiment).
struct FaultPlan {
  int rank = -1;      ///< the rank that fails; -1: none
  int64_t step = 0;   ///< at the experiment's step with this index (its own count, from 0)
  bool hang = false;  ///< alive but silent (sleeps forever) instead of exiting with dist::kExitInjectedFault
};

/// One rank of a multi-process run. The job's connection and the groups are made on first use,
/// so that a run which needs no collective (a pipeline on threads) opens nothing; every rank must
/// then ask for the same groups in the same order, as with torch.distributed.new_group. The
/// World owns the dist::Job (its groups share it, so it lasts as long as the last of them).
class World {
 public:
  /// `launch`: this process's place in the job (LaunchInfo{} for one process without a
  /// launcher); `device`: the run's device — a CUDA device becomes this rank's own GPU
  /// (cuda_device_for_rank(local_rank), made current), as DDP and Megatron-LM ranks do;
  /// `timeout`: the bound of the rendezvous and of every collective. Throws RuntimeFailure
  /// when a CUDA rank has no GPU of its own.
  World(dist::LaunchInfo launch, torch::Device device, std::chrono::milliseconds timeout, FaultPlan fault = {});
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int rank() const { return launch_.rank; }
  int size() const { return launch_.world_size; }
  /// Rank 0 reports: only its Report is printed and written by the harness.
  bool is_rank0() const { return launch_.rank == 0; }
  const dist::LaunchInfo& launch() const { return launch_; }
  /// This rank's device: the CPU, or its own GPU.
  torch::Device device() const { return device_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  /// This rank's connection to the job (store, heartbeat; dist::connect_store with launch() and
  /// timeout()), made on the first call; then, with a fingerprint set, dist::Job::check_same_launch.
  /// Throws what dist::connect_store and check_same_launch throw.
  const std::shared_ptr<dist::Job>& job();
  /// What every rank must agree on (a JSON object as text: the experiment, its config, the
  /// versions); checked against rank 0's when the job connects. Empty (the default): no check.
  void set_launch_fingerprint(std::string fingerprint) { fingerprint_ = std::move(fingerprint); }
  /// How the Gloo groups made from now on run reduce_scatter and all_gather
  /// (dist::Group::set_gloo_algorithm; default Native). Every rank must set the same.
  void set_gloo_algorithm(dist::GlooAlgorithm a) { gloo_algorithm_ = a; }
  dist::GlooAlgorithm gloo_algorithm() const { return gloo_algorithm_; }
  /// Whether job() has been made (by it, group() or new_group()).
  bool connected() const { return job_ != nullptr; }
  /// dist::Job::note_progress() of this rank's job: peers waiting for this rank see it work.
  /// Before the job is connected no peer watches this rank, and it does nothing.
  void note_progress() const {
    if (job_) job_->note_progress();
  }

  /// The group of every rank on the CPU (Gloo, store prefix "world/"): flags, barriers and
  /// CPU collectives. Created (and the job connected) on the first call. Throws RuntimeFailure
  /// when a peer does not show up within the timeout.
  const std::shared_ptr<dist::Group>& group();
  /// A group of ranks 0 .. size − 1 on `device` (CPU: Gloo; CUDA: NCCL), `name` its prefix in
  /// the job's store (unique per group, e.g. "train_n2/"). Only ranks < size call it. Connects
  /// the job on first use. Throws what dist::connect_store and dist::Group::create throw.
  std::shared_ptr<dist::Group> new_group(const std::string& name, int size, torch::Device device);
  /// A group of the job's ranks `global_ranks` (torch.distributed.new_group(ranks=...)): group
  /// rank i is global rank global_ranks[i]. Returns nullptr on a rank not in the list (torch's
  /// GroupMember.NON_GROUP_MEMBER) without touching the store, so every rank may walk the same
  /// list of groups in the same order (as torch requires, and as a DeviceMesh is built); the
  /// members must create their groups in one global order (no deadlock). `name`: the group's
  /// store prefix, unique per group. Throws std::invalid_argument for an empty list, a rank
  /// outside 0 .. size() − 1 or listed twice; else what new_group(name, size, device) throws.
  std::shared_ptr<dist::Group> new_group(const std::string& name, const std::vector<int>& global_ranks,
                                         torch::Device device);

  /// The fault-injection point: on rank FaultPlan::rank at step FaultPlan::step, logs a warning
  /// and ends the process at once with dist::kExitInjectedFault (no clean-up, like a crash), or
  /// hangs forever; elsewhere it returns at once.
  void fault_point(int64_t step) const;

 private:
  dist::LaunchInfo launch_;
  torch::Device device_;
  std::chrono::milliseconds timeout_;
  FaultPlan fault_;
  std::string fingerprint_;
  dist::GlooAlgorithm gloo_algorithm_ = dist::GlooAlgorithm::Native;
  std::shared_ptr<dist::Job> job_;      // before group_: the world group goes first
  std::shared_ptr<dist::Group> group_;
};

}  // namespace mpt
