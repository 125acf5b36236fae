#!/usr/bin/python3
"""Checks that every value of a reference (from a *_ref.py script) equals mpt's result
file exactly: numbers bit for bit (as doubles), strings and integers equal. Keys that
the reference lacks are not compared (mpt may report more); keys the reference has
must exist in mpt's results.

    compare.py MPT_RESULT.json REFERENCE.json
"""
import json
import math
import sys


def decode(v):
    if isinstance(v, str) and v in ("inf", "-inf", "nan"):
        return float(v)
    return v


def walk(ref, got, path, errors):
    if isinstance(ref, dict):
        if not isinstance(got, dict):
            errors.append(f"{path}: expected an object, mpt has {got!r}")
            return
        for k, v in ref.items():
            if k not in got:
                errors.append(f"{path}/{k}: missing in mpt's result")
            else:
                walk(v, got[k], f"{path}/{k}", errors)
    elif isinstance(ref, list):
        if not isinstance(got, list) or len(got) != len(ref):
            errors.append(f"{path}: expected a list of {len(ref)}, mpt has {got!r:.80}")
            return
        for i, (r, g) in enumerate(zip(ref, got)):
            walk(r, g, f"{path}/{i}", errors)
    else:
        r, g = decode(ref), decode(got)
        if isinstance(r, float) or isinstance(g, float):
            same = (math.isnan(r) and math.isnan(g)) if (isinstance(r, float) and math.isnan(r)) else float(r) == float(g)
        else:
            same = r == g
        if not same:
            errors.append(f"{path}: reference {ref!r}, mpt {got!r}")


def main():
    mpt = json.load(open(sys.argv[1]))["results"]
    ref = json.load(open(sys.argv[2]))
    errors = []
    walk(ref, mpt, "/results", errors)
    n = sum(1 for _ in json.dumps(ref).split(","))
    if errors:
        print(f"FAILED: {len(errors)} value(s) differ from PyTorch-Python:")
        for e in errors[:40]:
            print("  " + e)
        sys.exit(1)
    print(f"ok: mpt equals the PyTorch-Python reference exactly (~{n} values compared)")


if __name__ == "__main__":
    main()
