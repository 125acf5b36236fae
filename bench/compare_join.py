#!/usr/bin/env python3
"""The Python twin of `mpt compare BASE NEW --rtol R` for bench.py's `compare` benchmark: reads
both result files with json.load, flattens `results` and `checks` into leaf path -> value
(lists whose items all carry a distinct string "name" keyed by that name, other lists by
index; checks by their name), joins the two by path in a dict and counts the numbers that
differ beyond |new - base| <= rtol * |base| (other values: by equality). What a user without
mpt writes; it leaves out mpt's finer points (non-finite encodings, integers beyond 2^53 held
exactly, per-key tolerance files), which the benchmark's files do not exercise.

    compare_join.py BASE.json NEW.json [--rtol R]    # prints {"compared": N, "differ": K}
"""
import argparse
import json
import sys


def named(v):
    """True when v is a non-empty list of objects, each with a distinct string "name"."""
    if not isinstance(v, list) or not v:
        return False
    seen = set()
    for e in v:
        if not isinstance(e, dict) or not isinstance(e.get("name"), str) or e["name"] in seen:
            return False
        seen.add(e["name"])
    return True


def flatten(v, path, out):
    if isinstance(v, dict):
        for k, x in v.items():
            flatten(x, path + "/" + k, out)
    elif named(v):
        for e in v:
            row = path + "/" + e["name"]
            for k, x in e.items():
                if k != "name":
                    flatten(x, row + "/" + k, out)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            flatten(x, f"{path}/{i}", out)
    else:
        out[path] = v


def leaves(doc):
    out = {}
    flatten(doc["results"], "/results", out)
    checks = {c["name"]: c for c in doc.get("checks", []) if isinstance(c, dict) and isinstance(c.get("name"), str)}
    flatten(checks, "/checks", out)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--rtol", type=float, default=0.0)
    args = ap.parse_args()
    with open(args.base) as f:
        a = leaves(json.load(f))
    with open(args.new) as f:
        b = leaves(json.load(f))
    differ = 0
    for p in a.keys() | b.keys():
        if p not in a or p not in b:
            differ += 1
            continue
        x, y = a[p], b[p]
        numbers = all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in (x, y))
        if not (abs(y - x) <= args.rtol * abs(x) if numbers else x == y):
            differ += 1
    print(json.dumps({"compared": len(a.keys() | b.keys()), "differ": differ}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
