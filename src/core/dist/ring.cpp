// core/dist, ring: the ring reduce-scatter and all-gather from point-to-point messages (Gloo,
// dist.gloo_algorithm = "ring", or where LibTorch's Gloo has no reduce_scatter), the choice of
// algorithm (collective_algorithm) and the ring's second process group at N = 2 (ring_pg). The
// exact schedule: group.hpp.
#include "core/dist/group_impl.hpp"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "core/dist/detail.hpp"
#include "core/dist/group.hpp"
#include "core/errors.hpp"
#include "core/runtime/compat.hpp"
#include "core/runtime/trace.hpp"

namespace mpt::dist {

using namespace detail;
using namespace group_detail;

// ----------------------------------------------------------------------------
// Ring collectives from point-to-point messages (see group.hpp for the exact schedule)
// ----------------------------------------------------------------------------
GlooAlgorithm gloo_algorithm_from_name(const std::string& name) {
  if (name == "native") return GlooAlgorithm::Native;
  if (name == "ring") return GlooAlgorithm::Ring;
  throw std::invalid_argument("gloo algorithm: expected \"native\" or \"ring\", got \"" + name + "\"");
}

std::string gloo_algorithm_name(GlooAlgorithm a) { return a == GlooAlgorithm::Ring ? "ring" : "native"; }

namespace {
bool ring_on(const std::string& backend, GlooAlgorithm a, const std::string& kind) {
  if (backend != "gloo") return false;
  if (a == GlooAlgorithm::Ring) return true;
  return kind == "reduce_scatter" && !compat::kGlooHasReduceScatter;
}
}  // namespace

std::string collective_algorithm(const std::string& backend, GlooAlgorithm a, const std::string& kind) {
  if (kind != "reduce_scatter" && kind != "all_gather")
    throw std::invalid_argument("collective_algorithm: expected reduce_scatter or all_gather, got " + kind);
  // The c10d call Group makes: the flat forms on LibTorch 2.x (all_gather_into_tensor /
  // reduce_scatter_tensor: c10d's _allgather_base / _reduce_scatter_base), 1.13's list allgather.
  const std::string c10d_name = kind == "reduce_scatter" ? "_reduce_scatter_base (reduce_scatter_tensor)"
                                : compat::kTorch2          ? "_allgather_base (all_gather_into_tensor)"
                                                           : "allgather";
  if (backend != "gloo")
    return fmt::format("{} native (c10d ProcessGroup{}::{}; dist.gloo_algorithm does not apply)", backend,
                       backend == "nccl" ? "NCCL" : backend, c10d_name);
  if (!ring_on(backend, a, kind))
    return "gloo native (c10d ProcessGroupGloo::" + c10d_name + ")" +
           (kind == "reduce_scatter" ? std::string(": ") + kGlooNativeReduceScatter : std::string());
  if (a == GlooAlgorithm::Ring) return "ring (send/recv, mpt): dist.gloo_algorithm = \"ring\"";
  return "ring (send/recv, mpt): LibTorch " + compat::torch_version() + "'s ProcessGroupGloo has no reduce_scatter";
}

// (One rank too: the ring is then a copy, and 1.13's Gloo would refuse its reduce_scatter.)
bool Group::uses_ring(const std::string& kind) const { return ring_on(backend_, gloo_algorithm_, kind); }

namespace {
// The tag of step `step` of ring call number `call`: kRingTagBase + (call mod 2^24)·64 + step mod 64
// (steps between the same two ranks are sequential, so a step count beyond 64 may repeat tags).
int ring_tag(int64_t call, int step) {
  return kRingTagBase + static_cast<int>((call % (int64_t{1} << 24)) * 64 + step % 64);
}

// The ring's trace slice: from posting (or the previous collective's end) to the last step.
void ring_trace_end(const std::shared_ptr<TraceOp>& op, const std::shared_ptr<TraceLane>& lane) {
  if (!op) return;
  const double done = trace::now_us();
  double begin = op->post_us;
  {
    std::lock_guard<std::mutex> lock(lane->mu);
    begin = std::max(begin, std::min(done, lane->last_done_us));
    lane->last_done_us = done;
  }
  trace_end(*op, begin, done);
}

// dst = received ⊕ own, elementwise in the dtype.
void ring_combine(torch::Tensor& dst, const torch::Tensor& received, const torch::Tensor& own, ReduceOp op) {
  if (op == ReduceOp::Sum) {
    torch::add_out(dst, received, own);
  } else if (op == ReduceOp::Min) {
    torch::minimum_out(dst, received, own);
  } else {
    torch::maximum_out(dst, received, own);
  }
}

const char* ring_op_name(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : op == ReduceOp::Min ? "min" : "max"; }

// One step of a ring: waits for its recv, then its send; a failed recv aborts the send, so that
// nothing waits on it (the failure, already diagnosed by the Work, propagates).
void exchange(Work& rx, Work& tx) {
  try {
    rx.wait();
  } catch (...) {
    tx.abort();
    throw;
  }
  tx.wait();
}
}  // namespace

// Why two process groups. Gloo's TCP pair (gloo/transport/tcp/pair.cc) writes a message from the
// posting thread when the peer's "recv ready" notice has already arrived, holding the pair's
// mutex for the whole writev (on loopback the kernel also delivers the segments inside it).
// Its device thread, woken meanwhile by input on that socket, only try-locks the pair
// (Pair::handleEvents) and returns to a level-triggered epoll_wait, which returns at once: it
// spins until the write ends, on a CPU that the other rank needs when 2 ranks share 2 cores.
// With one group, a ring step's two messages share one pair; with the direction split, the
// socket a rank writes to carries no input for it then (the receiver's notice came before),
// and its input arrives on the other group's pair. Counted with uprobes on
// Pair::handleEvents / handleReadWrite (`mpt shard --nproc 2`, stages 0 and 2, 200 steps, ring):
// 544 000 and 695 000 calls, 5 000 past the try-lock, with one group; 209 000 and 215 000,
// 5 800 past it, split (stage 0's native all-reduce alone accounts for about 160 000).
// docs/shard.md, "Gloo's device thread spins".
compat::C10dBackend& Group::Impl::ring_pg(int from, int to, int rank, int size) {
  // At N > 2 the ring's neighbours are two different pairs already, and a lazily formed group
  // would need every rank (the middle ones never send down): only N = 2 splits.
  if (size != 2 || from < to || !gloo_options) return *pg;
  std::lock_guard<std::mutex> lock(pg_down_mu);
  if (!pg_down) {
    try {
      auto down_store = c10::make_intrusive<c10d::PrefixStore>("mpt_ring_down/", store);
      pg_down = c10::make_intrusive<c10d::ProcessGroupGloo>(down_store, rank, size, gloo_options);
    } catch (const std::exception& e) {
      throw RuntimeFailure(fmt::format("{}: cannot form the ring's second Gloo process group within {:g} s: {}",
                                       where, timeout.count() / 1000.0, first_line(e.what())));
    }
  }
  return *pg_down;
}

Work Group::ring_step(bool send, torch::Tensor t, int peer, int tag, const std::string& what) {
  auto impl = std::make_shared<WorkImpl>();
  impl->what = what;
  impl->job = job_;
  impl->monitor = impl_->monitor;  // diagnosed as a collective: every rank of the ring takes part
  impl->peer_global = impl_->global[static_cast<std::size_t>(peer)];
  std::vector<at::Tensor> ts{std::move(t)};
  try {
    compat::C10dBackend& pg = send ? impl_->ring_pg(rank_, peer, rank_, size_) : impl_->ring_pg(peer, rank_, rank_, size_);
    impl->w = send ? pg.send(ts, peer, tag) : pg.recv(ts, peer, tag);
  } catch (const std::exception& e) {
    collective_failed(impl->what, e, impl_->monitor.get());
  }
  return Work(impl);
}

void Group::ring_reduce_scatter(const torch::Tensor& in, torch::Tensor out, ReduceOp op) {
  check_chunks("ring_reduce_scatter", in, out, size_);
  const int n = size_, r = rank_;
  count("reduce_scatter", nbytes_of(in), ring_share(nbytes_of(in), n));
  if (n == 1) {
    out.copy_(in);
    return;
  }
  auto tr = trace_begin("reduce_scatter", nbytes_of(in), n);
  if (tr) tr->args["algorithm"] = "ring";
  const int64_t call = ring_calls_++;
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  const auto chunks = in.chunk(n, 0);
  auto chunk_of = [&](int j) { return chunks[static_cast<std::size_t>(((j % n) + n) % n)]; };
  torch::Tensor received = torch::empty_like(out), partial[2];  // N > 2: the partials sent on (made when needed)
  torch::Tensor to_send = chunk_of(r - 1);  // step 0: this rank's own chunk r−1
  for (int s = 0; s < n - 1; ++s) {
    const int tag = ring_tag(call, s);
    const std::string what = fmt::format("reduce-scatter (ring, {}) step {} of {} failed on {}", ring_op_name(op), s + 1,
                                         n - 1, impl_->where);
    Work rx = ring_step(false, received, prev, tag, what + " (recv from rank " + std::to_string(prev) + ")");
    Work tx = ring_step(true, to_send, next, tag, what + " (send to rank " + std::to_string(next) + ")");
    exchange(rx, tx);
    // The partial of chunk (r − s − 2) mod N: received ⊕ this rank's own; the last one is chunk r.
    if (s < n - 2 && !partial[s % 2].defined()) partial[s % 2] = torch::empty_like(out);
    torch::Tensor dst = s == n - 2 ? out : partial[s % 2];
    ring_combine(dst, received, chunk_of(r - s - 2), op);
    to_send = dst;
  }
  ring_trace_end(tr, impl_->trace_lane);
}

void Group::ring_all_gather(const torch::Tensor& in, torch::Tensor out) {
  check_chunks("ring_all_gather", out, in, size_);
  const int n = size_, r = rank_;
  count("all_gather", nbytes_of(out), ring_share(nbytes_of(out), n));
  const auto chunks = out.chunk(n, 0);
  auto chunk_of = [&](int j) { return chunks[static_cast<std::size_t>(((j % n) + n) % n)]; };
  if (chunk_of(r).data_ptr() != in.data_ptr()) chunk_of(r).copy_(in);  // `in` may be chunk r itself
  if (n == 1) return;
  auto tr = trace_begin("all_gather", nbytes_of(out), n);
  if (tr) tr->args["algorithm"] = "ring";
  const int64_t call = ring_calls_++;
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  for (int s = 0; s < n - 1; ++s) {
    const int tag = ring_tag(call, s);
    const std::string what =
        fmt::format("all-gather (ring) step {} of {} failed on {}", s + 1, n - 1, impl_->where);
    Work rx = ring_step(false, chunk_of(r - s - 1), prev, tag, what + " (recv from rank " + std::to_string(prev) + ")");
    Work tx = ring_step(true, chunk_of(r - s), next, tag, what + " (send to rank " + std::to_string(next) + ")");
    exchange(rx, tx);
  }
  ring_trace_end(tr, impl_->trace_lane);
}

}  // namespace mpt::dist
