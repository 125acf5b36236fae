// One rank of a multi-process run. See world.hpp.
#include "core/dist/world.hpp"

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

#include <spdlog/spdlog.h>

#include "core/runtime/runtime.hpp"

namespace mpt {

World::World(dist::LaunchInfo launch, torch::Device device, std::chrono::milliseconds timeout, FaultPlan fault)
    : launch_(std::move(launch)), device_(device), timeout_(timeout), fault_(fault) {
  if (device_.is_cuda()) {
    device_ = cuda_device_for_rank(launch_.local_rank);
    use_device(device_);
  }
}

const std::shared_ptr<dist::Job>& World::job() {
  if (!job_) {
    auto job = dist::connect_store(launch_, timeout_);
    if (job->world_size() > 1 && !fingerprint_.empty()) job->check_same_launch(fingerprint_);
    job_ = std::move(job);
  }
  return job_;
}

const std::shared_ptr<dist::Group>& World::group() {
  if (!group_) {
    group_ = dist::Group::create(job(), rank(), size(), "world/", timeout_);
    group_->set_gloo_algorithm(gloo_algorithm_);
  }
  return group_;
}

std::shared_ptr<dist::Group> World::new_group(const std::string& name, int size, torch::Device device) {
  auto g = dist::Group::create(job(), rank(), size, name, timeout_, device);
  g->set_gloo_algorithm(gloo_algorithm_);
  return g;
}

std::shared_ptr<dist::Group> World::new_group(const std::string& name, const std::vector<int>& global_ranks,
                                             torch::Device device) {
  if (global_ranks.empty()) throw std::invalid_argument("World::new_group '" + name + "': no ranks");
  int mine = -1;
  for (std::size_t i = 0; i < global_ranks.size(); ++i) {
    const int g = global_ranks[i];
    if (g < 0 || g >= size())
      throw std::invalid_argument("World::new_group '" + name + "': rank " + std::to_string(g) +
                                  " is not in the job (0 .. " + std::to_string(size() - 1) + ")");
    for (std::size_t j = 0; j < i; ++j)
      if (global_ranks[j] == g)
        throw std::invalid_argument("World::new_group '" + name + "': rank " + std::to_string(g) + " listed twice");
    if (g == rank()) mine = static_cast<int>(i);
  }
  if (mine < 0) return nullptr;
  // Group::create registers this process's global rank under the group rank, so failures name
  // the job's ranks (its rank -> global map), whatever the list.
  auto g = dist::Group::create(job(), mine, static_cast<int>(global_ranks.size()), name, timeout_, device);
  g->set_gloo_algorithm(gloo_algorithm_);
  return g;
}

void World::fault_point(int64_t step) const {
  if (fault_.rank != rank() || step != fault_.step) return;
  spdlog::warn("rank {}: {} at step {} (/fault/rank, for testing)", rank(), fault_.hang ? "hanging" : "exiting", step);
  std::fflush(nullptr);
  if (!fault_.hang) std::_Exit(dist::kExitInjectedFault);
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));  // alive, but never answers again
}

}  // namespace mpt
