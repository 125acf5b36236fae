// The contract between the harness and an experiment (one file per subcommand).
//
// An experiment declares its config schema and computes a Report from a resolved
// Config on a chosen device. It never prints, parses files or writes results: the
// harness (src/app/harness.cpp) owns those, as nccl-tests' shared harness does.
// This header is core's: the experiments implement it, the app layer calls it, and
// core itself knows no experiment.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "core/io/config.hpp"
#include "core/runtime/memory.hpp"
#include "core/io/results.hpp"
#include "core/dist/world.hpp"

namespace mpt {

/// Whether an experiment runs in one process or in several (docs/architecture.md, "Adding a multi-process experiment").
enum class Processes {
  Single,  ///< one process; no --nproc
  Multi,   ///< --nproc N workers, or one rank of torchrun / SLURM; the schema has /nproc
};

/// What the harness needs to set up the processes of a multi-process run, read from the
/// experiment's own config keys (so the harness knows none of them).
struct ProcessPlan {
  double timeout_s = 30.0;  ///< rendezvous and every collective, seconds; a launcher allows 10 s more
  FaultPlan fault;          ///< the fault-injection point of tests of failure handling (rank -1: none)
  /// How Gloo groups run reduce_scatter and all_gather: "native" or "ring" (the experiment's
  /// /dist/gloo_algorithm where its schema has one; dist::GlooAlgorithm). NCCL ignores it.
  std::string gloo_algorithm = "native";
  /// Non-empty when this config runs nothing across processes, saying why ("/train/enabled is
  /// false", dataparallel): the harness then runs it in this one process instead of spawning
  /// /nproc workers that would only wait, and logs the reason; under an outside launcher
  /// (torchrun, SLURM) the ranks run as launched.
  std::string one_process_because;
};

/// What an experiment's run() receives.
struct Context {
  const Config& cfg;      ///< resolved and validated config
  torch::Device device;   ///< chosen device (CPU or CUDA)
  bool tty = false;       ///< progress lines allowed: stderr is a terminal, not -q, rank 0 (core Progress)
  int rank = 0;           ///< this process's rank in a multi-process run; 0 otherwise
  int world_size = 1;     ///< processes in the run; only rank 0's report is printed and written
  World* world = nullptr; ///< multi-process experiments: this rank's World, set up by the harness; else null
};

/// A command-line option of one experiment that stands for one config key: `--<name> VALUE` is
/// `--set <pointer>=VALUE` (e.g. `mpt plan --search 1024`), applied after every --set.
struct OptionAlias {
  std::string name;     ///< the option without its dashes, e.g. "search"
  std::string pointer;  ///< the config key it sets, e.g. "/search/devices"
  std::string help;     ///< one line for --help
  bool flag = false;    ///< takes no value: `--<name>` is `--set <pointer>=true`
};

/// One subcommand.
struct Experiment {
  std::string name;                        ///< subcommand, e.g. "underflow"
  std::string summary;                     ///< one line for `mpt list`
  std::function<ConfigSpec()> spec;        ///< schema with the built-in defaults
  std::function<Report(const Context&)> run;  ///< computes the report; throws ConfigError
                                              ///< (exit 2) or RuntimeFailure (exit 3)
  /// Required: checks across keys that the schema cannot express, given the number of
  /// processes the run will have (--nproc, or the launcher's world size; 1 otherwise).
  /// The harness calls it before any work and before any worker is spawned, so a bad config
  /// fails once, with exit 2, instead of in every worker. Throws ConfigError naming the JSON
  /// pointer, what was expected and what was found.
  std::function<void(const Config&, int world_size)> validate;
  /// Optional: the memory a run of this config needs on this machine (core/runtime/memory's
  /// MemoryEstimate: parameters, gradients, activations, data, from the model shapes, batch
  /// and dtype; `world_size` processes spawned here each hold their own). The harness checks
  /// it right after `validate`, before anything is allocated, against MemAvailable or
  /// MPT_MEMORY_LIMIT_BYTES: a config that does not fit exits 2 naming its keys.
  std::function<MemoryEstimate(const Config&, int world_size)> memory;
  /// Single or multi-process. A multi-process experiment has /nproc in its schema (--nproc N
  /// sets it), and `plan`.
  Processes processes = Processes::Single;
  /// Multi-process only: the timeout and the fault-injection point, from the config.
  std::function<ProcessPlan(const Config&)> plan;
  /// Options that stand for config keys (OptionAlias); none by default.
  std::vector<OptionAlias> aliases;
};

}  // namespace mpt
