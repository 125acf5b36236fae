#!/usr/bin/python3
"""Plots from mpt result files (Debian's python3-matplotlib, headless Agg backend).

    scripts/plot.py results/underflow.json [more.json ...] --out-dir plots [--format png|svg]

Writes one or more images per result file, named <experiment>_<plot>.<format>, and prints
their paths. Every plot has a title and labelled axes with units.
"""
import argparse
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def num(v):
    if isinstance(v, str) and v in ("inf", "-inf", "nan"):
        return float(v)
    return v


def plot_underflow(doc, out, fmt):
    res = doc["results"]
    paths = []
    for key in sorted(k for k in res if k.startswith("histogram_d")):
        h = res[key]
        edges, counts = [num(e) for e in h["edges"]], h["counts"]
        fig, ax = plt.subplots(figsize=(9, 4.5))
        ax.bar(edges[:-1], counts, width=1.0, align="edge", color="#4477aa", label="gradients")
        fp16_sub, fp16_norm, fp16_max = -24, -14, math.log2(65504)
        lo = edges[0]
        ax.axvspan(lo, fp16_sub, color="#cc3311", alpha=0.12, label="fp16: below smallest subnormal (-> 0)")
        ax.axvspan(fp16_sub, fp16_norm, color="#ee7733", alpha=0.12, label="fp16 subnormal")
        ax.axvspan(fp16_norm, fp16_max, color="#009988", alpha=0.10, label="fp16 normal range")
        if lo <= -126:
            ax.axvline(-126, color="k", ls=":", label="bf16 min normal")
        ax.set_xlabel("log2 |gradient| (binade)")
        ax.set_ylabel("count (values)")
        ax.set_title(f"Gradient magnitudes, depth {key[len('histogram_d'):]} (bf16 holds all of this range)")
        ax.legend(fontsize=8)
        p = os.path.join(out, f"underflow_{key}.{fmt}")
        fig.tight_layout()
        fig.savefig(p)
        plt.close(fig)
        paths.append(p)
    rows = res.get("gradients", [])
    if rows:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for depth in sorted({r["depth"] for r in rows}):
            rs = [r for r in rows if r["depth"] == depth]
            ax.plot([r["layer"] for r in rs], [100 * r["underflow_fp16"] for r in rs], marker="o", label=f"depth {depth}")
        ax.set_xlabel("Linear layer (1 = nearest the input)")
        ax.set_ylabel("weight gradient -> 0 in fp16 (%)")
        ax.set_title("Gradient underflow in fp16 per layer")
        ax.legend(fontsize=8)
        p = os.path.join(out, f"underflow_zero_fraction.{fmt}")
        fig.tight_layout()
        fig.savefig(p)
        plt.close(fig)
        paths.append(p)
    return paths


PLOTTERS = {"underflow": plot_underflow}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+")
    ap.add_argument("--out-dir", default="plots")
    ap.add_argument("--format", default="png", choices=["png", "svg"])
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    status = 0
    for f in args.results:
        try:
            doc = json.load(open(f))
        except (OSError, ValueError) as e:
            print(f"plot: {f}: cannot read: {e}", file=sys.stderr)
            status = 2
            continue
        exp = doc.get("experiment")
        if exp not in PLOTTERS:
            print(f"plot: {f}: no plots for experiment {exp!r}", file=sys.stderr)
            continue
        for p in PLOTTERS[exp](doc, args.out_dir, args.format):
            print(p)
    sys.exit(status)


if __name__ == "__main__":
    main()
