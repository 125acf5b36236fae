// core/dist, groups: Group::create (Gloo on CPU, NCCL on CUDA), Work, the collectives and
// point-to-point messages through c10d, and their communication counts. Declarations:
// group.hpp; the ring collectives: ring.cpp; the job: job.cpp.
#include "core/dist/group_impl.hpp"

#include <cstdlib>
#include <exception>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef MPT_WITH_CUDA
// NCCL for CUDA tensors: compiled only against a CUDA LibTorch (set by CMake from what it found).
#define USE_C10D_NCCL 1
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "core/dist/detail.hpp"
#include "core/dist/group.hpp"

#include <limits>
#include "core/dist/job_state.hpp"
#include "core/errors.hpp"
#include "core/runtime/compat.hpp"
#include "core/runtime/trace.hpp"

namespace mpt::dist {

using namespace detail;
using namespace group_detail;

void Work::wait() {
  if (!impl_) return;
  auto* w = static_cast<WorkImpl*>(impl_.get());
  bool done = false;
  try {
    WaitScope waiting(*w->job->state_, w->monitor ? -2 : w->peer_global);
    done = w->w->wait();
  } catch (const std::exception& e) {
    // Its heartbeat says so while it finds whom to blame: peers follow its verdict, not it.
    WaitScope giving_up(*w->job->state_, kWaitingGaveUp);
    collective_failed(w->what, e, w->monitor.get(), w->job->state_.get(), w->peer_global);
  }
  // Gloo's send/recv return false when abort() ended the wait.
  if (!done) throw RuntimeFailure(w->what + ": aborted");
  if (w->trace) {
    trace_end(*w->trace, w->trace->post_us, trace::now_us());
    w->trace.reset();
  }
}

void Work::abort() {
  if (!impl_) return;
  try {
    static_cast<WorkImpl*>(impl_.get())->w->abort();
  } catch (const std::exception&) {
    // c10d's base Work has no abort; a collective then simply runs into its timeout.
  }
}

std::shared_ptr<Group> Group::create(std::shared_ptr<Job> job, int rank, int size, const std::string& prefix,
                                     std::chrono::milliseconds timeout, torch::Device device) {
  if (!job) throw std::invalid_argument("Group::create: no job (connect_store makes one)");
  JobState& js = *job->state_;
  const LaunchInfo& info = js.launch;
  std::shared_ptr<Group> g(new Group());
  g->job_ = std::move(job);
  g->rank_ = rank;
  g->size_ = size;
  g->device_ = device;
  g->impl_ = std::make_unique<Impl>();
  g->impl_->where = fmt::format("rank {} of {}", rank, size);
  g->impl_->timeout = timeout;
  auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, js.store);
  g->impl_->store = store;
  // Every member arrives first, in the store: a rank may come long after the others (it was
  // busy alone, e.g. rank 0 with N = 1), which Gloo's own rendezvous would not wait for.
  auto monitor_store = c10::make_intrusive<c10d::PrefixStore>("mpt_monitor/", store);
  try {
    store_set(*monitor_store, fmt::format("global/{}", rank), std::to_string(info.rank));
  } catch (const std::exception& e) {
    throw RuntimeFailure(fmt::format("rank {} of {}: cannot register with the store: {}", rank, size,
                                     first_line(e.what())));
  }
  auto global_of = [&](int r) {
    const std::string key = fmt::format("global/{}", r);
    try {
      if (monitor_store->check({key})) {
        auto v = monitor_store->get(key);
        auto parsed = parse_ranks(std::string(v.begin(), v.end()));
        if (!parsed.empty()) return parsed.front();
      }
    } catch (const std::exception&) {
    }
    return r;  // not registered yet: in mpt's groups a group rank is the job rank
  };
  store_barrier(js, *store, "create", rank, size, global_of, timeout,
                fmt::format("rank {} of {}: forming the process group '{}'", rank, size, prefix));
  for (int r = 0; r < size; ++r) g->impl_->global.push_back(r == rank ? info.rank : global_of(r));
  if (device.is_cuda()) {
#ifdef MPT_WITH_CUDA
    g->backend_ = "nccl";
    try {
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = timeout;
      g->impl_->pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
    } catch (const std::exception& e) {
      throw RuntimeFailure(fmt::format("rank {} of {}: cannot form the NCCL process group within {:g} s: {}", rank,
                                       size, timeout.count() / 1000.0, first_line(e.what())));
    }
#else
    throw RuntimeFailure("a process group on " + device.str() + ": this mpt was built against a CPU-only LibTorch (" +
                         compat::torch_version() + "), so it has no NCCL; use --device cpu (Gloo)");
#endif
  } else {
    try {
      auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
      // The address Gloo binds and advertises to its peers: GLOO_SOCKET_IFNAME's interfaces when
      // set (as torch.distributed's ProcessGroupGloo does, comma-separated); loopback for a master
      // on loopback; else the address this host reaches the master through (route_source_address:
      // across nodes, not the 127.0.0.1 that a hostname in /etc/hosts often resolves to); Gloo's
      // hostname-based default only where no route is found.
      const bool loopback = info.master_addr == "127.0.0.1" || info.master_addr == "localhost";
      const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
      if (ifname && *ifname) {
        std::stringstream names(ifname);
        for (std::string name; std::getline(names, name, ',');)
          if (!name.empty()) opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
      } else if (loopback) {
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      } else if (const std::string local = route_source_address(info.master_addr, info.master_port); !local.empty()) {
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(local));
      } else {
        opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      }
      opts->threads = 1;
      g->impl_->gloo_options = opts;
      g->impl_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
    } catch (const std::exception& e) {
      throw RuntimeFailure(fmt::format("rank {} of {}: cannot form the Gloo process group within {:g} s: {}", rank,
                                       size, timeout.count() / 1000.0, first_line(e.what())));
    }
  }
  if (trace::enabled()) trace::set_metadata("backend", g->backend_);
  try {
    auto m = std::make_shared<Monitor>();
    m->store = monitor_store;
    m->job_store = js.store;
    m->rank = rank;
    m->size = size;
    m->global_rank = info.rank;
    m->window_s = report_window_s(timeout);
    m->liveness = liveness_of(js);
    m->liveness.dog = nullptr;  // the exchange's thread is bounded by diagnose() instead
    m->store_timeout_s = static_cast<double>(timeout.count()) / 1000.0;
    m->host = store_host(info);
    g->impl_->monitor = m;
  } catch (const std::exception& e) {
    throw RuntimeFailure(fmt::format("rank {} of {}: cannot register with the store: {}", rank, size,
                                     first_line(e.what())));
  }
  return g;
}

Group::~Group() = default;

void Group::count(const char* kind, int64_t payload_bytes, double sent_bytes) {
  std::lock_guard<std::mutex> lock(count_mu_);
  CommCount& c = counts_[kind];
  ++c.calls;
  c.payload_bytes += payload_bytes;
  c.sent_bytes += size_ > 1 ? sent_bytes : 0.0;
}

std::map<std::string, CommCount> Group::comm_counts() const {
  std::lock_guard<std::mutex> lock(count_mu_);
  return counts_;
}

void Group::reset_comm_counts() {
  std::lock_guard<std::mutex> lock(count_mu_);
  counts_.clear();
}

Work Group::allreduce_async(torch::Tensor t, ReduceOp op) {
  count("all_reduce", nbytes_of(t), 2.0 * ring_share(nbytes_of(t), size_));
  auto tr = trace_begin("all_reduce", nbytes_of(t), size_);
  std::vector<at::Tensor> ts{std::move(t)};
  c10d::AllreduceOptions o;
  o.reduceOp = to_c10d(op);
  return post_collective("all-reduce failed on " + impl_->where, job_, impl_->monitor,
                         [&] { return impl_->pg->allreduce(ts, o); }, tr, impl_->trace_lane);
}

void Group::broadcast(torch::Tensor t, int root) {
  count("broadcast", nbytes_of(t), ring_share(nbytes_of(t), size_));
  auto tr = trace_begin("broadcast", nbytes_of(t), size_);
  if (tr) tr->args["root"] = root;
  std::vector<at::Tensor> ts{std::move(t)};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  post_collective("broadcast failed on " + impl_->where, job_, impl_->monitor, [&] { return impl_->pg->broadcast(ts, o); },
                  tr, impl_->trace_lane)
      .wait();
}

void Group::all_gather(const torch::Tensor& in, torch::Tensor out) {
  check_chunks("all_gather", out, in, size_);
  if (uses_ring("all_gather")) return ring_all_gather(in, std::move(out));
  count("all_gather", nbytes_of(out), ring_share(nbytes_of(out), size_));
  auto tr = trace_begin("all_gather", nbytes_of(out), size_);
  if constexpr (compat::kTorch2) {
    // The flat form (all_gather_into_tensor), as FSDP2 calls it: no list of chunk views.
    at::Tensor input = in, output = out;
    post_collective("all-gather failed on " + impl_->where, job_, impl_->monitor,
                    [&] { return impl_->pg->_allgather_base(output, input, c10d::AllgatherOptions()); }, tr,
                    impl_->trace_lane)
        .wait();
    return;
  }
  std::vector<at::Tensor> inputs{in};  // LibTorch 1.13's Gloo has only the list form
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < size_; ++r) outputs[0].push_back(out.chunk(size_, 0)[static_cast<std::size_t>(r)]);
  post_collective("all-gather failed on " + impl_->where, job_, impl_->monitor,
                  [&] { return impl_->pg->allgather(outputs, inputs, c10d::AllgatherOptions()); }, tr,
                  impl_->trace_lane)
      .wait();
}

void Group::reduce_scatter(const torch::Tensor& in, torch::Tensor out, ReduceOp op) {
  check_chunks("reduce_scatter", in, out, size_);
  if (uses_ring("reduce_scatter")) return ring_reduce_scatter(in, std::move(out), op);
  // NCCL, and LibTorch 2.x's Gloo (Native).
  count("reduce_scatter", nbytes_of(in), ring_share(nbytes_of(in), size_));
  auto tr = trace_begin("reduce_scatter", nbytes_of(in), size_);
  std::vector<at::Tensor> outputs{out};
  std::vector<std::vector<at::Tensor>> inputs(1);
  for (int r = 0; r < size_; ++r) inputs[0].push_back(in.chunk(size_, 0)[static_cast<std::size_t>(r)]);
  c10d::ReduceScatterOptions o;
  o.reduceOp = to_c10d(op);
  // The flat form (reduce_scatter_tensor): ProcessGroupGloo's list form took 1.5-2x as long at
  // 256 KiB-1 MiB on N = 2 (mpt collectives, docs/shard.md).
  at::Tensor input = in, output = out;
  post_collective("reduce-scatter failed on " + impl_->where, job_, impl_->monitor,
                  [&] { return impl_->pg->_reduce_scatter_base(output, input, o); }, tr, impl_->trace_lane)
      .wait();
}

void Group::all_to_all(const torch::Tensor& in, torch::Tensor out) {
  if (!in.is_contiguous() || !out.is_contiguous() || in.sizes() != out.sizes() || in.dim() == 0 ||
      in.size(0) % size_ != 0 || in.scalar_type() != out.scalar_type() || in.device() != out.device())
    throw std::invalid_argument(fmt::format("all_to_all: expected two contiguous tensors of one shape, dtype and "
                                            "device whose first dimension divides by {}, got {} and {}", size_,
                                            c10::str(in.sizes()), c10::str(out.sizes())));
  count("all_to_all", nbytes_of(in), ring_share(nbytes_of(in), size_));
  auto tr = trace_begin("all_to_all", nbytes_of(in), size_);
  at::Tensor input = in, output = out;
  std::vector<int64_t> equal_splits;  // empty: size equal chunks (all_to_all_single's default)
  post_collective("all-to-all failed on " + impl_->where, job_, impl_->monitor, [&] {
    return impl_->pg->alltoall_base(output, input, equal_splits, equal_splits, c10d::AllToAllOptions());
  }, tr, impl_->trace_lane).wait();
}

namespace {
void check_user_tag(const char* op, int tag) {
  if (tag >= kRingTagBase)
    throw std::invalid_argument(fmt::format("{}: tag {} is in the range reserved for the ring collectives "
                                            "(>= 2^30 = {}); use a tag 0 .. {}",
                                            op, tag, kRingTagBase, kRingTagBase - 1));
}
}  // namespace

Work Group::send_async(torch::Tensor t, int dst, int tag) {
  check_user_tag("send_async", tag);
  count("send", nbytes_of(t), static_cast<double>(nbytes_of(t)));
  const int64_t bytes = nbytes_of(t);
  std::vector<at::Tensor> ts{std::move(t)};
  auto impl = std::make_shared<WorkImpl>();
  impl->what = fmt::format("send to rank {} (tag {}) failed on {}", dst, tag, impl_->where);
  impl->job = job_;
  if (dst >= 0 && dst < size_) impl->peer_global = impl_->global[static_cast<std::size_t>(dst)];
  // The send's slice is its posting (Gloo moves the data once the receiver posts its recv).
  auto tr = trace_begin("send", bytes, size_, impl->peer_global);
  if (tr) tr->args["tag"] = tag;
  try {
    impl->w = impl_->pg->send(ts, dst, tag);
  } catch (const std::exception& e) {
    throw RuntimeFailure(fmt::format("{}: {}; a peer process failed or timed out", impl->what, first_line(e.what())));
  }
  if (tr) trace_end(*tr, tr->post_us, trace::now_us());
  return Work(impl);
}

Work Group::recv_async(torch::Tensor t, int src, int tag) {
  check_user_tag("recv_async", tag);
  count("recv", nbytes_of(t), 0.0);
  const int64_t bytes = nbytes_of(t);
  std::vector<at::Tensor> ts{std::move(t)};
  auto impl = std::make_shared<WorkImpl>();
  impl->what = fmt::format("recv from rank {} (tag {}) failed on {}", src, tag, impl_->where);
  impl->job = job_;
  if (src >= 0 && src < size_) impl->peer_global = impl_->global[static_cast<std::size_t>(src)];
  // The recv's slice: from posting to the return of wait() (the data is there).
  impl->trace = trace_begin("recv", bytes, size_, impl->peer_global);
  if (impl->trace) impl->trace->args["tag"] = tag;
  try {
    impl->w = impl_->pg->recv(ts, src, tag);
  } catch (const std::exception& e) {
    throw RuntimeFailure(fmt::format("{}: {}; a peer process failed or timed out", impl->what, first_line(e.what())));
  }
  return Work(impl);
}

void Group::barrier() {
  // First in the store, waiting as long as the missing ranks make progress; then an
  // all-reduce of one element (bounded by the group's timeout) so that all leave together.
  const auto& global = impl_->global;
  store_barrier(*job_->state_, *impl_->store, std::to_string(impl_->barriers++), rank_, size_,
                [&global](int r) { return global[static_cast<std::size_t>(r)]; }, impl_->timeout,
                fmt::format("barrier on {}", impl_->where));
  allreduce(torch::zeros({1}, torch::TensorOptions().device(device_)));
}

void settle(Group& group, torch::Tensor& token) { group.allreduce(token); }

double max_over(Group& group, double x) {
  auto all = torch::empty({group.size()}, torch::kFloat64);
  group.all_gather(torch::tensor({x}, torch::kFloat64), all);
  if (all.isnan().any().item<bool>()) return std::numeric_limits<double>::quiet_NaN();
  return all.max().item<double>();
}

}  // namespace mpt::dist
