// The table of experiments (like ninja's table of tools): name, summary, schema, run.
#pragma once

#include <string>
#include <vector>

#include "core/experiment.hpp"

namespace mpt {

/// Every experiment, in the order `mpt list` shows them (src/app/registry.cpp).
const std::vector<Experiment>& experiments();

/// The experiment named `name`, or nullptr.
const Experiment* find_experiment(const std::string& name);

}  // namespace mpt
