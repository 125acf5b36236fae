// The threads executor's threads (part of core/pipeline): kept from one step to the next and
// bound to CPUs while no other process shares them. run_pipeline runs its stages on them.
#pragma once

#include <functional>
#include <vector>

namespace mpt {

/// Runs tasks[i] on the i-th kept stage thread, all at once; returns when every one has returned.
/// One step at a time (a second caller waits). The tasks must not throw (run_pipeline's catch
/// everything). Binding: stage_thread_cpus, stage_threads_binding (core/pipeline/executor.hpp).
/// Each thread computes with stage_thread_intra_op() intra-op threads.
void run_on_stage_threads(const std::vector<std::function<void()>>& tasks);

/// The intra-op threads (OpenMP team, MKL) each stage thread uses: the calling thread's
/// at::get_num_threads(), the process's count (env.threads_policy), whatever the number of stage
/// threads — a reduction split over another number of threads sums in another order, and the
/// stages must compute exactly what one thread over the whole model computes (the executor's
/// checks are bitwise). Why it is set at all: LibTorch's counts are per thread for OpenMP
/// (omp_set_num_threads) and MKL (mkl_set_num_threads_local); a thread that never called
/// at::set_num_threads ran MKL's GEMMs on every core. Measured, 1F1B m = 8 on one stage thread,
/// threads = 1, 2 vCPUs (AMD EPYC): 5.2-8.3 ms a step with MKL's default team, 2.4 ms with the
/// process's one thread (docs/performance.md).
int stage_thread_intra_op();

}  // namespace mpt
