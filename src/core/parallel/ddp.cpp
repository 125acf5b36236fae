// core/parallel, reducer: DDP's bucketed all-reduce. See parallel/ddp.hpp.
#include "core/parallel/ddp.hpp"

#include <algorithm>

#include "core/runtime/runtime.hpp"
#include "core/runtime/trace.hpp"

namespace mpt::dist {

// ----------------------------------------------------------------------------
// Reducer
// ----------------------------------------------------------------------------

std::vector<Bucket> assign_buckets(const std::vector<torch::Tensor>& params, int64_t first_cap_bytes,
                                   int64_t cap_bytes, int64_t element_bytes) {
  std::vector<Bucket> out;
  Bucket cur;
  for (std::size_t k = params.size(); k-- > 0;) {
    const int64_t n = params[k].numel(), b = n * element_bytes;
    const int64_t cap = out.empty() ? first_cap_bytes : cap_bytes;
    if (!cur.params.empty() && cur.bytes + b > cap) {
      out.push_back(std::move(cur));
      cur = Bucket{};
    }
    cur.params.push_back(k);
    cur.offsets.push_back(cur.numel);
    cur.numel += n;
    cur.bytes += b;
  }
  if (!cur.params.empty()) out.push_back(std::move(cur));
  return out;
}

Reducer::Reducer(std::vector<torch::Tensor> params, std::shared_ptr<Group> group, ReducerOptions opts)
    : params_(std::move(params)), group_(std::move(group)), opts_(opts) {
  {
    torch::NoGradGuard ng;
    for (auto& p : params_) {
      auto d = p.detach();
      if (!d.is_contiguous()) throw std::invalid_argument("Reducer: parameters must be contiguous");
      group_->broadcast(d, 0);
    }
  }
  const int64_t elt = static_cast<int64_t>(c10::elementSize(kBucketDtype));
  const auto mb = [](double x) { return static_cast<int64_t>(x * 1024.0 * 1024.0); };
  buckets_ = assign_buckets(params_, std::max<int64_t>(1, mb(opts_.first_bucket_cap_mb)),
                            std::max<int64_t>(1, mb(opts_.bucket_cap_mb)), elt);
  bucket_of_.assign(params_.size(), 0);
  slot_of_.assign(params_.size(), 0);
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    for (std::size_t s = 0; s < buckets_[b].params.size(); ++s) {
      bucket_of_[buckets_[b].params[s]] = b;
      slot_of_[buckets_[b].params[s]] = s;
    }
    flat_.push_back(torch::zeros({buckets_[b].numel}, torch::TensorOptions().dtype(kBucketDtype).device(group_->device())));
  }
  for (std::size_t i = 0; i < params_.size(); ++i)
    params_[i].register_hook([this, i](torch::Tensor g) { on_grad(i, g); });
  prepare();
}

int64_t Reducer::total_bytes() const {
  int64_t s = 0;
  for (const auto& b : buckets_) s += b.bytes;
  return s;
}

void Reducer::prepare() {
  pending_.assign(buckets_.size(), 0);
  for (std::size_t b = 0; b < buckets_.size(); ++b) pending_[b] = static_cast<int>(buckets_[b].params.size());
  launched_.assign(buckets_.size(), false);
  works_.assign(buckets_.size(), Work());
  filled_.assign(params_.size(), false);
  next_launch_ = 0;
}

void Reducer::on_grad(std::size_t i, const torch::Tensor& grad) {
  if (!sync_) return;
  torch::NoGradGuard ng;
  const auto& p = params_[i];
  const std::size_t b = bucket_of_[i];
  const Bucket& bk = buckets_[b];
  // The gradient this backward will leave in .grad (the hook runs before accumulation).
  auto total = p.grad().defined() ? p.grad() + grad : grad;
  auto slice = flat_[b].narrow(0, bk.offsets[slot_of_[i]], p.numel());
  slice.copy_(total.reshape({-1}));
  if (opts_.divide_before) slice.div_(group_->size());
  if (!filled_[i]) {
    filled_[i] = true;
    --pending_[b];
  }
  if (opts_.overlap) {
    // Launch in bucket order only: every rank must issue its collectives in the same order.
    while (next_launch_ < buckets_.size() && pending_[next_launch_] == 0) launch(next_launch_++);
  }
}

void Reducer::launch(std::size_t b) {
  if (trace::enabled()) {  // timeline: name the bucket's all-reduce (core/runtime/trace)
    trace::P2P label;
    label.name = "all_reduce bucket " + std::to_string(b);
    label.args = {{"bucket", b}, {"overlap", opts_.overlap}};
    trace::annotate_next(std::move(label));
  }
  works_[b] = group_->allreduce_async(flat_[b], ReduceOp::Sum);
  launched_[b] = true;
}

double Reducer::finalize() {
  if (!sync_) return 0.0;
  const double t0 = now_seconds();
  torch::NoGradGuard ng;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    if (launched_[b]) continue;
    const Bucket& bk = buckets_[b];
    for (std::size_t s = 0; s < bk.params.size(); ++s) {
      const std::size_t i = bk.params[s];
      if (filled_[i]) continue;  // a parameter backward did not reach: its local grad or zeros
      auto slice = flat_[b].narrow(0, bk.offsets[s], params_[i].numel());
      if (params_[i].grad().defined()) {
        slice.copy_(params_[i].grad().reshape({-1}));
        if (opts_.divide_before) slice.div_(group_->size());
      } else {
        slice.zero_();
      }
      filled_[i] = true;
    }
    launch(b);
  }
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    works_[b].wait();
    if (!opts_.divide_before) flat_[b].div_(group_->size());
    const Bucket& bk = buckets_[b];
    for (std::size_t s = 0; s < bk.params.size(); ++s) {
      auto& p = params_[bk.params[s]];
      auto v = flat_[b].narrow(0, bk.offsets[s], p.numel()).view(p.sizes()).to(p.scalar_type());
      if (p.grad().defined())
        p.mutable_grad().copy_(v);
      else
        p.mutable_grad() = v.clone();
    }
  }
  prepare();
  sync_device(group_->device());  // NCCL's wait() only orders the stream; time what the host waits for
  return now_seconds() - t0;
}

double Reducer::time_allreduce(int iters) {
  std::vector<torch::Tensor> scratch;
  for (const auto& f : flat_) scratch.push_back(f.clone());
  group_->barrier();
  sync_device(group_->device());
  const double t0 = now_seconds();
  for (int it = 0; it < iters; ++it)
    for (auto& s : scratch) group_->allreduce(s);
  sync_device(group_->device());
  return (now_seconds() - t0) / std::max(1, iters);
}

}  // namespace mpt::dist
