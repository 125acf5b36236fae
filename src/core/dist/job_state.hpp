// core/dist internals: what a Job holds (JobState: the store, the heartbeat thread, the store
// watchdog) and the liveness vocabulary shared by the job, its groups and the ring collectives
// (PeerBeat, WaitScope, Liveness, Culprits, Monitor). Private to src/core/dist: not part of mpt's
// API, included only by its .cpp files. The design is described in group.hpp and
// docs/architecture.md.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "core/dist/detail.hpp"
#include "core/dist/group.hpp"
#include "core/errors.hpp"
#include "core/runtime/runtime.hpp"

// Types with linkage (namespace detail), not an anonymous namespace's: JobState and Group's
// members hold them (g++: -Wsubobject-linkage).
namespace mpt::dist::detail {

/// Sets `key` to the bytes of `value` in `store`.
inline void store_set(c10d::Store& store, const std::string& key, const std::string& value) {
  store.set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

/// "3, 1" from {3, 1} and ", " (`sep` between the ranks).
inline std::string join_ranks(const std::vector<int>& v, const char* sep) {
  std::string s;
  for (int r : v) s += (s.empty() ? "" : sep) + std::to_string(r);
  return s;
}

/// The key of global rank `global_rank`'s heartbeat in the job's store.
inline std::string heartbeat_key(int global_rank) { return fmt::format("mpt/heartbeat/{}", global_rank); }

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
void observe(c10d::Store& store, int global, PeerBeat& b, double now);

// Who serves a job's store, for the messages of a store that does not answer: rank 0, or the
// launcher's agent (mpt --nproc's parent, torchrun's agent) when the store is the agent's.
std::string store_host(const LaunchInfo& info);

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

// The heartbeat's "waiting" of a rank whose wait failed, while it finds out whom to blame: its
// verdict follows under unresponsive_key(), and it ends then; peers follow that verdict
// (find_culprits) instead of blaming it.
inline constexpr int kWaitingGaveUp = -3;

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

/// The job's heartbeat period in seconds.
inline double interval_s(const JobState& job) { return static_cast<double>(heartbeat_interval(job.timeout).count()) / 1000.0; }
// A heartbeat unchanged for this long belongs to a stopped or dead rank.
inline double stale_s(const JobState& job) { return 3.0 * interval_s(job) + 0.25; }

// How long a failed collective waits for its peers' failure reports (Monitor): a quarter of the
// timeout, between 1 and 5 s; their collectives fail too, within about the same timeout.
inline double report_window_s(std::chrono::milliseconds timeout) {
  return std::min(5.0, std::max(1.0, 0.25 * static_cast<double>(timeout.count()) / 1000.0));
}

// How long a rank that gave up waits for a peer's verdict when the only evidence is a peer that
// is itself failing or waiting in a collective: that peer's collective fails too, and it posts
// whom it blames after its own report window and heartbeat reading.
inline double verdict_patience_s(const JobState& job) { return report_window_s(job.timeout) + stale_s(job) + 0.5; }

/// A heartbeat never seen, or unchanged for longer than `stale` s (stale_s()), at `now`.
inline bool is_stale(double stale, const PeerBeat& b, double now) { return !b.seen || now - b.changed_at > stale; }
inline bool is_stale(const JobState& job, const PeerBeat& b, double now) { return is_stale(stale_s(job), b, now); }

// "alive and working", "stopped or dead (...)", ...: what `b` says about its rank at `now`
// (`stale`: stale_s() of the job).
std::string beat_state(double stale, const PeerBeat& b, double now);
std::string beat_state(const JobState& job, const PeerBeat& b, double now);

// What a rank that gave up posts under unresponsive_key() when it cannot tell whom to blame: no
// rank (parse_ranks() skips it), yet its peers see that it gave up and do not blame it.
inline constexpr const char* kCannotTell = "cannot-tell";

// Posts, before this rank ends, whom it blames (`globals`; empty: it cannot tell), for
// spawn_local and for its peers (find_culprits).
void post_unresponsive(JobState& job, const std::vector<int>& globals);

// The ranks that `global` blamed when it gave up (posted under unresponsive_key() just before
// it ends; empty: it could not tell); nullopt when it posted nothing. Throws when the store
// does not answer.
std::optional<std::vector<int>> posted_verdict(c10d::Store& store, int global);

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
                       std::map<int, PeerBeat>& beats);

// The job's Liveness as seen from its own rank.
Liveness liveness_of(const JobState& job);

// After a send/recv with rank `peer` (global) failed: finds who is behind it (find_culprits:
// the peer, the rank it waits for, or the rank it gave up on), posts them for spawn_local and
// the other ranks, and returns "; rank Q is late (rank P waits for rank Q): ...", or "; cannot
// tell which rank is late: ..." when the ranks followed all wait in collectives. Empty without
// heartbeats.
std::string blame_late(JobState& job, int peer);

// Marks this rank's arrival at the barrier `tag` without waiting for the others (a rank that
// leaves at once, like a mismatched rank at the launch check, still lets the others complete it).
// `what` names the call for the store watchdog.
void barrier_arrive(JobState& job, c10d::Store& store, const std::string& tag, int rank, const std::string& what);

// Waits until every group rank in `missing` has arrived at the barrier `tag` (barrier_arrive).
// `global(r)` maps a group rank to its rank in the job (for the job's heartbeats). The deadline
// is `timeout` after the start or after the last progress of a rank that has not arrived (for a
// rank never seen: start_allowance_s()). Throws RuntimeFailure naming the ranks that did not
// arrive and the late ones among them, or when the store does not answer.
void await_arrivals(JobState& job, c10d::Store& store, const std::string& tag, std::vector<int> missing,
                    const std::function<int(int)>& global, std::chrono::milliseconds timeout, const std::string& what);

// Waits in `store` (a group's, in `job`'s store) until ranks 0 .. size-1 have all arrived under
// "mpt_barrier/<tag>/": barrier_arrive(), then await_arrivals() of the others (its deadline and
// errors).
void store_barrier(JobState& job, c10d::Store& store, const std::string& tag, int rank, int size,
                   const std::function<int(int)>& global, std::chrono::milliseconds timeout,
                   const std::string& what);

// Waits until something accepts TCP connections at host:port, at most until `deadline`
// (now_seconds()). LibTorch's TCPStore client counts its connect timeout in whole seconds
// (0.5 s becomes 0 s); this loop honours milliseconds. Returns an empty string when
// connected, else why not (the last error). A TCPStore server never speaks first: a peer
// that sends bytes (or hangs up) before any request is some other service, and LibTorch's
// client would choke on it in a thread of its own (std::length_error: std::terminate), so
// such a peer is reported at once (`*fatal` set).
std::string wait_until_listening(const std::string& host, int port, double deadline, bool* fatal);

// Values of any length through a store. LibTorch 2.x's TCPStore server (the libuv backend, the
// default since 2.4, which mpt --nproc's launcher and torchrun's agent host) closes a client's
// connection on a message over 8 MiB (MAX_PAYLOAD_LEN in TCPStoreLibUvBackend.cpp): the client
// dies with a C++ backtrace and its peers wait out their timeout (issue 38: a rank's trace
// events of 10.9 MB). So a value travels as pieces of at most kStorePieceBytes (1 MiB, store.cpp),
// well under that limit and under the message LibTorch 1.13's server reads whole.
//
// Sets `key` to `value` in pieces: "<key>/piece/<i>" hold the bytes, then "<key>" = "<pieces>
// <bytes>", set last, so a reader that waits for "<key>" finds every piece there. Each store call
// is bounded by the job's watchdog (`what` names it).
void store_set_pieces(JobState& job, c10d::Store& store, const std::string& key, const std::string& value,
                      const std::string& what);

// The value store_set_pieces set under `key`, waiting for it (the store's timeout); its keys are
// deleted once read when `erase` (a value read by one rank only: the store's host keeps no copy).
// Throws RuntimeFailure for a header or pieces that do not add up (another program's value).
std::string store_get_pieces(JobState& job, c10d::Store& store, const std::string& key, const std::string& what,
                             bool erase);

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
  std::string diagnose();

 private:
  // Posts this rank's failure report, waits up to `window_s` for the peers' and reads the job's
  // heartbeats meanwhile; the peers that sent none are followed to whom to blame
  // (find_culprits: a peer that gave up on a third rank, or waits for one, is not the cause),
  // who are posted under unresponsive_key() for spawn_local and the other ranks.
  static std::string exchange(const c10::intrusive_ptr<c10d::Store>& store,
                              const c10::intrusive_ptr<c10d::Store>& job_store, int rank, int size, int global_rank,
                              double window_s, const Liveness& l);
};

}  // namespace mpt::dist::detail
