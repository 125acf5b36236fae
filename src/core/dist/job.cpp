// core/dist, job: a process's connection to its job — connect_store (the store, the heartbeat
// thread, the store watchdog), the Job's accessors and WaitingFor, and the job-wide exchanges
// through the store: the launch check (check_same_launch), clock exchanges and gathers on rank 0.
// Declarations: group.hpp; internals: job_state.hpp.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "core/dist/detail.hpp"
#include "core/dist/group.hpp"
#include "core/dist/job_state.hpp"
#include "core/errors.hpp"
#include "core/runtime/runtime.hpp"
#include "core/runtime/trace.hpp"

namespace mpt::dist {

using namespace detail;

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

}  // namespace mpt::dist
