// core/dist, groups: the job's connection (store, heartbeat), Group and Work. See group.hpp.
#define USE_C10D_GLOO 1
#define MPT_COMPAT_C10D 1
#include "core/dist/group.hpp"

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
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <optional>
#include <cstring>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>
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


#include "core/runtime/compat.hpp"
#include "core/dist/detail.hpp"
#include "core/errors.hpp"
#include "core/runtime/runtime.hpp"
#include "core/runtime/trace.hpp"

namespace mpt::dist {

namespace {

using detail::first_line;
using detail::parse_ranks;
using detail::unresponsive_key;

void store_set(c10d::Store& store, const std::string& key, const std::string& value) {
  store.set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

std::string join_ranks(const std::vector<int>& v, const char* sep) {
  std::string s;
  for (int r : v) s += (s.empty() ? "" : sep) + std::to_string(r);
  return s;
}

// ----------------------------------------------------------------------------
// Heartbeats (see dist.hpp)
// ----------------------------------------------------------------------------

std::string heartbeat_key(int global_rank) { return fmt::format("mpt/heartbeat/{}", global_rank); }

}  // namespace

// JobState (namespace detail) holds these two: types with linkage, not the anonymous namespace's
// (g++: -Wsubobject-linkage).
namespace detail {

// The thread that publishes this rank's heartbeat, on a store connection of its own (a
// TCPStore client serialises its operations: a long wait of the main thread would delay it).
// `waiting` and `progress` are its Job's (JobState), which outlive it. Its state is shared with
// the thread, and the thread reads the Job's counters only before a store call: when the store's
// host is stopped (SIGSTOP) a set never returns (LibTorch's TCPStore has no receive timeout
// there), so the destructor waits a bounded time and then leaves the thread behind, blocked,
// instead of hanging the rank's exit; if the call ever returns the thread sees `stop` and ends
// without touching the Job.
class Heartbeat {
 public:
  Heartbeat(c10::intrusive_ptr<c10d::Store> store, int global_rank, std::chrono::milliseconds interval,
            const std::atomic<int>& waiting, const std::atomic<long long>& progress)
      : state_(std::make_shared<State>()) {
    state_->store = std::move(store);
    state_->key = heartbeat_key(global_rank);
    state_->interval = interval;
    state_->waiting = &waiting;
    state_->progress = &progress;
    thread_ = std::thread([s = state_] { loop(*s); });
  }
  ~Heartbeat() {
    std::unique_lock<std::mutex> lock(state_->mu);
    state_->stop = true;
    state_->cv.notify_all();
    // A beat in flight on a healthy store takes milliseconds.
    const bool ended = state_->cv.wait_for(lock, std::chrono::seconds(2), [this] { return state_->done; });
    lock.unlock();
    if (ended)
      thread_.join();
    else
      thread_.detach();  // blocked in a store call on a stopped host: see above
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool stop = false, done = false;
    c10::intrusive_ptr<c10d::Store> store;
    std::string key;
    std::chrono::milliseconds interval{1000};
    const std::atomic<int>* waiting = nullptr;
    const std::atomic<long long>* progress = nullptr;
  };
  static void loop(State& s) {
    std::unique_lock<std::mutex> lock(s.mu);
    for (long long beat = 0; !s.stop; ++beat) {
      // The whole process's CPU time: LibTorch's intra-op threads and pipeline stage threads
      // count as work too; this thread's own beats cost far less than the 2% that counts.
      timespec ts{};
      ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
      const long long cpu_ms = static_cast<long long>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
      const std::string value = fmt::format("{} {} {} {}", beat, cpu_ms, s.waiting->load(), s.progress->load());
      lock.unlock();  // the store call may block: the destructor must still get the lock
      bool gone = false;
      try {
        store_set(*s.store, s.key, value);
      } catch (...) {  // the store is gone (the job is ending): nothing to tell anyone
        gone = true;
      }
      lock.lock();
      if (gone) break;
      s.cv.wait_for(lock, s.interval, [&s] { return s.stop; });
    }
    s.done = true;
    s.cv.notify_all();
  }
  std::shared_ptr<State> state_;
  std::thread thread_;
};
}  // namespace detail

using detail::Heartbeat;

namespace {


// What a waiting rank has seen of one peer's heartbeat (times are this process's now_seconds()).
struct PeerBeat {
  bool seen = false;
  std::string raw;
  long long cpu_ms = 0, progress = 0;
  int waiting = -1;
  double first_seen = 0, changed_at = 0;
  double progress_at = 0;  // last time its main thread was seen using CPU (0: never)
  int changes = 0;         // distinct values seen
};

// Reads `global`'s heartbeat into `b`. Progress: note_progress() was called, or the process
// used at least 2% of a core (and 1 ms) between two beats; a waiting rank polls or sleeps, a
// hung one sleeps.
void observe(c10d::Store& store, int global, PeerBeat& b, double now) {
  const std::string key = heartbeat_key(global);
  if (!store.check({key})) return;
  auto v = store.get(key);
  std::string raw(v.begin(), v.end());
  if (b.seen && raw == b.raw) return;
  long long beat = 0, cpu = 0, progress = 0;
  int waiting = -1;
  std::istringstream in(raw);
  in >> beat >> cpu >> waiting >> progress;
  if (b.seen) {
    const double wall_ms = (now - b.changed_at) * 1000.0;
    if (progress != b.progress || cpu - b.cpu_ms >= std::max(1.0, 0.02 * wall_ms)) b.progress_at = now;
  } else {
    b.first_seen = now;
  }
  b.seen = true;
  b.raw = std::move(raw);
  b.cpu_ms = cpu;
  b.progress = progress;
  b.waiting = waiting;
  b.changed_at = now;
  ++b.changes;
}

// Who serves a job's store, for the messages of a store that does not answer: rank 0, or the
// launcher's agent (mpt --nproc's parent, torchrun's agent) when the store is the agent's.
std::string store_host(const LaunchInfo& info) {
  if (!info.agent_store) return "its host, rank 0 (it serves MASTER_ADDR:MASTER_PORT), is stopped or hung";
  return fmt::format("its host, {} that serves MASTER_ADDR:MASTER_PORT, is stopped or hung",
                     info.launcher == "mpt" ? "the mpt launcher" : "the launcher's agent");
}

}  // namespace

namespace detail {  // as Heartbeat above: JobState holds it

// Bounds the store calls of a job's own threads: LibTorch's TCPStore client has no receive
// timeout for check() and set(), so a call to a store whose host is stopped (SIGSTOP) or hung
// never returns, and the rank would hang past every timeout (found by cli.shard_store_host_stopped
// on a loaded machine: rank 0 stopped while rank 1 was in a barrier). A thread of its own, which
// never touches the store, looks every 100 ms at the calls in flight (StoreWatchdog::Call); one
// older than the limit ends the process with exit 3 and its message on stderr, as
// ProcessGroupNCCL's watchdog tears down a process whose collective timed out
// (TORCH_NCCL_ASYNC_ERROR_HANDLING). Thread-safe.
class StoreWatchdog {
 public:
  /// `host`: store_host() of the job, for the message.
  StoreWatchdog(double limit_s, std::string host) : limit_s_(limit_s), host_(std::move(host)), thread_([this] { loop(); }) {}
  ~StoreWatchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  StoreWatchdog(const StoreWatchdog&) = delete;
  StoreWatchdog& operator=(const StoreWatchdog&) = delete;

  /// One guarded store call, in scope (RAII): `what` says what it is part of ("barrier on rank
  /// 1 of 2"); a null watchdog guards nothing.
  class Call {
   public:
    Call(StoreWatchdog* w, std::string what) : w_(w) {
      if (!w_) return;
      std::lock_guard<std::mutex> lock(w_->mu_);
      id_ = ++w_->next_;
      w_->calls_.emplace(id_, std::make_pair(now_seconds(), std::move(what)));
    }
    ~Call() {
      if (!w_) return;
      std::lock_guard<std::mutex> lock(w_->mu_);
      w_->calls_.erase(id_);
    }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

   private:
    StoreWatchdog* w_;
    std::uint64_t id_ = 0;
  };

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      const double now = now_seconds();
      for (const auto& [id, call] : calls_) {
        if (now - call.first <= limit_s_) continue;
        const std::string msg = fmt::format(
            "[error] mpt: {}: the store did not answer within {:g} s ({}); this rank ends (exit 3)\n",
            call.second, limit_s_, host_);
        [[maybe_unused]] auto n = ::write(2, msg.data(), msg.size());
        std::_Exit(kExitRuntime);
      }
    }
  }
  const double limit_s_;
  const std::string host_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::uint64_t next_ = 0;
  std::map<std::uint64_t, std::pair<double, std::string>> calls_;  // id -> (start, what)
  std::thread thread_;  // last: starts once the members above exist
};
}  // namespace detail

using detail::StoreWatchdog;

namespace {


}  // namespace

namespace detail {

/// What a Job owns (see group.hpp). Members are destroyed in reverse order: the heartbeat
/// thread is joined while the store, and the counters it publishes, are still there.
struct JobState {
  LaunchInfo launch;                         // this process in the job (rank, world size, master)
  std::chrono::milliseconds timeout{30000};  // of store operations and heartbeat-based waits
  // What the main thread waits for (published in the heartbeat): -1 nothing, a global rank, -2 a
  // group, -3 (kWaitingGaveUp) nothing any more: a wait failed and it is finding out whom to blame.
  std::atomic<int> waiting_on{-1};
  // Work done, as counted by Job::note_progress() (published in the heartbeat).
  std::atomic<long long> progress{0};
  c10::intrusive_ptr<c10d::Store> store;     // the job's store (TCPStore, or HashStore for one process)
  std::unique_ptr<Heartbeat> heartbeat;      // after store: destroyed (joined) before it
  std::unique_ptr<StoreWatchdog> watchdog;   // jobs of several ranks: bounds the main thread's store calls
};

}  // namespace detail

namespace {

using detail::JobState;

// The heartbeat's "waiting" of a rank whose wait failed, while it finds out whom to blame: its
// verdict follows under unresponsive_key(), and it ends then; peers follow that verdict
// (find_culprits) instead of blaming it.
constexpr int kWaitingGaveUp = -3;

// Marks `job`'s rank as waiting for `global_rank` (-2: a group, kWaitingGaveUp: giving up) while
// in scope (what WaitingFor does).
class WaitScope {
 public:
  WaitScope(JobState& job, int global_rank) : job_(job), previous_(job.waiting_on.exchange(global_rank)) {}
  ~WaitScope() { job_.waiting_on.store(previous_); }
  WaitScope(const WaitScope&) = delete;
  WaitScope& operator=(const WaitScope&) = delete;

 private:
  JobState& job_;
  int previous_;
};

double interval_s(const JobState& job) { return static_cast<double>(heartbeat_interval(job.timeout).count()) / 1000.0; }
// A heartbeat unchanged for this long belongs to a stopped or dead rank.
double stale_s(const JobState& job) { return 3.0 * interval_s(job) + 0.25; }

// How long a failed collective waits for its peers' failure reports (Monitor): a quarter of the
// timeout, between 1 and 5 s; their collectives fail too, within about the same timeout.
double report_window_s(std::chrono::milliseconds timeout) {
  return std::min(5.0, std::max(1.0, 0.25 * static_cast<double>(timeout.count()) / 1000.0));
}

// How long a rank that gave up waits for a peer's verdict when the only evidence is a peer that
// is itself failing or waiting in a collective: that peer's collective fails too, and it posts
// whom it blames after its own report window and heartbeat reading.
double verdict_patience_s(const JobState& job) { return report_window_s(job.timeout) + stale_s(job) + 0.5; }

bool is_stale(double stale, const PeerBeat& b, double now) { return !b.seen || now - b.changed_at > stale; }
bool is_stale(const JobState& job, const PeerBeat& b, double now) { return is_stale(stale_s(job), b, now); }

// "alive and working", "stopped or dead (...)", ...: what `b` says about its rank at `now`
// (`stale`: stale_s() of the job).
std::string beat_state(double stale, const PeerBeat& b, double now) {
  if (!b.seen) return "no heartbeat from it: it never started or cannot reach the store";
  if (is_stale(stale, b, now))
    return fmt::format("its heartbeat stopped (none for {:.1f} s): stopped (SIGSTOP?) or dead", now - b.changed_at);
  if (b.waiting >= 0) return fmt::format("alive, itself waiting for rank {}", b.waiting);
  if (b.waiting == -2) return "alive, itself waiting in a collective";
  if (b.waiting == kWaitingGaveUp) return "alive, itself giving up after a failed wait (whom it blames not posted yet)";
  const double idle = now - std::max(b.progress_at, b.first_seen);
  if (b.progress_at > 0 && now - b.progress_at <= stale) return "alive and working, but late";
  return fmt::format("alive but it made no progress for {:.1f} s: hung", idle);
}
std::string beat_state(const JobState& job, const PeerBeat& b, double now) { return beat_state(stale_s(job), b, now); }

// What a rank that gave up posts under unresponsive_key() when it cannot tell whom to blame: no
// rank (parse_ranks() skips it), yet its peers see that it gave up and do not blame it.
constexpr const char* kCannotTell = "cannot-tell";

// Posts, before this rank ends, whom it blames (`globals`; empty: it cannot tell), for
// spawn_local and for its peers (find_culprits).
void post_unresponsive(JobState& job, const std::vector<int>& globals) {
  try {
    if (job.store) store_set(*job.store, unresponsive_key(job.launch.rank), globals.empty() ? kCannotTell : join_ranks(globals, ","));
  } catch (const std::exception&) {
  }
}

// The ranks that `global` blamed when it gave up (posted under unresponsive_key() just before
// it ends; empty: it could not tell); nullopt when it posted nothing. Throws when the store
// does not answer.
std::optional<std::vector<int>> posted_verdict(c10d::Store& store, int global) {
  const std::string key = unresponsive_key(global);
  if (!store.check({key})) return std::nullopt;
  const auto v = store.get(key);
  return parse_ranks(std::string(v.begin(), v.end()));
}

// Who, in a job of `world_size` ranks seen from rank `self`, is behind a failed wait.
struct Liveness {
  int self = 0, world_size = 1;
  double stale_s = 1.0;     // stale_s() of the job
  double patience_s = 1.0;  // verdict_patience_s() of the job
  StoreWatchdog* dog = nullptr;  // bounds each round of store calls (null: the caller bounds them)
  std::string what;              // for the watchdog's message
};

// The ranks found behind a failed wait, and the evidence in words.
struct Culprits {
  std::vector<int> ranks;   // global ranks: dead or stopped, or alive but not waiting for anyone (late or hung)
  std::string evidence;     // per rank: "rank 2 gave up waiting for rank 3, rank 3: its heartbeat stopped ..."
  std::string undecided;    // when `ranks` is empty: the ranks that were followed and what they do
  bool direct = true;       // every culprit is a starting rank, reached by no link
};

// Finds who is behind a wait of this rank for the global ranks `start` that failed, from the
// job's heartbeats (read into `beats`, which may hold earlier readings) and the verdicts that
// ranks which gave up posted (unresponsive_key()). From each starting rank it follows
//  - a rank that gave up to the ranks it blamed: it ended, or is ending, after a failed wait of
//    its own, so its stopped heartbeat says nothing about the cause (issue 38: a killed rank 3,
//    and rank 0 blamed rank 2, which had only given up on rank 3 and exited);
//  - a live rank that waits for one peer to that peer;
// and stops at a rank that gave up nothing and whose heartbeat stopped (dead or stopped), or
// that is alive and waits for no one, or for this rank (late, hung, or a cycle). A live rank
// that waits in a collective or is itself giving up is no culprit: its verdict is waited for
// while no culprit is found. Every decision on a live rank needs two readings of its
// heartbeat, and on a silent one `l.stale_s` of silence; it returns at the latest after
// `l.patience_s`. Throws when the store does not answer.
Culprits find_culprits(c10d::Store& store, const Liveness& l, const std::vector<int>& start,
                       std::map<int, PeerBeat>& beats) {
  const double t0 = now_seconds();
  std::map<int, std::vector<int>> verdicts;  // posted ones: a rank posts once, before it ends
  for (;;) {
    StoreWatchdog::Call call(l.dog, l.what);
    const double now = now_seconds();
    Culprits c;
    bool decided = true;   // every rank reached is decided
    bool pending = false;  // some rank reached waits in a collective or is giving up
    std::vector<int> visited;
    std::vector<std::pair<int, std::string>> todo;     // (rank, the links that led to it)
    struct Late { int rank; bool direct; std::string evidence; };
    std::vector<Late> working;  // alive and working, not waiting
    for (int s : start) todo.emplace_back(s, std::string());
    for (std::size_t i = 0; i < todo.size(); ++i) {
      const int g = todo[i].first;
      const std::string via = todo[i].second;
      if (g < 0 || g >= l.world_size || g == l.self || std::find(visited.begin(), visited.end(), g) != visited.end())
        continue;
      visited.push_back(g);
      if (!verdicts.count(g))
        if (auto v = posted_verdict(store, g)) verdicts[g] = std::move(*v);
      if (auto it = verdicts.find(g); it != verdicts.end()) {
        if (it->second.empty())
          c.undecided += fmt::format("{}{}rank {} gave up and could not tell whom to blame", c.undecided.empty() ? "" : "; ", via, g);
        for (int v : it->second)
          todo.emplace_back(v, fmt::format("{}rank {} gave up waiting for rank {}, ", via, g, v));
        continue;
      }
      PeerBeat& b = beats[g];
      observe(store, g, b, now);
      const bool stale = is_stale(l.stale_s, b, now);
      const bool read_twice = b.changes >= 2;  // else a dead rank's last beat still looks fresh
      if (!stale && !read_twice) decided = false;
      const int next = b.waiting;
      if (!stale && next >= 0 && next < l.world_size && next != l.self) {
        if (std::find(visited.begin(), visited.end(), next) == visited.end())
          todo.emplace_back(next, fmt::format("{}rank {} waits for rank {}, ", via, g, next));
        else  // followed already: from another rank, or a cycle that does not pass this rank
          c.undecided += fmt::format("{}{}rank {}: {}", c.undecided.empty() ? "" : "; ", via, g,
                                     beat_state(l.stale_s, b, now));
      } else if (!stale && (next == -2 || next == kWaitingGaveUp)) {
        pending = true;
        c.undecided += fmt::format("{}{}rank {}: {}", c.undecided.empty() ? "" : "; ", via, g, beat_state(l.stale_s, b, now));
      } else if (!stale && next == -1 && b.progress_at > 0 && now - b.progress_at <= l.stale_s) {
        working.push_back({g, via.empty(), fmt::format("{}rank {}: {}", via, g, beat_state(l.stale_s, b, now))});
      } else if (std::find(c.ranks.begin(), c.ranks.end(), g) == c.ranks.end()) {
        c.ranks.push_back(g);
        c.direct = c.direct && via.empty();
        c.evidence += fmt::format("{}{}rank {}: {}", c.evidence.empty() ? "" : "; ", via, g, beat_state(l.stale_s, b, now));
      }
    }
    // A rank still working (not yet at the wait) is late, but only the cause when nothing else is:
    // beside a dead, stopped or hung rank it is merely slower than this rank (an instrumented
    // or loaded process), and it would fail on that rank too.
    if (c.ranks.empty())
      for (const Late& w : working) {
        c.ranks.push_back(w.rank);
        c.direct = c.direct && w.direct;
        c.evidence += (c.evidence.empty() ? "" : "; ") + w.evidence;
      }
    // A rank waiting in a collective or giving up delays the answer only while nothing else
    // names a culprit: its verdict would name the same rank. Every rank is decided within about
    // stale_s of its first reading.
    if ((decided && (!pending || !c.ranks.empty())) || now - t0 >= l.patience_s) return c;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
}

// The job's Liveness as seen from its own rank.
Liveness liveness_of(const JobState& job) {
  return {job.launch.rank, job.launch.world_size, stale_s(job), verdict_patience_s(job), job.watchdog.get(),
          fmt::format("rank {}: reading its peers' heartbeats to find whom to blame", job.launch.rank)};
}

// After a send/recv with rank `peer` (global) failed: finds who is behind it (find_culprits:
// the peer, the rank it waits for, or the rank it gave up on), posts them for spawn_local and
// the other ranks, and returns "; rank Q is late (rank P waits for rank Q): ...", or "; cannot
// tell which rank is late: ..." when the ranks followed all wait in collectives. Empty without
// heartbeats.
std::string blame_late(JobState& job, int peer) {
  const int world_size = job.launch.world_size;
  if (!job.store || world_size <= 1 || peer < 0 || peer >= world_size) return {};
  try {
    std::map<int, PeerBeat> beats;
    const Culprits c = find_culprits(*job.store, liveness_of(job), {peer}, beats);
    post_unresponsive(job, c.ranks);
    if (c.ranks.empty()) return fmt::format("; cannot tell which rank is late ({})", c.undecided);
    if (c.ranks.size() == 1 && c.direct)  // "rank Q is late: its heartbeat stopped ..."
      return fmt::format("; rank {} is late: {}", c.ranks[0], c.evidence.substr(c.evidence.find(": ") + 2));
    return fmt::format("; rank {} {} late ({})", join_ranks(c.ranks, ", "), c.ranks.size() == 1 ? "is" : "are",
                       c.evidence);
  } catch (const std::exception& e) {
    return fmt::format("; cannot tell which rank (the store did not answer: {})", first_line(e.what()));
  }
}

// The key under which rank `rank` marks its arrival at the barrier `tag` of a store.
std::string barrier_key(const std::string& tag, int rank) { return fmt::format("mpt_barrier/{}/{}", tag, rank); }

// Marks this rank's arrival at the barrier `tag` without waiting for the others (a rank that
// leaves at once, like a mismatched rank at the launch check, still lets the others complete it).
// `what` names the call for the store watchdog.
void barrier_arrive(JobState& job, c10d::Store& store, const std::string& tag, int rank, const std::string& what) {
  StoreWatchdog::Call call(job.watchdog.get(), what);
  store_set(store, barrier_key(tag, rank), "1");
}

// How long a rank that has sent no heartbeat yet is waited for: `timeout`, or, when mpt's own
// launcher started the job, at least 60 s. That launcher watches every worker and ends the job
// when one exits, so a rank not yet seen is still starting (a loaded machine can take seconds
// to load LibTorch), not dead; a rank stopped before its first heartbeat is then named after 60
// s instead of `timeout`. Under torchrun, SLURM or by hand nothing watches the processes, so
// the timeout holds.
double start_allowance_s(const JobState& job, double timeout_s) {
  return job.launch.launcher == "mpt" ? std::max(timeout_s, 60.0) : timeout_s;
}

// Waits until every group rank in `missing` has arrived at the barrier `tag` (barrier_arrive).
// `global(r)` maps a group rank to its rank in the job (for the job's heartbeats). The deadline
// is `timeout` after the start or after the last progress of a rank that has not arrived (for a
// rank never seen: start_allowance_s()). Throws RuntimeFailure naming the ranks that did not
// arrive and the late ones among them, or when the store does not answer.
void await_arrivals(JobState& job, c10d::Store& store, const std::string& tag, std::vector<int> missing,
                    const std::function<int(int)>& global, std::chrono::milliseconds timeout, const std::string& what) {
  WaitScope waiting(job, -2);
  const double t_timeout = static_cast<double>(timeout.count()) / 1000.0;
  const double t_start = start_allowance_s(job, t_timeout);
  StoreWatchdog* dog = job.watchdog.get();
  try {
    std::map<int, PeerBeat> beats;  // by global rank
    const double start = now_seconds();
    auto sleep_ms = std::chrono::milliseconds(1);
    for (;;) {
      std::optional<StoreWatchdog::Call> call(std::in_place, dog, what);
      missing.erase(std::remove_if(missing.begin(), missing.end(),
                                   [&](int r) { return store.check({barrier_key(tag, r)}); }),
                    missing.end());
      if (missing.empty()) return;
      const double now = now_seconds();
      bool in_time = false;  // some missing rank is within its bound
      if (job.store && job.launch.world_size > 1) {
        for (int r : missing) {
          PeerBeat& b = beats[global(r)];
          observe(*job.store, global(r), b, now);
          in_time = in_time || (b.seen ? now - std::max(start, b.progress_at) <= t_timeout : now - start <= t_start);
        }
      } else {
        in_time = now - start <= t_timeout;
      }
      call.reset();
      if (!in_time) {
        std::vector<int> missing_global;
        std::string states;
        constexpr std::size_t kShown = 8;  // a job of 64 ranks with one present: keep it readable
        for (std::size_t i = 0; i < missing.size(); ++i) {
          const int g = global(missing[i]);
          missing_global.push_back(g);
          if (i < kShown)
            states += fmt::format("{}rank {}: {}", states.empty() ? "" : "; ", g, beat_state(job, beats[g], now));
        }
        if (missing.size() > kShown) states += fmt::format("; and {} more", missing.size() - kShown);
        // Whom to blame: the missing ranks, or the rank they gave up on or wait for (find_culprits).
        Culprits c;
        if (job.store && job.launch.world_size > 1) {
          WaitScope giving_up(job, kWaitingGaveUp);
          c = find_culprits(*job.store, liveness_of(job), missing_global, beats);
        } else {
          c.ranks = missing_global;
        }
        const bool unseen_only = std::all_of(missing.begin(), missing.end(), [&](int r) { return !beats[global(r)].seen; });
        const double waited = unseen_only ? t_start : t_timeout;
        auto list = [&](const std::vector<int>& v) {
          std::vector<int> shown(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(std::min(v.size(), kShown)));
          return join_ranks(shown, ", ") + (v.size() > kShown ? fmt::format(" and {} more", v.size() - kShown) : "");
        };
        if (c.ranks.empty()) {
          // Everyone missing waits in a collective, and none of them has said whom it gave up on:
          // a protocol mismatch or a failure this rank cannot see. Posted as such: a rank named
          // here would be followed by its peers as the one this rank gave up on (the launcher
          // ends any rank still running after its grace).
          post_unresponsive(job, {});
          throw RuntimeFailure(fmt::format("{}: rank {} did not arrive within {:g} s of the last sign of progress "
                                           "(heartbeat); cannot tell which rank is to blame: {}",
                                           what, list(missing_global), waited, states));
        }
        post_unresponsive(job, c.ranks);
        const bool among_missing = std::all_of(c.ranks.begin(), c.ranks.end(), [&](int g) {
          return std::find(missing_global.begin(), missing_global.end(), g) != missing_global.end();
        });
        if (c.direct && among_missing)
          throw RuntimeFailure(fmt::format(
              "{}: rank {} did not arrive within {:g} s of the last sign of progress (heartbeat); {}", what,
              list(c.ranks), waited, states));
        throw RuntimeFailure(fmt::format("{}: rank {} did not arrive within {:g} s of the last sign of progress "
                                         "(heartbeat); the cause is rank {}: {}", what, list(missing_global), waited,
                                         list(c.ranks), c.evidence));
      }
      std::this_thread::sleep_for(sleep_ms);
      sleep_ms = std::min(sleep_ms * 2, std::chrono::milliseconds(20));
    }
  } catch (const RuntimeFailure&) {
    throw;
  } catch (const std::exception& e) {
    throw RuntimeFailure(fmt::format("{}: the store did not answer: {}", what, first_line(e.what())));
  }
}

// Waits in `store` (a group's, in `job`'s store) until ranks 0 .. size-1 have all arrived under
// "mpt_barrier/<tag>/": barrier_arrive(), then await_arrivals() of the others (its deadline and
// errors).
void store_barrier(JobState& job, c10d::Store& store, const std::string& tag, int rank, int size,
                   const std::function<int(int)>& global, std::chrono::milliseconds timeout,
                   const std::string& what) {
  if (size <= 1) return;
  try {
    barrier_arrive(job, store, tag, rank, what);
  } catch (const std::exception& e) {
    throw RuntimeFailure(fmt::format("{}: the store did not answer: {}", what, first_line(e.what())));
  }
  std::vector<int> missing;
  for (int r = 0; r < size; ++r)
    if (r != rank) missing.push_back(r);
  await_arrivals(job, store, tag, std::move(missing), global, timeout, what);
}

// Waits until something accepts TCP connections at host:port, at most until `deadline`
// (now_seconds()). LibTorch's TCPStore client counts its connect timeout in whole seconds
// (0.5 s becomes 0 s); this loop honours milliseconds. Returns an empty string when
// connected, else why not (the last error). A TCPStore server never speaks first: a peer
// that sends bytes (or hangs up) before any request is some other service, and LibTorch's
// client would choke on it in a thread of its own (std::length_error: std::terminate), so
// such a peer is reported at once (`*fatal` set).
std::string wait_until_listening(const std::string& host, int port, double deadline, bool* fatal) {
  std::string why = "timed out";
  *fatal = false;
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (gai != 0) {
      why = fmt::format("cannot resolve {}: {}", host, ::gai_strerror(gai));
    } else {
      for (addrinfo* a = res; a; a = a->ai_next) {
        int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
          pollfd pfd{fd, POLLOUT, 0};
          const double left_ms = std::max(1.0, (deadline - now_seconds()) * 1000.0);
          if (::poll(&pfd, 1, static_cast<int>(std::min(left_ms, 1000.0))) == 1) {
            int err = 0;
            socklen_t len = sizeof(err);
            ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
            rc = err == 0 ? 0 : -1;
            errno = err;
          } else {
            errno = ETIMEDOUT;
          }
        }
        const int err = errno;
        if (rc == 0) {
          pollfd pfd{fd, POLLIN, 0};
          const bool spoke = ::poll(&pfd, 1, 100) == 1;
          char byte = 0;
          const ssize_t got = spoke ? ::recv(fd, &byte, 1, MSG_PEEK) : -1;
          ::close(fd);
          ::freeaddrinfo(res);
          if (!spoke) return {};
          *fatal = true;
          return got > 0 ? "it sent data before any request: not a TCPStore"
                         : "it closed the connection at once: not a TCPStore that accepts this rank";
        }
        ::close(fd);
        why = std::strerror(err);
      }
      ::freeaddrinfo(res);
    }
    if (now_seconds() >= deadline) return why;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace


std::chrono::milliseconds heartbeat_interval(std::chrono::milliseconds timeout) {
  return std::clamp(timeout / 20, std::chrono::milliseconds(20), std::chrono::milliseconds(500));
}

// ----------------------------------------------------------------------------
// The job's connection
// ----------------------------------------------------------------------------

Job::Job(std::unique_ptr<detail::JobState> state) : state_(std::move(state)) {}
Job::~Job() = default;  // JobState: the heartbeat joined, then the store closed

const LaunchInfo& Job::launch() const { return state_->launch; }
std::chrono::milliseconds Job::timeout() const { return state_->timeout; }
void Job::note_progress() { state_->progress.fetch_add(1, std::memory_order_relaxed); }
long long Job::progress() const { return state_->progress.load(); }
int Job::waiting_on() const { return state_->waiting_on.load(); }

WaitingFor::WaitingFor(Job& job, int global_rank)
    : job_(job), previous_(job.state_->waiting_on.exchange(global_rank)) {}
WaitingFor::~WaitingFor() { job_.state_->waiting_on.store(previous_); }

std::shared_ptr<Job> connect_store(const LaunchInfo& info, std::chrono::milliseconds timeout) {
  auto state = std::make_unique<detail::JobState>();
  state->launch = info;
  state->timeout = timeout;
  if (info.world_size == 1 && info.launcher == "none") {
    state->store = c10::make_intrusive<c10d::HashStore>();
    return std::shared_ptr<Job>(new Job(std::move(state)));
  }
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(info.master_port);
  o.isServer = info.rank == 0 && !info.agent_store;
  o.numWorkers = info.agent_store ? c10::nullopt : c10::optional<std::size_t>(info.world_size);
  o.waitWorkers = false;
  // LibTorch truncates the connect timeout to whole seconds: the master is waited for below,
  // in milliseconds; the store's operations get `timeout` itself (setTimeout).
  o.timeout = std::max(timeout, std::chrono::milliseconds(1000));
  const double timeout_s = static_cast<double>(timeout.count()) / 1000.0;
  const std::string where = fmt::format("{}:{}", info.master_addr, info.master_port);
  auto fail = [&](const std::string& why) {
    return RuntimeFailure(fmt::format("rank {}: cannot {} the TCPStore at {} within {:g} s: {}", info.rank,
                                      o.isServer ? "host" : "reach", where, timeout_s, why));
  };
  if (!o.isServer) {
    bool fatal = false;
    const std::string why =
        wait_until_listening(info.master_addr, info.master_port, now_seconds() + timeout_s, &fatal);
    if (!why.empty()) throw fail(why);
  }
  // Last resort: an exception that escapes one of LibTorch's store threads (a peer speaking
  // another protocol) would abort (exit 134) without a word; name the store and exit 3.
  // Process-wide by nature, so kept outside any Job: std::set_terminate has one handler per
  // process, and it can only name the store of the job that connected last.
  static std::string terminate_context;
  terminate_context = fmt::format("rank {}: the TCPStore connection to {}", info.rank, where);
  std::set_terminate([] {
    std::string what = "unknown error";
    try {
      if (auto e = std::current_exception()) std::rethrow_exception(e);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    const std::string msg = fmt::format("[error] mpt: uncaught exception in a background thread: {} ({}: is it a "
                                        "TCPStore of this job?)\n", first_line(what), terminate_context);
    [[maybe_unused]] auto n = ::write(2, msg.data(), msg.size());
    std::_Exit(kExitRuntime);
  });
  // TCPStore's constructor pings the server with no receive timeout, so a host stopped (SIGSTOP)
  // after it began to listen held a connecting rank forever (found when the stopped-store-host
  // test ran on a loaded machine): the job's watchdog, made first, bounds the connection too.
  // Above the store's own timeout (its waits end by themselves then), so that only a store that
  // does not answer at all trips it.
  if (info.world_size > 1) state->watchdog = std::make_unique<StoreWatchdog>(timeout_s + 2.0, store_host(info));
  auto open = [&](c10d::TCPStoreOptions opts, bool ping) -> c10::intrusive_ptr<c10d::Store> {
    StoreWatchdog::Call call(state->watchdog.get(), fmt::format("rank {}: cannot reach the TCPStore at {}", info.rank,
                                                                where));
    c10::intrusive_ptr<c10d::Store> s = c10::make_intrusive<c10d::TCPStore>(info.master_addr, opts);
    s->setTimeout(timeout);
    if (!info.store_prefix.empty()) s = c10::make_intrusive<c10d::PrefixStore>(info.store_prefix, s);
    // One round trip: a port that answers with something else than a TCPStore fails here.
    if (ping) s->check({"mpt/ping"});
    return s;
  };
  try {
    state->store = open(o, true);
  } catch (const std::exception& e) {  // also std::length_error & co. from a peer speaking another protocol
    state->store.reset();
    const std::string what = first_line(e.what());
    if (o.isServer && what.find("EADDRINUSE") != std::string::npos)
      throw fail(fmt::format("{} (another process listens on port {}: a second process started as rank 0, or an "
                             "earlier run still alive; choose another MASTER_PORT)", what, info.master_port));
    throw fail(fmt::format("{} (is {} a TCPStore of this job?)", what, where));
  }
  if (info.world_size > 1) {
    try {
      o.isServer = false;
      state->heartbeat = std::make_unique<Heartbeat>(open(o, false), info.rank, heartbeat_interval(timeout),
                                                     state->waiting_on, state->progress);
    } catch (const std::exception& e) {
      throw fail(fmt::format("the heartbeat connection failed: {}", first_line(e.what())));
    }
  }
  return std::shared_ptr<Job>(new Job(std::move(state)));
}

// Named, not anonymous: Group::Impl (a member of an exported class) holds a Monitor and a
// TraceLane, and GCC warns (-Wsubobject-linkage) when such a type has internal linkage in a
// file that is not the main one, as in the unity build's batches.
namespace group_detail {

// What a rank does when one of its collectives fails: find out which peers did not answer.
// Every rank whose collective fails posts "failed/<rank>" in the group's store and waits a
// short window for the others to do the same (their collectives fail too, within about the
// same timeout). A peer that posts nothing within the window is dead or alive but silent
// (hung): it is named in the error message, and listed under unresponsive_key() of this
// rank for the launcher. Costs nothing while collectives succeed.
struct Monitor {
  c10::intrusive_ptr<c10d::Store> store;      // the group's (prefixed) store
  c10::intrusive_ptr<c10d::Store> job_store;  // the job's, where unresponsive_key() is read
  int rank = 0, size = 1, global_rank = 0;
  double window_s = 1.0;
  Liveness liveness;  // the job's (no watchdog: diagnose() bounds the thread that reads the store)
  std::mutex mu;
  std::optional<std::string> verdict;

  double store_timeout_s = 30.0;  // the job's timeout: bounds the store calls below
  std::string host;               // store_host() of the job

  /// "; rank R did not answer (...)", or "; cannot tell which rank (...)"; computed once.
  /// The exchange runs on a thread of its own and is waited for at most window_s + the
  /// liveness' patience + 2 s: LibTorch's TCPStore check() and set() have no receive timeout,
  /// and a store whose host is stopped (SIGSTOP) would otherwise hold this rank forever. The
  /// thread works on copies (the store handles, the ranks), so one left blocked touches nothing
  /// of this Monitor.
  std::string diagnose() {
    std::lock_guard<std::mutex> lock(mu);
    if (verdict) return *verdict;
    auto task = std::make_shared<std::packaged_task<std::string()>>(
        [store = store, job_store = job_store, rank = rank, size = size, global_rank = global_rank,
         window_s = window_s, l = liveness] { return exchange(store, job_store, rank, size, global_rank, window_s, l); });
    std::future<std::string> result = task->get_future();
    std::thread([task] { (*task)(); }).detach();
    // A store that answers does so in milliseconds: the window, the wait for the peers' verdicts
    // (find_culprits), plus 2 s, is enough (was the window plus the job's timeout, which made a
    // stopped store host cost a rank 2 x timeout).
    const double limit = window_s + liveness.patience_s + std::min(2.0, store_timeout_s);
    if (result.wait_for(std::chrono::duration<double>(limit)) == std::future_status::ready)
      verdict = result.get();
    else
      verdict = fmt::format("; the store did not answer within {:g} s: {}", limit, host);
    return *verdict;
  }

 private:
  // Posts this rank's failure report, waits up to `window_s` for the peers' and reads the job's
  // heartbeats meanwhile; the peers that sent none are followed to whom to blame
  // (find_culprits: a peer that gave up on a third rank, or waits for one, is not the cause),
  // who are posted under unresponsive_key() for spawn_local and the other ranks.
  static std::string exchange(const c10::intrusive_ptr<c10d::Store>& store,
                              const c10::intrusive_ptr<c10d::Store>& job_store, int rank, int size, int global_rank,
                              double window_s, const Liveness& l) {
    try {
      store_set(*store, fmt::format("failed/{}", rank), "1");
      std::vector<int> missing;
      std::map<int, PeerBeat> beats;  // by global rank
      const double end = now_seconds() + window_s;
      for (;;) {
        missing.clear();
        for (int r = 0; r < size; ++r)
          if (r != rank && !store->check({fmt::format("failed/{}", r)})) missing.push_back(r);
        if (missing.empty() || now_seconds() >= end) break;
        if (job_store)  // a dead rank's heartbeat is stale by the window's end, a live one's read twice
          for (int g = 0; g < l.world_size; ++g)
            if (g != global_rank) observe(*job_store, g, beats[g], now_seconds());
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      // Every peer's collective failed as well: the cause is outside this group, or the network.
      if (missing.empty()) {
        if (job_store) store_set(*job_store, unresponsive_key(global_rank), kCannotTell);
        return "; cannot tell which rank (every other rank of this group failed as well)";
      }
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
      if (!job_store || l.world_size <= 1) {  // no heartbeats to read: the silent ones are named
        if (job_store) store_set(*job_store, unresponsive_key(global_rank), join_ranks(global, ","));
        return fmt::format("; rank {} did not answer (no failure report from {} within {:g} s after this "
                           "rank's: hung or dead)",
                           join_ranks(global, ", "), global.size() == 1 ? "it" : "them", window_s);
      }
      const Culprits c = find_culprits(*job_store, l, global, beats);
      const std::string silent = fmt::format("rank {} sent no failure report within {:g} s after this rank's",
                                             join_ranks(global, ", "), window_s);
      store_set(*job_store, unresponsive_key(global_rank), c.ranks.empty() ? kCannotTell : join_ranks(c.ranks, ","));
      if (c.ranks.empty()) return fmt::format("; cannot tell which rank ({}; {})", silent, c.undecided);
      if (c.direct && c.ranks.size() == global.size())  // every silent peer is to blame itself
        return fmt::format("; rank {} did not answer (no failure report from {} within {:g} s after this rank's; {})",
                           join_ranks(c.ranks, ", "), global.size() == 1 ? "it" : "them", window_s, c.evidence);
      return fmt::format("; rank {} did not answer ({}; {})", join_ranks(c.ranks, ", "), silent, c.evidence);
    } catch (const std::exception& e) {
      return fmt::format("; cannot tell which rank (the store did not answer: {})", first_line(e.what()));
    }
  }
};

// What the timeline (core/runtime/trace, --trace) records of one posted operation: a slice on the
// communication track with bytes and peer, and the flow of a pipeline message.
struct TraceOp {
  std::string name;
  trace::json args;
  double post_us = 0;  // when the caller posted it (now_us)
  trace::P2P p2p;      // the transport's annotation (flow id, kind, microbatch)
};

// Starts the record of an operation when tracing is on (null otherwise: one branch).
std::shared_ptr<TraceOp> trace_begin(const char* name, int64_t bytes, int group_size, int peer_global = -1) {
  if (!trace::enabled()) return nullptr;
  auto op = std::make_shared<TraceOp>();
  op->name = name;
  op->post_us = trace::now_us();
  op->args = {{"bytes", bytes}, {"group_size", group_size}};
  if (peer_global >= 0) op->args["peer"] = peer_global;
  op->p2p = trace::take_annotation();
  if (!op->p2p.name.empty()) op->name = op->p2p.name;
  if (op->p2p.args.is_object())
    for (auto it = op->p2p.args.begin(); it != op->p2p.args.end(); ++it) op->args[it.key()] = it.value();
  return op;
}

// Records `op` as the slice [begin_us, end_us]; a flow start binds to the slice's start, a flow
// finish (bp "e") to a point inside the slice just before its end (when the data had arrived).
void trace_end(const TraceOp& op, double begin_us, double end_us) {
  trace::complete(trace::Track::Comm, op.name, begin_us, end_us, op.args);
  if (op.p2p.flow == 0) return;
  const double d = end_us - begin_us;
  trace::flow(op.p2p, trace::Track::Comm, op.p2p.out ? begin_us : end_us - std::min(1.0, d / 2));
}

// The completion time of the last traced collective of this process: Gloo (one thread per
// group) and NCCL (one stream) run a group's collectives in posting order, so one starts when
// both it was posted and the previous one was done. Shared by the process's groups (of any
// Job: the timeline of core/runtime/trace, like its communication track, is the process's), so that
// the slices of one communication track do not overlap (Trace Event slices of a thread nest).
struct TraceLane {
  std::mutex mu;
  double last_done_us = 0;
};
std::shared_ptr<TraceLane> process_trace_lane() {
  static auto lane = std::make_shared<TraceLane>();
  return lane;
}

struct WorkImpl {
  c10::intrusive_ptr<c10d::Work> w;
  std::string what;
  std::shared_ptr<Job> job;  // whose heartbeat says what wait() waits for
  std::shared_ptr<Monitor> monitor;
  int peer_global = -1;  // send/recv: the peer's rank in the job
  std::shared_ptr<TraceOp> trace;  // recorded when wait() returns (recv; collectives without a future)
};

// `m` may be null: point-to-point work (send/recv) is diagnosed from `job`'s heartbeats instead
// (blame_late: the peer, or the rank it waits for), as a collective diagnosis would wrongly
// name healthy ranks that are still waiting elsewhere.
[[noreturn]] void collective_failed(const std::string& what, const std::exception& e, Monitor* m,
                                    JobState* job = nullptr, int peer_global = -1) {
  const std::string cause = first_line(e.what());  // before diagnose() waits
  throw RuntimeFailure(fmt::format("{}: {}; a peer process failed or timed out{}", what, cause,
                                   m ? m->diagnose()
                                     : job && peer_global >= 0 ? blame_late(*job, peer_global) : std::string()));
}

// Posts one collective: `post` returns LibTorch's Work; a failure to post is diagnosed like a
// failed wait (the ranks that did not answer are named).
// `op` (tracing on): recorded as the slice from the collective's start — when it was posted
// and the group's previous one was done (`lane`) — to its completion, taken in the callback
// of the Work's future (c10d marks it completed in Gloo's worker thread, or when NCCL's
// kernels end); where a Work has no future, from posting to the return of wait().
template <class Post>
Work post_collective(std::string what, const std::shared_ptr<Job>& job, const std::shared_ptr<Monitor>& monitor,
                     Post&& post, std::shared_ptr<TraceOp> op = nullptr, std::shared_ptr<TraceLane> lane = nullptr) {
  auto impl = std::make_shared<WorkImpl>();
  impl->what = std::move(what);
  impl->job = job;
  impl->monitor = monitor;
  try {
    impl->w = post();
  } catch (const std::exception& e) {
    collective_failed(impl->what, e, monitor.get());
  }
  if (op) {
    try {
      impl->w->getFuture()->addCallback([op, lane](c10::ivalue::Future&) {
        const double done = trace::now_us();
        double begin = op->post_us;
        if (lane) {
          std::lock_guard<std::mutex> lock(lane->mu);
          begin = std::max(begin, std::min(done, lane->last_done_us));
          lane->last_done_us = done;
        }
        op->args["posted_us_before_start"] = begin - op->post_us;
        trace_end(*op, begin, done);
      });
    } catch (const std::exception&) {
      impl->trace = op;  // no future: recorded by wait()
    }
  }
  return Work(impl);
}

// The first dimension of `big` is size times that of `part`, both contiguous, same dtype and
// device (all_gather's output, reduce_scatter's input, all_to_all's chunks). Throws std::invalid_argument.
void check_chunks(const char* op, const torch::Tensor& big, const torch::Tensor& part, int size) {
  if (!big.is_contiguous() || !part.is_contiguous() || big.dim() == 0 || big.dim() != part.dim() ||
      big.size(0) != size * part.size(0) || big.numel() != size * part.numel() || big.scalar_type() != part.scalar_type() ||
      big.device() != part.device())
    throw std::invalid_argument(fmt::format("{}: expected contiguous tensors of one dtype and device, the larger with "
                                            "{} x the first dimension of the other ({} vs {})", op, size,
                                            c10::str(big.sizes()), c10::str(part.sizes())));
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  return op == ReduceOp::Sum ? c10d::ReduceOp::SUM : op == ReduceOp::Min ? c10d::ReduceOp::MIN : c10d::ReduceOp::MAX;
}

}  // namespace group_detail
using namespace group_detail;

struct Group::Impl {
  c10::intrusive_ptr<compat::C10dBackend> pg;  // ProcessGroupGloo or ProcessGroupNCCL
  // Gloo, N = 2: the ring's messages from rank 1 to rank 0 go through a second ProcessGroupGloo
  // on the same device (made at the first ring call: ring_pg), so that no Gloo pair carries both
  // directions of a ring step (why: ring_pg).
  c10::intrusive_ptr<compat::C10dBackend> pg_down;
  c10::intrusive_ptr<c10d::ProcessGroupGloo::Options> gloo_options;  // pg's, reused by pg_down
  std::mutex pg_down_mu;

  /// The process group that carries the ring's messages from group rank `from` to `to`: pg when
  /// from < to, on NCCL or at N != 2; else pg_down, made at the first call (both ranks reach it
  /// in the same ring call). Throws RuntimeFailure when pg_down cannot be formed.
  compat::C10dBackend& ring_pg(int from, int to, int rank, int size);
  std::string where;                           // "rank R of N" for messages
  std::shared_ptr<Monitor> monitor;
  c10::intrusive_ptr<c10d::Store> store;       // the group's (prefixed) store
  std::vector<int> global;                     // rank in the job of each group rank
  std::chrono::milliseconds timeout{30000};
  int barriers = 0;                            // barrier() calls so far (unique store keys)
  std::shared_ptr<TraceLane> trace_lane = process_trace_lane();
};

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

namespace {
int64_t nbytes_of(const torch::Tensor& t) { return static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size()); }
// (N−1)/N of `bytes`: what one rank sends in a ring all-gather / reduce-scatter of that payload.
double ring_share(int64_t bytes, int n) { return static_cast<double>(bytes) * (n - 1) / n; }
}  // namespace

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

namespace {

// Values of any length through a store. LibTorch 2.x's TCPStore server (the libuv backend, the
// default since 2.4, which mpt --nproc's launcher and torchrun's agent host) closes a client's
// connection on a message over 8 MiB (MAX_PAYLOAD_LEN in TCPStoreLibUvBackend.cpp): the client
// dies with a C++ backtrace and its peers wait out their timeout (issue 38: a rank's trace
// events of 10.9 MB). So a value travels as pieces of at most kStorePieceBytes, well under that
// limit and under the message LibTorch 1.13's server reads whole.
constexpr std::size_t kStorePieceBytes = std::size_t{1} << 20;

// The key of piece `i` of the value under `key`.
std::string piece_key(const std::string& key, std::size_t i) { return fmt::format("{}/piece/{}", key, i); }

// Sets `key` to `value` in pieces: "<key>/piece/<i>" hold the bytes, then "<key>" = "<pieces>
// <bytes>", set last, so a reader that waits for "<key>" finds every piece there. Each store call
// is bounded by the job's watchdog (`what` names it).
void store_set_pieces(JobState& job, c10d::Store& store, const std::string& key, const std::string& value,
                      const std::string& what) {
  const std::size_t n = (value.size() + kStorePieceBytes - 1) / kStorePieceBytes;
  for (std::size_t i = 0; i < n; ++i) {
    StoreWatchdog::Call call(job.watchdog.get(), what);
    const std::size_t at = i * kStorePieceBytes;
    store_set(store, piece_key(key, i), value.substr(at, std::min(kStorePieceBytes, value.size() - at)));
  }
  StoreWatchdog::Call call(job.watchdog.get(), what);
  store_set(store, key, fmt::format("{} {}", n, value.size()));
}

// The value store_set_pieces set under `key`, waiting for it (the store's timeout); its keys are
// deleted once read when `erase` (a value read by one rank only: the store's host keeps no copy).
// Throws RuntimeFailure for a header or pieces that do not add up (another program's value).
std::string store_get_pieces(JobState& job, c10d::Store& store, const std::string& key, const std::string& what,
                             bool erase) {
  std::string header;
  {
    StoreWatchdog::Call call(job.watchdog.get(), what);
    const auto v = store.get(key);
    header.assign(v.begin(), v.end());
  }
  unsigned long long n = 0, bytes = 0;
  char extra = 0;
  if (std::sscanf(header.c_str(), "%llu %llu%c", &n, &bytes, &extra) != 2 ||
      n != (bytes + kStorePieceBytes - 1) / kStorePieceBytes)
    throw RuntimeFailure(fmt::format("{}: the store's '{}' is '{}', expected '<pieces> <bytes>' (is every rank the "
                                     "same mpt?)", what, key, first_line(header.substr(0, 80))));
  std::string value;
  value.reserve(static_cast<std::size_t>(bytes));
  for (std::size_t i = 0; i < n; ++i) {
    StoreWatchdog::Call call(job.watchdog.get(), what);
    const auto v = store.get(piece_key(key, i));
    value.append(v.begin(), v.end());
    if (erase) store.deleteKey(piece_key(key, i));
  }
  if (value.size() != bytes)
    throw RuntimeFailure(fmt::format("{}: the store's '{}' holds {} bytes in {} pieces, its header says {}", what, key,
                                     value.size(), n, bytes));
  if (erase) {
    StoreWatchdog::Call call(job.watchdog.get(), what);
    store.deleteKey(key);
  }
  return value;
}

}  // namespace

void Job::check_same_launch(const std::string& fingerprint) {
  const int self = rank(), n = world_size();
  const auto same = [](int r) { return r; };
  std::string theirs;
  c10d::Store& store = *state_->store;
  const std::string what = fmt::format("rank {} of {}: comparing this job with rank 0's", self, n);
  bool duplicate = false;
  try {
    // A store whose host is stopped would hold these calls forever: the job's watchdog ends the
    // rank then (exit 3).
    {
      StoreWatchdog::Call call(state_->watchdog.get(), what);
      duplicate = store.add(fmt::format("mpt/launch/claim/{}", self), 1) > 1;
    }
    if (!duplicate && self == 0) store_set_pieces(*state_, store, "mpt/launch/fingerprint", fingerprint, what);
  } catch (const std::exception& e) {
    throw RuntimeFailure(fmt::format("{}: the store did not answer: {}", what, first_line(e.what())));
  }
  if (duplicate)
    throw ConfigError(fmt::format("rank {} of {}: another process already joined this job as rank {} (two "
                                  "processes were started with the same rank: check RANK / SLURM_PROCID, or the "
                                  "launcher's --node-rank on each machine)",
                                  self, n, self));
  if (self == 0) {
    try {
      barrier_arrive(*state_, store, "mpt/launch/posted", 0, what);
    } catch (const std::exception& e) {
      throw RuntimeFailure(fmt::format("{}: the store did not answer: {}", what, first_line(e.what())));
    }
  } else {
    // Rank 0's description is waited for as long as rank 0 shows progress in its heartbeat (a
    // rank 0 still starting on a loaded machine is not late; a stopped one is named).
    await_arrivals(*state_, store, "mpt/launch/posted", {0}, same, state_->timeout,
                   fmt::format("rank {} of {}: waiting for rank 0's description of the job", self, n));
    try {
      theirs = store_get_pieces(*state_, store, "mpt/launch/fingerprint", what, false);  // every rank reads it
    } catch (const std::exception& e) {
      throw RuntimeFailure(fmt::format("rank {} of {}: rank 0's description of the job did not come: {}", self, n,
                                       first_line(e.what())));
    }
  }
  std::string mismatch;  // empty: this rank runs rank 0's job
  if (self != 0 && theirs != fingerprint) {
    std::string where = "/", here_v, there_v, more;
    try {
      const auto mine = nlohmann::json::parse(fingerprint), zero = nlohmann::json::parse(theirs);
      // The job's identity first (experiment, world size, versions), then the config: the first
      // difference in that order is the one named (an RFC 6902 patch from rank 0's to this rank's).
      nlohmann::json ops = nlohmann::json::array();
      for (const char* k : {"experiment", "world_size", "mpt", "libtorch"})
        if (mine.value(k, nlohmann::json()) != zero.value(k, nlohmann::json()))
          ops.push_back({{"path", std::string("/") + k}});
      if (ops.empty()) ops = nlohmann::json::diff(zero, mine);
      if (!ops.empty()) {
        where = ops[0].value("path", "/");
        const nlohmann::json::json_pointer at(where);
        auto shown = [](const nlohmann::json& doc, const nlohmann::json::json_pointer& p) {
          if (!doc.contains(p)) return std::string("absent");
          std::string d = doc.at(p).dump();
          return d.size() > 80 ? d.substr(0, 77) + "..." : d;
        };
        here_v = shown(mine, at);
        there_v = shown(zero, at);
        if (ops.size() > 1) more = fmt::format(", and {} more key{} differ{}", ops.size() - 1, ops.size() == 2 ? "" : "s",
                                             ops.size() == 2 ? "s" : "");
      }
    } catch (const std::exception&) {
      here_v = "(unreadable)";
      there_v = "(unreadable)";
    }
    mismatch = fmt::format("rank {} of {}: this process runs another job than rank 0: {} is {} here, {} on rank 0{} "
                           "(every rank must be started with the same experiment, config and --set, and the same mpt)",
                           self, world_size(), where, here_v, there_v, more);
  }
  // The verdicts meet before anyone goes on: a mismatched rank alone would exit 2 while the
  // others ran into their first collective and blamed it as dead or stopped. A rank that finds
  // a difference leaves its message (the first one stays) and marks its arrival; every other
  // rank meets in a barrier (heartbeat-bounded like every other: a rank still starting is waited
  // for) and reads it.
  if (!mismatch.empty()) {
    // This rank's own message is the error whatever the store does now (rank 0, the store's
    // host, may already be gone once the barrier is complete). It marks its arrival and leaves
    // at once: it may not even agree on the world size, so it waits for no one.
    try {
      const std::string reporting = fmt::format("rank {} of {}: reporting its launch check", self, n);
      {
        StoreWatchdog::Call call(state_->watchdog.get(), reporting);
        store.compareSet("mpt/launch/refused", std::vector<uint8_t>(),
                         std::vector<uint8_t>(mismatch.begin(), mismatch.end()));
      }
      barrier_arrive(*state_, store, "mpt/launch/read", self, reporting);
      barrier_arrive(*state_, store, "mpt/launch/checked", self, reporting);
    } catch (const std::exception&) {
    }
    throw ConfigError(mismatch);
  }
  store_barrier(*state_, store, "mpt/launch/checked", self, n, same, state_->timeout,
                fmt::format("rank {} of {}: waiting for every rank's launch check", self, n));
  std::string refused;
  try {
    StoreWatchdog::Call call(state_->watchdog.get(), fmt::format("rank {} of {}: reading the launch check", self, n));
    if (store.check({"mpt/launch/refused"})) {
      auto v = store.get("mpt/launch/refused");
      refused.assign(v.begin(), v.end());
    }
  } catch (const std::exception& e) {
    throw RuntimeFailure(fmt::format("rank {} of {}: reading the launch check: the store did not answer: {}", self, n,
                                     first_line(e.what())));
  }
  if (refused.empty()) return;
  // Rank 0 hosts the store: it leaves only after every rank has read the verdict.
  try {
    if (self == 0)
      store_barrier(*state_, store, "mpt/launch/read", self, n, same, state_->timeout,
                    fmt::format("rank 0 of {}: waiting until every rank has read the launch check", n));
    else
      barrier_arrive(*state_, store, "mpt/launch/read", self,
                     fmt::format("rank {} of {}: reporting its launch check", self, n));
  } catch (const std::exception&) {
  }
  throw ConfigError(fmt::format("rank {} of {}: another rank was started for another job, so this one stops: {}",
                                self, n, refused));
}

std::vector<std::array<double, 4>> Job::clock_exchanges(int rounds, const std::string& tag) {
  c10d::Store& store = *state_->store;
  const int self = rank();
  StoreWatchdog* dog = state_->watchdog.get();
  const std::string what = fmt::format("rank {}: the clock exchange with rank 0", self);
  auto get_string = [&store, dog, &what](const std::string& key) {
    StoreWatchdog::Call call(dog, what);  // each call bounded, not the whole exchange
    auto v = store.get(key);  // waits for the key (store timeout)
    return std::string(v.begin(), v.end());
  };
  auto set_string = [&store, dog, &what](const std::string& key, const std::string& value) {
    StoreWatchdog::Call call(dog, what);
    store_set(store, key, value);
  };
  std::vector<std::array<double, 4>> out;
  try {
    if (self == 0) {
      for (int r = 1; r < world_size(); ++r)
        for (int k = 0; k < rounds; ++k) {
          get_string(fmt::format("mpt/clock/{}ping/{}/{}", tag, r, k));
          const double t1 = trace::now_us();
          const double t2 = trace::now_us();
          set_string(fmt::format("mpt/clock/{}pong/{}/{}", tag, r, k), fmt::format("{:.3f} {:.3f}", t1, t2));
        }
      return out;
    }
    for (int k = 0; k < rounds; ++k) {
      const double t0 = trace::now_us();
      set_string(fmt::format("mpt/clock/{}ping/{}/{}", tag, self, k), fmt::format("{:.3f}", t0));
      const std::string pong = get_string(fmt::format("mpt/clock/{}pong/{}/{}", tag, self, k));
      const double t3 = trace::now_us();
      double t1 = 0, t2 = 0;
      if (std::sscanf(pong.c_str(), "%lf %lf", &t1, &t2) != 2)
        throw RuntimeFailure("clock exchange: rank 0 answered '" + pong + "'");
      out.push_back({t0, t1, t2, t3});
    }
  } catch (const RuntimeFailure&) {
    throw;
  } catch (const std::exception& e) {
    throw RuntimeFailure(fmt::format("rank {}: the clock exchange with rank 0 failed: {}", self,
                                     first_line(e.what())));
  }
  return out;
}

std::vector<std::string> Job::gather_on_rank0(const std::string& key, const std::string& mine) {
  c10d::Store& store = *state_->store;
  const int self = rank();
  std::vector<std::string> out;
  const std::string what = fmt::format("rank {}: gathering '{}' on rank 0", self, key);
  try {
    if (self != 0) {  // each store call bounded by the watchdog, not the whole
      store_set_pieces(*state_, store, fmt::format("mpt/gather/{}/{}", key, self), mine, what);
      return out;
    }
    out.push_back(mine);
    for (int r = 1; r < world_size(); ++r) {
      WaitScope waiting(*state_, r);
      out.push_back(store_get_pieces(*state_, store, fmt::format("mpt/gather/{}/{}", key, r), what, true));
    }
  } catch (const RuntimeFailure&) {
    throw;
  } catch (const std::exception& e) {
    throw RuntimeFailure(fmt::format("rank {}: gathering '{}' on rank 0 failed: {}", self, key,
                                     first_line(e.what())));
  }
  return out;
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

}  // namespace mpt::dist
