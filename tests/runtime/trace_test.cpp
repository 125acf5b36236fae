// Unit tests of core/runtime/trace: the recorder (off, on, captures), flow ids, the NTP-style clock
// offset, the overlap fraction and the Chrome Trace Event document; core/pipeline/trace's
// slice args (schedule, run, virtual stage) and the order of an in-process message's flow.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <thread>

#include "catch.hpp"
#include "core/pipeline/trace.hpp"
#include "core/pipeline/transport.hpp"
#include "core/runtime/trace.hpp"

using namespace mpt;
using trace::json;

TEST_CASE("trace: nothing is recorded when off, start() records and clears", "[trace]") {
  trace::stop();
  const auto before = trace::event_count();
  trace::complete(trace::Track::Compute, "x", 0, 1);
  { trace::Scope s(trace::Track::Comm, "y"); }
  CHECK(trace::event_count() == before);
  trace::start(0);
  CHECK(trace::event_count() == 0);
  trace::complete(trace::Track::Compute, "forward", 10, 25, {{"microbatch", 3}});
  { trace::Scope s(trace::Track::Optimizer, "step"); }
  trace::stop();
  const auto ev = trace::events();
  REQUIRE(ev.size() == 2);
  CHECK(ev[0].name == "forward");
  CHECK(ev[0].cat == "compute");
  CHECK(ev[0].tid == 1);
  CHECK(ev[0].ts_us == 10);
  CHECK(ev[0].dur_us == 15);
  CHECK(ev[0].args["microbatch"] == 3);
  CHECK(ev[1].tid == 3);
  CHECK(ev[1].dur_us >= 0);
}

namespace {
void render_test(const trace::Deferred& d, trace::Event& e) {
  e.name = "F" + std::to_string(d.i[0]);
  e.args = {{"stage", d.i[1]}, {"big", d.i[2]}, {"schedule", trace::interned(d.i[3])}, {"wait_us", d.d}};
}
}  // namespace

TEST_CASE("trace: a Deferred event is named and given its args and flow when read", "[trace]") {
  const std::string odd = "a\"b\\c\n\x01 \xc3\xa9";  // a quote, a backslash, a newline, a control byte, UTF-8
  trace::Deferred d;
  d.render = render_test;
  d.i = {7, 3, int64_t{1} << 62, trace::intern(odd), 0, 0, 0, 0};
  d.d = 1.0 / 3.0;
  d.flow_out = false;
  d.flow_ts_us = 1.5;
  CHECK(trace::intern(odd) == d.i[3]);  // the same id again
  CHECK(trace::interned(0).empty());
  CHECK_THROWS_AS(trace::interned(1 << 30), std::out_of_range);
  trace::start(0);
  CHECK_THROWS_AS(trace::complete(trace::Track::Compute, trace::Deferred{}, 0, 1), std::invalid_argument);
  trace::set_run_label("zb-h1.m8");
  d.flow = 42;
  d.i[0] = 7;
  trace::complete(trace::Track::Comm, d, 1, 2, /*lane=*/2);
  trace::set_run_label("");
  d.flow = 0;
  d.i[0] = 8;
  trace::complete(trace::Track::Compute, d, 2, 3);
  trace::stop();
  REQUIRE(trace::event_count() == 2);  // two records
  const auto ev = trace::events();
  REQUIRE(ev.size() == 3);  // the first one's flow, read as its own event before its slice
  CHECK(ev[0].ph == 'f');
  CHECK(ev[0].id == 42);
  CHECK(ev[0].ts_us == 1.5);
  CHECK(ev[0].tid == 22);  // Comm + 10 · lane 2, the slice's track
  CHECK(ev[0].cat == "comm");
  CHECK(ev[0].args == json{{"run", "zb-h1.m8"}});
  CHECK(ev[1].ph == 'X');
  CHECK(ev[1].name == "F7");
  CHECK(ev[1].tid == 22);
  CHECK(ev[1].dur_us == 1);
  const json want = {{"stage", 3}, {"big", int64_t{1} << 62}, {"schedule", odd}, {"wait_us", 1.0 / 3.0},
                     {"run", "zb-h1.m8"}};
  CHECK(ev[1].args == want);
  CHECK(ev[1].args["wait_us"].get<double>() == 1.0 / 3.0);  // every bit
  CHECK(ev[2].name == "F8");
  CHECK(ev[2].cat == "compute");
  CHECK_FALSE(ev[2].args.contains("run"));
}

TEST_CASE("trace: a Capture records while tracing is off, then drops its events", "[trace]") {
  trace::stop();
  const auto n0 = trace::event_count();
  {
    trace::Capture cap("n2.overlap_on");
    CHECK(trace::enabled());
    trace::complete(trace::Track::Comm, "all_reduce", 0, 5);
    const auto ev = cap.events();
    REQUIRE(ev.size() == 1);
    CHECK(ev[0].args["run"] == "n2.overlap_on");
  }
  CHECK_FALSE(trace::enabled());
  CHECK(trace::event_count() == n0);
  // Under --trace a capture keeps its events (they belong to the file too).
  trace::start(0);
  {
    trace::Capture cap("a");
    trace::complete(trace::Track::Comm, "all_reduce", 0, 5);
  }
  CHECK(trace::enabled());
  CHECK(trace::event_count() == 1);
  trace::stop();
}

TEST_CASE("trace: the n-th send and the n-th recv of a message share a flow id", "[trace]") {
  trace::start(0);
  const auto s0 = trace::flow_id(true, 0, 1, 'F', 3, 0), s1 = trace::flow_id(true, 0, 1, 'F', 3, 0);
  const auto r0 = trace::flow_id(false, 0, 1, 'F', 3, 0), r1 = trace::flow_id(false, 0, 1, 'F', 3, 0);
  CHECK(s0 == r0);
  CHECK(s1 == r1);
  CHECK(s0 != s1);
  // Other kinds, microbatches, boundaries and directions get other ids.
  std::set<uint64_t> ids{s0, trace::flow_id(true, 0, 1, 'B', 3, 0), trace::flow_id(true, 0, 1, 'F', 4, 0),
                         trace::flow_id(true, 0, 1, 'F', 3, 1), trace::flow_id(true, 1, 0, 'F', 3, 0)};
  // A message between threads of this process never shares an id with one between processes.
  ids.insert(trace::flow_id(true, 0, 1, 'F', 3, 0, /*in_process=*/true));
  CHECK(ids.size() == 6);
  CHECK(ids.count(0) == 0);
  for (auto id : ids) CHECK(id < (uint64_t{1} << 53));
  trace::stop();
}

TEST_CASE("trace: the clock offset of NTP-style exchanges, within rtt/2", "[trace]") {
  // Rank 1's clock is 1000 us behind rank 0's: rank0 = rank1 + 1000. Delays 30 us out, 50 back.
  const double theta = 1000;
  auto exchange = [&](double t0, double d1, double d2, double hold) {
    const double t1 = t0 + d1 + theta, t2 = t1 + hold, t3 = t2 - theta + d2;
    return std::array<double, 4>{t0, t1, t2, t3};
  };
  auto c = trace::clock_from_exchanges(1, {exchange(0, 30, 50, 5), exchange(200, 10, 12, 1), exchange(400, 80, 5, 0)});
  CHECK(c.rounds == 3);
  // The second exchange has the smallest rtt (22 us): offset 1000 + (10 - 12) / 2 = 999.
  CHECK(c.rtt_us == Approx(22));
  CHECK(c.offset_us == Approx(999));
  CHECK(c.error_us == Approx(11));
  CHECK(std::abs(c.offset_us - theta) <= c.error_us);
  auto zero = trace::clock_from_exchanges(0, {});
  CHECK(zero.offset_us == 0);
  CHECK(zero.error_us == 0);
  CHECK_THROWS_AS(trace::clock_from_exchanges(1, {{10, 0, 0, 5}}), std::invalid_argument);
}

TEST_CASE("trace: overlap_fraction is the part of comm inside the union of compute", "[trace]") {
  // comm [0,10] and [20,30]; compute [5,12], [8,25] (overlapping): union [5,25].
  // Inside: [5,10] (5) + [20,25] (5) = 10 of 20.
  CHECK(trace::overlap_fraction({{0, 10}, {20, 30}}, {{8, 25}, {5, 12}}) == Approx(0.5));
  CHECK(trace::overlap_fraction({{0, 10}}, {}) == 0);
  CHECK(trace::overlap_fraction({}, {{0, 10}}) == 0);
  CHECK(trace::overlap_fraction({{2, 4}}, {{0, 10}}) == Approx(1.0));
}

TEST_CASE("trace: chrome_trace names processes and threads and applies the clock offsets", "[trace]") {
  trace::Event x;
  x.name = "F0";
  x.cat = "compute";
  x.tid = 1;
  x.ts_us = 100;
  x.dur_us = 20;
  trace::Event s = x, f = x;
  s.ph = 's';
  s.cat = "comm";
  s.tid = 2;
  s.id = 7;
  f = s;
  f.ph = 'f';
  trace::ClockSync c0, c1;
  c1.rank = 1;
  c1.offset_us = 50;
  c1.error_us = 3;
  const json doc = trace::chrome_trace({{x, s}, {x, f}}, {c0, c1}, 90, {{"experiment", "pipeline"}});
  REQUIRE(doc.contains("traceEvents"));
  CHECK(doc["otherData"]["experiment"] == "pipeline");
  CHECK(doc["otherData"]["clock"]["ranks"][1]["error_bound_us"] == 3.0);
  int names = 0, threads = 0;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") {
      ++names;
      CHECK(e["args"]["name"] == "rank " + std::to_string(e["pid"].get<int>()));
    }
    if (e["ph"] == "M" && e["name"] == "thread_name") ++threads;
    if (e["ph"] == "X" && e["pid"] == 0) CHECK(e["ts"] == 10.0);  // 100 + 0 - 90
    if (e["ph"] == "X" && e["pid"] == 1) CHECK(e["ts"] == 60.0);  // 100 + 50 - 90
    if (e["ph"] == "f") CHECK(e["bp"] == "e");
    if (e["ph"] == "s" || e["ph"] == "f") CHECK(e["id"] == 7);
  }
  CHECK(names == 2);
  CHECK(threads == 4);  // (0: compute, communication), (1: compute, communication)
  CHECK(trace::track_name(2) == "communication");
  CHECK(trace::track_name(1 + 10 * 3) == "stage 2 compute");
  CHECK_THROWS_AS(trace::chrome_trace({{x}}, {c0, c1}, 0, json::object()), std::invalid_argument);
  // events_json round trip (what ranks send to rank 0).
  const auto back = trace::events_from_json(trace::events_json({x, s}));
  REQUIRE(back.size() == 2);
  CHECK(back[1].ph == 's');
  CHECK(back[1].id == 7);
  CHECK(back[0].dur_us == 20);
  // The same read as text, event by event (rank 0 reading another rank's part).
  const auto streamed = trace::events_from_text(trace::events_json({x, s}).dump());
  REQUIRE(streamed.size() == 2);
  CHECK(trace::events_json(streamed) == trace::events_json(back));
  CHECK(trace::events_from_text("[]").empty());
  CHECK_THROWS_AS(trace::events_from_text("{}"), std::invalid_argument);
  CHECK_THROWS_AS(trace::events_from_text("[1]"), std::invalid_argument);
  CHECK_THROWS(trace::events_from_text("[{\"ph\": \"X\"}"));
}

TEST_CASE("trace: write_chrome_trace writes the text dump() gives, event by event", "[trace]") {
  // The harness writes the file with write_chrome_trace (no JSON tree of the whole trace); its
  // text must be what dump() of the document gives: the same keys in dump()'s order, the same
  // separators and numbers, so the file is the one the tree would have made.
  trace::Event x;
  x.name = "B3";
  x.cat = "compute";
  x.tid = 21;
  x.ts_us = 1234.56789;
  x.dur_us = 0.1 + 0.2;
  x.args = {{"microbatch", 3}, {"run", "1f1b.m8"}, {"bytes", 4096}};
  trace::Event s = x;
  s.ph = 's';
  s.cat = "comm";
  s.tid = 2;
  s.id = (uint64_t{1} << 52) + 5;
  s.args = nullptr;
  trace::Event f = s;
  f.ph = 'f';
  trace::ClockSync c0, c1;
  c1.rank = 1;
  c1.offset_us = -17.25;
  c1.error_us = 2.5;
  c1.rtt_us = 5;
  c1.rounds = 16;
  const std::vector<trace::Event> r0{x, s}, r1{f, x};
  std::string text = "keep:";  // appended to
  const std::size_t n = trace::write_chrome_trace(text, {trace::rank_events(r0), trace::rank_events(r1)}, {c0, c1},
                                                  1000.0, {{"experiment", "pipeline"}, {"config", {{"b", 1}, {"a", 2}}}});
  REQUIRE(text.rfind("keep:", 0) == 0);
  text.erase(0, 5);
  const json doc = json::parse(text);
  CHECK(doc.dump() == text);
  CHECK(n == doc["traceEvents"].size());
  // 2 process entries and 2 thread entries per (rank, tid), then the events: 2·2 + 2·2·2 + 4.
  CHECK(n == 16);
  CHECK(doc["traceEvents"].back()["ts"] == Approx(1234.56789 - 17.25 - 1000.0).margin(1e-3));
  CHECK_THROWS_AS(trace::write_chrome_trace(text, {trace::rank_events(r0)}, {c0, c1}, 0, json::object()),
                  std::invalid_argument);
}

TEST_CASE("trace: write_events_json and for_each_event read the recorder as events() does", "[trace]") {
  trace::start(0);
  trace::complete(trace::Track::Compute, "fwd", 1, 2, {{"microbatch", 0}});
  trace::complete(trace::Track::Comm, "all_reduce", 2, 5, {{"bytes", 64}});
  trace::complete(trace::Track::Optimizer, "step", 5, 6);
  trace::stop();
  std::string text;
  trace::write_events_json(text);
  CHECK(text == trace::events_json(trace::events()).dump());
  std::vector<std::string> names;
  trace::for_each_event([&](const trace::Event& e) { names.push_back(e.name); });
  CHECK(names == std::vector<std::string>{"fwd", "all_reduce", "step"});
}

TEST_CASE("trace: events from many threads are all kept", "[trace]") {
  trace::start(0);
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([t] {
      for (int i = 0; i < 250; ++i) trace::complete(trace::Track::Compute, "op", i, i + 1, nullptr, t + 1);
    });
  for (auto& t : ts) t.join();
  CHECK(trace::event_count() == 1000);
  trace::stop();
}

TEST_CASE("pipeline trace: slices carry their schedule, run and virtual stage (V: 2p - 1 - s)", "[trace]") {
  trace::start(0);
  trace_pipeline_sweep("threads", 2, {"1f1b", "zb-v"});
  const auto t0 = std::chrono::steady_clock::now();
  // Stage 1 of p = 2: zb-v's chunk 1 is virtual stage 2p - 1 - 1 = 2; a loop chunk 1 is 1 + 2 = 3.
  const std::vector<PipeEvent> ev = {{1, {'F', 0, 0}, 0.0, 1e-3, 0.0}, {1, {'W', 0, 1}, 2e-3, 3e-3, 0.0}};
  {
    PipelineTraceRun r("zb-v.m1", "zb-v", 1, 2, Placement::V);
    trace_stage_events(ev, t0, 1, 2, Placement::V, /*threaded=*/true);
  }
  trace_stage_events(ev, t0, 1, 2, Placement::Loop, /*threaded=*/true);  // outside a run: no label
  trace::stop();
  const auto got = trace::events();
  REQUIRE(got.size() == 4);
  CHECK(got[0].name == "F0");
  CHECK(got[0].tid == 21);  // lane 2: stage 1's compute track
  CHECK(got[0].args["virtual_stage"] == 1);
  CHECK(got[1].name == "W0.1");
  CHECK(got[1].args["virtual_stage"] == 2);
  CHECK(got[1].args["schedule"] == "zb-v");
  CHECK(got[1].args["run"] == "zb-v.m1");
  CHECK(got[1].dur_us == Approx(1e3));
  CHECK(got[3].args["virtual_stage"] == 3);
  CHECK(got[3].args["schedule"] == "");
  CHECK_FALSE(got[3].args.contains("run"));
  CHECK(got[3].args["step"].get<int64_t>() == got[1].args["step"].get<int64_t>() + 1);  // the lane's next step
  const json meta = trace::metadata()["pipeline"];
  CHECK(meta["executor"] == "threads");
  CHECK(meta["schedules"] == json::array({"1f1b", "zb-v"}));
  REQUIRE(meta["runs"].size() == 1);
  CHECK(meta["runs"][0] == json({{"run", "zb-v.m1"}, {"schedule", "zb-v"}, {"microbatches", 1}, {"chunks", 2},
                                 {"placement", "v"}}));
}

TEST_CASE("pipeline trace: an in-process message's recv flow never precedes its send's", "[trace]") {
  // Two stage threads ping-pong 2 000 messages through a QueueTransport, so that the receiver
  // is polling when each message is stored and finds it within a microsecond (CI, stop 31: the
  // recv's flow, put a fixed 1 µs inside its slice's end, came 0.23 µs before the send's).
  // Causality holds on one steady clock: the send's flow is a time before the store, the
  // recv's a time after it was found; and each flow lies inside its own slice.
  constexpr int kMessages = 1000;
  trace::start(0);
  {
    QueueTransport tr(10);
    const auto t = torch::zeros({4});
    std::thread stage1([&] {
      for (int i = 0; i < kMessages; ++i) tr.send(1, 0, 'B', i, tr.recv(0, 1, 'F', i));
    });
    for (int i = 0; i < kMessages; ++i) {
      tr.send(0, 1, 'F', i, t);
      tr.recv(1, 0, 'B', i);
    }
    stage1.join();
  }
  trace::stop();
  std::map<uint64_t, const trace::Event*> starts, finishes;
  const auto ev = trace::events();
  for (const auto& e : ev) {
    if (e.ph == 's') starts[e.id] = &e;
    if (e.ph == 'f') finishes[e.id] = &e;
  }
  REQUIRE(starts.size() == 2 * kMessages);
  REQUIRE(finishes.size() == 2 * kMessages);
  int early = 0, outside = 0;
  for (const auto& [id, s] : starts) {
    REQUIRE(finishes.count(id) == 1);
    if (finishes[id]->ts_us < s->ts_us) ++early;
  }
  // Each flow event inside a message slice of its own track (tid).
  for (const auto& f : ev) {
    if (f.ph != 's' && f.ph != 'f') continue;
    const bool in = std::any_of(ev.begin(), ev.end(), [&f](const trace::Event& x) {
      return x.ph == 'X' && x.tid == f.tid && x.ts_us <= f.ts_us && f.ts_us <= x.ts_us + x.dur_us;
    });
    if (!in) ++outside;
  }
  CHECK(early == 0);
  CHECK(outside == 0);
}
