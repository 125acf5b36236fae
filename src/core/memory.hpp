// Memory meter: bytes allocated as the allocator sees them, not estimated.
//  - CPU: a counting allocator installed in front of LibTorch's CPU allocator
//    (c10::SetCPUAllocator); it counts live bytes and their high-water mark.
//  - CUDA: the caching allocator's statistics (allocated_bytes current/peak, as
//    torch.cuda.max_memory_allocated), reset at the start of each measurement.
//
//   mpt::PeakScope scope(device);      // starts a measurement
//   ... forward + backward ...
//   int64_t peak = scope.peak_bytes(); // bytes above what was live at the start
#pragma once

#include <cstdint>

#include <torch/torch.h>

namespace mpt {

/// Installs the counting CPU allocator (idempotent; thread-safe). Call before the
/// tensors to be measured are allocated: tensors allocated earlier are not counted.
void install_counting_allocator();

/// Live bytes allocated through LibTorch on `device` now.
int64_t current_bytes(torch::Device device);

/// Measures the peak bytes allocated on `device` while the scope is alive, relative
/// to the bytes live when it began. Scopes do not nest (the high-water mark is global).
class PeakScope {
 public:
  explicit PeakScope(torch::Device device);
  /// Bytes live at the start of the scope.
  int64_t start_bytes() const { return start_; }
  /// Highest (live − start) seen since the scope began, in bytes (≥ 0).
  int64_t peak_bytes() const;
  /// Live bytes now minus live bytes at the start (may be negative).
  int64_t delta_bytes() const;

 private:
  torch::Device device_;
  int64_t start_ = 0;
};

}  // namespace mpt
