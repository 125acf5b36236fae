// core/dist, launch: the launcher environments and spawn_local. See launch.hpp.
#include "core/dist/launch.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <ctime>
#include <map>
#include <optional>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>

#include <spdlog/spdlog.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

extern char** environ;

#include "core/dist/detail.hpp"
#include "core/errors.hpp"
#include "core/runtime/runtime.hpp"

namespace mpt::dist {

namespace {

using detail::first_line;
using detail::parse_ranks;
using detail::unresponsive_key;

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

// The most processes (and so ranks, nodes, restarts) a launcher variable may name.
constexpr long kMaxProcesses = 1'000'000;

int env_int(const char* name, int fallback) {
  const char* v = env(name);
  if (!v) return fallback;
  // Decimal digits only: strtol's own overflow would clamp, and its sign and spaces would pass.
  const std::string text(v);
  if (text.find_first_not_of("0123456789") != std::string::npos)
    throw RuntimeFailure(fmt::format("environment variable {}={:?} is not a non-negative integer", name, v));
  const std::size_t digits = text.size() - std::min(text.find_first_not_of('0'), text.size());
  if (digits > 7 || std::stol(text) > kMaxProcesses)
    throw RuntimeFailure(fmt::format("environment variable {}={} is too large: at most {} processes", name, v,
                                     kMaxProcesses));
  return static_cast<int>(std::stol(text));
}

// How long the launcher waits, after its peers named a hung rank, for those peers to exit
// before it kills whatever is left (they exit right after their own report).
constexpr double kHungGraceSeconds = 10.0;

}  // namespace

// ----------------------------------------------------------------------------
// Launch
// ----------------------------------------------------------------------------

std::optional<LaunchInfo> launch_from_environment() {
  LaunchInfo li;
  if (env("MPT_RANK")) {
    // mpt --nproc sets both for its workers: MPT_RANK alone was set by hand (or leaked from a worker's
    // environment), and would make this process a worker of a job that does not exist.
    if (!env("MPT_WORLD_SIZE"))
      throw ConfigError(fmt::format("launcher environment: MPT_RANK={} is set but MPT_WORLD_SIZE is not; mpt --nproc "
                                    "sets both for the workers it starts: unset MPT_RANK to run on your own",
                                    env("MPT_RANK")));
    li.launcher = "mpt";
    li.rank = env_int("MPT_RANK", 0);
    li.world_size = env_int("MPT_WORLD_SIZE", 1);
    li.world_size_var = "MPT_WORLD_SIZE";
    li.local_rank = env_int("MPT_LOCAL_RANK", li.rank);
    li.local_world_size = li.world_size;  // spawn_local: every worker on this machine
    const char* agent = env("MPT_AGENT_STORE");
    li.agent_store = agent && std::string(agent) == "1";
  } else if (env("MPT_WORLD_SIZE") || env("MPT_LOCAL_RANK")) {
    // Without MPT_RANK these would be ignored: the run would go on in one process.
    throw ConfigError(fmt::format("launcher environment: {}={} is set but MPT_RANK is not; mpt --nproc sets them for the "
                                  "workers it starts: unset it to run on your own, or use --nproc N",
                                  env("MPT_WORLD_SIZE") ? "MPT_WORLD_SIZE" : "MPT_LOCAL_RANK",
                                  env("MPT_WORLD_SIZE") ? env("MPT_WORLD_SIZE") : env("MPT_LOCAL_RANK")));
  } else if (env("RANK") || env("WORLD_SIZE")) {
    // torchrun sets both; one without the other is a broken launcher, not a single process.
    for (const char* v : {"RANK", "WORLD_SIZE"})
      if (!env(v))
        throw ConfigError(fmt::format("launcher environment: {} is set but {} is not (torchrun sets RANK, WORLD_SIZE, "
                                      "MASTER_ADDR and MASTER_PORT; unset them all to run on your own)",
                                      std::string(v) == "RANK" ? "WORLD_SIZE" : "RANK", v));
    li.launcher = "torchrun";
    li.rank = env_int("RANK", 0);
    li.world_size = env_int("WORLD_SIZE", 1);
    li.world_size_var = "WORLD_SIZE";
    li.local_rank = env_int("LOCAL_RANK", 0);
    li.local_world_size = env_int("LOCAL_WORLD_SIZE", li.world_size);
    li.node_rank = env_int("GROUP_RANK", 0);  // torchrun's --node-rank (the agent's group)
    const char* agent = env("TORCHELASTIC_USE_AGENT_STORE");
    li.agent_store = agent && std::string(agent) == "True";
    li.store_prefix = li.agent_store ? fmt::format("/worker/attempt_{}", env_int("TORCHELASTIC_RESTART_COUNT", 0)) : "";
  } else if (env("SLURM_PROCID") && env("SLURM_NTASKS")) {
    // Both, as srun sets them for each task. SLURM_NTASKS alone is an allocation's shell (salloc)
    // outside any srun: one process, which may spawn its own workers with --nproc.
    li.launcher = "slurm";
    li.rank = env_int("SLURM_PROCID", 0);
    li.world_size = env_int("SLURM_NTASKS", 1);
    li.world_size_var = "SLURM_NTASKS";
    li.local_rank = env_int("SLURM_LOCALID", 0);
    li.node_rank = env_int("SLURM_NODEID", 0);
    if (const char* t = env("SLURM_NTASKS_PER_NODE")) {
      // "2", "2(x3)" or, for nodes with different counts, "3,1(x2)": the largest count bounds
      // every node's local ranks.
      long most = 0;
      for (const char* p = t;;) {
        char* end = nullptr;
        const long n = std::strtol(p, &end, 10);
        if (end == p || n < 0)
          throw RuntimeFailure(fmt::format("environment variable SLURM_NTASKS_PER_NODE={:?} is not a list of task "
                                           "counts such as 2 or 2(x3),1", t));
        most = std::max(most, std::min<long>(n, 1'000'001));
        p = end;
        if (*p == '(') {  // "(xN)": N nodes with this count
          char* reps_end = nullptr;
          const long reps = p[1] == 'x' ? std::strtol(p + 2, &reps_end, 10) : 0;
          if (reps < 1 || reps_end == p + 2 || *reps_end != ')')
            throw RuntimeFailure(fmt::format("environment variable SLURM_NTASKS_PER_NODE={:?} is not a list of task "
                                             "counts such as 2 or 2(x3),1", t));
          p = reps_end + 1;
        }
        if (*p == '\0') break;
        if (*p != ',')
          throw RuntimeFailure(fmt::format("environment variable SLURM_NTASKS_PER_NODE={:?} is not a list of task "
                                           "counts such as 2 or 2(x3),1", t));
        ++p;
      }
      // An allocation's per-node count may exceed a smaller step's SLURM_NTASKS: at most that.
      li.local_world_size = static_cast<int>(std::min<long>(most, li.world_size));
    } else {
      li.local_world_size = li.world_size;
    }
  } else {
    return std::nullopt;
  }
  if (li.world_size < 1)
    throw RuntimeFailure(fmt::format("{} environment: {}=0: expected at least 1 process", li.launcher, li.world_size_var));
  if (li.rank >= li.world_size) {
    const char* rank_var = li.launcher == "torchrun" ? "RANK" : li.launcher == "slurm" ? "SLURM_PROCID" : "MPT_RANK";
    throw RuntimeFailure(fmt::format("{} environment: {}={} is not a rank in [0, {}={})", li.launcher, rank_var, li.rank,
                                     li.world_size_var, li.world_size));
  }
  // The per-node variables must describe a place that exists: a local rank on its node, a node
  // among the job's (torchrun sets LOCAL_RANK < LOCAL_WORLD_SIZE <= WORLD_SIZE and GROUP_RANK <
  // GROUP_WORLD_SIZE; SLURM likewise SLURM_LOCALID < tasks per node, SLURM_NODEID < SLURM_NNODES).
  // A local rank chooses this rank's GPU and env.launch records them, so a wrong one is refused.
  const bool torchrun = li.launcher == "torchrun", slurm = li.launcher == "slurm";
  const char* lr_var = torchrun ? "LOCAL_RANK" : slurm ? "SLURM_LOCALID" : "MPT_LOCAL_RANK";
  const char* lws_var = torchrun ? "LOCAL_WORLD_SIZE" : slurm ? "SLURM_NTASKS_PER_NODE" : "MPT_WORLD_SIZE";
  const char* node_var = torchrun ? "GROUP_RANK" : "SLURM_NODEID";
  if (li.local_world_size < 1 || li.local_world_size > li.world_size)
    throw RuntimeFailure(fmt::format("{} environment: {}={} is not a process count in [1, {}={}]", li.launcher,
                                     lws_var, li.local_world_size, li.world_size_var, li.world_size));
  if (li.local_rank >= li.local_world_size)
    throw RuntimeFailure(fmt::format("{} environment: {}={} is not a local rank in [0, {}={})", li.launcher, lr_var,
                                     li.local_rank, lws_var, li.local_world_size));
  if (li.local_rank > li.rank)
    throw RuntimeFailure(fmt::format("{} environment: {}={} exceeds the global rank {}={} (ranks are numbered "
                                     "node by node, so a local rank is never above the global one)",
                                     li.launcher, lr_var, li.local_rank, torchrun ? "RANK" : slurm ? "SLURM_PROCID"
                                                                                               : "MPT_RANK", li.rank));
  if (torchrun || slurm) {
    const char* nodes_var = torchrun ? "GROUP_WORLD_SIZE" : "SLURM_NNODES";
    const int nodes = env_int(nodes_var, li.world_size);
    if (nodes < 1 || nodes > li.world_size)
      throw RuntimeFailure(fmt::format("{} environment: {}={} is not a node count in [1, {}={}]", li.launcher,
                                       nodes_var, nodes, li.world_size_var, li.world_size));
    if (li.node_rank >= nodes)
      throw RuntimeFailure(fmt::format("{} environment: {}={} is not a node rank in [0, {})", li.launcher, node_var,
                                       li.node_rank, env(nodes_var) ? fmt::format("{}={}", nodes_var, nodes)
                                                                    : fmt::format("{}={}", li.world_size_var, nodes)));
    // torchrun: every other node holds at least one process, and the agents number the ranks
    // node by node (by GROUP_RANK): the counts must fit in the world, and this node's first rank
    // must leave one rank to each earlier node. (Each node's torchrun may be given its own
    // --nproc-per-node, so no product is required. Not for SLURM: its per-node count may be the
    // allocation's, larger than a step's.)
    if (torchrun && env(nodes_var) && env("LOCAL_WORLD_SIZE") && li.local_world_size + nodes - 1 > li.world_size)
      throw RuntimeFailure(fmt::format("{} environment: {}={} processes on this node and {}={} nodes need at least {} "
                                       "processes, more than {}={}",
                                       li.launcher, lws_var, li.local_world_size, nodes_var, nodes,
                                       li.local_world_size + nodes - 1, li.world_size_var, li.world_size));
    if (torchrun && li.node_rank > li.rank - li.local_rank)
      throw RuntimeFailure(fmt::format("{} environment: {}={} needs at least {} ranks on the nodes before this one, but "
                                       "this node's first rank is RANK - LOCAL_RANK = {} (ranks are numbered node by "
                                       "node, each node holding at least one)",
                                       li.launcher, node_var, li.node_rank, li.node_rank, li.rank - li.local_rank));
  }
  if (const char* a = env("MASTER_ADDR")) li.master_addr = a;
  if (li.world_size > 1) {
    // Resolved once here, so that a mistyped host fails at once with its name instead of
    // c10d's connect retries (a page of warnings and two timeouts; found by the stop-27 probe).
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int rc = ::getaddrinfo(li.master_addr.c_str(), nullptr, &hints, &res);
    if (res) ::freeaddrinfo(res);
    if (rc != 0)
      throw RuntimeFailure(fmt::format("{} environment: MASTER_ADDR={:?} does not resolve to an address ({}): expected "
                                       "the host name or IP address of the machine of rank 0",
                                       li.launcher, li.master_addr, ::gai_strerror(rc)));
  }
  li.master_port = env_int("MASTER_PORT", 0);
  if (li.world_size > 1 && (li.master_port <= 0 || li.master_port > 65535))
    throw RuntimeFailure(fmt::format("{} environment: MASTER_PORT must be set to a TCP port (1-65535) for {} processes, "
                                     "got {}{}", li.launcher, li.world_size,
                                     std::getenv("MASTER_PORT") ? fmt::format("{:?}", std::string(std::getenv("MASTER_PORT"))) : "none",
                                     // mpt --nproc always sets it: MPT_RANK/MPT_WORLD_SIZE without it were set by hand
                                     li.launcher == "mpt" && !std::getenv("MASTER_PORT")
                                         ? " (MPT_RANK and MPT_WORLD_SIZE are set: mpt --nproc sets them with MASTER_ADDR "
                                           "and MASTER_PORT for its workers; unset them to run on your own)"
                                         : ""));
  return li;
}

std::string route_source_address(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port > 0 ? port : 9).c_str(), &hints, &res) != 0 || !res) return "";
  std::string out;
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    char buf[INET_ADDRSTRLEN] = {};
    if (::connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        ::inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf)) != nullptr)
      out = buf;
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return out;
}

namespace {
// The running spawn_local's workers (0: none or reaped), for end_workers_on_signal: fixed slots
// that a signal handler reads without locking (a pid_t fits a sig_atomic_t on Linux: both int).
constexpr int kMaxSignalWorkers = 1024;
volatile std::sig_atomic_t g_worker_pids[kMaxSignalWorkers];
volatile std::sig_atomic_t g_nworkers = 0;
}  // namespace

void end_workers_on_signal(int sig) noexcept {
  const int n = g_nworkers;
  for (int i = 0; i < n; ++i)
    if (g_worker_pids[i] > 0) ::kill(static_cast<pid_t>(g_worker_pids[i]), sig);
  const timespec step{0, 10 * 1000 * 1000};
  for (int t = 0; t < 200; ++t) {  // 2 s
    bool running = false;
    for (int i = 0; i < n; ++i) {
      if (g_worker_pids[i] <= 0) continue;
      // 0: still running; the pid or -1 (ECHILD: spawn_local's loop reaped it first): gone.
      if (::waitpid(static_cast<pid_t>(g_worker_pids[i]), nullptr, WNOHANG) == 0) running = true;
      else g_worker_pids[i] = 0;
    }
    if (!running) return;
    ::nanosleep(&step, nullptr);
  }
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
  // Returned or thrown: end_workers_on_signal has no workers to end any more.
  struct Forget {
    ~Forget() { g_nworkers = 0; }
  } forget;
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
    if (r < kMaxSignalWorkers) {
      g_worker_pids[r] = pid;
      g_nworkers = r + 1;
    }
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
      if (r < kMaxSignalWorkers) g_worker_pids[r] = 0;  // its pid may be reused: never signal it again
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

}  // namespace mpt::dist
