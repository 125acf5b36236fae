// Memory meter: bytes allocated as the allocator sees them, not estimated.
//  - CPU: a counting allocator installed in front of LibTorch's CPU allocator
//    (c10::SetCPUAllocator); it counts live bytes and their high-water mark.
//  - CUDA: the caching allocator's statistics (allocated_bytes current/peak, as
//    torch.cuda.max_memory_allocated), reset at the start of each measurement.
//
//   mpt::PeakScope scope(device);      // starts a measurement
//   ... forward + backward ...
//   int64_t peak = scope.peak_bytes(); // bytes above what was live at the start
//
// And an estimate before anything is allocated (MemoryEstimate, check_memory): the bytes a
// config will need from its model shapes, batch and dtype, against what the machine has
// (MemAvailable, or the cap MPT_MEMORY_LIMIT_BYTES), so that a config too large for the
// machine ends with exit 2 naming its keys instead of the kernel's OOM killer.
#pragma once

#include <algorithm>

#include <cstdint>
#include <string>
#include <vector>

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

// ---------------------------------------------------------------------------
// Estimates before allocating: does a config fit in this machine's memory?
// ---------------------------------------------------------------------------

namespace mpt {

/// One term of a memory estimate: what it holds, the config keys it grows with (JSON
/// pointers, comma-separated) and its size in bytes.
struct MemoryTerm {
  std::string what;
  std::string keys;
  double bytes = 0;
};

/// The bytes a run of one config allocates at its peak, as a sum of its dominant terms
/// (parameters, gradients and the copies an experiment keeps, saved activations, data sets).
/// An estimate of the order of magnitude, made before anything is allocated; the measured
/// peaks of core/runtime/memory's PeakScope are the exact numbers.
struct MemoryEstimate {
  std::vector<MemoryTerm> terms;
  /// Adds a term (bytes as a double: huge configs must not overflow an integer).
  void add(std::string what, std::string keys, double bytes);
  /// Sum of the terms, in bytes.
  double total() const;
  /// Multiplies every term by `n` (n processes of one machine that each hold the same).
  void times(double n, const std::string& why);
};

/// Elements of the parameters of an MLP with layer widths w_0 .. w_L (Linear layers with
/// bias): P = Σ_{i<L} (w_i · w_{i+1} + w_{i+1}).
double mlp_param_count(const std::vector<int64_t>& widths);

/// Adds the two dominant terms of training an MLP with layer widths w_0 .. w_L on `batch`
/// samples, each element `elem_bytes` bytes (4: fp32, also where fp16/bf16 are emulated):
///   parameters:  copies · P · elem_bytes   (copies: weights, gradients and every further
///                parameter-sized tensor the experiment keeps at once: reference gradients,
///                master weights, momentum, the other model of a side-by-side comparison)
///   activations: batch · (w_0 + saved · Σ_{i≥1} w_i) · elem_bytes   (the input, and `saved`
///                tensors of each layer's width kept for backward per sample: the Linear
///                output, the activation's output, a dropout mask; plus their gradients)
/// `param_keys` / `act_keys` name the config keys each term grows with.
void add_mlp_training(MemoryEstimate& e, const std::string& label, const std::vector<int64_t>& widths, int64_t batch,
                      double copies, double saved, const std::string& param_keys, const std::string& act_keys,
                      double elem_bytes = 4);

/// Bytes of `samples` Fashion-MNIST samples as core/io/data's loader holds them: 784 fp32 pixels and
/// an int64 label each (3144 bytes a sample).
inline double fashion_mnist_bytes(int64_t samples) { return static_cast<double>(samples) * (784 * 4 + 8); }

/// The rows an MLP holds at once in a train-then-evaluate run: a training batch (at most the
/// `train_samples`) or an evaluation chunk of up to `eval_chunk` of the `test_samples`, whichever
/// is larger (the `batch` of add_mlp_training for fp8's and fp4's estimates).
inline int64_t mlp_rows_at_once(int64_t batch, int64_t train_samples, int64_t test_samples, int64_t eval_chunk = 1000) {
  return std::max(std::min(batch, train_samples), std::min(eval_chunk, test_samples));
}

/// Bytes of the activations a tiny GPT (core/models/gpt) keeps for backward over one batch of `batch`
/// sequences of `context` tokens, in fp32: Korthikanti et al. 2022 ("Reducing Activation
/// Recomputation in Large Transformer Models", §4.1) count s·b·h·(34 + 5·a·s/h) bytes per block for
/// 16-bit values (s = context, b = batch, h = width, a = heads), doubled here for fp32 and times
/// `copies` (1: the values themselves; 2: also a stored copy of each, e.g. a rounded or quantized
/// one), plus the logits and their gradient (3 · b·s·vocab fp32 values).
double gpt_activation_bytes(double layers, double context, double batch, double width, double heads, double vocab,
                            double copies = 1);

/// The memory a run may use on this machine, in bytes, and where the number comes from:
/// MPT_MEMORY_LIMIT_BYTES when set (a cap of the user's; 0 turns the check off, returned as
/// -1), else MemAvailable of /proc/meminfo; -1 when neither is known. Throws ConfigError for
/// a malformed MPT_MEMORY_LIMIT_BYTES.
int64_t available_memory_bytes(std::string* source = nullptr);

/// MemAvailable (bytes) in the text of /proc/meminfo ("MemAvailable:  123456 kB"); -1 when absent.
int64_t parse_meminfo_available(const std::string& meminfo);

/// "1.50 GiB", "12.0 MiB", "512 bytes".
std::string human_bytes(double bytes);

/// Throws ConfigError when `e.total()` exceeds `available` bytes (available < 0: no check).
/// The message names the keys of the largest terms first, then the estimate term by term and
/// the limit with its source, e.g. "/model/width, /model/depth: this config needs about
/// 256 GiB (...), more than the 20.1 GiB available (MemAvailable in /proc/meminfo) ...".
void check_memory(const MemoryEstimate& e, int64_t available, const std::string& source);

}  // namespace mpt
