// Devices, capabilities, seeding, environment. See runtime.hpp.
#include "core/runtime.hpp"

#include <unistd.h>

#include <chrono>

#include "core/compat.hpp"
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

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace mpt
