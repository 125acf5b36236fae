// core/parallel, reducer: DDP's bucketed gradient all-reduce, overlapped with backward. See
// dist.hpp for the whole module.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "core/dist/group.hpp"

namespace mpt::dist {

// ----------------------------------------------------------------------------
// DDP-style reducer
// ----------------------------------------------------------------------------

/// Options of the Reducer (names as in torch.nn.parallel.DistributedDataParallel).
struct ReducerOptions {
  double bucket_cap_mb = 25.0;        ///< cap of every bucket but the first (MB = 2^20 bytes)
  double first_bucket_cap_mb = 1.0;   ///< DDP's smaller first bucket, so communication starts early
  bool overlap = true;                ///< launch a bucket's all-reduce from the gradient hooks
  bool divide_before = true;          ///< divide by world size before the sum (DDP) or after it
};

/// dtype of the flattened buckets on the wire: the parameters' own (mpt's models train in fp32).
inline constexpr torch::ScalarType kBucketDtype = torch::kFloat32;

/// One bucket: parameter indices (into the parameter list), their sizes and offsets.
struct Bucket {
  std::vector<std::size_t> params;
  std::vector<int64_t> offsets;  ///< element offset of each parameter in the flat buffer
  int64_t numel = 0;
  int64_t bytes = 0;
};

/// Groups parameters into buckets in reverse order (the order backward produces their
/// gradients): a bucket is closed when adding the next parameter would exceed its cap
/// (first bucket `first_cap_bytes`, the rest `cap_bytes`); a parameter larger than the cap
/// gets a bucket of its own. Mirrors DDP's compute_bucket_assignment_by_size.
std::vector<Bucket> assign_buckets(const std::vector<torch::Tensor>& params, int64_t first_cap_bytes,
                                   int64_t cap_bytes, int64_t element_bytes);

/// Averages gradients across a Group the way DDP does.
/// Usage per step: prepare(); forward; backward; finalize(). With sync(false) the hooks
/// leave gradients to accumulate locally (DDP's no_sync) and finalize() does nothing.
class Reducer {
 public:
  /// Broadcasts rank 0's parameters to every rank, builds the buckets and registers
  /// the gradient hooks. `params` must be leaf tensors that require grad.
  /// The hooks point at this object: it must outlive every backward through `params`.
  Reducer(std::vector<torch::Tensor> params, std::shared_ptr<Group> group, ReducerOptions opts);
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  /// Whether the next backward communicates (false: DDP's no_sync, local accumulation).
  void set_sync(bool on) { sync_ = on; }
  /// Call before each backward that communicates.
  void prepare();
  /// Waits for the all-reduces (launching any not yet launched), unflattens into .grad.
  /// Returns the seconds spent here (the all-reduce time not hidden behind backward).
  double finalize();

  const std::vector<Bucket>& buckets() const { return buckets_; }
  int64_t total_bytes() const;
  /// Synchronous all-reduce of every bucket as it would be sent (for bandwidth): returns seconds.
  double time_allreduce(int iters);

 private:
  void on_grad(std::size_t param, const torch::Tensor& grad);
  void launch(std::size_t bucket);
  std::vector<torch::Tensor> params_;
  std::shared_ptr<Group> group_;
  ReducerOptions opts_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_, slot_of_;
  std::vector<torch::Tensor> flat_;
  std::vector<int> pending_;
  std::vector<Work> works_;
  std::vector<bool> launched_;
  std::vector<bool> filled_;
  std::size_t next_launch_ = 0;
  bool sync_ = true;
};

}  // namespace mpt::dist
