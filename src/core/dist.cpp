// c10d process groups, launch and the DDP-style reducer. See dist.hpp.
#define USE_C10D_GLOO 1
#define MPT_COMPAT_C10D 1
#include "core/dist.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <cstring>
#include <mutex>
#include <thread>

#include <spdlog/spdlog.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef MPT_WITH_CUDA
// NCCL for CUDA tensors: compiled only against a CUDA LibTorch (set by CMake from what it found).
#define USE_C10D_NCCL 1
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

extern char** environ;

#include "core/compat.hpp"
#include "core/errors.hpp"
#include "core/runtime.hpp"

namespace mpt::dist {

namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

int env_int(const char* name, int fallback) {
  const char* v = env(name);
  if (!v) return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > 1'000'000)
    throw RuntimeFailure(fmt::format("environment variable {}={:?} is not a non-negative integer", name, v));
  return static_cast<int>(x);
}

std::string first_line(const std::string& s) {
  auto p = s.find('\n');
  return p == std::string::npos ? s : s.substr(0, p);
}

// The job's store (one per process), and how long collectives may take.
c10::intrusive_ptr<c10d::Store> g_store;
std::chrono::milliseconds g_timeout{30000};

// Key (in the job's store, no group prefix) under which rank R lists the ranks that did not
// answer when its collective failed: the launcher reads it to name a hung rank.
// How long the launcher waits, after its peers named a hung rank, for those peers to exit
// before it kills whatever is left (they exit right after their own report).
constexpr double kHungGraceSeconds = 10.0;

std::string unresponsive_key(int rank) { return fmt::format("mpt/unresponsive/{}", rank); }

std::vector<int> parse_ranks(const std::string& s) {
  std::vector<int> out;
  std::size_t i = 0;
  while (i < s.size()) {
    std::size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    try {
      out.push_back(std::stoi(s.substr(i, j - i)));
    } catch (const std::exception&) {
    }
    i = j + 1;
  }
  return out;
}

void store_set(c10d::Store& store, const std::string& key, const std::string& value) {
  store.set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

std::string join_ranks(const std::vector<int>& v, const char* sep) {
  std::string s;
  for (int r : v) s += (s.empty() ? "" : sep) + std::to_string(r);
  return s;
}

}  // namespace

// ----------------------------------------------------------------------------
// Launch
// ----------------------------------------------------------------------------

std::optional<LaunchInfo> launch_from_environment() {
  LaunchInfo li;
  if (env("MPT_RANK")) {
    li.launcher = "mpt";
    li.rank = env_int("MPT_RANK", 0);
    li.world_size = env_int("MPT_WORLD_SIZE", 1);
    li.local_rank = env_int("MPT_LOCAL_RANK", li.rank);
    const char* agent = env("MPT_AGENT_STORE");
    li.agent_store = agent && std::string(agent) == "1";
  } else if (env("RANK") && env("WORLD_SIZE")) {
    li.launcher = "torchrun";
    li.rank = env_int("RANK", 0);
    li.world_size = env_int("WORLD_SIZE", 1);
    li.local_rank = env_int("LOCAL_RANK", 0);
    const char* agent = env("TORCHELASTIC_USE_AGENT_STORE");
    li.agent_store = agent && std::string(agent) == "True";
    li.store_prefix = li.agent_store ? fmt::format("/worker/attempt_{}", env_int("TORCHELASTIC_RESTART_COUNT", 0)) : "";
  } else if (env("SLURM_PROCID") && env("SLURM_NTASKS")) {
    li.launcher = "slurm";
    li.rank = env_int("SLURM_PROCID", 0);
    li.world_size = env_int("SLURM_NTASKS", 1);
    li.local_rank = env_int("SLURM_LOCALID", 0);
  } else {
    return std::nullopt;
  }
  if (li.world_size < 1 || li.rank >= li.world_size)
    throw RuntimeFailure(fmt::format("{} environment: rank {} is not in [0, world size {})", li.launcher, li.rank,
                                     li.world_size));
  if (const char* a = env("MASTER_ADDR")) li.master_addr = a;
  li.master_port = env_int("MASTER_PORT", 0);
  if (li.world_size > 1 && (li.master_port <= 0 || li.master_port > 65535))
    throw RuntimeFailure(fmt::format("{} environment: MASTER_PORT must be set to a TCP port (1-65535) for {} processes",
                                     li.launcher, li.world_size));
  return li;
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw RuntimeFailure(fmt::format("socket(): {}", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw RuntimeFailure(fmt::format("cannot find a free port on 127.0.0.1: {}", std::strerror(errno)));
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

int spawn_local(int nproc, const std::vector<std::string>& argv, double grace_s) {
  // The launcher hosts the job's TCPStore (as torchrun's agent does): it outlives any worker,
  // so ranks can still leave their diagnosis there when rank 0 is the one that failed, and
  // the launcher reads which rank the others found unresponsive.
  c10::intrusive_ptr<c10d::TCPStore> store;
  {
    c10d::TCPStoreOptions o;
    o.port = 0;  // any free port; getPort() tells which
    o.isServer = true;
    o.numWorkers = c10::nullopt;
    o.waitWorkers = false;
    o.timeout = std::chrono::milliseconds(5000);
    try {
      store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
    } catch (const std::exception& e) {
      throw RuntimeFailure(fmt::format("cannot host a TCPStore on 127.0.0.1: {}", first_line(e.what())));
    }
  }
  const int port = store->getPort();
  // Everything the children need is built before fork(): between fork and exec a child
  // may only make async-signal-safe calls (no allocation).
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const std::vector<std::string> ours = {"MPT_RANK",    "MPT_WORLD_SIZE", "MPT_LOCAL_RANK",
                                         "MASTER_ADDR", "MASTER_PORT",    "MPT_AGENT_STORE"};
  std::vector<std::string> inherited;
  for (char** e = environ; *e; ++e) {
    std::string kv(*e);
    std::string key = kv.substr(0, kv.find('='));
    if (std::find(ours.begin(), ours.end(), key) == ours.end()) inherited.push_back(kv);
  }
  std::vector<std::vector<std::string>> env_text(static_cast<std::size_t>(nproc));
  std::vector<std::vector<char*>> envp(static_cast<std::size_t>(nproc));
  for (int r = 0; r < nproc; ++r) {
    auto& t = env_text[static_cast<std::size_t>(r)];
    t = inherited;
    t.push_back("MPT_RANK=" + std::to_string(r));
    t.push_back("MPT_WORLD_SIZE=" + std::to_string(nproc));
    t.push_back("MPT_LOCAL_RANK=" + std::to_string(r));
    t.push_back("MASTER_ADDR=127.0.0.1");
    t.push_back("MASTER_PORT=" + std::to_string(port));
    t.push_back("MPT_AGENT_STORE=1");
    for (auto& kv : t) envp[static_cast<std::size_t>(r)].push_back(kv.data());
    envp[static_cast<std::size_t>(r)].push_back(nullptr);
  }
  const pid_t parent = ::getpid();
  const int max_fd = static_cast<int>(std::min<long>(::sysconf(_SC_OPEN_MAX), 65536));
  std::vector<pid_t> pids(static_cast<std::size_t>(nproc), -1);
  for (int r = 0; r < nproc; ++r) {
    pid_t pid = ::fork();
    if (pid < 0) {
      const int err = errno;
      for (pid_t p : pids)
        if (p > 0) ::kill(p, SIGKILL), ::waitpid(p, nullptr, 0);
      throw RuntimeFailure(fmt::format("fork(): {}", std::strerror(err)));
    }
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);    // no orphaned workers if mpt itself dies
      if (::getppid() != parent) ::_exit(kExitRuntime);
      for (int fd = 3; fd < max_fd; ++fd) ::close(fd);  // not the store's listening socket
      ::execve("/proc/self/exe", args.data(), envp[static_cast<std::size_t>(r)].data());
      static const char msg[] = "mpt: a worker could not exec /proc/self/exe\n";
      [[maybe_unused]] auto n = ::write(2, msg, sizeof(msg) - 1);
      ::_exit(kExitRuntime);
    }
    pids[static_cast<std::size_t>(r)] = pid;
  }
  spdlog::debug("spawned {} workers (MASTER_ADDR=127.0.0.1 MASTER_PORT={}, store hosted here)", nproc, port);

  // Ranks the worker `r` found unresponsive when its collective failed (empty: none said).
  auto unresponsive_by = [&](int r) -> std::vector<int> {
    try {
      const std::string key = unresponsive_key(r);
      if (!store->check({key})) return {};
      auto v = store->get(key);
      return parse_ranks(std::string(v.begin(), v.end()));
    } catch (const std::exception&) {
      return {};
    }
  };

  struct Failure { int rank; int code; std::string why; bool own; std::vector<int> unresponsive; };
  std::optional<Failure> blamed;
  bool hung = false;               // the blamed rank is alive but did not answer its peers
  std::vector<Failure> window;     // failures seen within the blame window
  double window_end = 0, deadline = 0, wait_s = grace_s;
  int alive = nproc;
  auto reap = [&](pid_t pid, int status) {
    for (int r = 0; r < nproc; ++r) {
      if (pids[static_cast<std::size_t>(r)] != pid) continue;
      pids[static_cast<std::size_t>(r)] = -1;
      --alive;
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (code == 0 || blamed) return;
      std::string why = WIFEXITED(status)
                            ? fmt::format("exit code {}{}", code, code == kExitInjectedFault ? " (injected fault)" : "")
                            : fmt::format("killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
      if (window.empty()) window_end = now_seconds() + 0.2;
      window.push_back({r, code, why, code != kExitRuntime, code == kExitRuntime ? unresponsive_by(r) : std::vector<int>{}});
    }
  };
  // Whom to blame for the failures in the window: a rank that failed on its own; else a rank
  // that its peers found unresponsive and that is still running (hung); else the first.
  auto choose = [&]() -> Failure {
    auto own = std::find_if(window.begin(), window.end(), [](const Failure& f) { return f.own; });
    if (own != window.end()) return *own;
    for (const auto& f : window)
      for (int s : f.unresponsive)
        if (s >= 0 && s < nproc && pids[static_cast<std::size_t>(s)] > 0) {
          hung = true;
          return {s, kExitRuntime,
                  fmt::format("did not answer: rank {} gave up waiting for it, and it is still running (hung)",
                              f.rank),
                  true, {}};
        }
    return window.front();
  };
  while (alive > 0) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      reap(pid, status);
      continue;
    }
    if (pid < 0 && errno != EINTR) break;
    const double now = now_seconds();
    if (!blamed && !window.empty() && (now >= window_end || alive == 0)) {
      blamed = choose();
      // A hung rank never ends on its own: once the other ranks are gone (they exit right
      // after their timeout), or after a short grace, it is killed.
      wait_s = hung ? std::min(grace_s, kHungGraceSeconds) : grace_s;
      deadline = now + wait_s;
      spdlog::error("rank {} of {} failed: {}; waiting up to {:g} s for the other ranks", blamed->rank, nproc,
                    blamed->why, wait_s);
    }
    bool only_hung_left = hung && alive > 0;
    if (hung)
      for (int r = 0; r < nproc; ++r)
        if (pids[static_cast<std::size_t>(r)] > 0 && r != blamed->rank) only_hung_left = false;
    if (blamed && (now > deadline || only_hung_left)) {
      for (int r = 0; r < nproc; ++r)
        if (pids[static_cast<std::size_t>(r)] > 0) {
          if (r == blamed->rank)
            spdlog::error("rank {} still running after the other ranks stopped: killing it", r);
          else
            spdlog::error("rank {} still running {:g} s after rank {} failed: killing it", r, wait_s, blamed->rank);
          ::kill(pids[static_cast<std::size_t>(r)], SIGKILL);
        }
      deadline = now + 3600;
      hung = false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!blamed && !window.empty()) blamed = choose();
  if (!blamed) return kExitOk;
  spdlog::error("rank {} of {} failed ({}); the run failed", blamed->rank, nproc, blamed->why);
  return (blamed->code >= 1 && blamed->code <= 3) ? blamed->code : kExitRuntime;
}

// ----------------------------------------------------------------------------
// Store and groups
// ----------------------------------------------------------------------------

void connect_store(const LaunchInfo& info, std::chrono::milliseconds timeout) {
  g_timeout = timeout;
  if (info.world_size == 1 && info.launcher == "none") {
    g_store = c10::make_intrusive<c10d::HashStore>();
    return;
  }
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(info.master_port);
  o.isServer = info.rank == 0 && !info.agent_store;
  o.numWorkers = info.agent_store ? c10::nullopt : c10::optional<std::size_t>(info.world_size);
  o.waitWorkers = false;
  o.timeout = timeout;
  try {
    c10::intrusive_ptr<c10d::Store> s = c10::make_intrusive<c10d::TCPStore>(info.master_addr, o);
    if (!info.store_prefix.empty()) s = c10::make_intrusive<c10d::PrefixStore>(info.store_prefix, s);
    g_store = s;
  } catch (const std::exception& e) {
    throw RuntimeFailure(fmt::format("rank {}: cannot {} the TCPStore at {}:{} within {:g} s: {}", info.rank,
                                     o.isServer ? "host" : "reach", info.master_addr, info.master_port,
                                     timeout.count() / 1000.0, first_line(e.what())));
  }
}

namespace {

// What a rank does when one of its collectives fails: find out which peers did not answer.
// Every rank whose collective fails posts "failed/<rank>" in the group's store and waits a
// short window for the others to do the same (their collectives fail too, within about the
// same timeout). A peer that posts nothing within the window is dead or alive but silent
// (hung): it is named in the error message, and listed under unresponsive_key() of this
// rank for the launcher. Costs nothing while collectives succeed.
struct Monitor {
  c10::intrusive_ptr<c10d::Store> store;  // the group's (prefixed) store
  int rank = 0, size = 1, global_rank = 0;
  double window_s = 1.0;
  std::mutex mu;
  std::optional<std::string> verdict;

  /// "; rank R did not answer (...)", or an empty string when every peer reported; computed once.
  std::string diagnose() {
    std::lock_guard<std::mutex> lock(mu);
    if (verdict) return *verdict;
    verdict = std::string();
    try {
      store_set(*store, fmt::format("failed/{}", rank), "1");
      std::vector<int> missing;
      const double end = now_seconds() + window_s;
      for (;;) {
        missing.clear();
        for (int r = 0; r < size; ++r)
          if (r != rank && !store->check({fmt::format("failed/{}", r)})) missing.push_back(r);
        if (missing.empty() || now_seconds() >= end) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (missing.empty()) return *verdict;
      std::vector<int> global;
      for (int r : missing) {
        const std::string key = fmt::format("global/{}", r);
        int g = r;
        if (store->check({key})) {
          auto v = store->get(key);
          auto parsed = parse_ranks(std::string(v.begin(), v.end()));
          if (!parsed.empty()) g = parsed.front();
        }
        global.push_back(g);
      }
      if (g_store) store_set(*g_store, unresponsive_key(global_rank), join_ranks(global, ","));
      *verdict = fmt::format("; rank {} did not answer (no failure report from {} within {:g} s after this "
                             "rank's: hung or dead)",
                             join_ranks(global, ", "), global.size() == 1 ? "it" : "them", window_s);
    } catch (const std::exception& e) {
      *verdict = fmt::format("; cannot tell which rank (the store did not answer: {})", first_line(e.what()));
    }
    return *verdict;
  }
};

struct WorkImpl {
  c10::intrusive_ptr<c10d::Work> w;
  std::string what;
  std::shared_ptr<Monitor> monitor;
};

// `m` may be null: point-to-point work (send/recv) names its peer in `what` already, and a
// collective diagnosis would wrongly name healthy ranks that are still waiting elsewhere.
[[noreturn]] void collective_failed(const std::string& what, const std::exception& e, Monitor* m) {
  const std::string cause = first_line(e.what());  // before diagnose() waits
  throw RuntimeFailure(fmt::format("{}: {}; a peer process failed or timed out{}", what, cause,
                                   m ? m->diagnose() : std::string()));
}

}  // namespace

struct Group::Impl {
  c10::intrusive_ptr<compat::C10dBackend> pg;  // ProcessGroupGloo or ProcessGroupNCCL
  std::string where;                           // "rank R of N" for messages
  std::shared_ptr<Monitor> monitor;
};

void Work::wait() {
  if (!impl_) return;
  auto* w = static_cast<WorkImpl*>(impl_.get());
  bool done = false;
  try {
    done = w->w->wait();
  } catch (const std::exception& e) {
    collective_failed(w->what, e, w->monitor.get());
  }
  // Gloo's send/recv return false when abort() ended the wait.
  if (!done) throw RuntimeFailure(w->what + ": aborted");
}

void Work::abort() {
  if (!impl_) return;
  try {
    static_cast<WorkImpl*>(impl_.get())->w->abort();
  } catch (const std::exception&) {
    // c10d's base Work has no abort; a collective then simply runs into its timeout.
  }
}

std::shared_ptr<Group> Group::create(const LaunchInfo& info, int rank, int size, const std::string& prefix,
                                     std::chrono::milliseconds timeout, torch::Device device) {
  if (!g_store) connect_store(info, timeout);
  std::shared_ptr<Group> g(new Group());
  g->rank_ = rank;
  g->size_ = size;
  g->device_ = device;
  g->impl_ = std::make_unique<Impl>();
  g->impl_->where = fmt::format("rank {} of {}", rank, size);
  auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, g_store);
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
      const bool loopback = info.master_addr == "127.0.0.1" || info.master_addr == "localhost";
      opts->devices.push_back(loopback ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                       : c10d::ProcessGroupGloo::createDefaultDevice());
      opts->threads = 1;
      g->impl_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
    } catch (const std::exception& e) {
      throw RuntimeFailure(fmt::format("rank {} of {}: cannot form the Gloo process group within {:g} s: {}", rank,
                                       size, timeout.count() / 1000.0, first_line(e.what())));
    }
  }
  try {
    auto m = std::make_shared<Monitor>();
    m->store = c10::make_intrusive<c10d::PrefixStore>("mpt_monitor/", store);
    m->rank = rank;
    m->size = size;
    m->global_rank = info.rank;
    m->window_s = std::min(5.0, std::max(1.0, 0.25 * static_cast<double>(timeout.count()) / 1000.0));
    store_set(*m->store, fmt::format("global/{}", rank), std::to_string(info.rank));
    g->impl_->monitor = m;
  } catch (const std::exception& e) {
    throw RuntimeFailure(fmt::format("rank {} of {}: cannot register with the store: {}", rank, size,
                                     first_line(e.what())));
  }
  return g;
}

Group::~Group() = default;

Work Group::allreduce_async(torch::Tensor t, ReduceOp op) {
  std::vector<at::Tensor> ts{std::move(t)};
  c10d::AllreduceOptions o;
  o.reduceOp = op == ReduceOp::Sum ? c10d::ReduceOp::SUM : op == ReduceOp::Min ? c10d::ReduceOp::MIN : c10d::ReduceOp::MAX;
  auto impl = std::make_shared<WorkImpl>();
  impl->what = "all-reduce failed on " + impl_->where;
  impl->monitor = impl_->monitor;
  try {
    impl->w = impl_->pg->allreduce(ts, o);
  } catch (const std::exception& e) {
    collective_failed(impl->what, e, impl_->monitor.get());
  }
  return Work(impl);
}

void Group::broadcast(torch::Tensor t, int root) {
  std::vector<at::Tensor> ts{std::move(t)};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  auto impl = std::make_shared<WorkImpl>();
  impl->what = "broadcast failed on " + impl_->where;
  impl->monitor = impl_->monitor;
  try {
    impl->w = impl_->pg->broadcast(ts, o);
  } catch (const std::exception& e) {
    collective_failed(impl->what, e, impl_->monitor.get());
  }
  Work(impl).wait();
}

Work Group::send_async(torch::Tensor t, int dst, int tag) {
  std::vector<at::Tensor> ts{std::move(t)};
  auto impl = std::make_shared<WorkImpl>();
  impl->what = fmt::format("send to rank {} (tag {}) failed on {}", dst, tag, impl_->where);
  try {
    impl->w = impl_->pg->send(ts, dst, tag);
  } catch (const std::exception& e) {
    throw RuntimeFailure(fmt::format("{}: {}; a peer process failed or timed out", impl->what, first_line(e.what())));
  }
  return Work(impl);
}

Work Group::recv_async(torch::Tensor t, int src, int tag) {
  std::vector<at::Tensor> ts{std::move(t)};
  auto impl = std::make_shared<WorkImpl>();
  impl->what = fmt::format("recv from rank {} (tag {}) failed on {}", src, tag, impl_->where);
  try {
    impl->w = impl_->pg->recv(ts, src, tag);
  } catch (const std::exception& e) {
    throw RuntimeFailure(fmt::format("{}: {}; a peer process failed or timed out", impl->what, first_line(e.what())));
  }
  return Work(impl);
}

void Group::barrier() {
  // An all-reduce of one element: bounded by the group's timeout like every collective.
  allreduce(torch::zeros({1}, torch::TensorOptions().device(device_)));
}

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
  const int64_t elt = static_cast<int64_t>(c10::elementSize(opts_.comm_dtype));
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
    flat_.push_back(torch::zeros({buckets_[b].numel}, torch::TensorOptions().dtype(opts_.comm_dtype).device(group_->device())));
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
