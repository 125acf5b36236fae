// core/dist, liveness: who is to blame when a wait fails. Reads the job's heartbeats (PeerBeat),
// follows "waiting for" links and posted verdicts to the culprits (find_culprits), names them
// after a failed send/recv (blame_late) or collective (Monitor), and waits in store barriers whose
// deadline moves with the awaited ranks' progress. Declarations and the shared types:
// job_state.hpp; the design: group.hpp.
#include <algorithm>
#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "core/dist/job_state.hpp"
#include "core/errors.hpp"
#include "core/runtime/runtime.hpp"

namespace mpt::dist::detail {

// ----------------------------------------------------------------------------
// Heartbeats as read by a waiting rank
// ----------------------------------------------------------------------------

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

std::string store_host(const LaunchInfo& info) {
  if (!info.agent_store) return "its host, rank 0 (it serves MASTER_ADDR:MASTER_PORT), is stopped or hung";
  return fmt::format("its host, {} that serves MASTER_ADDR:MASTER_PORT, is stopped or hung",
                     info.launcher == "mpt" ? "the mpt launcher" : "the launcher's agent");
}

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

// ----------------------------------------------------------------------------
// Verdicts: whom a rank blames
// ----------------------------------------------------------------------------

void post_unresponsive(JobState& job, const std::vector<int>& globals) {
  try {
    if (job.store) store_set(*job.store, unresponsive_key(job.launch.rank), globals.empty() ? kCannotTell : join_ranks(globals, ","));
  } catch (const std::exception&) {
  }
}

std::optional<std::vector<int>> posted_verdict(c10d::Store& store, int global) {
  const std::string key = unresponsive_key(global);
  if (!store.check({key})) return std::nullopt;
  const auto v = store.get(key);
  return parse_ranks(std::string(v.begin(), v.end()));
}

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

Liveness liveness_of(const JobState& job) {
  return {job.launch.rank, job.launch.world_size, stale_s(job), verdict_patience_s(job), job.watchdog.get(),
          fmt::format("rank {}: reading its peers' heartbeats to find whom to blame", job.launch.rank)};
}

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

// ----------------------------------------------------------------------------
// Collective failures: the group's failure reports (Monitor)
// ----------------------------------------------------------------------------

std::string Monitor::diagnose() {
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

// (Its steps: job_state.hpp, Monitor::exchange.)
std::string Monitor::exchange(const c10::intrusive_ptr<c10d::Store>& store,
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

// ----------------------------------------------------------------------------
// Store barriers bounded by the awaited ranks' progress
// ----------------------------------------------------------------------------

namespace {

// The key under which rank `rank` marks its arrival at the barrier `tag` of a store.
std::string barrier_key(const std::string& tag, int rank) { return fmt::format("mpt_barrier/{}/{}", tag, rank); }

// How long a rank that has sent no heartbeat yet is waited for: `timeout`, or, when mpt's own
// launcher started the job, at least 60 s. That launcher watches every worker and ends the job
// when one exits, so a rank not yet seen is still starting (a loaded machine can take seconds
// to load LibTorch), not dead; a rank stopped before its first heartbeat is then named after 60
// s instead of `timeout`. Under torchrun, SLURM or by hand nothing watches the processes, so
// the timeout holds.
double start_allowance_s(const JobState& job, double timeout_s) {
  return job.launch.launcher == "mpt" ? std::max(timeout_s, 60.0) : timeout_s;
}

}  // namespace

void barrier_arrive(JobState& job, c10d::Store& store, const std::string& tag, int rank, const std::string& what) {
  StoreWatchdog::Call call(job.watchdog.get(), what);
  store_set(store, barrier_key(tag, rank), "1");
}

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

}  // namespace mpt::dist::detail
