// Devices, capabilities, seeding and the environment block of the result file.
#pragma once

#include <string>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "core/precision.hpp"

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

/// Resolves a compute request for format `f` on `device`: "emulated" → Emulated; "native" →
/// Native, provided the device has native matrix products in f's dtype (native_matmul);
/// "auto" → Native where it has them, else Emulated. fp32 is always Native (nothing to
/// emulate); fp8 is always Emulated (mpt has no native fp8 path). Throws RuntimeFailure (exit 3)
/// when "native" is asked for and the device lacks the kernels (naming LibTorch, device and
/// format), std::invalid_argument for any other request string.
Compute resolve_compute(const std::string& request, Format f, torch::Device device);

/// Seeds LibTorch's default generators (CPU, and CUDA when present), as torch.manual_seed.
void seed_all(std::uint64_t seed);

/// The `env` block: LibTorch version, device and its name, CUDA, fp16 compute mode,
/// intra-op threads, host name, compiler, mpt version. Run-dependent by nature.
json environment(torch::Device device);

/// Seconds since an arbitrary epoch (steady clock), for timings.
double now_seconds();

/// The GPU of the process with local rank `local_rank` on this machine: cuda:<local_rank>, one
/// GPU per process as NCCL requires (torchrun's LOCAL_RANK convention). Throws RuntimeFailure
/// when the machine has fewer CUDA devices than local ranks (naming both), or in a CPU-only build.
torch::Device cuda_device_for_rank(int local_rank);

/// Makes `device` the current CUDA device of this process (torch.cuda.set_device), so that
/// NCCL and allocations without an explicit device use it; a no-op for the CPU.
void use_device(torch::Device device);

/// Waits until every kernel queued on `device` has finished (torch.cuda.synchronize); a no-op
/// on the CPU. Call before reading the clock around GPU work.
void sync_device(torch::Device device);

/// A one-line progress indicator on stderr ("\r<label> 120/400 steps  loss 0.5321"), redrawn at
/// most 10 times a second and erased when done, so stdout (the tables) stays clean. Does
/// nothing unless `enabled` (pass Context::tty: stderr is a terminal, not -q, rank 0).
class Progress {
 public:
  /// `total`: the count update() goes to (> 0); `unit`: what is counted, e.g. "steps".
  Progress(bool enabled, std::string label, int64_t total, std::string unit);
  /// Records `done` of total and an optional note (e.g. the current loss); redraws if due.
  void update(int64_t done, const std::string& note = "");
  /// Erases the line (also done by the destructor).
  void finish();
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

 private:
  bool enabled_;
  std::string label_, unit_;
  int64_t total_;
  double last_ = -1;
  bool drawn_ = false;
};

}  // namespace mpt
