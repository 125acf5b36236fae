// Stage-to-stage transport: in-process mailbox and c10d send/recv. See transport.hpp.
#include "core/pipeline/transport.hpp"
#include "core/pipeline/trace.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "core/dist/dist.hpp"
#include "core/errors.hpp"
#include "core/runtime/runtime.hpp"

namespace mpt {

// ----------------------------------------------------------------------------
// Transport
// ----------------------------------------------------------------------------

void QueueTransport::send(int src, int dst, char kind, int microbatch, const torch::Tensor& t, int boundary) {
  const double trace_t0 = trace::enabled() ? trace::now_us() : 0;  // timeline (trace.hpp)
  {
    std::lock_guard<std::mutex> lock(mu_);
    box_[Key{src, dst, kind, microbatch, boundary < 0 ? std::min(src, dst) : boundary}] = t;
    sent_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  if (trace::enabled())
    trace_queue_p2p(true, src, dst, kind, microbatch, boundary < 0 ? std::min(src, dst) : boundary,
                    static_cast<int64_t>(t.nbytes()), trace_t0, trace::now_us(), /*flow_us=*/trace_t0);
}

std::string recv_timeout_message(int dst, char kind, int microbatch, int src, double timeout_s) {
  return fmt::format("stage {}: no {} for microbatch {} from stage {} within {} s", dst, message_name(kind), microbatch,
                     src, timeout_s);
}

torch::Tensor QueueTransport::recv(int src, int dst, char kind, int microbatch, int boundary) {
  const double trace_t0 = trace::enabled() ? trace::now_us() : 0;  // timeline (trace.hpp)
  std::unique_lock<std::mutex> lock(mu_);
  const Key key{src, dst, kind, microbatch, boundary < 0 ? std::min(src, dst) : boundary};
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration<double>(timeout_s_);
  const auto spin_end = start + std::chrono::duration<double, std::micro>(kSpinUs);
  while (true) {
    if (!aborted_.empty()) throw RuntimeFailure(aborted_);
    auto it = box_.find(key);
    if (it != box_.end()) {
      torch::Tensor t = std::move(it->second);
      box_.erase(it);
      lock.unlock();  // the timeline's record is made outside the mailbox's lock (the other stages' sends wait on it)
      if (trace::enabled()) {
        const double found_us = trace::now_us();  // after the store (the lock orders them): the flow's finish
        trace_queue_p2p(false, src, dst, kind, microbatch, std::get<4>(key), static_cast<int64_t>(t.nbytes()), trace_t0,
                        trace::now_us(), found_us);
      }
      return t;
    }
    if (std::chrono::steady_clock::now() < spin_end) {  // poll: wait for the next message stored, yielding the core
      const uint64_t seen = sent_.load(std::memory_order_acquire);
      lock.unlock();
      while (sent_.load(std::memory_order_acquire) == seen && std::chrono::steady_clock::now() < spin_end)
        std::this_thread::yield();
      lock.lock();
      continue;
    }
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && box_.find(key) == box_.end())
      throw RuntimeFailure(recv_timeout_message(dst, kind, microbatch, src, timeout_s_));
  }
}

bool QueueTransport::ready(int src, int dst, char kind, int microbatch, int boundary) {
  std::lock_guard<std::mutex> lock(mu_);
  return !aborted_.empty() || box_.count(Key{src, dst, kind, microbatch, boundary < 0 ? std::min(src, dst) : boundary});
}

bool QueueTransport::wait_for_send(uint64_t seen) {
  const auto start = std::chrono::steady_clock::now();
  const auto spin_end = start + std::chrono::duration<double, std::micro>(kSpinUs);
  while (sent() == seen && std::chrono::steady_clock::now() < spin_end) std::this_thread::yield();
  if (sent() != seen) return true;
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_until(lock, start + std::chrono::duration<double>(timeout_s_), [&] { return sent() != seen; });
}

void QueueTransport::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_.empty()) aborted_ = why;
    sent_.fetch_add(1, std::memory_order_release);  // a polling recv looks again
  }
  cv_.notify_all();
}

// ----------------------------------------------------------------------------
// Transport between processes (c10d point to point)
// ----------------------------------------------------------------------------

ProcessGroupTransport::ProcessGroupTransport(std::shared_ptr<dist::Group> group,
                                             std::vector<std::vector<int64_t>> boundary_shapes,
                                             std::shared_ptr<dist::Group> backward_group, Placement placement)
    : group_(std::move(group)),
      backward_group_(std::move(backward_group)),
      shapes_(std::move(boundary_shapes)),
      placement_(placement) {
  if (!group_) throw std::invalid_argument("ProcessGroupTransport: no process group");
  if (!backward_group_) backward_group_ = group_;
  if (backward_group_->size() != group_->size() || backward_group_->rank() != group_->rank() ||
      backward_group_->device() != group_->device())
    throw std::invalid_argument(fmt::format("ProcessGroupTransport: the backward group (rank {} of {} on {}) is not "
                                            "the forward group's ranks and device (rank {} of {} on {})",
                                            backward_group_->rank(), backward_group_->size(),
                                            backward_group_->device().str(), group_->rank(), group_->size(),
                                            group_->device().str()));
  const int p = group_->size();
  if (static_cast<int>(shapes_.size()) < p - 1 || (static_cast<int>(shapes_.size()) + 1) % p != 0)
    throw std::invalid_argument(fmt::format("ProcessGroupTransport: {} stages need p*v - 1 boundary shapes ({} with "
                                            "one chunk per stage), got {}", p, p - 1, shapes_.size()));
  if (placement_ == Placement::V && static_cast<int>(shapes_.size()) != 2 * p - 1)
    throw std::invalid_argument(fmt::format("ProcessGroupTransport: the V placement has 2 chunks per stage: {} "
                                            "boundary shapes, got {}", 2 * p - 1, shapes_.size()));
}

void ProcessGroupTransport::set_job_ranks(std::vector<int> ranks) {
  if (!ranks.empty() && static_cast<int>(ranks.size()) != group_->size())
    throw std::invalid_argument(fmt::format("ProcessGroupTransport::set_job_ranks: expected {} ranks (one per stage), "
                                            "got {}", group_->size(), ranks.size()));
  job_ranks_ = std::move(ranks);
}

ProcessGroupTransport::~ProcessGroupTransport() {
  // Only after a failure are sends still pending: nobody will receive them.
  for (auto& p : sends_) p.work->abort();
}

std::pair<int, int> ProcessGroupTransport::boundary_of(int src, int dst, int boundary) const {
  const int p = group_->size();
  const int b = boundary < 0 ? std::min(src, dst) : boundary;
  // Boundary b joins the stages of virtual stages b and b + 1 (loop: b mod p and (b + 1) mod p).
  const bool in_range = b >= 0 && b < static_cast<int>(shapes_.size());
  const int lo = in_range ? stage_rank(b, p, placement_) : -1, hi = in_range ? stage_rank(b + 1, p, placement_) : -1;
  const bool joins = in_range && std::min(src, dst) == std::min(lo, hi) && std::max(src, dst) == std::max(lo, hi) &&
                     src != dst;
  if (!joins)
    throw std::invalid_argument(fmt::format("ProcessGroupTransport on rank {}: boundary {} does not join stages {} "
                                            "and {} ({} stages, {} boundaries)", group_->rank(), b, src, dst, p,
                                            shapes_.size()));
  return {b, b / p};
}

void ProcessGroupTransport::send(int src, int dst, char kind, int microbatch, const torch::Tensor& t, int boundary) {
  const int me = group_->rank();
  if (src != me)
    throw std::invalid_argument(fmt::format("ProcessGroupTransport on rank {}: cannot send from stage {} to stage {} "
                                            "(only from this rank's stage)", me, src, dst));
  const auto [b, lap] = boundary_of(src, dst, boundary);
  const auto& shape = shapes_[static_cast<std::size_t>(b)];
  if (t.sizes().vec() != shape)
    throw std::invalid_argument(fmt::format("stage {}: the {} of microbatch {} for stage {} has shape [{}], the "
                                            "boundary's is [{}]", src, message_name(kind), microbatch, dst,
                                            fmt::join(t.sizes().vec(), ", "), fmt::join(shape, ", ")));
  // Not copied: the activation (a detached output kept for backward) and the input gradient
  // are not written again, and the Work keeps them alive until the receiver has them.
  auto buf = t.detach().to(group_->device(), torch::kFloat32).contiguous();
  auto& g = kind == 'F' ? group_ : backward_group_;
  trace_p2p_annotate(true, src, dst, kind, microbatch, b, job_rank(src), job_rank(dst));  // timeline: the send's flow
  sends_.push_back({std::make_shared<dist::Work>(g->send_async(buf, dst, tag(kind, microbatch, lap))), dst, kind,
                    microbatch});
}

torch::Tensor ProcessGroupTransport::recv(int src, int dst, char kind, int microbatch, int boundary) {
  const int me = group_->rank();
  if (dst != me)
    throw std::invalid_argument(fmt::format("ProcessGroupTransport on rank {}: cannot receive {} {} from stage {} "
                                            "at stage {}", me, kind, microbatch, src, dst));
  const auto [b, lap] = boundary_of(src, dst, boundary);
  // Forward messages come from the stage of virtual stage b, gradients from that of b + 1.
  const int p = group_->size();
  if (src != stage_rank(kind == 'F' ? b : b + 1, p, placement_))
    throw std::invalid_argument(fmt::format("ProcessGroupTransport on rank {}: {} {} across boundary {} does not come "
                                            "from stage {}", me, kind, microbatch, b, src));
  auto t = torch::empty(shapes_[static_cast<std::size_t>(b)],
                        torch::TensorOptions().dtype(torch::kFloat32).device(group_->device()));
  auto& g = kind == 'F' ? group_ : backward_group_;
  std::shared_ptr<dist::Work> work;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!aborted_.empty()) throw RuntimeFailure(aborted_);
    trace_p2p_annotate(false, src, dst, kind, microbatch, b, job_rank(src), job_rank(dst));  // the recv's flow
    work = std::make_shared<dist::Work>(g->recv_async(t, src, tag(kind, microbatch, lap)));
    recv_ = work;
  }
  try {
    work->wait();
    // NCCL's wait only orders the current stream after the recv; the host waits here so
    // that the stage's measured wait is the time until the data is there.
    sync_device(t.device());
  } catch (const RuntimeFailure& e) {
    std::lock_guard<std::mutex> lock(mu_);
    recv_.reset();
    if (!aborted_.empty()) throw RuntimeFailure(aborted_);
    throw RuntimeFailure(fmt::format("stage {}: no {} for microbatch {} from stage {} (rank {}): {}", dst,
                                     message_name(kind), microbatch, src, src, e.what()));
  }
  std::lock_guard<std::mutex> lock(mu_);
  recv_.reset();
  return t;
}

void ProcessGroupTransport::abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_.empty()) aborted_ = why;
  if (recv_) recv_->abort();
}

void ProcessGroupTransport::flush() {
  for (const auto& p : sends_) {
    try {
      p.work->wait();
    } catch (const RuntimeFailure& e) {
      throw RuntimeFailure(fmt::format("stage {}: the {} of microbatch {} did not reach stage {} (rank {}): {}",
                                       group_->rank(), message_name(p.kind), p.microbatch, p.dst, p.dst, e.what()));
    }
  }
  sends_.clear();
}

}  // namespace mpt
