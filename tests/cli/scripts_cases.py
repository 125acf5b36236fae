#!/usr/bin/python3
"""Hostile and odd input for scripts/sweep.py and scripts/plot.py (issue 15, defect 10).

    tests/cli/scripts_cases.py sweep MPT   # MPT: the built binary, for the one end-to-end case
    tests/cli/scripts_cases.py plot        # exit 77 (skipped) without python3-matplotlib
    tests/cli/scripts_cases.py plotdeps    # plot.py under a Python without matplotlib (runs everywhere)

Most sweep cases run a fake `--mpt` (a small script written here) that logs its arguments, writes
a tiny result file and, like mpt, creates the parent folders of --out: path sanitising, repeated
keys, list values, a missing binary, Ctrl-C and unknown fields need no real training. Every case
runs; the failures are listed at the end (exit 1).
"""
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = "/usr/bin/python3"
SWEEP = os.path.join(ROOT, "scripts", "sweep.py")
PLOT = os.path.join(ROOT, "scripts", "plot.py")
GOLDEN = os.path.join(ROOT, "tests", "golden")
SAFE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$")

FAKE_MPT = r'''#!/usr/bin/python3
import json, os, sys, time
try:
    args = sys.argv[1:]
    if args == ["list"]:  # sweep.py asks once which experiments there are (the first word of each line)
        print("underflow      gradients in fp16\n../evil        a name to sanitise\nlossscale      loss scaling")
        sys.exit(0)
    if "--help" in args:  # and for a name not listed, what mpt says of it
        if args[0] == "nosuch":
            print("mpt: unknown experiment 'nosuch'; `mpt list` shows them all", file=sys.stderr)
            sys.exit(2)
        print("help")
        sys.exit(0)
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    out = args[args.index("--out") + 1]
    log = os.environ["FAKE_MPT_LOG"]
    with open(log, "a") as fh:
        fh.write(json.dumps({"event": "start", "experiment": args[0], "sets": sets}) + "\n")
    point = dict(s.split("=", 1) for s in sets)
    if point.get("seed") is not None and point.get("seed") == os.environ.get("FAKE_MPT_SLEEP_SEED"):
        time.sleep(60)
    if os.path.dirname(out):
        os.makedirs(os.path.dirname(out), exist_ok=True)  # as mpt does for --out
    doc = {"schema_version": 1, "experiment": args[0], "config": point,
           "results": {"value": point.get("seed"), "table": [{"name": "r1", "x": 1}]}}
    if point.get("seed", "0").isdigit() and int(point.get("seed", "0")) % 2 == 0:
        doc["results"]["even"] = True
    with open(out, "w") as fh:
        json.dump(doc, fh)
    with open(log, "a") as fh:
        fh.write(json.dumps({"event": "done", "sets": sets}) + "\n")
except KeyboardInterrupt:
    sys.exit(130)
'''

failures = []


def check(cond, what):
    """Records a failed assertion (the case goes on, so that one run shows every failure)."""
    if not cond:
        failures.append(what)
        print(f"  FAIL: {what}")
    return cond


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    print(f"$ {' '.join(cmd)}\n  -> exit {p.returncode}; stderr: {p.stderr.strip()[-600:]!r}")
    return p


def no_traceback(p, case):
    check("Traceback" not in p.stderr + p.stdout, f"{case}: no traceback")


class Fake:
    """A scratch folder with the fake mpt and its log."""

    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="mpt-scripts-")
        self.mpt = os.path.join(self.tmp, "fake-mpt")
        with open(self.mpt, "w") as fh:
            fh.write(FAKE_MPT)
        os.chmod(self.mpt, 0o755)
        self.log = os.path.join(self.tmp, "fake.log")
        self.env = dict(os.environ, FAKE_MPT_LOG=self.log)

    def calls(self, event="start"):
        if not os.path.exists(self.log):
            return []
        with open(self.log) as fh:
            return [e for e in map(json.loads, fh) if e["event"] == event]

    def sweep(self, *args, out="out", exp="underflow", mpt=None):
        return run([PY, SWEEP, exp, "--mpt", mpt or self.mpt, "--out-dir", os.path.join(self.tmp, out), *args],
                   env=self.env)

    def files(self):
        """Every file and folder under the scratch folder, relative to it."""
        found = []
        for d, dirs, files in os.walk(self.tmp):
            found += [os.path.relpath(os.path.join(d, x), self.tmp) for x in dirs + files]
        return sorted(found)

    def summary(self, out="out"):
        with open(os.path.join(self.tmp, out, "summary.csv")) as fh:
            return list(csv.DictReader(fh))

    def close(self):
        shutil.rmtree(self.tmp, ignore_errors=True)


def sweep_sanitised_names():
    print("== sweep: names built from values stay inside --out-dir")
    f = Fake()
    long = "x" * 400
    p = f.sweep("--grid", "data.dir=/../../escape,a/b,a_b,.hidden," + long + ",A_B", out="box/out")
    no_traceback(p, "sanitise")
    check(p.returncode == 0, "sanitise: exit 0")
    outside = [x for x in f.files() if not x.startswith(os.path.join("box", "out")) and x not in
               ("box", "fake-mpt", "fake.log")]
    check(outside == [], f"sanitise: nothing written outside --out-dir, found {outside}")
    inside = os.listdir(os.path.join(f.tmp, "box", "out"))
    jsons = [x for x in inside if x.endswith(".json")]
    check(len(jsons) == 6, f"sanitise: 6 distinct result files, got {sorted(inside)}")
    for x in inside:
        check(SAFE.match(x) is not None, f"sanitise: safe name {x!r}")
        check(len(x) <= 160, f"sanitise: bounded name length {len(x)}")
        check(os.path.isfile(os.path.join(f.tmp, "box", "out", x)), f"sanitise: {x} is a file, not a folder")
    check(len({x.lower() for x in jsons}) == len(jsons), f"sanitise: unique without case {jsons}")
    sets = sorted(s for c in f.calls() for s in c["sets"])
    check("data.dir=/../../escape" in sets and "data.dir=a/b" in sets, f"sanitise: mpt got the raw values {sets}")
    if os.path.exists(os.path.join(f.tmp, "box", "out", "summary.csv")):
        rows = f.summary("box/out")
        check(sorted(r["data.dir"] for r in rows) == sorted(["/../../escape", "a/b", "a_b", ".hidden", long, "A_B"]),
              "sanitise: the summary keeps the raw values")
        check(all(os.path.isfile(r["result_file"]) for r in rows), "sanitise: summary names the files written")
    f.close()
    # The experiment name is part of the file name too.
    f = Fake()
    p = f.sweep("--grid", "seed=0", exp="../evil", out="box/out")
    no_traceback(p, "sanitise experiment")
    outside = [x for x in f.files() if not x.startswith(os.path.join("box", "out")) and x not in
               ("box", "fake-mpt", "fake.log")]
    check(outside == [], f"sanitise experiment: nothing written outside --out-dir, found {outside}")
    f.close()


def sweep_repeated_key():
    print("== sweep: a key in two --grid is an error, nothing runs")
    f = Fake()
    p = f.sweep("--grid", "seed=0,1", "--grid", "seed=2,3")
    no_traceback(p, "repeated key")
    check(p.returncode == 2, "repeated key: exit 2")
    check("'seed'" in p.stderr, "repeated key: the message names the key")
    check(f.calls() == [], f"repeated key: mpt never ran, got {f.calls()}")
    f.close()


def sweep_list_values():
    print("== sweep: values split at top-level commas only")
    f = Fake()
    p = f.sweep("--grid", "model.depth=[2,3],[4]", "--grid", 'name="a,b",c', "--grid", 'obj={"k":[1,2]},{}')
    no_traceback(p, "lists")
    check(p.returncode == 0, "lists: exit 0")
    sets = [tuple(c["sets"]) for c in f.calls()]
    want = {("model.depth=" + d, "name=" + n, "obj=" + o) for d in ("[2,3]", "[4]") for n in ('"a,b"', "c")
            for o in ('{"k":[1,2]}', "{}")}
    check(set(sets) == want and len(sets) == 8, f"lists: 8 points {sorted(want)}, got {sets}")
    for bad in ("model.depth=[2,3", "model.depth=2]", 'name="a,b', "model.depth=,"):
        p = f.sweep("--grid", bad, out="bad")
        no_traceback(p, f"lists {bad}")
        check(p.returncode == 2 and "--grid" in p.stderr, f"lists: {bad!r} exits 2 naming --grid")
    f.close()


def sweep_missing_mpt():
    print("== sweep: a missing --mpt is one line, exit 2")
    f = Fake()
    for mpt in (os.path.join(f.tmp, "no-such-mpt"), f.tmp, "no-such-mpt-on-path"):
        p = f.sweep("--grid", "seed=0,1", mpt=mpt, out="m")
        no_traceback(p, f"missing mpt {mpt}")
        check(p.returncode == 2, f"missing mpt {mpt}: exit 2")
        check(len(p.stderr.strip().splitlines()) == 1 and mpt in p.stderr, f"missing mpt {mpt}: one line naming it")
        check(not os.path.exists(os.path.join(f.tmp, "m", "summary.csv")), "missing mpt: no summary")
    f.close()


def sweep_ctrl_c():
    print("== sweep: Ctrl-C ends with exit 130, the finished runs in summary.csv")
    f = Fake()
    env = dict(f.env, FAKE_MPT_SLEEP_SEED="2")
    out = os.path.join(f.tmp, "out")
    cmd = [PY, SWEEP, "underflow", "--mpt", f.mpt, "--out-dir", out, "--grid", "seed=0,1,2,3"]
    # A new session: SIGINT to its process group is what a terminal's Ctrl-C sends.
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.time() + 30
    while time.time() < deadline and len(f.calls()) < 3:
        time.sleep(0.05)
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGINT)
    try:
        stdout, stderr = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
    print(f"$ {' '.join(cmd)}  (Ctrl-C during the third run)\n  -> exit {proc.returncode}; stderr: {stderr.strip()!r}")
    check("Traceback" not in stderr + stdout, "ctrl-c: no traceback")
    check(proc.returncode == 130, "ctrl-c: exit 130")
    check(re.search(r"2 of 4 runs finished", stderr) is not None and "summary.csv" in stderr,
          "ctrl-c: a line with the runs finished and summary.csv")
    if check(os.path.exists(os.path.join(out, "summary.csv")), "ctrl-c: summary.csv written"):
        rows = f.summary()
        check([r["seed"] for r in rows] == ["0", "1"], f"ctrl-c: summary holds seeds 0 and 1, got {rows}")
    left = [x for x in os.listdir(out) if "tmp" in x]
    check(left == [], f"ctrl-c: no temporary file left, found {left}")
    f.close()


def sweep_fields():
    print("== sweep: a --field found in no result is an error; in some only, a warning naming the runs")
    f = Fake()
    p = f.sweep("--grid", "seed=0,1", "--field", "/results/value", "--field", "/results/nosuch/x",
                "--field", "/results/even", "--field", "/results/table/r1/x")
    no_traceback(p, "fields")
    check(p.returncode == 2, "fields: an unknown field exits 2")
    check(re.search(r"--field /results/nosuch/x: not found in any", p.stderr) is not None,
          "fields: the unknown field is named")
    check(re.search(r"warning: --field /results/even: not found in 1 of 2 results: underflow_seed-1\.json",
                    p.stderr) is not None, "fields: the field missing in some runs names them")
    check("/results/value" not in p.stderr, "fields: no message for fields found everywhere")
    rows = f.summary()
    check([r["/results/value"] for r in rows] == ["0", "1"], "fields: values in the summary")
    check([r["/results/table/r1/x"] for r in rows] == ["1", "1"], "fields: table rows by name")
    check([r["/results/even"] for r in rows] == ["true", ""], f"fields: JSON true and a missing cell, got {rows}")
    p = f.sweep("--grid", "seed=0,1", "--field", "/results/even", out="out2")
    check(p.returncode == 0 and "warning: --field /results/even" in p.stderr, "fields: a warning only: exit 0")
    f.close()


def sweep_slash_names():
    print("== sweep: a row name with '/' in it (shard's stage0/all_reduce), addressed as mpt compare prints it")
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import sweep  # noqa: E402
    doc = {"results": {"comm": [{"name": "tp", "x": 1}, {"name": "tp/all_reduce", "sent_bytes": 5}]}}
    check(sweep.lookup(doc, "/results/comm/tp/all_reduce/sent_bytes") == 5, "slash: the row tp/all_reduce")
    check(sweep.lookup(doc, "/results/comm/tp/x") == 1, "slash: the row tp beside it")
    check(sweep.lookup(doc, "/results/comm/tp/all_reduce/nosuch") is sweep.MISSING, "slash: a missing column")


def sweep_unknown_experiment():
    print("== sweep: an experiment mpt does not have: one line, exit 2, nothing run")
    f = Fake()
    cmd = [PY, SWEEP, "nosuch", "--mpt", f.mpt, "--out-dir", os.path.join(f.tmp, "u"), "--grid", "seed=0,1"]
    p = subprocess.run(cmd, env=f.env, capture_output=True, text=True)
    no_traceback(p, "unknown experiment")
    check(p.returncode == 2, f"unknown experiment: exit 2, got {p.returncode}")
    check("experiment 'nosuch': mpt: unknown experiment 'nosuch'" in p.stderr, f"unknown experiment: named: {p.stderr}")
    check(f.calls() == [], "unknown experiment: no point ran")
    f.close()


def sweep_not_an_experiment():
    print("== sweep: mpt's other commands (compare, env, list) are refused once, nothing run (issue 38)")
    f = Fake()
    for name in ("compare", "env", "list"):
        p = f.sweep("--grid", "seed=0,1", exp=name, out=name)
        no_traceback(p, f"command {name}")
        check(p.returncode == 2, f"command {name}: exit 2, got {p.returncode}")
        check(len(p.stderr.strip().splitlines()) == 1 and f"experiment '{name}': an mpt command, not an experiment"
              in p.stderr and "underflow, ../evil, lossscale" in p.stderr,
              f"command {name}: one line saying so, with the experiments: {p.stderr!r}")
        check(f.calls() == [], f"command {name}: no point ran, got {f.calls()}")
        check(not os.path.exists(os.path.join(f.tmp, name)), f"command {name}: no --out-dir made")
    f.close()


def sweep_grid_cap():
    print("== sweep: a huge grid is refused at once, naming its size and --max-points (issue 38)")
    import resource

    def cap_memory():  # today's 6 x 100 grid grew to 24 GB; 1 GiB of address space is plenty for the check
        resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))

    f = Fake()
    values = ",".join(str(v) for v in range(100))
    grid = [a for k in "abcdef" for a in ("--grid", f"{k}={values}")]
    cmd = [PY, SWEEP, "underflow", "--mpt", f.mpt, "--out-dir", os.path.join(f.tmp, "big"), *grid]
    try:
        p = subprocess.run(cmd, env=f.env, capture_output=True, text=True, timeout=120, preexec_fn=cap_memory)
        print(f"$ sweep.py underflow --grid a=0..99 ... --grid f=0..99\n  -> exit {p.returncode}; "
              f"stderr: {p.stderr.strip()[-600:]!r}")
        no_traceback(p, "huge grid")
        check(p.returncode == 2, f"huge grid: exit 2, got {p.returncode}")
        check("1,000,000,000,000 points" in p.stderr and "--max-points 10,000" in p.stderr,
              f"huge grid: the count and --max-points named: {p.stderr!r}")
    except subprocess.TimeoutExpired:
        check(False, "huge grid: refused at once (it ran for 120 s)")
    check(f.calls() == [] and not os.path.exists(os.path.join(f.tmp, "big")), "huge grid: nothing ran or made")
    # --max-points moves the limit: 9 points are refused under 8 and run under 9.
    p = f.sweep("--grid", "seed=0,1,2", "--grid", "x=a,b,c", "--max-points", "8", out="nine")
    check(p.returncode == 2 and "9 points (3 (seed) x 3 (x)) is more than --max-points 8" in p.stderr,
          f"--max-points 8: 9 points refused: {p.stderr!r}")
    check(f.calls() == [], "--max-points 8: nothing ran")
    p = f.sweep("--grid", "seed=0,1,2", "--grid", "x=a,b,c", "--max-points", "9", out="nine")
    check(p.returncode == 0 and len(f.calls()) == 9, f"--max-points 9: the 9 points ran, got {len(f.calls())}")
    for bad in ("0", "-1", "many"):
        p = f.sweep("--max-points", bad, out="bad")
        check(p.returncode == 2 and "--max-points" in p.stderr, f"--max-points {bad}: exit 2 naming it")
    f.close()


def sweep_out_dir_is_a_file():
    print("== sweep: an --out-dir that is a file (or under one) is said so, exit 2, the file untouched (issue 38)")
    f = Fake()
    path = os.path.join(f.tmp, "notes.txt")
    with open(path, "w") as fh:
        fh.write("keep me")
    for out, said in ((path, f"--out-dir {path}: is a file, not a folder"),
                      (os.path.join(path, "sub"), f"--out-dir {path}/sub: {path} is a file, not a folder")):
        p = run([PY, SWEEP, "underflow", "--mpt", f.mpt, "--out-dir", out, "--grid", "seed=0,1"], env=f.env)
        no_traceback(p, "out-dir file")
        check(p.returncode == 2 and p.stderr.strip() == f"sweep: {said}", f"out-dir file: exit 2, {said!r}")
    check(open(path).read() == "keep me" and f.calls() == [], "out-dir file: the file kept, nothing ran")
    f.close()


def sweep_end_to_end(mpt):
    print("== sweep: the real mpt, list values and a field found in one run only")
    if not (mpt and os.access(mpt, os.X_OK)):
        check(False, f"end-to-end: no mpt binary at {mpt!r}")
        return
    f = Fake()
    p = run([PY, SWEEP, "underflow", "--mpt", mpt, "--out-dir", os.path.join(f.tmp, "out"),
             "--grid", "model.depth=[2,3],[4]", "--set", "data.batch=4",
             "--field", "/results/formats/fp16/max", "--field", "/results/gradients/d3.L01/underflow_fp16"])
    no_traceback(p, "end-to-end")
    check(p.returncode == 0, "end-to-end: exit 0")
    rows = f.summary()
    check([r["model.depth"] for r in rows] == ["[2,3]", "[4]"], f"end-to-end: two points, got {rows}")
    check(all(r["exit_code"] == "0" and os.path.isfile(r["result_file"]) for r in rows), "end-to-end: both ran")
    check(all(r["/results/formats/fp16/max"] == "65504.0" for r in rows), "end-to-end: fp16 max in both")
    check(rows[0]["/results/gradients/d3.L01/underflow_fp16"] != "" and
          rows[1]["/results/gradients/d3.L01/underflow_fp16"] == "", "end-to-end: d3 only in the [2,3] run")
    check(re.search(r"warning: --field /results/gradients/d3.L01/underflow_fp16: not found in 1 of 2 results: "
                    r"underflow_model.depth-_4_-[0-9a-f]{8}\.json", p.stderr) is not None,
          "end-to-end: the warning names the [4] run")
    # mpt's own commands are not experiments: every point of `sweep.py compare` used to fail.
    for name in ("compare", "env"):
        out = os.path.join(f.tmp, name)
        p = run([PY, SWEEP, name, "--mpt", mpt, "--out-dir", out, "--grid", "seed=0,1"])
        no_traceback(p, f"end-to-end {name}")
        check(p.returncode == 2 and "an mpt command, not an experiment" in p.stderr and "underflow" in p.stderr,
              f"end-to-end {name}: exit 2, refused once")
        check(not os.path.exists(out), f"end-to-end {name}: nothing written")
    # A base config every point shares that mpt refuses: said once before any point (each used to
    # run and fail alike; probe, issue 38).
    out = os.path.join(f.tmp, "noconfig")
    p = run([PY, SWEEP, "underflow", "--mpt", mpt, "--out-dir", out, "--grid", "model.depth=2,3,4",
             "--config", os.path.join(f.tmp, "no-such-config.json")])
    no_traceback(p, "end-to-end missing --config")
    check(p.returncode == 2 and "every point" in p.stderr and "no-such-config.json" in p.stderr,
          f"end-to-end missing --config: exit 2 once, naming the file (exit {p.returncode}: {p.stderr.strip()[-200:]})")
    check(not os.path.exists(out), "end-to-end missing --config: nothing written")
    f.close()


def plot_malformed():
    print("== plot: each bad file one line, the others still plotted")
    tmp = tempfile.mkdtemp(prefix="mpt-plot-")
    bad = {"invalid.json": "{", "list.json": "[1, 2]", "nores.json": '{"experiment": "underflow"}',
           "wrongtype.json": '{"experiment": "lossscale", "results": {"sweep": [{"scale": "x"}]}}',
           "deep.json": "[" * 100000 + "]" * 100000, "unknown.json": '{"experiment": "nosuch"}',
           "binary.json": b"\xff\xfe\x00garbage",
           # a result none of whose tables has a plot (a mesh-only run was a silent exit 0: probe, stop 31)
           "noplots.json": '{"experiment": "tensorparallel", "results": {"mesh_layout": []}}',
           # no "experiment" key: said as such, not "experiment None" (probe, issue 38)
           "noexp.json": "{}",
           # one bar artist per row: a huge table took minutes; refused past MAX_BARS (issue 38)
           "bigledger.json": json.dumps({"experiment": "fp8", "results": {"ledger": [
               {"name": f"r{i}", "rel_error": 0.01} for i in range(6000)]}})}
    for name, text in bad.items():
        with open(os.path.join(tmp, name), "wb") as fh:
            fh.write(text if isinstance(text, bytes) else text.encode())
    shutil.copy(os.path.join(GOLDEN, "underflow.json"), os.path.join(tmp, "good.json"))
    shutil.copy(os.path.join(GOLDEN, "lossscale.json"), os.path.join(tmp, "first.json"))
    files = [os.path.join(tmp, "first.json")] + [os.path.join(tmp, n) for n in bad] + \
        [os.path.join(tmp, "missing.json"), tmp, "/dev/zero", os.path.join(tmp, "good.json")]
    out = os.path.join(tmp, "plots")
    p = run([PY, PLOT, *files, "--out-dir", out])
    no_traceback(p, "plot malformed")
    check(p.returncode == 1, "plot malformed: exit 1")
    lines = p.stderr.strip().splitlines()
    failed = files[1:-1]
    check(len(lines) == len(failed), f"plot malformed: one line per bad file ({len(failed)}), got {len(lines)}")
    for f in failed:
        check(sum(line.startswith(f"plot: {f}: ") for line in lines) == 1, f"plot malformed: one line for {f}")
    check(any("noexp.json: not an mpt result file" in line for line in lines),
          "plot malformed: a file with no experiment key is said to be no result file")
    check(any("noplots.json: no plots in this tensorparallel result" in line for line in lines),
          "plot malformed: a result with no plottable table is said")
    check(any("bigledger.json: cannot plot: 6000 rows in the ledger, more than the 5000 bars" in line
              for line in lines), "plot malformed: a table too large for a bar chart is said")
    made = p.stdout.split()
    check(os.path.join(out, "good_zero_fraction.png") in made, "plot malformed: the good file after them plotted")
    check(os.path.join(out, "first_sweep.png") in made, "plot malformed: the good file before them plotted")
    check(all(os.path.isfile(x) for x in made), "plot malformed: every printed plot exists")
    p = run([PY, PLOT, *[os.path.join(tmp, n) for n in bad], "--out-dir", out])
    no_traceback(p, "plot all bad")
    check(p.returncode == 2, "plot all bad: exit 2")
    shutil.rmtree(tmp, ignore_errors=True)


def plot_same_experiment():
    print("== plot: two results of one experiment do not overwrite each other's plots")
    tmp = tempfile.mkdtemp(prefix="mpt-plot-")
    files = []
    for sub, name in (("a", "underflow.json"), ("b", "underflow.json"), ("c", "run2.json")):
        os.makedirs(os.path.join(tmp, sub))
        files.append(os.path.join(tmp, sub, name))
        shutil.copy(os.path.join(GOLDEN, "underflow.json"), files[-1])
    hostile = os.path.join(tmp, "c", "hostile.json")
    with open(hostile, "w") as fh:
        json.dump({"experiment": "underflow", "results": {"histogram_d/../../../x": {"edges": [-30, -29],
                                                                                      "counts": [1]}}}, fh)
    out = os.path.join(tmp, "plots")
    p = run([PY, PLOT, *files, hostile, "--out-dir", out])
    no_traceback(p, "plot same")
    check(p.returncode == 0, "plot same: exit 0")
    made = p.stdout.split()
    check(len(made) == 10 and len(set(made)) == 10, f"plot same: 10 distinct plots, got {made}")
    check(sorted(os.listdir(out)) == sorted(os.path.basename(x) for x in made),
          f"plot same: every plot printed is in the folder, {sorted(os.listdir(out))}")
    check(os.path.join(out, "underflow_zero_fraction.png") in made and
          os.path.join(out, "run2_zero_fraction.png") in made, "plot same: named after the result file")
    check(all(os.path.dirname(x) == out and SAFE.match(os.path.basename(x)) for x in made),
          "plot same: names from file content stay in the folder")
    shutil.rmtree(tmp, ignore_errors=True)


def plot_nothing_leaves_no_folder():
    print("== plot: nothing plotted, the --out-dir folders it made are taken away (probe, stop 32)")
    tmp = tempfile.mkdtemp(prefix="mpt-plot-")
    out = os.path.join(tmp, "a", "b")
    p = run([PY, PLOT, os.path.join(tmp, "missing.json"), "--out-dir", out])
    no_traceback(p, "plot nothing")
    check(p.returncode == 2, f"plot nothing: exit 2, got {p.returncode}")
    check(os.listdir(tmp) == [], f"plot nothing: no folder left, found {os.listdir(tmp)}")
    # A folder that was there before stays, empty or not.
    os.makedirs(os.path.join(tmp, "keep"))
    p = run([PY, PLOT, os.path.join(tmp, "missing.json"), "--out-dir", os.path.join(tmp, "keep")])
    check(p.returncode == 2 and os.path.isdir(os.path.join(tmp, "keep")), "plot nothing: an existing folder kept")
    shutil.rmtree(tmp)


def plot_without_matplotlib():
    print("== plot: a Python without matplotlib: one line naming the module and the fix, exit 3 (issue 38)")
    # `python3 -S` has no site-packages, so no matplotlib: as under pyenv's python3, which a user
    # gets with `python3 scripts/plot.py` where python3 is not Debian's.
    if subprocess.run([PY, "-S", "-c", "import matplotlib"], capture_output=True).returncode == 0:
        check(False, "no matplotlib: python3 -S still imports matplotlib; this case cannot run")
        return
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "plots")
        p = run([PY, "-S", PLOT, os.path.join(GOLDEN, "underflow.json"), "--out-dir", out])
        no_traceback(p, "no matplotlib")
        check(p.returncode == 3, f"no matplotlib: exit 3, got {p.returncode}")
        lines = p.stderr.strip().splitlines()
        check(len(lines) == 1 and lines[0].startswith("plot: cannot import matplotlib (No module named 'matplotlib')")
              and "apt-get install python3-matplotlib" in lines[0] and "-m pip install matplotlib" in lines[0],
              f"no matplotlib: one line naming the module and both fixes, got {lines}")
        check(not os.path.exists(out), "no matplotlib: no --out-dir made")
        p = run([PY, "-S", PLOT, "--help"])
        check(p.returncode == 0 and "--out-dir" in p.stdout, "no matplotlib: --help still works")


def write_trace(path, slices, target_bytes=0):
    """A Chrome trace like mpt's pipeline on 4 ranks: per rank a compute row (F, B, W slices with
    mpt's args, 90% busy) and a communication row (a send per slice, 10% busy), a flow per send.
    `slices` slices per rank, or as many as fill `target_bytes` when that is given."""
    head = [{"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}} for r in range(4)]
    parts = ['{"displayTimeUnit":"ms","otherData":{"experiment":"pipeline"},"traceEvents":',
             json.dumps(head, separators=(",", ":"))[:-1]]
    size, i, ts = sum(map(len, parts)), 0, 0.0
    while (size < target_bytes) if target_bytes else (i < slices * 4):
        r, op, mb = i % 4, "FBW"[i // 4 % 3], i // 12 % 8
        evs = [{"args": {"kind": op, "microbatch": mb, "run": "1f1b.m8", "schedule": "1f1b", "stage": r,
                         "step": i // 96, "wait_us": 1.5}, "cat": "compute", "dur": 180.0, "name": f"{op}{mb}",
                "ph": "X", "pid": r, "tid": 1, "ts": ts},
               {"args": {"bytes": 65536, "peer": (r + 1) % 4, "tag": i}, "cat": "comm", "dur": 20.0,
                "name": f"send {op}{mb} -> {(r + 1) % 4}", "ph": "X", "pid": r, "tid": 2, "ts": ts + 180.0},
               {"cat": "flow", "id": i + 1, "name": "msg", "ph": "s", "pid": r, "tid": 2, "ts": ts + 180.0},
               {"bp": "e", "cat": "flow", "id": i + 1, "name": "msg", "ph": "f", "pid": (r + 1) % 4, "tid": 2,
                "ts": ts + 200.0}]
        text = "," + ",".join(json.dumps(e, separators=(",", ":")) for e in evs)
        parts.append(text)
        size += len(text)
        i += 1
        if i % 4 == 0:
            ts += 200.0
    parts.append("]}")
    with open(path, "w") as fh:
        fh.write("".join(parts))
    return i


def plot_large_trace():
    print("== plot: a trace near the 64 MiB cap plots in bounded memory; what is drawn does not grow with it "
          "(issue 38)")
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import plot  # noqa: E402
    getattr(plot, "load_matplotlib", lambda: None)()
    # What is drawn: the same number of artists for 2,000 and 20,000 slices per rank (one barh per
    # slice took 190 s and 4.6 GB for a 59 MiB trace).
    drawn = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in (2000, 20000):
            path = os.path.join(tmp, f"t{n}.json")
            write_trace(path, n)
            with open(path) as fh:
                doc = json.load(fh)
            figs = []
            saved = plot.save
            plot.save = lambda fig, out, name, fmt, paths: figs.append(fig)
            try:
                plot.plot_trace(doc, plot.PlotNames(tmp, "png"), "png")
            finally:
                plot.save = saved
            ax = figs[0].axes[0]
            drawn[n] = len(ax.patches) + len(ax.collections) + len(ax.images) + len(ax.texts) + len(ax.lines)
            plot.plt.close("all")
    check(drawn[2000] == drawn[20000] and drawn[20000] < 1000,
          f"large trace: as many artists for 20,000 slices per rank as for 2,000 (and < 1000), got {drawn}")
    # The coverage of a dense track is its busy fraction, not a solid bar.
    cov = plot.coverage([(0.0, 1.0), (2.0, 1.0)], 4.0, 4) if hasattr(plot, "coverage") else None
    check(cov is not None and list(cov) == [1.0, 0.0, 1.0, 0.0], f"coverage: whole bins, got {cov}")
    cov = plot.coverage([(0.5, 1.0)], 2.0, 2) if hasattr(plot, "coverage") else None
    check(cov is not None and list(cov) == [0.5, 0.5], f"coverage: half bins, got {cov}")
    # End to end: about 60 MiB (under the cap) in 3 GiB of address space (the old drawing needed 4.6 GB).
    import resource

    def cap_memory():
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "big.json")
        write_trace(path, 0, target_bytes=60 * 2**20)
        out = os.path.join(tmp, "plots")
        try:
            p = subprocess.run([PY, PLOT, path, "--out-dir", out], capture_output=True, text=True, timeout=600,
                               preexec_fn=cap_memory, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
        except subprocess.TimeoutExpired:
            check(False, "large trace: plot.py ran for 600 s")
            return
        print(f"$ plot.py big.json ({os.path.getsize(path) / 2**20:.1f} MiB) --out-dir plots\n  -> exit "
              f"{p.returncode}; stderr: {p.stderr.strip()[-600:]!r}")
        no_traceback(p, "large trace")
        png = os.path.join(out, "big_timeline.png")
        check(p.returncode == 0 and p.stdout.split() == [png], f"large trace: exit 0 and {png}, got {p.stdout!r}")
        check(os.path.isfile(png) and open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n", "large trace: a PNG")


def plot_out_dir_is_a_file():
    print("== plot: an --out-dir that is a file is said so, exit 2 (issue 38)")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "notes.txt")
        with open(path, "w") as fh:
            fh.write("keep me")
        p = run([PY, PLOT, os.path.join(GOLDEN, "underflow.json"), "--out-dir", path])
        no_traceback(p, "plot out-dir file")
        check(p.returncode == 2 and p.stderr.strip() == f"plot: --out-dir {path}: is a file, not a folder",
              f"plot out-dir file: exit 2, said: {p.stderr!r}")
        check(open(path).read() == "keep me", "plot out-dir file: the file kept")


def gpu_check_args():
    """scripts/gpu-check.sh --help prints its usage and an unknown argument is refused (exit 2),
    both before it looks for LibTorch or builds anything (no gpu-report/ is made)."""
    script = os.path.join(ROOT, "scripts", "gpu-check.sh")
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, MPT_REPORT_DIR=os.path.join(tmp, "report"), MPT_BUILD_DIR=os.path.join(tmp, "build"))
        p = run(["bash", script, "--help"], env=env)
        check(p.returncode == 0 and "NVIDIA GPU" in p.stdout, "gpu-check --help: exit 0 and the usage")
        p = run(["bash", script, "--bogus"], env=env)
        check(p.returncode == 2 and "unknown argument '--bogus'" in p.stderr, "gpu-check --bogus: exit 2 naming it")
        check(not os.path.exists(os.path.join(tmp, "report")), "gpu-check: nothing made before the arguments are read")


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "sweep":
        sweep_sanitised_names()
        sweep_repeated_key()
        sweep_list_values()
        sweep_missing_mpt()
        sweep_ctrl_c()
        sweep_fields()
        sweep_slash_names()
        sweep_unknown_experiment()
        sweep_not_an_experiment()
        sweep_grid_cap()
        sweep_out_dir_is_a_file()
        sweep_end_to_end(sys.argv[2] if len(sys.argv) > 2 else None)
    elif what == "plot":
        if subprocess.run([PY, "-c", "import matplotlib"], capture_output=True).returncode != 0:
            print("SKIPPED: python3-matplotlib missing")
            sys.exit(77)
        plot_malformed()
        plot_same_experiment()
        plot_nothing_leaves_no_folder()
        plot_out_dir_is_a_file()
        plot_large_trace()
    elif what == "plotdeps":
        plot_without_matplotlib()
    elif what == "gpucheck":
        gpu_check_args()
    else:
        sys.exit("usage: scripts_cases.py sweep MPT | plot | plotdeps | gpucheck")
    if failures:
        print(f"{len(failures)} check(s) failed:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
