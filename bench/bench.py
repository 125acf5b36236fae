#!/usr/bin/env python3
"""mpt against the same work in PyTorch-Python, side by side, in one run.

For each pair: run mpt once, run the PyTorch-Python twin on mpt's resolved config and check
that both computed the same numbers (tests/parity/compare.py); then time both alternately,
`--rounds` times after one warm-up, and report the median wall time, peak RSS (from wait4's
rusage of each child) and the ratio mpt/Python per round. Timings are reported, never asserted.

    scripts/bench.sh [--rounds 7] [--only underflow]
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REF_PY = "/usr/bin/python3"  # Debian's interpreter, the one with python3-torch
MPT = os.path.join(ROOT, "build", "mpt")

# name -> (mpt arguments, reference script under tests/parity)
PAIRS = {
    "underflow": (["underflow"], "underflow_ref.py"),
    "underflow_depth_sweep": (["underflow", "--config", "configs/underflow_depth_sweep.json"], "underflow_ref.py"),
}


def timed(cmd):
    """Runs cmd; returns (wall seconds, peak RSS in bytes). Raises on non-zero exit."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.read().decode()[-500:]}")
    return wall, ru.ru_maxrss * 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--only", action="append", help="run only these pairs")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="mpt-bench-")
    rows = []
    for name, (mpt_args, ref) in PAIRS.items():
        if args.only and name not in args.only:
            continue
        out = os.path.join(tmp, name + ".json")
        ref_out = os.path.join(tmp, name + ".ref.json")
        mpt_cmd = [MPT] + mpt_args + ["-q", "--device", "cpu", "--out", out]
        subprocess.run(mpt_cmd, cwd=ROOT, check=True)
        ref_cmd = [REF_PY, os.path.join(ROOT, "tests", "parity", ref), out]
        with open(ref_out, "w") as f:
            subprocess.run(ref_cmd, cwd=ROOT, check=True, stdout=f)
        same = subprocess.run([REF_PY, os.path.join(ROOT, "tests", "parity", "compare.py"), out, ref_out],
                              cwd=ROOT, capture_output=True, text=True)
        if same.returncode != 0:
            print(f"{name}: results differ, not timing:\n{same.stdout}", file=sys.stderr)
            sys.exit(1)
        ref_cmd_quiet = ref_cmd  # stdout goes to /dev/null in timed()
        timed(mpt_cmd), timed(ref_cmd_quiet)  # warm-up (page cache, first-touch)
        m_t, p_t, ratios, m_rss, p_rss = [], [], [], [], []
        for _ in range(args.rounds):
            a, ra = timed(mpt_cmd)
            b, rb = timed(ref_cmd_quiet)
            m_t.append(a), p_t.append(b), ratios.append(a / b), m_rss.append(ra), p_rss.append(rb)
        rows.append({"name": name, "mpt_s": statistics.median(m_t), "python_s": statistics.median(p_t),
                     "ratio": statistics.median(ratios), "mpt_rss_bytes": max(m_rss), "python_rss_bytes": max(p_rss),
                     "rounds": args.rounds})
    print(f"# mpt vs PyTorch-Python (same LibTorch), median of {args.rounds} alternating rounds; same results checked first")
    print(f"# {'name':>24} {'mpt':>9} {'python':>9} {'mpt/py':>7} {'mpt RSS':>9} {'py RSS':>9}")
    print(f"# {'-':>24} {'s':>9} {'s':>9} {'-':>7} {'MiB':>9} {'MiB':>9}")
    for r in rows:
        print(f"  {r['name']:>24} {r['mpt_s']:9.3f} {r['python_s']:9.3f} {r['ratio']:7.3f} "
              f"{r['mpt_rss_bytes'] / 2**20:9.1f} {r['python_rss_bytes'] / 2**20:9.1f}")
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    path = os.path.join(ROOT, "bench", "results", datetime.date.today().isoformat() + ".json")
    env = {"host": platform.node(), "cpus": os.cpu_count(), "machine": platform.machine(),
           "python": platform.python_version()}
    with open(path + ".tmp", "w") as f:
        json.dump({"schema_version": 1, "env": env, "rows": rows}, f, indent=2)
    os.replace(path + ".tmp", path)
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
