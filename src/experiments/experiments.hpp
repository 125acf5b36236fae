// The experiments layer's one public header: a factory per experiment file, each returning
// the core/experiment.hpp contract filled in. Only the app layer's registry includes it.
#pragma once

#include "core/experiment.hpp"

namespace mpt {

/// Each experiment file defines one of these (src/experiments/<name>.cpp).
Experiment underflow_experiment();
Experiment lossscale_experiment();
Experiment pipeline_experiment();
Experiment dataparallel_experiment();
Experiment checkpoint_experiment();
Experiment accumulate_experiment();
Experiment collectives_experiment();
Experiment fp8_experiment();
Experiment fp4_experiment();
Experiment shard_experiment();
Experiment tensorparallel_experiment();
Experiment contextparallel_experiment();
Experiment expertparallel_experiment();
Experiment plan_experiment();

}  // namespace mpt
