// The tools around result files: `mpt compare` and `mpt env`.
#pragma once

#include <string>
#include <vector>

#include "core/io/compare.hpp"

namespace mpt {

/// `mpt compare`: compares two result files; returns 0 (within tolerance), 1 (differs) or 2
/// (unreadable, not comparable, bad --tol or --tol-file). Rules: `key_tols` (PATTERN=RTOL[,ATOL])
/// first, then those of each tolerance file (core/io/tolerance.hpp) in order; first match wins.
int run_compare(const std::string& base_file, const std::string& new_file, const std::vector<std::string>& key_tols,
                CompareOptions opt, bool quiet, const std::vector<std::string>& tol_files = {});

/// `mpt env`: prints environment(device) — versions, compute modes and the hardware fingerprint —
/// as "path value" lines or, with `as_json`, as the JSON of a result file's `env`. Returns 0, or
/// 3 when the device cannot be used.
int run_env(const std::string& device_name, bool as_json);

}  // namespace mpt
