#!/usr/bin/env python3
"""Sweep mpt over a grid of config values (Python 3 standard library only).

Runs `mpt EXPERIMENT` once per point of the grid (the Cartesian product of every --grid),
each with `--set KEY=VALUE` for the point and its own result file in --out-dir, then writes
one summary CSV with the swept keys and the chosen result fields.

    scripts/sweep.py underflow --grid model.depth=4,8,12 --grid seed=0,1,2 \\
        --field /results/gradients/d{model.depth}.L01/underflow_fp16 --out-dir results/sweep

Values are split at top-level commas only: --grid 'model.depth=[2,3],[4]' gives the two
points [2,3] and [4] (commas inside JSON brackets or quotes stay). Each key may be swept by
one --grid only. Result files are named EXPERIMENT_KEY-VALUE_....json with only the characters
[A-Za-z0-9._-]; a name that had to be changed, cut or that collides gets a short hash.

A field is a path into the result file: '/'-separated keys, where a table's row is picked by
its "name" (as `mpt compare` prints paths). `{key}` in a field is replaced by the point's value
of that swept key. A field found in no result is an error; found in some results only, a
warning naming the runs without it.

A grid of more than --max-points points (default 10,000, MAX_POINTS) is refused before anything
runs: the points are made one at a time, but each is a run of mpt and a row of the summary
kept in memory, and a grid that large is more often a mistake than a plan.

Exit code: 0 when every run succeeded; 1 when a run failed (listed in the CSV with its exit
code); 2 for bad arguments (--grid, a grid over --max-points, a missing --mpt, a name that is not
one of the experiments `mpt list` shows, such as `compare` or `env`, an --out-dir that is a file:
checked once, before any run) and for a --field found in no result (the
runs and the summary are kept); 130 after Ctrl-C (summary.csv holds the runs that finished).
"""
import argparse
import csv
import hashlib
import itertools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from outdir import writable_out_dir  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MISSING = object()  # a field path that does not resolve (distinct from a JSON null)
MAX_STEM = 120  # characters of a result file's name before the hash and ".json"
MAX_POINTS = 10_000  # points of a grid run without --max-points (at ~1 s or more per run of mpt: hours)


def fail(msg, code=2):
    """Prints "sweep: <msg>" on stderr and exits with `code` (2: bad input)."""
    print(f"sweep: {msg}", file=sys.stderr)
    sys.exit(code)


def cut(text, limit=80):
    """`text` cut to `limit` characters (with "...") for messages."""
    return text if len(text) <= limit else text[:limit] + "..."


def lookup(doc, path):
    """Value at a '/'-separated path; table rows are addressed by their "name".
    A row name or key may itself contain '/' (shard's "stage0/all_reduce"), as `mpt compare`
    prints it: the parts are joined until one names a row or key, shortest first.
    Returns MISSING when a part of the path is not there."""
    return _lookup(doc, [p for p in path.split("/") if p])


def _lookup(cur, parts):
    if not parts:
        return cur
    for k in range(1, len(parts) + 1):
        part, rest = "/".join(parts[:k]), parts[k:]
        if isinstance(cur, dict):
            if part not in cur:
                continue
            found = _lookup(cur[part], rest)
        elif isinstance(cur, list):
            named = [r for r in cur if isinstance(r, dict) and r.get("name") == part]
            if named:
                found = _lookup(named[0], rest)
            elif part.isdigit() and int(part) < len(cur):
                found = _lookup(cur[int(part)], rest)
            else:
                continue
        else:
            return MISSING
        if found is not MISSING:
            return found
    return MISSING


def split_values(text):
    """Splits a --grid value list at top-level commas: commas inside JSON brackets ([...], {...})
    or double-quoted strings (with backslash escapes) stay in the value.
    Raises ValueError naming an unbalanced bracket or an unterminated string."""
    vals, cur, stack, in_str, esc = [], [], [], False, False
    pairs = {"]": "[", "}": "{"}
    for ch in text:
        if in_str:
            esc = ch == "\\" and not esc
            if ch == '"' and not esc:
                in_str = False
            cur.append(ch)
            continue
        if ch == '"':
            in_str, esc = True, False
        elif ch in "[{":
            stack.append(ch)
        elif ch in "]}":
            if not stack or stack[-1] != pairs[ch]:
                raise ValueError(f"'{ch}' without its opening '{pairs[ch]}'")
            stack.pop()
        elif ch == "," and not stack:
            vals.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    if in_str:
        raise ValueError("a '\"' string is not closed")
    if stack:
        raise ValueError(f"'{stack[-1]}' is not closed")
    vals.append("".join(cur))
    return [v for v in vals if v != ""]


def parse_grid(items):
    """--grid KEY=V1,V2,... items as [(key, [values])]; exits 2 on a malformed item or a key
    given by more than one --grid (the values would silently replace each other)."""
    grid, seen = [], set()
    for item in items:
        if "=" not in item:
            fail(f"--grid '{cut(item)}': expected KEY=V1,V2,...")
        key, values = item.split("=", 1)
        if key == "":
            fail(f"--grid '{cut(item)}': expected KEY=V1,V2,..., got an empty key")
        if key in seen:
            fail(f"--grid: key '{cut(key)}' is given more than once; put all its values in one --grid "
                 f"{cut(key)}=V1,V2,...")
        seen.add(key)
        try:
            vals = split_values(values)
        except ValueError as e:
            fail(f"--grid '{cut(item)}': {e}")
        if not vals:
            fail(f"--grid '{cut(item)}': no values")
        grid.append((key, vals))
    return grid


def check_grid_size(grid, max_points):
    """The number of points of `grid` (the product of its value counts; 1 without --grid). Exits 2
    naming the count, its factors and --max-points when it is over `max_points`, before anything
    runs (the points themselves are never listed: itertools.product makes them one at a time)."""
    count = math.prod(len(v) for _, v in grid)
    if count > max_points:
        factors = " x ".join(f"{len(v)} ({cut(k, 40)})" for k, v in grid)
        fail(f"--grid: {count:,} points ({factors}) is more than --max-points {max_points:,}; sweep fewer values "
             f"or raise --max-points (each point is a run of mpt)")
    return count


def positive_int(text):
    """argparse type: an integer >= 1 (--max-points)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {cut(text)!r}")
    return n


def check_base(mpt, experiment, config, sets):
    """Exits 2 with mpt's own message when the part every point shares (--config, --set) is bad
    input: `mpt EXP --print-config` makes every check of a run without running it, so a missing
    config file is said once, not by each of the grid's points."""
    cmd = [mpt, experiment, "--print-config"] + (["--config", config] if config else [])
    for s in sets:
        cmd += ["--set", s]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return  # the points will say what is wrong
    if p.returncode == 2:
        lines = p.stderr.strip().splitlines() or [f"exit {p.returncode}"]
        fail(f"--config/--set (every point): {cut(lines[-1], 400)}")


def check_experiment(mpt, mpt_arg, experiment):
    """Exits 2 with one line unless `experiment` is one of the experiments `mpt list` prints (the
    first word of each line): mpt's other commands (list, compare, env) take no --set or --out,
    so every point would fail alike. For a name mpt does not know at all, mpt's own message (with
    its "did you mean") is passed on from `mpt NAME --help`."""
    def ask(args):
        try:
            return subprocess.run([mpt] + args, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as e:
            fail(f"--mpt {mpt_arg}: cannot run it: {getattr(e, 'strerror', None) or e}")

    def last_line(p):
        return (p.stderr.strip().splitlines() or p.stdout.strip().splitlines() or [f"exit {p.returncode}"])[-1]

    p = ask(["list"])
    if p.returncode != 0:
        fail(f"--mpt {mpt_arg}: `mpt list` failed: {cut(last_line(p), 200)}")
    experiments = [line.split()[0] for line in p.stdout.splitlines() if line.strip()]
    if not experiments:
        fail(f"--mpt {mpt_arg}: `mpt list` printed no experiments (is it mpt?)")
    if experiment in experiments:
        return
    p = ask([experiment, "--help"])
    if p.returncode != 0:
        fail(f"experiment {cut(experiment)!r}: {cut(last_line(p), 200)}")
    fail(f"experiment {cut(experiment)!r}: an mpt command, not an experiment (it takes no --set or --out); "
         f"the experiments (mpt list): {cut(', '.join(experiments), 300)}")


def safe_name(raw, used):
    """A file name stem for `raw` that is safe inside --out-dir: only [A-Za-z0-9._-] (anything
    else becomes '_'), no leading '.' or '-', at most MAX_STEM characters. When sanitising changed
    `raw`, or the stem is already in `used` (compared case-insensitively), "-<8 hex of sha1(raw)>"
    is appended (and a counter if even that collides). Adds the stem to `used` and returns it."""
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", raw).lstrip(".-")[:MAX_STEM] or "run"
    if stem != raw or stem.lower() in used:
        stem = f"{stem}-{hashlib.sha1(raw.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"
        base, n = stem, 2
        while stem.lower() in used:
            stem, n = f"{base}-{n}", n + 1
    used.add(stem.lower())
    return stem


def check_mpt(path):
    """The mpt binary to run: `path` itself, or found on PATH when it has no '/'.
    Exits 2 with one line when it is missing or not executable."""
    found = shutil.which(path) if os.sep not in path else (path if os.path.isfile(path) else None)
    if found is None or not os.access(found, os.X_OK):
        why = "not an executable file" if found is not None or os.path.exists(path) else "not found"
        fail(f"--mpt {path}: {why} (build it: cmake -S . -B build && cmake --build build, or pass --mpt PATH)")
    return found


def cell(v):
    """A result value as a CSV cell: strings and numbers as they are, others as JSON."""
    if v is MISSING:
        return ""
    if isinstance(v, str) or (isinstance(v, (int, float)) and not isinstance(v, bool)):
        return v
    return json.dumps(v)


def write_summary(path, fieldnames, rows):
    """Writes the CSV atomically: a temporary file beside `path`, then renamed over it."""
    fd, tmp = tempfile.mkstemp(prefix=".summary.", suffix=".tmp", dir=os.path.dirname(path) or ".")
    try:
        with os.fdopen(fd, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=fieldnames)
            w.writeheader()
            for r in rows:
                w.writerow({k: cell(v) for k, v in r.items()})
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(e, OSError):  # a full disk, a folder gone: say so, exit 3 (a runtime failure)
            print(f"sweep: cannot write {path}: {e.strerror or e}", file=sys.stderr)
            sys.exit(3)
        raise


class Terminated(Exception):
    """Raised by the SIGTERM handler so that a terminated sweep ends like Ctrl-C."""


def on_sigterm(signum, frame):
    """SIGTERM handler: raises Terminated (the sweep then writes its summary and exits 143)."""
    raise Terminated()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiment")
    ap.add_argument("--grid", action="append", default=[], help="KEY=V1,V2,... (repeatable, one per key)")
    ap.add_argument("--field", action="append", default=[], help="result path to put in the CSV (repeatable)")
    ap.add_argument("--config", help="base config file")
    ap.add_argument("--set", action="append", default=[], help="fixed override for every point")
    ap.add_argument("--out-dir", default="results/sweep")
    ap.add_argument("--mpt", default=os.path.join(ROOT, "build", "mpt"))
    ap.add_argument("--max-points", type=positive_int, default=MAX_POINTS,
                    help=f"the most points a grid may have (default {MAX_POINTS:,})")
    args = ap.parse_args()
    grid = parse_grid(args.grid)
    total = check_grid_size(grid, args.max_points)
    mpt = check_mpt(args.mpt)
    # Not an experiment is bad input: said once, before any point runs (each would exit 2 alike).
    check_experiment(mpt, args.mpt, args.experiment)
    check_base(mpt, args.experiment, args.config, args.set)
    writable_out_dir("sweep", args.out_dir)
    signal.signal(signal.SIGTERM, on_sigterm)
    keys = [k for k, _ in grid]
    points = itertools.product(*[v for _, v in grid])  # one at a time: never the whole grid in memory
    summary = os.path.join(args.out_dir, "summary.csv")
    fieldnames = keys + args.field + ["exit_code", "result_file"]
    rows, failed, used, found = [], 0, set(), {f: [] for f in args.field}
    try:
        for point in points:
            assign = dict(zip(keys, point))
            tag = "_".join(f"{k}-{v}" for k, v in assign.items()) or "default"
            out = os.path.join(args.out_dir, safe_name(f"{args.experiment}_{tag}", used) + ".json")
            cmd = [mpt, args.experiment, "-q", "--out", out]
            if args.config:
                cmd += ["--config", args.config]
            for s in args.set:
                cmd += ["--set", s]
            for k, v in assign.items():
                cmd += ["--set", f"{k}={v}"]
            try:
                rc = subprocess.run(cmd).returncode
            except OSError as e:
                write_summary(summary, fieldnames, rows)
                fail(f"--mpt {args.mpt}: cannot run it: {e.strerror}")
            row = dict(assign)
            row["exit_code"] = rc
            row["result_file"] = out
            doc = None
            if rc in (0, 1) and os.path.exists(out):
                try:
                    with open(out, encoding="utf-8") as fh:
                        doc = json.load(fh)
                except (OSError, ValueError, RecursionError) as e:
                    print(f"sweep: {out}: cannot read the result: {cut(str(e))}", file=sys.stderr)
            if doc is not None:
                for f in found:  # each field once, even when given twice
                    path = f
                    for k, v in assign.items():
                        path = path.replace("{" + k + "}", v)
                    row[f] = lookup(doc, path)
                    found[f].append(row[f] is not MISSING)
            else:
                failed += 1
            rows.append(row)
            print(f"sweep: {os.path.basename(out)}: exit {rc}", file=sys.stderr)
    except (KeyboardInterrupt, Terminated) as e:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the summary short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        write_summary(summary, fieldnames, rows)
        what = "interrupted" if isinstance(e, KeyboardInterrupt) else "terminated"
        print(f"sweep: {what}: {len(rows)} of {total} runs finished ({failed} failed); "
              f"{summary} holds them", file=sys.stderr)
        sys.exit(130 if isinstance(e, KeyboardInterrupt) else 143)
    write_summary(summary, fieldnames, rows)
    print(f"sweep: {len(rows)} runs, {failed} failed; summary in {summary}", file=sys.stderr)
    unknown = []
    for f, hits in found.items():
        if hits and not any(hits):
            unknown.append(f)
            print(f"sweep: --field {cut(f)}: not found in any of the {len(hits)} results (a path like "
                  f"/results/<table>/<row name>/<column>; see `mpt compare` or the result file)", file=sys.stderr)
        elif not all(hits):
            ok_rows = [r for r in rows if f in r]
            without = [os.path.basename(r["result_file"]) for r in ok_rows if r[f] is MISSING]
            print(f"sweep: warning: --field {cut(f)}: not found in {len(without)} of {len(hits)} results: "
                  f"{', '.join(without[:5])}{', ...' if len(without) > 5 else ''}", file=sys.stderr)
    if unknown:
        sys.exit(2)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
