#!/usr/bin/env python3
"""Writes a large synthetic mpt result file for timing `mpt compare` (bench.py's `compare`
benchmark; docs/performance.md). The file has the shape compare reads: `schema_version`,
`experiment`, a `results` object whose `rows` list holds named rows (joined by "name", as a
sweep's rows are) and a few `checks`.

Each row is {"name": "rI", "v": <double>, "n": <integer>}, about 50 bytes, so 1e6 rows
make about 50 MB and --bytes 250e6 about 5 M rows (just under compare's 256 MiB cap). The
values come from a seeded generator: the same arguments give the same file. --perturb K
changes the value "v" of K evenly spaced rows by a relative 1e-9 (what a rerun on another CPU
might do), so that compare has differences to report.

    gen_results.py OUT.json --rows 200000 [--perturb 10] [--seed 0]
    gen_results.py OUT.json --bytes 250e6
"""
import argparse
import json
import os
import random
import sys

ROW_BYTES = 50  # what one row takes in the file, name and separators included (see the docstring)


def write(path, rows, perturb, seed):
    """Writes `rows` rows to `path` (atomically: a temporary file, then a rename); returns its size in bytes."""
    rng = random.Random(seed)
    step = rows // perturb if perturb else 0
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write('{"schema_version": 2, "experiment": "underflow",\n "results": {"rows": [\n')
        chunk = []
        for i in range(rows):
            v = rng.random()
            n = rng.randrange(1000)
            if step and i % step == 0 and i // step < perturb:
                v *= 1 + 1e-9
            chunk.append(f'{{"name":"r{i}","v":{v!r},"n":{n}}}')
            if len(chunk) == 10000:
                f.write(",\n".join(chunk) + (",\n" if i + 1 < rows else "\n"))
                chunk = []
        if chunk:
            f.write(",\n".join(chunk) + "\n")
        f.write(']},\n "checks": [{"name": "rows written", "value": %d, "ok": true}],\n' % rows)
        f.write(' "timings": {"wall_s": 1.0}}\n')
    os.replace(tmp, path)
    return os.path.getsize(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    size = ap.add_mutually_exclusive_group(required=True)
    size.add_argument("--rows", type=int, help="number of rows")
    size.add_argument("--bytes", type=float, help="approximate file size in bytes (rows = BYTES / %d)" % ROW_BYTES)
    ap.add_argument("--perturb", type=int, default=0, help="rows whose value differs by a relative 1e-9 (default 0)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rows = args.rows if args.rows is not None else int(args.bytes / ROW_BYTES)
    if rows < 1 or args.perturb < 0 or args.perturb > rows:
        ap.error("expected --rows/--bytes giving at least one row and 0 <= --perturb <= rows")
    size = write(args.out, rows, args.perturb, args.seed)
    print(json.dumps({"rows": rows, "bytes": size, "perturbed": args.perturb}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
