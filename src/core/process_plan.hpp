// The timeout and fault-injection keys that multi-process experiments share, and the ProcessPlan
// read from them (core/experiment.hpp's contract), so that each experiment does not spell it out.
#pragma once

#include "core/io/config.hpp"
#include "core/experiment.hpp"

namespace mpt {

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

}  // namespace mpt
