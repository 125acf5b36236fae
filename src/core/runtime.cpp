// Devices, capabilities, seeding, environment. See runtime.hpp.
#include "core/runtime.hpp"

#include <unistd.h>

#include <chrono>

#include "core/compat.hpp"
#ifdef MPT_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif
#include "core/errors.hpp"

namespace mpt {

torch::Device choose_device(const std::string& want) {
  if (want == "cpu") return torch::Device(torch::kCPU);
  const bool cuda = compat::cuda_available();
  if (want == "auto") return cuda ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  if (want == "cuda") {
    if (!compat::kBuiltWithCuda)
      throw RuntimeFailure("--device cuda: this mpt was built against a CPU-only LibTorch (" +
                           compat::torch_version() + "); rebuild with a CUDA LibTorch (scripts/setup.sh --torch pip)");
    if (!cuda) throw RuntimeFailure("--device cuda: no CUDA device is available on this machine");
    return torch::Device(torch::kCUDA, 0);
  }
  throw RuntimeFailure("unknown device \"" + want + "\" (expected auto, cpu or cuda)");
}

bool native_matmul(torch::Device device, torch::ScalarType dtype) {
  try {
    auto a = torch::ones({2, 2}, torch::TensorOptions().dtype(dtype).device(device));
    auto c = torch::matmul(a, a);
    return c.scalar_type() == dtype && c.sum().item<double>() == 8.0;
  } catch (const c10::Error&) {
    return false;
  }
}

std::string fp16_compute(torch::Device device) {
  return native_matmul(device, torch::kHalf) ? "native" : "emulated";
}

Compute resolve_compute(const std::string& request, Format f, torch::Device device) {
  if (request != "auto" && request != "native" && request != "emulated")
    throw std::invalid_argument("compute mode: expected auto, native or emulated, got \"" + request + "\"");
  if (f == Format::FP32) return Compute::Native;
  if (f == Format::FP8_E4M3 || f == Format::FP8_E5M2) {
    if (request == "native") throw RuntimeFailure("native " + format_name(f) + " compute: mpt has no native fp8 path; use emulated");
    return Compute::Emulated;
  }
  if (request == "emulated") return Compute::Emulated;
  const bool has = native_matmul(device, storage_dtype(f));
  if (request == "native" && !has)
    throw RuntimeFailure(fmt::format("native {} compute: LibTorch {} has no {} matrix product on {}; use emulated "
                                     "(or a LibTorch 2.x build: scripts/setup.sh --torch pip)",
                                     format_name(f), compat::torch_version(), format_name(f), device.str()));
  return has ? Compute::Native : Compute::Emulated;
}

void seed_all(std::uint64_t seed) { torch::manual_seed(seed); }

json environment(torch::Device device) {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  json env = {
      {"torch", compat::torch_version()},
      {"device", device.str()},
      {"cuda", device.is_cuda()},
      {"cuda_build", compat::kBuiltWithCuda},
      {"fp16_compute", fp16_compute(device)},
      {"bf16_compute", native_matmul(device, torch::kBFloat16) ? "native" : "emulated"},
      {"threads", torch::get_num_threads()},
      {"host", host},
      {"compiler", fmt::format("{} {}", "gcc", __VERSION__)},
      {"mpt", MPT_VERSION},
  };
  return env;
}

torch::Device cuda_device_for_rank(int local_rank) {
  const auto count = static_cast<int>(torch::cuda::device_count());
  if (local_rank < 0 || local_rank >= count)
    throw RuntimeFailure(fmt::format("local rank {} has no GPU of its own: this machine has {} CUDA device(s) and NCCL "
                                     "needs one per process; run fewer processes per machine or use --device cpu (Gloo)",
                                     local_rank, count));
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
}

void use_device(torch::Device device) {
#ifdef MPT_WITH_CUDA
  if (device.is_cuda() && device.has_index()) c10::cuda::set_device(device.index());
#else
  (void)device;
#endif
}

void sync_device(torch::Device device) {
#ifdef MPT_WITH_CUDA
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
#else
  (void)device;
#endif
}

Progress::Progress(bool enabled, std::string label, int64_t total, std::string unit)
    : enabled_(enabled && total > 0), label_(std::move(label)), unit_(std::move(unit)), total_(total) {}

void Progress::update(int64_t done, const std::string& note) {
  if (!enabled_) return;
  const double t = now_seconds();
  if (done < total_ && last_ >= 0 && t - last_ < 0.1) return;
  last_ = t;
  std::string line = fmt::format("{} {}/{} {}", label_, done, total_, unit_);
  if (!note.empty()) line += "  " + note;
  std::fprintf(stderr, "\r\033[K%s", line.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::finish() {
  if (drawn_) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  }
  drawn_ = false;
}

Progress::~Progress() { finish(); }

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace mpt
