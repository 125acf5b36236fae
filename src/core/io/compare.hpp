// `mpt compare BASE.json NEW.json`: joins two result files by stable row names and
// compares every number under `results` and `checks` within tolerances — the role of
// google/benchmark's compare.py, for numerical regressions across versions and hardware.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/io/results.hpp"

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
  nlohmann::json base, now;  ///< null when missing on that side (see `why`)
  double abs_diff = 0, rel_diff = 0;  ///< NaN when there is no numeric difference (missing, not numbers);
                                      ///< rel_diff of a timing NaN when the base is 0 (shown "n/a")
  bool ok = true;
  std::string why;  ///< for a differing leaf: "only in base", "only in new", "not numbers", "beyond tolerance"
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

/// Compares two result documents. Integers compare exactly (also beyond 2^53), other
/// numbers as doubles. Throws ConfigError (exit 2) when they are not comparable: not JSON
/// objects, different schema_version or experiment, `results` missing or not an object,
/// `checks` not a list. `base_name`/`new_name` name the files in messages.
Comparison compare_results(const nlohmann::json& base, const nlohmann::json& now, const CompareOptions& opt,
                           const std::string& base_name = "base", const std::string& new_name = "new");

/// The table `mpt compare` prints for the differing leaves (paths and values escaped and cut
/// for the terminal; "-" where there is no numeric difference, and why the leaf differs).
Table comparison_table(const Comparison& c, const std::string& title);

/// The informational table of `mpt compare --timings` (relative change; "n/a" for a base of 0).
Table timings_table(const Comparison& c);

}  // namespace mpt
