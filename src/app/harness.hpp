// The harness: config resolution, launch, device choice, running one experiment,
// printing its report and writing the result file (on rank 0). The command line that
// fills RunOptions is cli.cpp's; the harness itself has no CLI11.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/io/config.hpp"
#include "core/experiment.hpp"
#include "core/io/results.hpp"

namespace mpt {

/// Options common to every experiment's subcommand.
struct RunOptions {
  std::string config_file;          ///< --config
  bool config_given = false;        ///< --config appeared (an empty value is then an error)
  std::vector<std::string> sets;    ///< --set KEY=VALUE, in order
  std::string out;                  ///< --out (default results/<experiment>.json)
  bool out_given = false;           ///< --out appeared (an empty value is then an error)
  std::string trace;                ///< --trace FILE: a Chrome Trace Event timeline (core/runtime/trace); empty: none
  bool trace_given = false;         ///< --trace appeared (an empty value is then an error)
  std::string device;               ///< --device (empty: from config)
  std::optional<std::string> seed;  ///< --seed, as typed: checked by the config schema like --set seed=N
  bool print_config = false;        ///< --print-config
  bool quiet = false;               ///< -q
  bool verbose = false;             ///< -v
  std::optional<std::string> nproc; ///< --nproc N, as typed: shorthand for --set nproc=N, checked by the schema
  std::vector<std::string> argv;    ///< the full command line, re-run by spawned workers
};

/// Resolves the config of schema `spec` (the experiment's full_spec) from `opts`
/// (defaults ← file ← --set ← --seed/--device).
/// Throws ConfigError.
Config resolve_for(const ConfigSpec& spec, const RunOptions& opts);

/// The schema of `exp` with the keys every experiment has (/seed, /device, /threads).
ConfigSpec full_spec(const Experiment& exp);

/// The result document of docs/results.md (schema_version 1).
nlohmann::ordered_json result_document(const Experiment& exp, const Config& cfg, const Report& report,
                                       const nlohmann::json& env, double wall_s);

/// Runs `exp` end to end; returns the process exit code (0, 1, 2 or 3).
int run_experiment(const Experiment& exp, const RunOptions& opts);

}  // namespace mpt
