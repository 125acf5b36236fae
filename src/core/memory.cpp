// Memory meter. See memory.hpp.
#include "core/memory.hpp"

#include <atomic>
#include <cstddef>
#include <cstring>
#include <mutex>

#include <c10/core/CPUAllocator.h>

#ifdef MPT_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "core/compat.hpp"

namespace mpt {

namespace {

std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};

// The counting allocator keeps c10::Allocator's whole contract, including the "raw" interface
// (raw_allocate / raw_deallocate, used by oneDNN's scratchpads for bf16 and AMX kernels through
// at::native::mkldnn), which requires a DataPtr whose context *is* its data pointer and a raw
// deleter that frees from that pointer alone. So the byte count travels in a header in front
// of the data instead of in a separate context object:
//
//   base (from the inner allocator)          data = base + kHeader (what tensors see)
//   | n (int64) | ... padding to 64 bytes ... | n bytes of tensor data ... |
//
// kHeader keeps LibTorch's 64-byte alignment (c10::gAlignment) for the data. Freeing reads n
// back from the header, uncounts it and hands `base` to the inner allocator's raw deleter.
// Exact (requested bytes, as torch.cuda.memory_allocated counts requested sizes rounded to its
// blocks), lock-free, and one allocation per tensor as before (the old Counted context was a
// second heap allocation per tensor).
constexpr std::size_t kHeader = 64;
static_assert(kHeader % alignof(std::max_align_t) == 0 && kHeader >= sizeof(int64_t));

c10::Allocator* g_inner = nullptr;
c10::DeleterFnPtr g_inner_delete = nullptr;

void counted_delete(void* data) {
  if (data == nullptr) return;
  char* base = static_cast<char*>(data) - kHeader;
  int64_t n = 0;
  std::memcpy(&n, base, sizeof(n));
  g_live.fetch_sub(n, std::memory_order_relaxed);
  g_inner_delete(base);
}

class CountingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) MPT_COMPAT_ALLOCATE_CONST override {
    const c10::Device cpu(c10::DeviceType::CPU);
    if (n == 0) return {nullptr, nullptr, &counted_delete, cpu};  // as c10::alloc_cpu(0): no storage
    auto* base = static_cast<char*>(g_inner->raw_allocate(n + kHeader));
    const auto bytes = static_cast<int64_t>(n);
    std::memcpy(base, &bytes, sizeof(bytes));
    int64_t live = g_live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    int64_t peak = g_peak.load(std::memory_order_relaxed);
    while (live > peak && !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
    }
    void* data = base + kHeader;
    return {data, data, &counted_delete, cpu};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &counted_delete; }
  MPT_COMPAT_ALLOCATOR_EXTRA
};

}  // namespace

void install_counting_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_inner = c10::GetCPUAllocator();
    g_inner_delete = g_inner->raw_deleter();
    // LibTorch's DefaultCPUAllocator has a raw deleter in every version; another allocator
    // installed ahead of us (a mobile or profiling one) might not, and then it cannot be wrapped.
    TORCH_CHECK(g_inner_delete != nullptr,
                "mpt memory meter: the installed CPU allocator has no raw deleter, so it cannot be wrapped");
    static CountingAllocator alloc;
    c10::SetCPUAllocator(&alloc, /*priority=*/100);
  });
}

int64_t current_bytes(torch::Device device) {
#ifdef MPT_WITH_CUDA
  if (device.is_cuda()) {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index() < 0 ? 0 : device.index());
    return stats.allocated_bytes[compat::kAllocatorStatAggregate].current;
  }
#endif
  return g_live.load(std::memory_order_relaxed);
}

PeakScope::PeakScope(torch::Device device) : device_(device) {
#ifdef MPT_WITH_CUDA
  if (device.is_cuda()) {
    int idx = device.index() < 0 ? 0 : device.index();
    c10::cuda::CUDACachingAllocator::resetPeakStats(idx);
    start_ = current_bytes(device);
    return;
  }
#endif
  install_counting_allocator();
  start_ = g_live.load(std::memory_order_relaxed);
  g_peak.store(start_, std::memory_order_relaxed);
}

int64_t PeakScope::peak_bytes() const {
#ifdef MPT_WITH_CUDA
  if (device_.is_cuda()) {
    int idx = device_.index() < 0 ? 0 : device_.index();
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(idx);
    return stats.allocated_bytes[compat::kAllocatorStatAggregate].peak -
           start_;
  }
#endif
  return std::max<int64_t>(0, g_peak.load(std::memory_order_relaxed) - start_);
}

int64_t PeakScope::delta_bytes() const { return current_bytes(device_) - start_; }

}  // namespace mpt
