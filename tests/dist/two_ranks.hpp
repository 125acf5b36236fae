// on_ranks / on_two_ranks: runs a test body on ranks 0 .. N−1 of a real N-rank Gloo group — N threads
// of this process meeting in its store (a HashStore: one process, no launcher) as N processes
// would. Shared by the unit tests of core/dist/group, dist_bench, dist_shard and tensor_parallel.
// Catch2's assertions are not thread-safe: the ranks only compute, the checks run on the main
// thread afterwards.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/dist/dist.hpp"

namespace mpt::testing {

/// Runs body(group, rank) on ranks 0 .. n−1 of a fresh n-rank Gloo group named `prefix` (a
/// prefix no other test uses, e.g. "ring_n3/"), one thread per rank. Every group lives until all
/// ranks are done. Returns each rank's error message ("" when it finished).
inline std::vector<std::string> on_ranks(int n, const std::string& prefix,
                                         const std::function<void(std::shared_ptr<dist::Group>, int)>& body) {
  using std::chrono::milliseconds;
  const auto job = dist::connect_store(dist::LaunchInfo{}, milliseconds(10000));  // a fresh HashStore
  const auto count = static_cast<std::size_t>(n);
  std::vector<std::shared_ptr<dist::Group>> gs(count);
  std::vector<std::string> errors(count);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      const auto i = static_cast<std::size_t>(r);
      try {
        gs[i] = dist::Group::create(job, r, n, prefix, milliseconds(10000));
        body(gs[i], r);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  return errors;
}

/// The same with the body taking the group by reference.
inline std::vector<std::string> on_ranks(int n, const std::string& prefix,
                                         const std::function<void(dist::Group&, int)>& body) {
  return on_ranks(n, prefix, std::function<void(std::shared_ptr<dist::Group>, int)>(
                                 [&body](std::shared_ptr<dist::Group> g, int r) { body(*g, r); }));
}

/// Runs body(group, rank) on ranks 0 and 1 of a fresh two-rank Gloo group named `prefix` (a
/// prefix no other test uses, e.g. "shard_collectives/"). Both groups live until both ranks are
/// done. Returns each rank's error message ("" when it finished).
inline std::vector<std::string> on_two_ranks(const std::string& prefix,
                                             const std::function<void(std::shared_ptr<dist::Group>, int)>& body) {
  return on_ranks(2, prefix, body);
}

/// The same with the body taking the group by reference.
inline std::vector<std::string> on_two_ranks(const std::string& prefix,
                                             const std::function<void(dist::Group&, int)>& body) {
  return on_two_ranks(prefix, std::function<void(std::shared_ptr<dist::Group>, int)>(
                                  [&body](std::shared_ptr<dist::Group> g, int r) { body(*g, r); }));
}

}  // namespace mpt::testing
