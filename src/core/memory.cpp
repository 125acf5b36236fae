// Memory meter. See memory.hpp.
#include "core/memory.hpp"

#include <atomic>
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

// Owns the real allocation; deleting it frees the memory and uncounts the bytes.
struct Counted {
  c10::DataPtr inner;
  int64_t bytes;
};

void counted_delete(void* ctx) {
  auto* c = static_cast<Counted*>(ctx);
  g_live.fetch_sub(c->bytes, std::memory_order_relaxed);
  delete c;  // ~DataPtr frees through LibTorch's own deleter
}

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}
  c10::DataPtr allocate(size_t n) MPT_COMPAT_ALLOCATE_CONST override {
    c10::DataPtr p = inner_->allocate(n);
    void* data = p.get();
    auto device = p.device();
    auto* ctx = new Counted{std::move(p), static_cast<int64_t>(n)};
    int64_t live = g_live.fetch_add(ctx->bytes, std::memory_order_relaxed) + ctx->bytes;
    int64_t peak = g_peak.load(std::memory_order_relaxed);
    while (live > peak && !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
    }
    return {data, ctx, &counted_delete, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  MPT_COMPAT_ALLOCATOR_EXTRA
 private:
  c10::Allocator* inner_;
};

}  // namespace

void install_counting_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    static CountingAllocator alloc(c10::GetCPUAllocator());
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
