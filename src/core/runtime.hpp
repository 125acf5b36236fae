// Devices, capabilities, seeding and the environment block of the result file.
#pragma once

#include <string>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

namespace mpt {

using json = nlohmann::json;

/// Picks the device: "cpu", "cuda" (CUDA device 0), or "auto" (CUDA when available).
/// Throws RuntimeFailure (exit 3) when CUDA is asked for but not usable, naming why
/// (CPU-only build of mpt/LibTorch, or no device visible).
torch::Device choose_device(const std::string& want);

/// Whether `device` has native kernels for matrix products in `dtype` (probed by a
/// tiny matmul, not assumed: Debian's LibTorch 1.13 has no CPU fp16 matmul).
bool native_matmul(torch::Device device, torch::ScalarType dtype);

/// "native" or "emulated": how fp16 compute runs on `device` in this build.
std::string fp16_compute(torch::Device device);

/// Seeds LibTorch's default generators (CPU, and CUDA when present), as torch.manual_seed.
void seed_all(std::uint64_t seed);

/// The `env` block: LibTorch version, device and its name, CUDA, fp16 compute mode,
/// intra-op threads, host name, compiler, mpt version. Run-dependent by nature.
json environment(torch::Device device);

/// Seconds since an arbitrary epoch (steady clock), for timings.
double now_seconds();

}  // namespace mpt
