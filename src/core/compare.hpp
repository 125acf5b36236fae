// `mpt compare BASE.json NEW.json`: joins two result files by stable row names and
// compares every number under `results` and `checks` within tolerances — the role of
// google/benchmark's compare.py, for numerical regressions across versions and hardware.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/results.hpp"

namespace mpt {

/// A tolerance for the leaves whose path matches `pattern` (fnmatch(3) glob, e.g.
/// "/results/gradients/*/mean_abs"). |new − base| ≤ atol + rtol·|base| passes.
/// `unbounded`: the leaves are not compared (a tolerance file's `unbounded` rule: values with no
/// derivable bound across kernels, such as counts of kernel-dependent values that cross a
/// threshold); they are counted in Comparison::unbounded instead.
struct KeyTolerance {
  std::string pattern;
  double rtol = 0;
  double atol = 0;
  bool unbounded = false;
};

/// Options of a comparison. Defaults are strict: equal values only.
struct CompareOptions {
  double rtol = 0;
  double atol = 0;
  std::vector<KeyTolerance> per_key;  ///< first match wins over rtol/atol
  bool timings = false;               ///< also report relative change of `timings` (never fails)
};

/// One compared leaf.
struct LeafDiff {
  std::string path;  ///< e.g. /results/gradients/d12.L01/mean_abs (rows joined by their "name")
  nlohmann::json base, now;  ///< null when missing on that side
  double abs_diff = 0, rel_diff = 0;
  bool ok = true;
};

/// The outcome: every differing leaf (and with timings, every timing), counts.
struct Comparison {
  std::vector<LeafDiff> diffs;   ///< leaves outside tolerance, or missing on one side
  std::vector<LeafDiff> timings; ///< relative changes of timings (informational)
  std::size_t compared = 0;      ///< leaves compared under results and checks
  std::size_t unbounded = 0;     ///< leaves left out by an `unbounded` rule
  bool ok() const { return diffs.empty(); }
};

/// Flattens a JSON value into leaf path -> value. Arrays of objects that all carry a
/// string "name" are keyed by that name (rows join by name, not position); other arrays by index.
std::vector<std::pair<std::string, nlohmann::json>> flatten(const nlohmann::json& v, const std::string& prefix);

/// Compares two result documents. Throws ConfigError (exit 2) when they are not comparable:
/// different schema_version or experiment, or missing `results`.
Comparison compare_results(const nlohmann::json& base, const nlohmann::json& now, const CompareOptions& opt);

/// The table `mpt compare` prints for the differing leaves.
Table comparison_table(const Comparison& c, const std::string& title);

}  // namespace mpt
