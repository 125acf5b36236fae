// Timelines: the recorder and the Chrome Trace Event writer. See trace.hpp.
#include "core/runtime/trace.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <tuple>

#include <fmt/format.h>

namespace mpt::trace {

namespace detail {
std::atomic<bool> g_on{false};
}  // namespace detail

namespace {

/// A recorded event as kept until read: a Deferred's name, args and flow and the run label
/// are made into Events by read().
struct Stored {
  Event e;
  Deferred def;           ///< def.render == nullptr: e is the event as recorded
  int64_t run = 0;        ///< intern() id of the run label at recording (0: "", none)
};

struct Recorder {
  std::mutex mu;
  std::deque<Stored> events;  // a deque: growing never moves what was recorded
  json meta = json::object();
  int64_t run_label = 0;                 // intern() id
  std::deque<std::string> strings{""};   // intern()'s table (a deque: references stay valid)
  std::map<std::string, int64_t> ids{{"", 0}};
  bool started = false;  // start() was called (and not stop())
  int captures = 0;      // live Capture objects
  int rank = 0;
  double start_us = 0;
  using Key = std::tuple<bool, bool, int, int, char, int, int>;
  std::map<Key, uint64_t> flow_seq;
};

Recorder& rec() {
  static Recorder* r = new Recorder();  // never destroyed: hooks may run from exiting threads
  return *r;
}

thread_local P2P t_annotation;
thread_local bool t_has_annotation = false;

const char* cat_of(Track t) {
  switch (t) {
    case Track::Compute: return "compute";
    case Track::Comm: return "comm";
    case Track::Optimizer: return "optimizer";
  }
  return "compute";
}

int tid_of(Track t, int lane) { return static_cast<int>(t) + 10 * lane; }

void push(Event e, const Deferred* d = nullptr) {
  auto& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  r.events.push_back(Stored{std::move(e), d ? *d : Deferred{}, r.run_label});
}

int64_t intern_locked(Recorder& r, const std::string& s) {
  auto it = r.ids.find(s);
  if (it != r.ids.end()) return it->second;
  const auto id = static_cast<int64_t>(r.strings.size());
  r.strings.push_back(s);
  r.ids.emplace(s, id);
  return id;
}

/// The events of a Stored as read (the caller holds the lock): a Deferred's flow, then the
/// slice with its rendered name and args; args.run added.
void read(const Recorder& r, const Stored& s, std::vector<Event>& out) {
  Event e = s.e;
  if (s.def.render) {
    if (s.def.flow != 0) {
      Event f;
      f.ph = s.def.flow_out ? 's' : 'f';
      f.name = "p2p";
      f.cat = e.cat;
      f.tid = e.tid;
      f.ts_us = s.def.flow_ts_us;
      f.id = s.def.flow;
      if (s.run != 0) f.args = {{"run", r.strings.at(static_cast<std::size_t>(s.run))}};
      out.push_back(std::move(f));
    }
    s.def.render(s.def, e);
  }
  if (s.run != 0) {
    if (e.args.is_null()) e.args = json::object();
    e.args["run"] = r.strings.at(static_cast<std::size_t>(s.run));
  }
  out.push_back(std::move(e));
}

void update_on(Recorder& r) { detail::g_on.store(r.started || r.captures > 0, std::memory_order_relaxed); }

}  // namespace

double now_us() { return to_us(std::chrono::steady_clock::now()); }

double to_us(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::micro>(t.time_since_epoch()).count();
}

void start(int rank) {
  auto& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  r.events.clear();
  r.flow_seq.clear();
  r.rank = rank;
  r.start_us = now_us();
  r.started = true;
  update_on(r);
}

void stop() {
  auto& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  r.started = false;
  update_on(r);
}

double start_us() {
  auto& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.start_us;
}

namespace {
/// A complete ('X') event without args.
Event slice(Track track, std::string name, double start_us, double end_us, int lane) {
  Event e;
  e.ph = 'X';
  e.name = std::move(name);
  e.cat = cat_of(track);
  e.tid = tid_of(track, lane);
  e.ts_us = start_us;
  e.dur_us = std::max(0.0, end_us - start_us);
  return e;
}
}  // namespace

void complete(Track track, std::string name, double start_us, double end_us, json args, int lane) {
  if (!enabled()) return;
  Event e = slice(track, std::move(name), start_us, end_us, lane);
  e.args = std::move(args);
  push(std::move(e));
}

void complete(Track track, const Deferred& d, double start_us, double end_us, int lane) {
  if (!enabled()) return;
  if (!d.render) throw std::invalid_argument("trace::complete: expected a Deferred with a render function");
  push(slice(track, std::string(), start_us, end_us, lane), &d);
}

int64_t intern(const std::string& s) {
  auto& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  return intern_locked(r, s);
}

const std::string& interned(int64_t id) {
  const auto& r = rec();
  if (id < 0 || static_cast<std::size_t>(id) >= r.strings.size())
    throw std::out_of_range(fmt::format("trace::interned: no string has id {}", id));
  return r.strings[static_cast<std::size_t>(id)];
}

Scope::Scope(Track track, const char* name, json args, int lane)
    : track_(track), name_(name), args_(std::move(args)), lane_(lane) {
  if (enabled()) t0_ = now_us();
}

Scope::~Scope() {
  if (t0_ >= 0) complete(track_, name_, t0_, now_us(), std::move(args_), lane_);
}

uint64_t flow_id(bool send, int src, int dst, char kind, int microbatch, int boundary, bool in_process) {
  auto& r = rec();
  uint64_t n, domain;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    domain = in_process ? 1 + static_cast<uint64_t>(r.rank % 15) : 0;
    n = r.flow_seq[Recorder::Key{send, in_process, src, dst, kind, microbatch, boundary}]++;
  }
  const uint64_t k = static_cast<uint64_t>(kind == 'F' ? 0 : kind == 'B' ? 1 : kind == 'W' ? 2 : 3);
  uint64_t id = domain;                                                  // 4 bits
  id = (id << 12) | (n & 0xfffu);                                        // 12
  id = (id << 6) | (static_cast<uint64_t>(src) & 0x3fu);                 // 6
  id = (id << 6) | (static_cast<uint64_t>(dst) & 0x3fu);                 // 6
  id = (id << 2) | k;                                                    // 2
  id = (id << 13) | (static_cast<uint64_t>(microbatch) & 0x1fffu);       // 13
  id = (id << 8) | (static_cast<uint64_t>(boundary + 1) & 0xffu);        // 8: 51 bits in all
  return id + 1;  // never 0 ("no flow")
}

void annotate_next(P2P p) {
  if (!enabled()) return;
  t_annotation = std::move(p);
  t_has_annotation = true;
}

P2P take_annotation() {
  if (!t_has_annotation) return {};
  t_has_annotation = false;
  return std::move(t_annotation);
}

void flow(const P2P& p, Track track, double ts_us, int lane) {
  if (!enabled() || p.flow == 0) return;
  Event e;
  e.ph = p.out ? 's' : 'f';
  e.name = "p2p";
  e.cat = cat_of(track);
  e.tid = tid_of(track, lane);
  e.ts_us = ts_us;
  e.id = p.flow;
  push(std::move(e));
}

void set_run_label(std::string label) {
  auto& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  r.run_label = intern_locked(r, label);
}

void set_metadata(const std::string& key, json value) {
  auto& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  r.meta[key] = std::move(value);
}

json metadata() {
  auto& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.meta;
}

std::vector<Event> events() { return events_since(0); }

void for_each_event(const std::function<void(const Event&)>& fn) {
  auto& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<Event> one;  // read() makes one or two events (a Deferred's flow, its slice)
  for (const auto& s : r.events) {
    one.clear();
    read(r, s, one);
    for (const auto& e : one) fn(e);
  }
}

std::size_t event_count() {
  auto& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.events.size();
}

std::vector<Event> events_since(std::size_t from) {
  auto& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  if (from >= r.events.size()) return {};
  std::vector<Event> out;
  out.reserve(r.events.size() - from);
  for (std::size_t i = from; i < r.events.size(); ++i) read(r, r.events[i], out);
  return out;
}

Capture::Capture(std::string label) {
  auto& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  owner_ = !r.started && r.captures == 0;
  ++r.captures;
  from_ = r.events.size();
  r.run_label = intern_locked(r, label);
  update_on(r);
}

Capture::~Capture() {
  auto& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  --r.captures;
  r.run_label = 0;
  if (owner_ && !r.started && from_ <= r.events.size())
    r.events.erase(r.events.begin() + static_cast<std::ptrdiff_t>(from_), r.events.end());
  update_on(r);
}

std::vector<Event> Capture::events() const { return events_since(from_); }

namespace {
json event_json(const Event& e) {
  json j = {{"ph", std::string(1, e.ph)}, {"name", e.name}, {"cat", e.cat}, {"tid", e.tid}, {"ts", e.ts_us}};
  if (e.ph == 'X') j["dur"] = e.dur_us;
  if (e.id != 0) j["id"] = e.id;
  if (!e.args.is_null()) j["args"] = e.args;
  return j;
}
}  // namespace

json events_json(const std::vector<Event>& ev) {
  json a = json::array();
  for (const auto& e : ev) a.push_back(event_json(e));
  return a;
}

void write_events_json(std::string& out) {
  out += '[';
  bool first = true;
  for_each_event([&](const Event& e) {
    if (!first) out += ',';
    first = false;
    out += event_json(e).dump();
  });
  out += ']';
}

namespace {
// One element of events_json's array as an Event.
Event event_from_json(const json& x) {
  Event e;
  e.ph = x.at("ph").get<std::string>().at(0);
  e.name = x.at("name").get<std::string>();
  e.cat = x.at("cat").get<std::string>();
  e.tid = x.at("tid").get<int>();
  e.ts_us = x.at("ts").get<double>();
  if (x.contains("dur")) e.dur_us = x.at("dur").get<double>();
  if (x.contains("id")) e.id = x.at("id").get<uint64_t>();
  if (x.contains("args")) e.args = x.at("args");
  return e;
}
}  // namespace

std::vector<Event> events_from_json(const json& j) {
  std::vector<Event> out;
  for (const auto& x : j) out.push_back(event_from_json(x));
  return out;
}

std::vector<Event> events_from_text(const std::string& text) {
  std::vector<Event> out;
  bool top_is_array = false;
  // nlohmann's parser callback: each element of the top-level array becomes an Event as soon as
  // it is parsed and is then discarded (returning false), so no tree of the whole array is built.
  const json::parser_callback_t keep = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (depth == 0 && ev == json::parse_event_t::array_start) top_is_array = true;
    if (depth == 1 && top_is_array && ev == json::parse_event_t::object_end) {
      out.push_back(event_from_json(parsed));
      return false;
    }
    return true;
  };
  const json rest = json::parse(text, keep);
  if (!top_is_array || !rest.empty())
    throw std::invalid_argument("trace::events_from_text: expected an array of event objects");
  return out;
}

ClockSync clock_from_exchanges(int rank, const std::vector<std::array<double, 4>>& exchanges) {
  ClockSync c;
  c.rank = rank;
  c.rounds = static_cast<int>(exchanges.size());
  bool have = false;
  for (const auto& x : exchanges) {
    const double t0 = x[0], t1 = x[1], t2 = x[2], t3 = x[3];
    if (t3 < t0 || t2 < t1)
      throw std::invalid_argument(fmt::format("clock exchange of rank {}: expected t3 >= t0 and t2 >= t1, got "
                                              "t0={} t1={} t2={} t3={}", rank, t0, t1, t2, t3));
    const double rtt = (t3 - t0) - (t2 - t1);
    if (!have || rtt < c.rtt_us) {
      have = true;
      c.rtt_us = std::max(0.0, rtt);
      c.offset_us = ((t1 - t0) + (t2 - t3)) / 2.0;
      c.error_us = c.rtt_us / 2.0;
    }
  }
  return c;
}

std::string track_name(int tid) {
  const int track = tid % 10, lane = tid / 10;
  const char* base = track == 1 ? "compute" : track == 2 ? "communication" : track == 3 ? "optimizer" : "other";
  return lane == 0 ? std::string(base) : fmt::format("stage {} {}", lane - 1, base);
}

RankEvents rank_events(const std::vector<Event>& events) {
  return [&events](const std::function<void(const Event&)>& fn) {
    for (const auto& e : events) fn(e);
  };
}

json chrome_trace(const std::vector<std::vector<Event>>& per_rank, const std::vector<ClockSync>& clocks,
                  double zero_us, const json& meta) {
  std::vector<RankEvents> ranks;
  for (const auto& ev : per_rank) ranks.push_back(rank_events(ev));
  std::string text;
  write_chrome_trace(text, ranks, clocks, zero_us, meta);
  return json::parse(text);
}

std::size_t write_chrome_trace(std::string& out, const std::vector<RankEvents>& per_rank,
                               const std::vector<ClockSync>& clocks, double zero_us, const json& meta) {
  if (!clocks.empty() && clocks.size() != per_rank.size())
    throw std::invalid_argument(fmt::format("chrome_trace: {} clock offsets for {} ranks", clocks.size(),
                                            per_rank.size()));
  // The document is {"displayTimeUnit", "otherData", "traceEvents"}: nlohmann::json's dump()
  // orders an object's keys, so this text is the one dump() of the whole tree would give.
  json clock_meta = json::array();
  for (std::size_t r = 0; r < clocks.size(); ++r)
    clock_meta.push_back({{"rank", clocks[r].rank}, {"offset_us", clocks[r].offset_us},
                          {"error_bound_us", clocks[r].error_us}, {"rtt_us", clocks[r].rtt_us},
                          {"exchanges", clocks[r].rounds}});
  json other = meta.is_object() ? meta : json::object();
  other["clock"] = {{"reference", "rank 0's steady clock (CLOCK_MONOTONIC); ts = 0 at rank 0's trace start"},
                    {"method", "NTP-style exchange through the job's store: offset = ((t1-t0)+(t2-t3))/2, "
                               "|error| <= rtt/2, the exchange with the smallest rtt"},
                    {"ranks", clock_meta}};
  out += "{\"displayTimeUnit\":\"ms\",\"otherData\":";
  out += other.dump();
  out += ",\"traceEvents\":[";
  std::size_t count = 0;
  auto emit = [&](const json& j) {
    if (count++ > 0) out += ',';
    out += j.dump();
  };
  // Microseconds with nanosecond resolution (Trace Event Format allows fractional ts).
  auto round_ns = [](double us) { return std::round(us * 1000.0) / 1000.0; };
  for (std::size_t r = 0; r < per_rank.size(); ++r) {
    const int pid = static_cast<int>(r);
    const double offset = clocks.empty() ? 0.0 : clocks[r].offset_us;
    emit({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"tid", 0},
          {"args", {{"name", fmt::format("rank {}", r)}}}});
    emit({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"tid", 0}, {"args", {{"sort_index", pid}}}});
    std::set<int> tids;
    per_rank[r]([&](const Event& e) { tids.insert(e.tid); });
    for (int tid : tids) {
      emit({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", track_name(tid)}}}});
      emit({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", pid}, {"tid", tid}, {"args", {{"sort_index", tid}}}});
    }
    per_rank[r]([&](const Event& e) {
      json j = {{"ph", std::string(1, e.ph)}, {"name", e.name}, {"cat", e.cat}, {"pid", pid}, {"tid", e.tid},
                {"ts", round_ns(e.ts_us + offset - zero_us)}};
      if (e.ph == 'X') j["dur"] = round_ns(e.dur_us);
      if (e.ph == 's' || e.ph == 'f') j["id"] = e.id;
      if (e.ph == 'f') j["bp"] = "e";
      if (!e.args.is_null()) j["args"] = e.args;
      emit(j);
    });
  }
  out += "]}";
  return count;
}

double overlap_fraction(const Intervals& comm, const Intervals& compute) {
  // The union of compute as sorted disjoint intervals.
  Intervals u = compute;
  std::sort(u.begin(), u.end());
  Intervals merged;
  for (const auto& iv : u) {
    if (iv.second <= iv.first) continue;
    if (!merged.empty() && iv.first <= merged.back().second)
      merged.back().second = std::max(merged.back().second, iv.second);
    else
      merged.push_back(iv);
  }
  double total = 0, hidden = 0;
  for (const auto& c : comm) {
    if (c.second <= c.first) continue;
    total += c.second - c.first;
    for (const auto& m : merged) {
      const double a = std::max(c.first, m.first), b = std::min(c.second, m.second);
      if (b > a) hidden += b - a;
    }
  }
  return total > 0 ? hidden / total : 0.0;
}

}  // namespace mpt::trace
