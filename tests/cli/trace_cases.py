#!/usr/bin/env python3
"""Timelines (--trace FILE, docs/timelines.md): runs mpt and checks the file it writes.

    tests/cli/trace_cases.py MPT CASE          # CASE: see CASES below
    tests/cli/trace_cases.py --check TRACE     # only validate a trace file

Every written trace is validated against the Chrome Trace Event Format (the fields each
phase needs, numbers for ts/dur, integer pid/tid, every flow start with exactly one finish,
each flow bound to a slice of its pid/tid/cat, properly nested slices per thread). Then, per
case: every pipeline send has its recv flow and no recv finishes before its send began (up to
the two ranks' clock error bounds); a sweep of every schedule (gpipe, 1f1b, interleaved-1f1b,
zb-h1, zb-v) on threads and on processes: each compute slice names its schedule, run and
virtual stage, the metadata its ranks, devices, schedules and config, and the bubble computed
from the trace equals the experiment's own `measured` table within 0.01 (absolute) for every
schedule, while one perturbed slice moves it beyond that; dataparallel's hidden fraction
likewise; an unwritable --trace exits 2 before the run and writes nothing; a failed run leaves
an existing trace untouched (atomic write) and no temporary file; a trace that cannot be written
(/dev/full) leaves an existing result untouched; --out or --trace naming the config: exit 2; a
rank's events beyond the 8 MiB that one message of the job's store may carry reach the file.
Exit 0 pass, 1 fail.
"""
import bisect
import json
import os
import subprocess
import sys
import tempfile

TOL = 0.01  # the bound: trace-derived fractions equal the tables within 1 % (absolute)
EPS_US = 0.002  # timestamps are written rounded to 1 ns: 2 ns covers ts + dur rounding


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def validate(path):
    """Validates the file against the Trace Event Format; returns the document."""
    with open(path) as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        fail(f"{path}: expected an object with a traceEvents array")
    evs = doc["traceEvents"]
    slices = {}  # (pid, tid) -> [(ts, end, cat)]
    flows = {"s": {}, "f": {}}
    names = set()
    for i, e in enumerate(evs):
        ph = e.get("ph")
        for k in ("ph", "name", "pid", "tid"):
            if k not in e:
                fail(f"event {i} ({e}): missing '{k}'")
        if not isinstance(e["pid"], int) or not isinstance(e["tid"], int) or isinstance(e["pid"], bool):
            fail(f"event {i}: pid/tid must be integers")
        if not isinstance(e["name"], str):
            fail(f"event {i}: name must be a string")
        if ph == "M":
            if e["name"] not in ("process_name", "thread_name", "process_sort_index", "thread_sort_index"):
                fail(f"event {i}: unknown metadata {e['name']}")
            if not isinstance(e.get("args"), dict):
                fail(f"event {i}: metadata without args")
            if e["name"] == "process_name":
                names.add(e["pid"])
            continue
        if not is_num(e.get("ts")) or not isinstance(e.get("cat"), str):
            fail(f"event {i} ({ph}): ts must be a number and cat a string")
        if ph == "X":
            if not is_num(e.get("dur")) or e["dur"] < 0:
                fail(f"event {i}: X needs dur >= 0")
            slices.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"], e["cat"], e))
        elif ph in ("s", "f"):
            if not isinstance(e.get("id"), int):
                fail(f"event {i}: flow without an integer id")
            if ph == "f" and e.get("bp") != "e":
                fail(f"event {i}: flow finish without bp 'e'")
            if e["id"] in flows[ph]:
                fail(f"flow id {e['id']}: two '{ph}' events")
            flows[ph][e["id"]] = e
        else:
            fail(f"event {i}: unexpected phase {ph}")
    pids = {p for (p, _) in slices}
    if not pids <= names:
        fail(f"pids without a process_name: {sorted(pids - names)}")
    # Slices of one thread nest (Perfetto's JSON importer requires it).
    for key, lst in slices.items():
        lst.sort(key=lambda s: (s[0], -s[1]))
        stack = []
        for b, e, _, ev in lst:
            while stack and b >= stack[-1] - EPS_US:
                stack.pop()
            if stack and e > stack[-1] + EPS_US:
                fail(f"pid {key[0]} tid {key[1]}: slice {ev['name']} [{b}, {e}] overlaps its enclosing slice "
                     f"ending at {stack[-1]} without nesting")
            stack.append(e)
    if set(flows["s"]) != set(flows["f"]):
        miss = sorted(set(flows["s"]) ^ set(flows["f"]))[:5]
        fail(f"flows without their other end: {len(set(flows['s']) ^ set(flows['f']))} (ids {miss})")

    # Some slice of the flow's pid, tid and cat holds its ts: of the slices that start by ts, the
    # one that ends last must end at ts or later (sorted starts, prefix maxima of the ends, a
    # bisection per flow: a trace of 10^5 events is checked in a second, not in minutes).
    by_cat = {}
    for (pid, tid), lst in slices.items():
        for b, e, cat, _ in lst:
            by_cat.setdefault((pid, tid, cat), []).append((b, e))
    index = {}
    for key, lst in by_cat.items():
        lst.sort()
        ends, m = [], float("-inf")
        for _, e in lst:
            m = max(m, e)
            ends.append(m)
        index[key] = ([b for b, _ in lst], ends)

    def bound(ev):
        starts, ends = index.get((ev["pid"], ev["tid"], ev["cat"]), ([], []))
        i = bisect.bisect_right(starts, ev["ts"] + EPS_US)
        return i > 0 and ends[i - 1] + EPS_US >= ev["ts"]

    for ph in ("s", "f"):
        for fid, ev in flows[ph].items():
            if not bound(ev):
                fail(f"flow {fid} '{ph}' at {ev['ts']} (pid {ev['pid']} tid {ev['tid']}) is inside no slice")
    # Causality: a message is received after it was sent, up to the ranks' clock error bounds.
    err = {r["rank"]: r["error_bound_us"] for r in doc.get("otherData", {}).get("clock", {}).get("ranks", [])}
    for fid, s in flows["s"].items():
        f = flows["f"][fid]
        slack = err.get(s["pid"], 0) + err.get(f["pid"], 0) + EPS_US
        if f["ts"] < s["ts"] - slack:
            fail(f"flow {fid}: received at {f['ts']} before sent at {s['ts']} (clock slack {slack} us)")
    # Every pipeline send slice carries a flow start, every recv slice a flow finish (the flows'
    # times per phase, pid and tid, sorted: the first at or after the slice's start is inside it).
    flow_ts = {}
    for ph in ("s", "f"):
        for fl in flows[ph].values():
            flow_ts.setdefault((ph, fl["pid"], fl["tid"]), []).append(fl["ts"])
    for v in flow_ts.values():
        v.sort()
    for lst in slices.values():
        for b, e, cat, sl in lst:
            n = sl["name"]
            if n.startswith("send ") or n.startswith("recv "):
                ph = "s" if n.startswith("send ") else "f"
                ts = flow_ts.get((ph, sl["pid"], sl["tid"]), [])
                i = bisect.bisect_left(ts, b - EPS_US)
                if i == len(ts) or ts[i] > e + EPS_US:
                    fail(f"{n} at {b} (pid {sl['pid']}) has no flow {ph}")
    nx = sum(len(v) for v in slices.values())
    print(f"ok: {path}: {len(evs)} events, {nx} slices, {len(flows['s'])} flows, {len(pids)} process(es)")
    return doc


def x_events(doc):
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"]


def pipeline_ops(doc, lanes):
    """The pipeline's F/B/W slices (compute track, args.kind) on the `lanes`: 'processes' (lane 0
    of every rank) or 'threads' (lanes >= 1: stage s on lane s + 1)."""
    return [e for e in x_events(doc) if e["tid"] % 10 == 1 and (e["tid"] // 10 == 0) == (lanes == "processes")
            and isinstance(e.get("args"), dict) and "kind" in e["args"]]


def step_bubble(ops):
    """measured_bubble (core/pipeline) of one step's slices: mean over stages of 1 - busy/span,
    busy = the stage's summed slice durations, span = first start to last end over all stages.
    Returns (bubble, span_us, stages)."""
    first = min(e["ts"] for e in ops)
    last = max(e["ts"] + e["dur"] for e in ops)
    busy = {}
    for e in ops:
        busy[e["args"]["stage"]] = busy.get(e["args"]["stage"], 0.0) + e["dur"]
    span = last - first
    return sum(1 - b / span for b in busy.values()) / len(busy), span, len(busy)


def bubble_from_trace(ops, run):
    """The bubble of run `run` (a row name of the measured table): its steps (args.run, args.step)
    as step_bubble, and of those the one the experiment reports - the median step time
    (order[n / 2] of the steps sorted by step time). Returns (bubble, span_us, stages, the
    step's slices)."""
    steps = {}
    for e in ops:
        if e["args"].get("run") == run:
            steps.setdefault(e["args"]["step"], []).append(e)
    if not steps:
        fail(f"no pipeline slices of run {run}")
    per = sorted((step_bubble(v) + (v,) for v in steps.values()), key=lambda t: t[1])
    return per[len(per) // 2]


def hidden_from_trace(doc, run):
    """dataparallel's hidden fraction from the trace: rank 0's bucket all-reduce slices of `run`
    inside the union of its backward slices, over their total."""
    ev = [e for e in x_events(doc) if e["pid"] == 0 and isinstance(e.get("args"), dict) and e["args"].get("run") == run]
    comm = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e["tid"] == 2 and "bucket" in e["args"]]
    bwd = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e["tid"] == 1 and e["name"] == "backward")
    if not comm or not bwd:
        fail(f"run {run}: no bucket all-reduce or backward slices in the trace")
    merged = []
    for b, e in bwd:
        if merged and b <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([b, e])
    total = sum(e - b for b, e in comm)
    hidden = sum(max(0.0, min(e, m1) - max(b, m0)) for b, e in comm for m0, m1 in merged)
    return hidden / total


def run(mpt, args, tmp, want=0):
    p = subprocess.run([mpt] + args, cwd=tmp, capture_output=True, text=True, timeout=600)
    if p.returncode != want:
        print(p.stdout[-3000:])
        print(p.stderr[-3000:])
        fail(f"mpt {' '.join(args)}: exit {p.returncode}, expected {want}")
    return p


# Every schedule in one run (one process start): p = 4 on threads, 2 on processes; m = 4 (a
# multiple of p, as interleaved-1f1b needs); 8 layers (p x 2 chunks for interleaved and zb-v).
# 1 ms per layer. On processes the table and the trace both put every rank's events on rank
# 0's clock (offsets measured through the store: the executor's own exchange and --trace's);
# they used to differ by (1 - b) x skew / step when the table aligned each rank at its own exit
# from the step's barrier, which failed this check under load (zb-v 4.4e-2, zb-h1 2.9e-2 with
# two busy loops beside it; docs/timelines.md).
SCHEDULES = ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v"]
SWEEP = ["pipeline", "--set", "cost.forward_us=1000", "--set", "pipeline.steps=1", "--set", "pipeline.microbatches=[4]",
         "--set", "pipeline.schedules=" + json.dumps(SCHEDULES), "--set", "sync.enabled=false"]
PIPE = ["pipeline", "--set", "cost.forward_us=300", "--set", "pipeline.steps=1", "--set", "pipeline.microbatches=[4]",
        "--set", 'pipeline.schedules=["1f1b"]']


def case_pipeline(mpt, tmp, executor, extra=()):
    p = 2 if executor == "processes" else 4
    args = SWEEP + ["--set", f"executor={executor}", "--set", f"pipeline.stages={p}", *extra]
    if executor == "processes":
        args += ["--nproc", str(p)]
    run(mpt, args + ["--out", "r.json", "--trace", "t.json"], tmp)
    doc = validate(os.path.join(tmp, "t.json"))
    res = json.load(open(os.path.join(tmp, "r.json")))
    if "pipeline.workers=2" in extra and not res["env"].get("pipeline_workers", "").startswith("2 thread(s) for 4 stages"):
        fail(f"env.pipeline_workers: expected 2 threads for 4 stages, got {res['env'].get('pipeline_workers')!r}")
    # Metadata: rank, device, schedule, config.
    other = doc["otherData"]
    if other.get("experiment") != "pipeline" or other.get("config") != res["config"]:
        fail("otherData lacks the experiment or its resolved config")
    if not isinstance(other.get("device"), str) or [r.get("rank") for r in other.get("ranks", [])] != \
            list(range(p if executor == "processes" else 1)) or not all("device" in r for r in other["ranks"]):
        fail(f"otherData: expected device and ranks [{{rank, device}}...], got {other.get('device')}, {other.get('ranks')}")
    pipe = other.get("pipeline", {})
    if pipe.get("executor") != executor or pipe.get("stages") != p or pipe.get("schedules") != SCHEDULES:
        fail(f"otherData.pipeline: expected executor {executor}, stages {p}, schedules {SCHEDULES}, got {pipe}")
    runs = {r["run"]: r for r in pipe.get("runs", [])}
    nflows = sum(1 for e in doc["traceEvents"] if e.get("ph") == "s")
    if nflows == 0:
        fail("a pipeline trace without send -> recv flows")
    # Every compute slice says its schedule, run, chunk and virtual stage (torch.distributed.
    # pipelining's stage_index: loop c = k p + s; V, zb-v: chunk 1 of rank s is 2p - 1 - s) and
    # sits on its stage's track (threads: lane s + 1; processes: rank s).
    ops = pipeline_ops(doc, executor)
    kinds = {}
    for e in ops:
        a = e["args"]
        r = runs.get(a.get("run"))
        if r is None or a.get("schedule") != r["schedule"]:
            fail(f"slice {e['name']} (pid {e['pid']}): run {a.get('run')} / schedule {a.get('schedule')} not in "
                 f"otherData.pipeline.runs")
        s, k = a["stage"], a["chunk"]
        want = (s if k == 0 else 2 * p - 1 - s) if r["placement"] == "v" else k * p + s
        if a.get("virtual_stage") != want or not 0 <= k < r["chunks"]:
            fail(f"{a['run']} slice {e['name']} of stage {s}: virtual_stage {a.get('virtual_stage')}, expected {want}")
        if (e["tid"] // 10 - 1 if executor == "threads" else e["pid"]) != s:
            fail(f"{a['run']} slice {e['name']} of stage {s} on pid {e['pid']} tid {e['tid']}")
        kinds.setdefault(a["schedule"], set()).add(a["kind"])
    for sch in SCHEDULES:
        want = {"F", "B", "W"} if sch.startswith("zb") else {"F", "B"}
        if kinds.get(sch) != want:
            fail(f"{sch}: slice kinds {sorted(kinds.get(sch, []))}, expected {sorted(want)} (W: its own slices)")
    # The bubble of every schedule from the trace against the measured table.
    rows = {r["name"]: r for r in res["timings"]["measured"]}
    if sorted(rows) != sorted(f"{k}.m4" for k in SCHEDULES):
        fail(f"measured rows: {sorted(rows)}")
    for name, row in rows.items():
        b, span, stages, step_ops = bubble_from_trace(ops, name)
        if stages != p:
            fail(f"{name}: slices of {stages} stages, expected {p}")
        print(f"bubble {name} ({executor}, {stages} stages): trace {b:.5f}, table {row['bubble']:.5f}, "
              f"|diff| {abs(b - row['bubble']):.2e} (bound {TOL})")
        if abs(b - row["bubble"]) > TOL:
            fail(f"{name}: the trace's bubble differs from the measured table")
        # The check can fail: one slice started f x the step earlier lengthens the step by that
        # much and moves the bubble by (1 - b) f / (1 + f): f = 0.1 gives > 0.036 for any b < 0.6;
        # a larger bubble (no synthetic cost on a loaded machine: b near 0.9) takes a larger f,
        # chosen so that the move is 3 x TOL.
        first = min(step_ops, key=lambda e: e["ts"])
        idle = 1 - row["bubble"]
        f = 0.1 if idle * 0.1 / 1.1 > 3 * TOL else 3 * TOL / max(idle - 3 * TOL, 1e-9)
        if idle <= 4 * TOL:
            fail(f"{name}: bubble {row['bubble']:.5f}: too close to 1 for a perturbed slice to show")
        moved = [dict(e, ts=e["ts"] - f * span) if e is first else e for e in step_ops]
        b2 = step_bubble(moved)[0]
        if abs(b2 - row["bubble"]) <= TOL:
            fail(f"{name}: a perturbed slice (moved {f:.2f} x the step) went unnoticed (bubble {b2:.5f} vs "
                 f"{row['bubble']:.5f})")
    print(f"ok: perturbing one slice of each run moves its bubble beyond {TOL}")
    if executor == "processes":
        clocks = doc["otherData"]["clock"]["ranks"]
        if len(clocks) != 2 or clocks[1]["exchanges"] < 1:
            fail(f"expected the clock offsets of 2 ranks, got {clocks}")
        print(f"clock: rank 1 offset {clocks[1]['offset_us']:.1f} us, error bound {clocks[1]['error_bound_us']:.1f} us")


def case_dataparallel(mpt, tmp):
    run(mpt, ["dataparallel", "--config", os.path.join(ROOT, "configs/dataparallel_quick.json"), "--set",
              "train.nprocs=[2]", "--set", "train.nosync_steps=0", "--out", "r.json", "--trace", "t.json"], tmp)
    doc = validate(os.path.join(tmp, "t.json"))
    res = json.load(open(os.path.join(tmp, "r.json")))
    rows = res["timings"]["overlap"]
    if set(rows) != {"n2.overlap_on", "n2.overlap_off"}:
        fail(f"overlap rows: {sorted(rows)}")
    for name, row in rows.items():
        h = hidden_from_trace(doc, name)
        print(f"hidden {name}: trace {h:.5f}, table {row['hidden']:.5f}, |diff| {abs(h - row['hidden']):.2e}")
        if abs(h - row["hidden"]) > TOL:
            fail("the trace's hidden fraction differs from the overlap table")
    names = {e["name"] for e in x_events(doc)}
    for n in ("forward", "backward", "optimizer.step", "wait all-reduce"):
        if n not in names:
            fail(f"no '{n}' slice")
    if not any(n.startswith("all_reduce bucket") for n in names):
        fail("no bucket all-reduce slices")
    if not any(e["name"] == "broadcast" and e["args"].get("bytes", 0) > 0 for e in x_events(doc)):
        fail("no broadcast slice with bytes")


def case_single(mpt, tmp):
    run(mpt, ["underflow", "--out", "r.json", "--trace", "sub/t.json"], tmp)
    doc = validate(os.path.join(tmp, "sub/t.json"))
    if not any(e["name"] == "mpt underflow" for e in x_events(doc)):
        fail("no run slice")


def case_mesh(mpt, tmp):
    """A dp 2 x tp 1 x pp 2 mesh: two pipelines in one job. Every flow id has one start and one
    finish (validate), and each joins the two stages of one pipeline: ranks (pp*dp + d)*tp + t,
    so stage 0 and stage 1 of replica d are ranks d and d + dp*tp (probe, stop 31: ids were keyed
    by stage alone, and both replicas' messages shared them)."""
    run(mpt, ["tensorparallel", "--config", os.path.join(ROOT, "configs/tensorparallel_quick.json"), "--nproc", "4",
              "--set", "model.layers=2", "--set", "mesh.steps=2", "--set", "mesh.dp=2", "--set", "mesh.pp=2",
              "--out", "r.json", "--trace", "t.json"], tmp)
    doc = validate(os.path.join(tmp, "t.json"))
    starts = {e["id"]: e for e in doc["traceEvents"] if e.get("ph") == "s"}
    ends = {e["id"]: e for e in doc["traceEvents"] if e.get("ph") == "f"}
    if len(starts) < 16:
        fail(f"{len(starts)} flows: expected at least 16 (2 replicas x 2 steps x microbatches x F and B)")
    for fid, st in starts.items():
        if abs(st["pid"] - ends[fid]["pid"]) != 2:
            fail(f"flow {fid}: from rank {st['pid']} to rank {ends[fid]['pid']}, not the two stages of one pipeline")
    print(f"ok: mesh dp 2 x pp 2: {len(starts)} flows, each within its replica's pipeline")


def case_contextparallel(mpt, tmp):
    """The ring on 2 ranks: its send/recv on each rank's communication track, with bytes and peer,
    and its block computations ("ring forward step", "ring backward step") on the compute track."""
    run(mpt, ["contextparallel", "--config", os.path.join(ROOT, "configs/contextparallel_quick.json"),
              "--out", "r.json", "--trace", "t.json"], tmp)
    doc = validate(os.path.join(tmp, "t.json"))
    events = x_events(doc)
    for rank in (0, 1):
        sends = [e for e in events if e["pid"] == rank and e.get("cat") == "comm" and "send" in e["name"]]
        if not sends or not all((e.get("args") or {}).get("bytes", 0) > 0 for e in sends):
            fail(f"rank {rank}: no send with bytes on the communication track")
        for step in ("ring forward step", "ring backward step"):
            if not any(e["pid"] == rank and e["name"] == step for e in events):
                fail(f"rank {rank}: no '{step}' slice")
    print(f"ok: contextparallel ring: {sum(1 for e in events if e.get('cat') == 'comm')} communication slices")


def case_expertparallel(mpt, tmp):
    """Expert parallelism on 2 ranks: the dispatch and combine all-to-alls (forward and backward) on
    each rank's communication track, with their bytes, and the local experts' forward ("experts")
    on the compute track."""
    run(mpt, ["expertparallel", "--config", os.path.join(ROOT, "configs/expertparallel_quick.json"),
              "--out", "r.json", "--trace", "t.json"], tmp)
    doc = validate(os.path.join(tmp, "t.json"))
    events = x_events(doc)
    for rank in (0, 1):
        a2a = [e for e in events if e["pid"] == rank and e.get("cat") == "comm" and e["name"] == "all_to_all"]
        if not a2a or not all((e.get("args") or {}).get("bytes", 0) > 0 for e in a2a):
            fail(f"rank {rank}: no all_to_all with bytes on the communication track")
        if len(a2a) % 4:
            fail(f"rank {rank}: {len(a2a)} all-to-alls, not 4 per MoE layer and step (dispatch, combine, both backward)")
        if not any(e["pid"] == rank and e["name"] == "experts" and e.get("cat") == "compute" for e in events):
            fail(f"rank {rank}: no 'experts' slice on the compute track")
    print(f"ok: expertparallel: {sum(1 for e in events if e['name'] == 'all_to_all')} all-to-all slices")


STORE_MESSAGE_LIMIT = 8 << 20  # LibTorch 2.x's libuv TCPStore: MAX_PAYLOAD_LEN, one message


def case_over_store_limit(mpt, tmp):
    """Rank 1's events are more bytes than one message of the job's TCPStore may carry (issue 38:
    10.9 MB of events; rank 1 died with a backtrace, rank 0 waited out its timeout, no result).
    They travel in pieces: exit 0, the result written, and all of rank 1's events in the trace -
    every flow that rank 0's sends start finishes in a recv of rank 1 (validate), and rank 1 has
    one recv slice per send of rank 0. A pipeline on 2 processes with no synthetic cost: about 6
    events per microbatch, the quickest way here to 8 MiB (collectives: one per collective)."""
    run(mpt, ["pipeline", "--nproc", "2", "--set", "executor=processes", "--set", "pipeline.stages=2", "--set",
              "cost.forward_us=0", "--set", "pipeline.microbatches=[64]", "--set", 'pipeline.schedules=["1f1b","gpipe"]',
              "--set", "pipeline.steps=75", "--set", "sync.enabled=false", "-q", "--out", "r.json", "--trace", "t.json"],
        tmp)
    doc = validate(os.path.join(tmp, "t.json"))
    res = json.load(open(os.path.join(tmp, "r.json")))
    if res.get("experiment") != "pipeline":
        fail("no pipeline result")
    mine = {0: [], 1: []}
    for e in doc["traceEvents"]:
        if e.get("ph") != "M":
            mine[e["pid"]].append(e)
    # Rank 1's part as it sent it: its events without pid (events_json's compact text).
    sent = sum(len(json.dumps({k: v for k, v in e.items() if k != "pid"}, separators=(",", ":"))) + 1
               for e in mine[1])
    print(f"rank 1: {len(mine[1])} events, about {sent / 2**20:.1f} MiB sent (one store message: at most "
          f"{STORE_MESSAGE_LIMIT / 2**20:.0f} MiB); rank 0: {len(mine[0])} events")
    if sent <= STORE_MESSAGE_LIMIT:
        fail(f"rank 1 sent {sent} bytes: not above the store's message limit, the case shows nothing")
    # Between the processes only: lane 0's tracks (rank 0 also checks the schedule on threads,
    # lanes >= 1, against one process).
    sends = sum(1 for e in mine[0] if e.get("ph") == "X" and e["tid"] < 10 and e["name"].startswith("send F"))
    recvs = sum(1 for e in mine[1] if e.get("ph") == "X" and e["tid"] < 10 and e["name"].startswith("recv F"))
    if sends < 2 * 75 * 64 or recvs != sends:
        fail(f"rank 0 sent {sends} forward messages, rank 1's trace has {recvs} recv slices: expected the same, "
             f"at least {2 * 75 * 64}")


def case_unwritable(mpt, tmp):
    os.makedirs(os.path.join(tmp, "ro"))
    os.chmod(os.path.join(tmp, "ro"), 0o500)
    for target in ("/proc/mpt-nowhere/t.json", os.path.join(tmp, "ro/t.json"), tmp):
        if target.startswith(tmp + "/ro") and os.access(os.path.join(tmp, "ro"), os.W_OK):
            continue  # root writes anywhere
        p = run(mpt, ["dataparallel", "--config", os.path.join(ROOT, "configs/dataparallel_quick.json"), "--out",
                      "r.json", "--trace", target], tmp, want=2)
        if "--trace" not in p.stderr or "worker" in p.stderr.lower() and "rank 1" in p.stderr:
            fail(f"message does not name --trace: {p.stderr}")
        if os.path.exists(os.path.join(tmp, "r.json")):
            fail("a result was written although --trace is unwritable")
        print(f"ok: --trace {target}: exit 2: {p.stderr.strip().splitlines()[-1]}")
    run(mpt, ["underflow", "--trace", ""], tmp, want=2)


def case_atomic(mpt, tmp):
    t = os.path.join(tmp, "t.json")
    with open(t, "w") as f:
        f.write("previous\n")
    # Rank 1 dies at step 1: the run fails (exit 3) and the old trace stays as it was.
    run(mpt, ["dataparallel", "--config", os.path.join(ROOT, "configs/dataparallel_quick.json"), "--set",
              "fault.rank=1", "--set", "fault.step=1", "--set", "dist.timeout_s=5", "--out", "r.json", "--trace", t],
        tmp, want=3)
    if open(t).read() != "previous\n":
        fail("a failed run changed the existing trace")
    left = [n for n in os.listdir(tmp) if n not in ("t.json",)]
    if left:
        fail(f"files left behind: {left}")
    print("ok: a failed run leaves the existing trace untouched and no temporary file")
    # A trace that cannot be written after the run (a full device) leaves the existing result as it
    # was: the result and the trace are written together (probe, stop 31: the result was replaced).
    if os.path.exists("/dev/full"):
        r = os.path.join(tmp, "r.json")
        with open(r, "w") as f:
            f.write("previous result\n")
        p = run(mpt, ["underflow", "-q", "--set", "model.depth=3", "--out", r, "--trace", "/dev/full"], tmp, want=3)
        if "cannot write the result and trace files: /dev/full: write failed" not in p.stderr:
            fail(f"message: {p.stderr}")
        if open(r).read() != "previous result\n":
            fail("a trace that could not be written let the result file be replaced")
        left = [n for n in os.listdir(tmp) if n not in ("t.json", "r.json")]
        if left:
            fail(f"files left behind: {left}")
        print("ok: --trace /dev/full: exit 3, the existing result untouched, no temporary file")
    # --out or --trace naming the --config file: exit 2 before the run, the config untouched.
    c = os.path.join(tmp, "c.json")
    with open(c, "w") as f:
        f.write('{"model": {"depth": 3}}\n')
    for args, opt in ((["--out", c], "--out"), (["--out", "r2.json", "--trace", c], "--trace")):
        p = run(mpt, ["underflow", "--config", c] + args, tmp, want=2)
        if f"{opt} {c}: expected a file other than the config (--config {c})" not in p.stderr:
            fail(f"message: {p.stderr}")
        if open(c).read() != '{"model": {"depth": 3}}\n' or os.path.exists(os.path.join(tmp, "r2.json")):
            fail(f"{opt} over the config: a file was written")
    print("ok: --out / --trace naming the config: exit 2, the config untouched")


def case_plot(mpt, tmp):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("SKIPPED: python3-matplotlib missing")
        sys.exit(77)
    run(mpt, PIPE + ["--out", "r.json", "--trace", "t.json"], tmp)
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts/plot.py"), "t.json", "--out-dir", "plots"],
                       cwd=tmp, capture_output=True, text=True)
    if p.returncode != 0:
        fail(f"plot.py: exit {p.returncode}: {p.stderr}")
    made = p.stdout.split()
    if made != ["plots/t_timeline.png"]:
        fail(f"plot.py made {made}")
    with open(os.path.join(tmp, made[0]), "rb") as f:
        if f.read(8) != b"\x89PNG\r\n\x1a\n":
            fail("not a PNG")
    print(f"ok: {made[0]} ({os.path.getsize(os.path.join(tmp, made[0]))} bytes)")


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASES = {
    "pipeline_threads": lambda m, t: case_pipeline(m, t, "threads"),
    "pipeline_processes": lambda m, t: case_pipeline(m, t, "processes"),
    # 4 stages on 2 threads: each thread's two stages keep their own lanes. A spun cost (100 us a
    # layer) keeps the bubble away from 1 on a loaded machine (with none, tiny ops and a busy
    # neighbour: b near 0.97, where no perturbed slice can show)
    "pipeline_workers": lambda m, t: case_pipeline(m, t, "threads", ["--set", "cost.forward_us=100", "--set",
                                                                     "cost.mode=spin", "--set", "pipeline.workers=2"]),
    "dataparallel": case_dataparallel,
    "single": case_single,
    "mesh": case_mesh,
    "contextparallel": case_contextparallel,
    "expertparallel": case_expertparallel,
    "unwritable": case_unwritable,
    "over_store_limit": case_over_store_limit,
    "atomic": case_atomic,
    "plot": case_plot,
}


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        validate(sys.argv[2])
        return
    if len(sys.argv) != 3 or sys.argv[2] not in CASES:
        print(__doc__)
        print("cases:", ", ".join(CASES))
        sys.exit(2)
    with tempfile.TemporaryDirectory(prefix="mpt-trace-") as tmp:
        CASES[sys.argv[2]](os.path.abspath(sys.argv[1]), tmp)
        os.chmod(tmp, 0o700)
        for d, _, _ in os.walk(tmp):
            os.chmod(d, 0o700)
    print("ok")


if __name__ == "__main__":
    main()
