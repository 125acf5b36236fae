// The timeout and fault-injection keys that multi-process experiments share, and the ProcessPlan
// read from them (core/experiment.hpp's contract), so that each experiment does not spell it out.
#pragma once

#include <string>

#include <fmt/format.h>

#include "core/errors.hpp"
#include "core/io/config.hpp"
#include "core/experiment.hpp"

namespace mpt {

/// What differs between the experiments that share the job keys: what /fault/step counts (e.g.
/// "step", "measurement (operation and size, counted from 0)"), its default, /fault/rank's cap,
/// and whether the schema has /dist/gloo_algorithm.
struct DistKeys {
  std::string fault_step_counts = "step";
  int64_t fault_step_default = 2;
  int64_t fault_rank_max = 63;
  bool gloo_algorithm = false;
};

/// Declares the job keys in `s`, once for every experiment that dist_fault_plan reads:
/// /dist/timeout_s (seconds: rendezvous and every collective), /dist/gloo_algorithm (when
/// `k.gloo_algorithm`), /fault/rank, /fault/step and /fault/mode.
inline void add_dist_keys(ConfigSpec& s, const DistKeys& k = {}) {
  s.number("/dist/timeout_s", 30.0, "timeout of every collective and of the rendezvous (seconds)", 0.1, 3600.0);
  if (k.gloo_algorithm)
    s.choice("/dist/gloo_algorithm", "native", {"native", "ring"},
             "how Gloo (CPU) runs reduce-scatter and all-gather: native (c10d ProcessGroupGloo's; LibTorch 1.13 has "
             "no reduce_scatter, so that one is the ring there) or ring (mpt's send/recv ring: N-1 steps, chunk j "
             "summed in rank order from j+1, docs/shard.md); NCCL (CUDA) ignores it");
  s.integer("/fault/rank", -1, "for testing: this rank fails at /fault/step (-1: none)", -1, k.fault_rank_max);
  s.integer("/fault/step", k.fault_step_default,
            "for testing: the " + k.fault_step_counts + " at which /fault/rank fails (counted from 0)", 0);
  s.choice("/fault/mode", "exit", {"exit", "hang"},
           "for testing: how /fault/rank fails: exit (the process ends) or hang (alive but silent: sleeps forever)");
}

/// The plan of an experiment whose schema has /dist/timeout_s (seconds: rendezvous and every
/// collective) and /fault/rank, /fault/step, /fault/mode ("exit" | "hang"): the timeout, and the
/// rank that fails at that step of the experiment's loop (-1: none); and /dist/gloo_algorithm
/// ("native" | "ring") where the schema has it. Throws ConfigError (through Config) if a key is missing.
inline ProcessPlan dist_fault_plan(const Config& cfg) {
  ProcessPlan p;
  if (cfg.json_value().contains(json::json_pointer("/dist/gloo_algorithm"))) p.gloo_algorithm = cfg.str("/dist/gloo_algorithm");
  p.timeout_s = cfg.number("/dist/timeout_s");
  p.fault.rank = static_cast<int>(cfg.integer("/fault/rank"));
  p.fault.step = cfg.integer("/fault/step");
  p.fault.hang = cfg.str("/fault/mode") == "hang";
  return p;
}

/// The fault keys' cross-checks for an experiment's validate(): /fault/rank a rank of the
/// `world_size` (or -1), and, when a rank is to fail, /fault/step below `steps` (the fault points
/// the run has; `steps_what` says what bounds them in the message, e.g. "/mesh/steps"). Throws
/// ConfigError naming the key.
inline void validate_fault_keys(const Config& cfg, int world_size, int64_t steps, const std::string& steps_what) {
  const int64_t fault = cfg.integer("/fault/rank");
  if (fault >= world_size)
    throw ConfigError(fmt::format("/fault/rank: expected -1 or a rank 0 .. {}, got {}", world_size - 1, fault));
  if (fault >= 0 && cfg.integer("/fault/step") >= steps)
    throw ConfigError(fmt::format("/fault/step: expected a step < {} = {}, got {}", steps_what, steps,
                                  cfg.integer("/fault/step")));
}

}  // namespace mpt
