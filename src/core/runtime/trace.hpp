// Timelines: a process-wide recorder of what each rank did when, written as a Chrome Trace
// Event Format JSON file (the format of chrome://tracing and ui.perfetto.dev; Google's "Trace
// Event Format" document, and Perfetto's JSON importer) — the file PyTorch's profiler and
// torch.distributed.pipelining write, here with durations, communication tracks and flows.
//
//   trace::start(rank);                                   // the harness, for --trace FILE
//   { trace::Scope s(trace::Track::Compute, "backward"); loss.backward(); }
//   trace::complete(trace::Track::Comm, "all_reduce", t0_us, t1_us, {{"bytes", n}});
//   trace::write_chrome_trace(text, per_rank, clocks, zero_us, meta);  // rank 0, at the end:
//                                            // the file's text, event by event (chrome_trace: as JSON)
//
// Layout of a file: one process (pid) per rank, named "rank R"; in it one thread (tid) per
// track: compute (forward / backward / F, B, W of a pipeline microbatch), communication (every
// collective and send/recv, with bytes and peer) and optimizer. A pipeline that runs its stages
// as threads of one process puts stage s on tracks of lane s + 1 ("stage s compute", ...).
// Timestamps are microseconds on rank 0's steady clock, from rank 0's start(); the other ranks'
// clocks are moved by their measured offsets (ClockSync, NTP-style), stated in the metadata.
//
// Cost when off: one relaxed atomic load per hook (enabled()). When on: one mutex-guarded
// push_back per event (a handful per training step; bench.sh measures the overhead); the
// per-microbatch hooks record numbers only (Deferred), named and formatted when read.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace mpt::trace {

using json = nlohmann::json;

/// The tracks of a rank (thread ids in the file: track + 10 · lane).
enum class Track : int {
  Compute = 1,    ///< forward, backward, pipeline F/B/W per microbatch
  Comm = 2,       ///< collectives and send/recv (bytes, peer)
  Optimizer = 3,  ///< the optimizer step
};

/// One recorded event. `ph` is the Trace Event phase: 'X' a complete event (ts, dur),
/// 's' / 'f' the start / finish of a flow arrow with `id` (bound to the slice of the same
/// pid, tid, cat and ts; 'f' with "bp": "e", Trace Event Format's "enclosing slice" binding).
struct Event {
  char ph = 'X';
  std::string name;
  std::string cat;      ///< "compute", "comm" or "optimizer" (flows take their slice's)
  int tid = 1;          ///< Track + 10 · lane
  double ts_us = 0;     ///< start, microseconds on this process's steady clock (now_us())
  double dur_us = 0;    ///< 'X' only
  uint64_t id = 0;      ///< flows only
  json args;            ///< null or an object (bytes, peer, microbatch, ...)
};

namespace detail {
extern std::atomic<bool> g_on;
}  // namespace detail

/// Whether events are being recorded (the only cost of a hook when tracing is off).
inline bool enabled() { return detail::g_on.load(std::memory_order_relaxed); }

/// This process's steady clock (std::chrono::steady_clock, CLOCK_MONOTONIC) in microseconds.
double now_us();
/// A steady_clock time point in the units of now_us().
double to_us(std::chrono::steady_clock::time_point t);

/// Starts recording for --trace (the harness): clears what was recorded, remembers `rank`
/// and the start time (the zero of the file on rank 0).
void start(int rank);
/// Stops recording (events stay until the next start()).
void stop();
/// The start() time in now_us() units (0 when never started).
double start_us();

/// Records a complete event [start_us, end_us] on `track` of `lane` (0: this rank's own
/// tracks; s + 1: stage s of a pipeline on threads). No-op when disabled.
void complete(Track track, std::string name, double start_us, double end_us, json args = nullptr, int lane = 0);

/// An event recorded as numbers, its name and args made only when the events are read
/// (events_since), off the run's timed path: for the hooks that run several times per
/// microbatch (a pipeline's slices and in-process messages). Recording one copies this struct
/// under the recorder's lock: no formatting, no allocation but the buffer's amortised growth
/// (about 0.1 µs, against 2.5 µs for formatting a name and eight args; bench.sh's trace rows
/// measure the step). `render` fills the slice's name and args from the fields, in the
/// layout its hook chose; strings travel as intern() ids. A flow (`flow` != 0) bound to the
/// slice is stored with it and read as its own event just before the slice, as flow() then
/// complete() would have recorded them.
struct Deferred {
  /// Makes the slice's name and args (Event::name, Event::args) from `d`. Runs with the
  /// recorder's lock held: it may call interned(), nothing else of this API.
  using Render = void (*)(const Deferred& d, Event& e);
  Render render = nullptr;
  std::array<int64_t, 8> i{};  ///< integer fields (the hook's layout)
  double d = 0;                ///< a double field
  uint64_t flow = 0;           ///< 0: no flow; else the id of a flow start or finish bound to the slice
  bool flow_out = true;        ///< the flow's side: start ('s', the send) or finish ('f', the receive)
  double flow_ts_us = 0;       ///< the flow event's timestamp (inside the slice)
};

/// Records a complete event [start_us, end_us] whose name and args `d.render` makes when the
/// events are read (see Deferred). No-op when disabled. Throws std::invalid_argument for a
/// Deferred without render.
void complete(Track track, const Deferred& d, double start_us, double end_us, int lane = 0);

/// The id of `s` in the recorder's string table (one lock and a map lookup), for a Deferred's
/// fields; the same string gets the same id while the process lives (start() keeps the table).
int64_t intern(const std::string& s);
/// The string of an intern() id, for Deferred::render only (it reads the table without
/// locking: render runs with the recorder's lock held). Throws std::out_of_range for an id
/// intern() never returned.
const std::string& interned(int64_t id);

/// RAII: a complete event from construction to destruction (when enabled at construction).
class Scope {
 public:
  Scope(Track track, const char* name, json args = nullptr, int lane = 0);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Track track_;
  const char* name_;
  json args_;
  int lane_;
  double t0_ = -1;
};

/// A flow id for the message (src → dst, kind, microbatch, boundary): the n-th send of that
/// key on the sender (`send` = true) and the n-th receive of it on the receiver get the same
/// id (both sides count the key's messages, in the order the protocol sends them, which
/// send/recv matching by tag already requires). `in_process`: both ends are threads of this
/// process (a pipeline on threads), counted apart from messages between processes and tagged
/// with this rank, so the two kinds never share an id. Ids stay below 2^53 (exact in the
/// doubles of JavaScript trace viewers): fields of 4 (domain), 12 (n, mod 4096), 6, 6
/// (stages), 2 (kind), 13 (microbatch) and 8 (boundary) bits. Thread-safe; the counters
/// restart at start().
uint64_t flow_id(bool send, int src, int dst, char kind, int microbatch, int boundary, bool in_process = false);

/// Point-to-point annotation for the next communication event that this thread records
/// (dist_group's send/recv): extra args and a flow start (`out`) or finish bound to it.
/// Used by the pipeline transports, which know the message's (kind, microbatch, boundary).
struct P2P {
  std::string name;   ///< the slice's name ("": the operation's, e.g. "send")
  uint64_t flow = 0;  ///< 0: no flow
  bool out = true;    ///< true: the send side ('s'), false: the receive side ('f')
  json args;
};
/// Sets this thread's pending annotation (replacing an unused one). No-op when disabled.
void annotate_next(P2P p);
/// Takes (and clears) this thread's pending annotation; empty P2P when none.
P2P take_annotation();

/// Records the flow event of `p` bound to the slice that starts at `ts_us` on `track`/`lane`.
void flow(const P2P& p, Track track, double ts_us, int lane = 0);

/// A label added as args.run to every event recorded while it is set ("" : none), so that a
/// reader can pick the events of one part of a run (e.g. "n2.overlap_on"). Process-wide.
void set_run_label(std::string label);

/// Metadata that goes to the file's otherData (experiment, device, backend, config, ...).
void set_metadata(const std::string& key, json value);
/// The metadata set so far.
json metadata();

/// A copy of the events recorded so far (this process), in recording order.
std::vector<Event> events();
/// How many events have been recorded so far (an index for events_since).
std::size_t event_count();
/// The events recorded from index `from` on.
std::vector<Event> events_since(std::size_t from);

/// Calls `fn` with each recorded event in recording order (as events() would return them),
/// one at a time, without copying the whole list: for writing a large trace. Holds the
/// recorder's lock throughout, so `fn` must not record events or call this API.
void for_each_event(const std::function<void(const Event&)>& fn);

/// Records events within its lifetime even without --trace (an experiment that computes a
/// figure from the recorded intervals, e.g. dataparallel's overlap). When tracing was off, it
/// is off again afterwards and the events of the capture are dropped from the recorder.
class Capture {
 public:
  /// `label`: the run label (set_run_label) while the capture lasts.
  explicit Capture(std::string label);
  ~Capture();
  Capture(const Capture&) = delete;
  Capture& operator=(const Capture&) = delete;
  /// The events recorded since construction.
  std::vector<Event> events() const;

 private:
  std::size_t from_;
  bool owner_;  // tracing was off: this capture turned it on
};

/// Events as JSON (compact: ph, name, cat, tid, ts, dur, id, args), for sending to rank 0.
json events_json(const std::vector<Event>& ev);
/// The text of events_json(events()).dump(), written event by event into `out` (appended)
/// from the recorder (for_each_event): no copy of the list, no JSON tree of it.
void write_events_json(std::string& out);
/// Inverse of events_json. Throws nlohmann::json::exception on malformed input.
std::vector<Event> events_from_json(const json& j);
/// events_from_json(json::parse(text)) without the JSON tree of the whole array: each event is
/// made as soon as it is parsed (rank 0 reading another rank's events: the tree took about 40
/// bytes of memory per byte of text). Throws nlohmann::json::exception on malformed JSON,
/// std::invalid_argument when the text is not an array of objects.
std::vector<Event> events_from_text(const std::string& text);

/// A rank's clock against rank 0's, from NTP-style exchanges (RFC 5905's on-wire protocol):
/// rank r sends at t0 (its clock), rank 0 receives at t1 and answers at t2 (rank 0's clock),
/// rank r receives at t3. offset = ((t1 − t0) + (t2 − t3)) / 2 is rank 0's clock minus rank
/// r's; whatever the two one-way delays d1, d2 ≥ 0 are, the true offset lies within
/// ± rtt/2 of it, rtt = (t3 − t0) − (t2 − t1) = d1 + d2. The exchange with the smallest rtt wins.
struct ClockSync {
  int rank = 0;
  double offset_us = 0;  ///< add to this rank's timestamps to get rank 0's clock
  double error_us = 0;   ///< bound on |true offset − offset_us|: rtt / 2 of the exchange used
  double rtt_us = 0;
  int rounds = 0;        ///< exchanges made
};
/// ClockSync from exchanges {t0, t1, t2, t3} in microseconds (rank 0: offset 0, error 0 with
/// no exchanges). Throws std::invalid_argument for an exchange with t3 < t0 or t2 < t1.
ClockSync clock_from_exchanges(int rank, const std::vector<std::array<double, 4>>& exchanges);

/// The Chrome Trace Event document: {"traceEvents": [...], "displayTimeUnit": "ms",
/// "otherData": {...}}. `per_rank[r]` are rank r's events (its steady clock), `clocks[r]` its
/// offset (clocks may be empty for one rank), `zero_us` the time (rank 0's clock) that
/// becomes ts = 0. Adds "M" events process_name "rank R", process_sort_index, thread_name of
/// every (pid, tid) used; otherData gets `meta` and "clock": offsets and error bounds.
/// Throws std::invalid_argument when clocks is neither empty nor per_rank.size() long.
json chrome_trace(const std::vector<std::vector<Event>>& per_rank, const std::vector<ClockSync>& clocks,
                  double zero_us, const json& meta);

/// One rank's events for write_chrome_trace: calls its argument with each event, in order
/// (write_chrome_trace visits each rank twice: the thread ids, then the events).
using RankEvents = std::function<void(const std::function<void(const Event&)>&)>;
/// RankEvents over a vector (which must outlive it).
RankEvents rank_events(const std::vector<Event>& events);

/// The text of chrome_trace(...).dump(), byte for byte, written event by event into `out`
/// (appended): memory grows with the text only, not with a JSON tree of every event (about 40
/// bytes of memory per byte of text; docs/timelines.md, "Memory"). Returns the number of
/// entries of traceEvents (the "M" metadata events included). Throws as chrome_trace.
std::size_t write_chrome_trace(std::string& out, const std::vector<RankEvents>& per_rank,
                               const std::vector<ClockSync>& clocks, double zero_us, const json& meta);

/// Name of a thread id ("compute", "communication", "optimizer"; "stage S compute" etc. for
/// lane S + 1).
std::string track_name(int tid);

/// Intervals [begin, end] (any unit).
using Intervals = std::vector<std::pair<double, double>>;
/// The fraction of the total length of `comm` that lies inside the union of `compute`
/// (DDP's measure of overlap: all-reduce time hidden behind backward). 0 when `comm` has no
/// length. Intervals may overlap each other and come in any order.
double overlap_fraction(const Intervals& comm, const Intervals& compute);

}  // namespace mpt::trace
