// Error types and the exit codes they map to (README.md, "Exit codes"):
//   0 ok; 1 the experiment's own check failed; 2 usage or config error;
//   3 runtime error (missing data, device unavailable, a peer process failed).
#pragma once

#include <stdexcept>
#include <string>

namespace mpt {

/// Process exit codes used by every subcommand.
enum ExitCode : int { kExitOk = 0, kExitCheckFailed = 1, kExitUsage = 2, kExitRuntime = 3 };

/// Bad command line or bad configuration (file, JSON pointer, expected, got). Exit code 2.
struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The environment cannot run the experiment: missing data file, no CUDA device,
/// a peer process that failed or timed out. Exit code 3.
struct RuntimeFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace mpt
