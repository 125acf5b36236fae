#!/usr/bin/python3
"""Hostile and odd input for scripts/sweep.py and scripts/plot.py (issue 15, defect 10).

    tests/cli/scripts_cases.py sweep MPT   # MPT: the built binary, for the one end-to-end case
    tests/cli/scripts_cases.py plot        # exit 77 (skipped) without python3-matplotlib

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
    if "--help" in args:  # sweep.py asks once whether the experiment exists
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
    f.close()


def plot_malformed():
    print("== plot: each bad file one line, the others still plotted")
    tmp = tempfile.mkdtemp(prefix="mpt-plot-")
    bad = {"invalid.json": "{", "list.json": "[1, 2]", "nores.json": '{"experiment": "underflow"}',
           "wrongtype.json": '{"experiment": "lossscale", "results": {"sweep": [{"scale": "x"}]}}',
           "deep.json": "[" * 100000 + "]" * 100000, "unknown.json": '{"experiment": "nosuch"}',
           "binary.json": b"\xff\xfe\x00garbage",
           # a result none of whose tables has a plot (a mesh-only run was a silent exit 0: probe, stop 31)
           "noplots.json": '{"experiment": "tensorparallel", "results": {"mesh_layout": []}}'}
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
    check(any("noplots.json: no plots in this tensorparallel result" in line for line in lines),
          "plot malformed: a result with no plottable table is said")
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
        sweep_end_to_end(sys.argv[2] if len(sys.argv) > 2 else None)
    elif what == "plot":
        if subprocess.run([PY, "-c", "import matplotlib"], capture_output=True).returncode != 0:
            print("SKIPPED: python3-matplotlib missing")
            sys.exit(77)
        plot_malformed()
        plot_same_experiment()
        plot_nothing_leaves_no_folder()
    elif what == "gpucheck":
        gpu_check_args()
    else:
        sys.exit("usage: scripts_cases.py sweep MPT | plot | gpucheck")
    if failures:
        print(f"{len(failures)} check(s) failed:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
