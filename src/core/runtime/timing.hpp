// Timing: the median of repeated runs, the statistic mpt reports for every measured time
// (a shared machine gives some runs a late start; the median ignores them, the mean does not).
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "core/runtime/runtime.hpp"

namespace mpt {

/// Runs `fn` `warmup` times untimed (first-touch allocations, lazy initialisation), then
/// `repeats` times timed with now_seconds() (steady clock); returns the durations in seconds,
/// sorted. Throws std::invalid_argument when repeats < 1. Synchronise a device inside `fn` if its
/// work is asynchronous (sync_device).
template <class Fn>
std::vector<double> sorted_seconds(Fn&& fn, int64_t repeats, int64_t warmup = 0) {
  if (repeats < 1) throw std::invalid_argument("timing (median_seconds, fastest_seconds): repeats must be >= 1");
  for (int64_t i = 0; i < warmup; ++i) fn();
  std::vector<double> t;
  t.reserve(static_cast<std::size_t>(repeats));
  for (int64_t i = 0; i < repeats; ++i) {
    const double t0 = now_seconds();
    fn();
    t.push_back(now_seconds() - t0);
  }
  std::sort(t.begin(), t.end());
  return t;
}

/// The median of sorted_seconds(fn, repeats, warmup): element repeats/2 of the sorted times (the
/// upper median for an even count). Throws std::invalid_argument when repeats < 1.
template <class Fn>
double median_seconds(Fn&& fn, int64_t repeats, int64_t warmup = 0) {
  const std::vector<double> t = sorted_seconds(fn, repeats, warmup);
  return t[t.size() / 2];
}

/// The median of `v` (seconds or any measure), the upper one for an even count: what mpt reports
/// for a loop that times its own steps. 0 for an empty `v` (nothing timed).
inline double median_of(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

/// The fastest of sorted_seconds(fn, repeats, warmup): the run least disturbed by other work,
/// for a comparison that picks a path (runtime's kernel probe). Throws as sorted_seconds.
template <class Fn>
double fastest_seconds(Fn&& fn, int64_t repeats, int64_t warmup = 0) {
  return sorted_seconds(fn, repeats, warmup).front();
}

}  // namespace mpt
