// The one place where LibTorch 1.13 (Debian) and LibTorch 2.x differ for mpt.
// Everything version-dependent goes here, so the rest of the code reads the same
// against either. Version macros come from <torch/version.h> (TORCH_VERSION_MAJOR...).
#pragma once

#include <string>

#include <torch/torch.h>
#include <torch/version.h>

namespace mpt::compat {

/// True when built against LibTorch 2.x or newer.
inline constexpr bool kTorch2 = TORCH_VERSION_MAJOR >= 2;

/// LibTorch version string, e.g. "1.13.1" (from <torch/version.h>).
inline std::string torch_version() { return TORCH_VERSION; }

/// Whether this build of mpt compiled its CUDA paths (set from the LibTorch found by CMake).
inline constexpr bool kBuiltWithCuda =
#ifdef MPT_WITH_CUDA
    true;
#else
    false;
#endif

/// Whether a CUDA device is usable right now (false in a CPU-only build).
inline bool cuda_available() {
#ifdef MPT_WITH_CUDA
  return torch::cuda::is_available();
#else
  return false;
#endif
}

}  // namespace mpt::compat

// c10::Allocator gained a pure virtual copy_data() in LibTorch 2.3; a subclass must
// define it there and must not (override) before.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define MPT_COMPAT_ALLOCATOR_EXTRA \
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
#else
#define MPT_COMPAT_ALLOCATOR_EXTRA
#endif

// c10d (core/dist.cpp): in LibTorch 1.13 c10d::ProcessGroupGloo derives from c10d::ProcessGroup,
// in 2.x from c10d::Backend (ProcessGroup became a dispatcher over backends). mpt holds the
// concrete ProcessGroupGloo and uses only what both versions share — the constructor
// (store, rank, size, Options::create(timeout)), allreduce/broadcast returning
// c10::intrusive_ptr<c10d::Work>, TCPStore(host, TCPStoreOptions), PrefixStore, HashStore —
// so no version switch is needed. ProcessGroupGloo.hpp declares its class only under
// USE_C10D_GLOO, which dist.cpp defines before including it.
