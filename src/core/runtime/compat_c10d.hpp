// The one difference between LibTorch 1.13 and 2.x in c10d that mpt meets, apart from compat.hpp's:
// the base class of a process-group backend.
#pragma once

#include <torch/version.h>

// c10d (core/dist): in LibTorch 1.13 c10d::ProcessGroupGloo derives from c10d::ProcessGroup,
// in 2.x from c10d::Backend (ProcessGroup became a dispatcher over backends), and so does
// ProcessGroupNCCL. mpt holds its group through that base (C10dBackend below) and uses only what
// both versions share — the constructors (store, rank, size, Options), allreduce/broadcast
// returning c10::intrusive_ptr<c10d::Work>, TCPStore(host, TCPStoreOptions), PrefixStore,
// HashStore. ProcessGroupGloo.hpp / ProcessGroupNCCL.hpp declare their classes only under
// USE_C10D_GLOO / USE_C10D_NCCL, which core/dist defines before including them.
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
namespace mpt::compat {
/// The base class of a c10d process-group backend (Gloo, NCCL) in this LibTorch.
using C10dBackend = c10d::Backend;
}  // namespace mpt::compat
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
namespace mpt::compat {
/// The base class of a c10d process-group backend (Gloo, NCCL) in this LibTorch.
using C10dBackend = c10d::ProcessGroup;
}  // namespace mpt::compat
#endif
