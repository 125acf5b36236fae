// The table of experiments (like ninja's table of tools): name, summary, schema, run.
#include "app/registry.hpp"

#include "experiments/experiments.hpp"

namespace mpt {

const std::vector<Experiment>& experiments() {
  static const std::vector<Experiment> all = {
      underflow_experiment(),    lossscale_experiment(), dataparallel_experiment(),
      pipeline_experiment(),     accumulate_experiment(), checkpoint_experiment(),
      collectives_experiment(),
      fp8_experiment(),          fp4_experiment(),
      shard_experiment(),
      tensorparallel_experiment(),
      contextparallel_experiment(),
      expertparallel_experiment(),
      plan_experiment(),
  };
  return all;
}

const Experiment* find_experiment(const std::string& name) {
  for (const auto& e : experiments())
    if (e.name == name) return &e;
  return nullptr;
}

}  // namespace mpt
