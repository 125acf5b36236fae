// The threads executor's threads (part of core/pipeline): kept from one step to the next and
// bound to CPUs while no other process shares them. run_pipeline runs its stages on them.
#pragma once

#include <functional>
#include <vector>

namespace mpt {

/// Runs tasks[i] on the i-th kept stage thread, all at once; returns when every one has returned.
/// One step at a time (a second caller waits). The tasks must not throw (run_pipeline's catch
/// everything). Binding: stage_thread_cpus, stage_threads_binding (core/pipeline/executor.hpp).
void run_on_stage_threads(const std::vector<std::function<void()>>& tasks);

}  // namespace mpt
