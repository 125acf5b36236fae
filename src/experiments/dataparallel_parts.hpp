// The parts of `mpt dataparallel` that run in one process (src/experiments/dataparallel_equivalence.cpp:
// sections 1, 2 and the in-process rows of 5), used by src/experiments/dataparallel.cpp, which
// runs the training across processes. Included by dataparallel*.cpp only.
#pragma once

#include "core/experiment.hpp"
#include "core/io/config.hpp"
#include "core/io/results.hpp"

namespace mpt::dataparallel {

/// Section 1: the whole-batch gradient of Linear(in, hidden)-ReLU-Linear(hidden, 1) under MSE
/// against the average of /equivalence/shards equal shards' gradients, per parameter (checked
/// within 1e-6). The same draws as tests/parity/dataparallel_ref.py.
Table equivalence_table(const Config& cfg, Report& report);

/// Section 2: uneven shards (torch.tensor_split sizes): the naive average (DDP's) against the
/// sample-weighted one, per parameter; checks the weighted one exact within 1e-6 and the naive
/// one biased where the shard sizes differ; records results.uneven_shard_sizes.
Table uneven_table(const Config& cfg, Report& report);

/// Section 5, in one process: /fp16/ranks fp16 gradients of /fp16/grad summed then divided by
/// the rank count, against divided then summed (a row; the training adds the Gloo row).
Table fp16_table(const Config& cfg);

}  // namespace mpt::dataparallel
