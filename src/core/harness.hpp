// The harness: command line, config resolution, device choice, running one
// experiment, printing its report and writing the result file.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/compare.hpp"
#include "experiments/experiment.hpp"

namespace mpt {

/// Options common to every experiment's subcommand.
struct RunOptions {
  std::string config_file;          ///< --config
  bool config_given = false;        ///< --config appeared (an empty value is then an error)
  std::vector<std::string> sets;    ///< --set KEY=VALUE, in order
  std::string out;                  ///< --out (default results/<experiment>.json)
  bool out_given = false;           ///< --out appeared (an empty value is then an error)
  std::string device;               ///< --device (empty: from config)
  std::optional<std::string> seed;  ///< --seed, as typed: checked by the config schema like --set seed=N
  bool print_config = false;        ///< --print-config
  bool quiet = false;               ///< -q
  bool verbose = false;             ///< -v
  std::optional<int> nproc;         ///< --nproc N: shorthand for --set nproc=N (experiments with a /nproc key)
  std::vector<std::string> argv;    ///< the full command line, re-run by spawned workers
};

/// Resolves the config of `exp` from `opts` (defaults ← file ← --set ← --seed/--device).
/// Throws ConfigError.
Config resolve_for(const Experiment& exp, const ConfigSpec& spec, const RunOptions& opts);

/// The schema of `exp` with the keys every experiment has (/seed, /device, /threads).
ConfigSpec full_spec(const Experiment& exp);

/// The result document of shared/design.md §4 (schema_version 1).
nlohmann::ordered_json result_document(const Experiment& exp, const Config& cfg, const Report& report,
                                       const nlohmann::json& env, double wall_s);

/// Runs `exp` end to end; returns the process exit code (0, 1, 2 or 3).
int run_experiment(const Experiment& exp, const RunOptions& opts);

/// `mpt compare`: compares two result files; returns 0 (within tolerance), 1 (differs) or 2
/// (unreadable, not comparable, bad --tol or --tol-file). Rules: `key_tols` (PATTERN=RTOL[,ATOL])
/// first, then those of each tolerance file (core/tolerance.hpp) in order; first match wins.
int run_compare(const std::string& base_file, const std::string& new_file, const std::vector<std::string>& key_tols,
                CompareOptions opt, bool quiet, const std::vector<std::string>& tol_files = {});

/// `mpt env`: prints environment(device) — versions, compute modes and the hardware fingerprint —
/// as "path value" lines or, with `as_json`, as the JSON of a result file's `env`. Returns 0, or
/// 3 when the device cannot be used.
int run_env(const std::string& device_name, bool as_json);

/// Entry point of the `mpt` binary: parses argv and dispatches.
int main_cli(int argc, char** argv);

}  // namespace mpt
