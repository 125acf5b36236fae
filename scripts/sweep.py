#!/usr/bin/env python3
"""Sweep mpt over a grid of config values (Python 3 standard library only).

Runs `mpt EXPERIMENT` once per point of the grid (the Cartesian product of every --grid),
each with `--set KEY=VALUE` for the point and its own result file in --out-dir, then writes
one summary CSV with the swept keys and the chosen result fields.

    scripts/sweep.py underflow --grid model.depth=4,8,12 --grid seed=0,1,2 \\
        --field /results/gradients/d{model.depth}.L01/underflow_fp16 --out-dir results/sweep

A field is a path into the result file: '/'-separated keys, where a table's row is picked by
its "name" (as `mpt compare` prints paths). `{key}` in a field is replaced by the point's value
of that swept key. Exit code: 0 when every run succeeded, 1 otherwise (failed runs are listed
in the CSV with their exit code).
"""
import argparse
import csv
import itertools
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from outdir import writable_out_dir  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def lookup(doc, path):
    """Value at a '/'-separated path; table rows are addressed by their "name"."""
    cur = doc
    for part in [p for p in path.split("/") if p]:
        if isinstance(cur, dict):
            if part not in cur:
                return None
            cur = cur[part]
        elif isinstance(cur, list):
            named = [r for r in cur if isinstance(r, dict) and r.get("name") == part]
            if named:
                cur = named[0]
            elif part.isdigit() and int(part) < len(cur):
                cur = cur[int(part)]
            else:
                return None
        else:
            return None
    return cur


def parse_grid(items):
    grid = []
    for item in items:
        if "=" not in item:
            sys.exit(f"sweep: --grid '{item}': expected KEY=V1,V2,...")
        key, values = item.split("=", 1)
        vals = [v for v in values.split(",") if v != ""]
        if not vals:
            sys.exit(f"sweep: --grid '{item}': no values")
        grid.append((key, vals))
    return grid


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiment")
    ap.add_argument("--grid", action="append", default=[], help="KEY=V1,V2,... (repeatable)")
    ap.add_argument("--field", action="append", default=[], help="result path to put in the CSV (repeatable)")
    ap.add_argument("--config", help="base config file")
    ap.add_argument("--set", action="append", default=[], help="fixed override for every point")
    ap.add_argument("--out-dir", default="results/sweep")
    ap.add_argument("--mpt", default=os.path.join(ROOT, "build", "mpt"))
    args = ap.parse_args()
    grid = parse_grid(args.grid)
    writable_out_dir("sweep", args.out_dir)
    keys = [k for k, _ in grid]
    rows, failed = [], 0
    for point in itertools.product(*[v for _, v in grid]) if grid else [()]:
        assign = dict(zip(keys, point))
        tag = "_".join(f"{k.replace('.', '-')}={v}" for k, v in assign.items()) or "default"
        out = os.path.join(args.out_dir, f"{args.experiment}_{tag}.json")
        cmd = [args.mpt, args.experiment, "-q", "--out", out]
        if args.config:
            cmd += ["--config", args.config]
        for s in args.set:
            cmd += ["--set", s]
        for k, v in assign.items():
            cmd += ["--set", f"{k}={v}"]
        rc = subprocess.run(cmd).returncode
        row = dict(assign)
        row["exit_code"] = rc
        row["result_file"] = out
        if rc in (0, 1) and os.path.exists(out):
            doc = json.load(open(out))
            for f in args.field:
                path = f
                for k, v in assign.items():
                    path = path.replace("{" + k + "}", v)
                row[f] = lookup(doc, path)
        else:
            failed += 1
        rows.append(row)
        print(f"sweep: {tag}: exit {rc}", file=sys.stderr)
    summary = os.path.join(args.out_dir, "summary.csv")
    with open(summary + ".tmp", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys + args.field + ["exit_code", "result_file"])
        w.writeheader()
        for r in rows:
            w.writerow(r)
    os.replace(summary + ".tmp", summary)
    print(f"sweep: {len(rows)} runs, {failed} failed; summary in {summary}", file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
