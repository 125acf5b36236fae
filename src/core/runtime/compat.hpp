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
/// ProcessGroupGloo implements reduce_scatter in LibTorch 2.x; 1.13's throws "ProcessGroupGloo
/// does not support reduce_scatter" (dist::Group::reduce_scatter runs its own ring there).
inline constexpr bool kGlooHasReduceScatter = kTorch2;
/// ProcessGroupGloo moves bfloat16 tensors in LibTorch 2.x; 1.13's refuses them in every
/// collective and in send/recv ("Invalid scalar type").
inline constexpr bool kGlooHasBFloat16 = kTorch2;

/// LibTorch's own low-bit dtypes, by the release that added each (quant::measured_stored_bytes
/// stores in them; 1.13 has none): Float8_e4m3fn and Float8_e5m2 (2.1), Float8_e8m0fnu (2.7),
/// Float4_e2m1fn_x2 (2.8: two E2M1 codes per byte). The macros guard code that names the dtypes.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
#define MPT_COMPAT_HAS_FLOAT8 1
#else
#define MPT_COMPAT_HAS_FLOAT8 0
#endif
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 7)
#define MPT_COMPAT_HAS_FLOAT8_E8M0 1
#else
#define MPT_COMPAT_HAS_FLOAT8_E8M0 0
#endif
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8)
#define MPT_COMPAT_HAS_FLOAT4 1
#else
#define MPT_COMPAT_HAS_FLOAT4 0
#endif
inline constexpr bool kHasFloat8 = MPT_COMPAT_HAS_FLOAT8;
inline constexpr bool kHasFloat8E8M0 = MPT_COMPAT_HAS_FLOAT8_E8M0;
inline constexpr bool kHasFloat4 = MPT_COMPAT_HAS_FLOAT4;

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

// c10::Allocator in LibTorch 2.3 gained a pure virtual copy_data() (a subclass must define it
// there and must not before) and its allocate() lost its const.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define MPT_COMPAT_ALLOCATOR_EXTRA \
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
#define MPT_COMPAT_ALLOCATE_CONST
#else
#define MPT_COMPAT_ALLOCATOR_EXTRA
#define MPT_COMPAT_ALLOCATE_CONST const
#endif

namespace mpt::compat {
/// Index of the aggregate entry (all pools) in a caching allocator's StatArray: StatType::AGGREGATE,
/// first in every version; the enum lives in c10::cuda::CUDACachingAllocator in 1.13 and in
/// c10::CachingAllocator in 2.x.
inline constexpr std::size_t kAllocatorStatAggregate = 0;
}  // namespace mpt::compat

// c10d's backend base class differs too: core/runtime/compat_c10d.hpp (only core/dist includes c10d).
