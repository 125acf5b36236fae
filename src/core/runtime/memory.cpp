// Memory meter. See memory.hpp.
#include "core/runtime/memory.hpp"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>

#include <fmt/format.h>

#include <c10/core/CPUAllocator.h>

#ifdef MPT_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "core/runtime/compat.hpp"
#include "core/errors.hpp"

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

int64_t current_bytes([[maybe_unused]] torch::Device device) {  // read only with CUDA
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

// ---------------------------------------------------------------------------
// Estimates before allocating
// ---------------------------------------------------------------------------

namespace mpt {

void MemoryEstimate::add(std::string what, std::string keys, double bytes) {
  terms.push_back(MemoryTerm{std::move(what), std::move(keys), bytes});
}

double MemoryEstimate::total() const {
  double s = 0;
  for (const auto& t : terms) s += t.bytes;
  return s;
}

void MemoryEstimate::times(double n, const std::string& why) {
  if (n == 1) return;
  for (auto& t : terms) {
    t.bytes *= n;
    t.what += " x" + fmt::format("{:g}", n) + " " + why;
  }
}

double mlp_param_count(const std::vector<int64_t>& widths) {
  double p = 0;
  for (std::size_t i = 0; i + 1 < widths.size(); ++i)
    p += static_cast<double>(widths[i]) * static_cast<double>(widths[i + 1]) + static_cast<double>(widths[i + 1]);
  return p;
}

void add_mlp_training(MemoryEstimate& e, const std::string& label, const std::vector<int64_t>& widths, int64_t batch,
                      double copies, double saved, const std::string& param_keys, const std::string& act_keys,
                      double elem_bytes) {
  if (widths.empty()) return;
  double units = 0;
  for (std::size_t i = 1; i < widths.size(); ++i) units += static_cast<double>(widths[i]);
  e.add(fmt::format("{}: parameters x{:g} (weights, gradients, copies)", label, copies), param_keys,
        copies * mlp_param_count(widths) * elem_bytes);
  e.add(label + ": activations", act_keys,
        static_cast<double>(batch) * (static_cast<double>(widths[0]) + saved * units) * elem_bytes);
}

double gpt_activation_bytes(double layers, double context, double batch, double width, double heads, double vocab,
                            double copies) {
  const double per_block = context * batch * width * (34 + 5 * heads * context / width);  // 16-bit bytes
  return copies * 2 * layers * per_block + 3 * batch * context * vocab * 4;
}

int64_t parse_meminfo_available(const std::string& meminfo) {
  std::istringstream in(meminfo);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream f(line.substr(13));
    long long kb = -1;
    std::string unit;
    if (!(f >> kb) || kb < 0) return -1;
    f >> unit;
    return static_cast<int64_t>(kb) * (unit == "kB" || unit.empty() ? 1024 : 1);
  }
  return -1;
}

int64_t available_memory_bytes(std::string* source) {
  if (const char* cap = std::getenv("MPT_MEMORY_LIMIT_BYTES"); cap && *cap) {
    const std::string v(cap);
    std::size_t used = 0;
    long long n = -1;
    try {
      n = std::stoll(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != v.size() || n < 0)
      throw ConfigError(fmt::format("MPT_MEMORY_LIMIT_BYTES: expected an integer >= 0 (bytes; 0: no check), got \"{}\"",
                                    v.size() > 40 ? v.substr(0, 40) + "..." : v));
    if (source) *source = "MPT_MEMORY_LIMIT_BYTES";
    return n == 0 ? -1 : static_cast<int64_t>(n);
  }
  std::ifstream in("/proc/meminfo");
  std::stringstream text;
  text << in.rdbuf();
  if (source) *source = "MemAvailable in /proc/meminfo";
  return in ? parse_meminfo_available(text.str()) : -1;
}

std::string human_bytes(double bytes) {
  const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return fmt::format("{:.0f} bytes", bytes);
  int u = -1;
  while (bytes >= 1024 && u < 5) bytes /= 1024, ++u;
  if (bytes < 10) return fmt::format("{:.2f} {}", bytes, units[u]);
  if (bytes < 100) return fmt::format("{:.1f} {}", bytes, units[u]);
  return fmt::format("{:.0f} {}", bytes, units[u]);
}

void check_memory(const MemoryEstimate& e, int64_t available, const std::string& source) {
  const double total = e.total();
  if (available < 0 || total <= static_cast<double>(available)) return;
  std::vector<MemoryTerm> terms = e.terms;
  std::stable_sort(terms.begin(), terms.end(), [](const MemoryTerm& a, const MemoryTerm& b) { return a.bytes > b.bytes; });
  // The keys to change: those of the terms that make up most of the total, largest first.
  std::vector<std::string> keys;
  double covered = 0;
  for (const auto& t : terms) {
    if (covered >= 0.9 * total) break;
    covered += t.bytes;
    std::istringstream in(t.keys);
    std::string k;
    while (std::getline(in, k, ',')) {
      k.erase(0, k.find_first_not_of(' '));
      if (!k.empty() && std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
    }
  }
  std::string names, detail;
  for (const auto& k : keys) names += (names.empty() ? "" : ", ") + k;
  for (const auto& t : terms)
    if (t.bytes >= 0.01 * total) detail += (detail.empty() ? "" : "; ") + t.what + " " + human_bytes(t.bytes);
  throw ConfigError(fmt::format("{}: this config needs about {} of memory ({}), more than the {} available ({}); "
                                "choose smaller values, or set MPT_MEMORY_LIMIT_BYTES to another cap in bytes "
                                "(0: no check)",
                                names, human_bytes(total), detail, human_bytes(static_cast<double>(available)), source));
}

}  // namespace mpt
