// Whether other processes keep this machine's CPUs busy as mpt starts (part of core/runtime):
// what OpenMP's wait policy is chosen from (src/app/main.cpp, docs/performance.md "The defaults").
#pragma once

namespace mpt {

/// Threads of other processes that are runnable, on average over `samples` readings of
/// /proc/stat's procs_running taken `interval_us` apart, less the one that is reading (this
/// thread). Only open, read and nanosleep: safe from the executable's DT_PREINIT_ARRAY, before
/// any shared library has initialised. A process spinning on one core reads as 1.0, an idle
/// machine as 0.0-0.1 (kernel threads). Negative (-1) when /proc/stat cannot be read. Source:
/// proc(5), procs_running: "number of processes in runnable state".
double runnable_others(int samples, int interval_us) noexcept;

/// What main's start-up measured with runnable_others() and recorded here (-1: not measured in
/// this process; MPT_START_RUNNABLE_OTHERS carries it across mpt's own re-exec and to its workers).
double start_runnable_others() noexcept;

/// Records `v` for start_runnable_others(); a plain store, safe before any initialiser.
void set_start_runnable_others(double v) noexcept;

}  // namespace mpt
