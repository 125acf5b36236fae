#!/usr/bin/python3
"""Plots from mpt result files (Debian's python3-matplotlib, headless Agg backend).

    scripts/plot.py results/underflow.json [more.json ...] --out-dir plots [--format png|svg]
    scripts/plot.py trace.json --out-dir plots      # a timeline written by mpt --trace FILE (one row per rank/track)

Writes one or more images per result file, named <stem>_<plot>.<format> after the result file
(results/underflow.json gives underflow_zero_fraction.png, ...), and prints their paths; two files
with the same stem get "-2", "-3", ... so no plot of one invocation overwrites another. Every plot
has a title and labelled axes with units.

A file that cannot be read or plotted gets one line on stderr and the others are still plotted.
A file over 64 MiB (MAX_BYTES) is not read. What is drawn is bounded whatever the file holds: a
--trace timeline of a 59 MiB trace (484,000 events) plots in 5 s with a peak RSS of 0.49 GB, and
64 MiB of the smallest slices in 4.5 s and 0.70 GB (2-core VM, 2026-12-06; drawn one bar per
slice, as before, the 59 MiB trace took 190 s and 4.6 GB): rows too dense for their pixels are
drawn as their busy fraction (docs/results.md, Plots).
Exit code: 0 all plotted; 1 some files failed; 2 none could be plotted (or --out-dir unwritable
or a file); 3 matplotlib missing (one line naming the module and the fix) or stdout unwritable.
"""
import argparse
import json
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from outdir import writable_out_dir  # noqa: E402

plt = None  # matplotlib.pyplot, imported by load_matplotlib() once the arguments are read


def load_matplotlib():
    """Imports matplotlib with the headless Agg backend into the global `plt`. Without it (a
    `python3` that is not Debian's, such as pyenv's, or a matplotlib whose own dependency is
    missing) prints one line naming the missing module, this Python and the fix, and exits 3: the
    environment, not the input, is what is wrong. Imported here, not at the top, so that --help
    works without matplotlib."""
    global plt
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as pyplot
    except ImportError as e:
        missing = getattr(e, "name", None) or "matplotlib"
        print(f"plot: cannot import {missing} ({e}) in {sys.executable}: install Debian's python3-matplotlib "
              f"(sudo apt-get install python3-matplotlib) and run scripts/plot.py directly (it uses "
              f"/usr/bin/python3), or install matplotlib into this Python ({sys.executable} -m pip install "
              f"matplotlib)", file=sys.stderr)
        sys.exit(3)
    plt = pyplot


class Unplottable(ValueError):
    """Content that is valid but too large for one image (said as "cannot plot: ..." with the
    reason and where to look instead)."""


MAX_BARS = 5000  # bars (each an artist) in one bar chart; mpt's tables have at most a few hundred rows


def few_bars(n, what):
    """Raises Unplottable when a bar chart of `what` would have `n` > MAX_BARS bars: one artist per
    bar makes the time (and memory) grow with the file, about 1 ms a bar, and no image shows them."""
    if n > MAX_BARS:
        raise Unplottable(f"{n} {what}, more than the {MAX_BARS} bars one plot draws (a table of mpt has at most a "
                          f"few hundred rows)")


def num(v):
    if isinstance(v, str) and v in ("inf", "-inf", "nan"):
        return float(v)
    return v


class PlotNames:
    """Names the plots of one invocation: <stem>_<plot>.<format> in the output folder, where <stem> is
    the result file's name without ".json" (so results/underflow.json gives underflow_zero_fraction.png).
    A name already made in this invocation (two files with the same stem) gets "-2", "-3", ...:
    no plot overwrites another of the same run. Names keep only [A-Za-z0-9._-] (others become '_'):
    parts taken from a file's content cannot reach outside the output folder."""

    def __init__(self, out_dir, fmt):
        self.out_dir, self.fmt, self.stem, self.used, self.made = out_dir, fmt, "", set(), []

    def path(self, plot):
        """The path for plot `plot` of the current result file (marked as used)."""
        base = re.sub(r"[^A-Za-z0-9._-]", "_", f"{self.stem}_{plot}").lstrip(".-")[:150]
        name, n = base, 2
        while name.lower() in self.used:
            name, n = f"{base}-{n}", n + 1
        self.used.add(name.lower())
        return os.path.join(self.out_dir, f"{name}.{self.fmt}")


def save(fig, out, name, fmt, paths):
    """Saves `fig` as plot `name` under the names of `out` (a PlotNames; `fmt` is its format)."""
    p = out.path(name)
    fig.tight_layout()
    try:
        fig.savefig(p)
    except BaseException:
        # a full disk leaves a partial (often empty) file behind: remove it, then report
        if os.path.exists(p):
            os.remove(p)
        raise
    finally:
        plt.close(fig)
    paths.append(p)
    out.made.append(p)


def plot_underflow(doc, out, fmt):
    res = doc["results"]
    paths = []
    for key in sorted(k for k in res if k.startswith("histogram_d")):
        h = res[key]
        edges, counts = [num(e) for e in h["edges"]], h["counts"]
        few_bars(len(counts), f"bins in {key}")
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
        save(fig, out, key, fmt, paths)
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
        save(fig, out, "zero_fraction", fmt, paths)
    return paths


def loss_curves(series, title, out, name, fmt, paths):
    """One line per name of `series` (name -> per-step training losses), saved as `name`."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, losses in series.items():
        ax.plot(range(1, len(losses) + 1), [num(v) for v in losses], label=label, lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (cross-entropy, nats)")
    ax.set_title(title)
    ax.legend(fontsize=7)
    save(fig, out, name, fmt, paths)


def plot_lossscale(doc, out, fmt):
    res, paths = doc["results"], []
    sweep = res.get("sweep", [])
    if sweep:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        xs = [math.log2(r["scale"]) for r in sweep]
        for key, label, style in [("first_underflow", "layer 1 -> 0", "o-"), ("all_underflow", "all -> 0", "s-"),
                                  ("first_overflow", "layer 1 -> inf", "o--"), ("all_overflow", "all -> inf", "s--")]:
            ax.plot(xs, [100 * num(r[key]) for r in sweep], style, label=label)
        ax.set_xlabel("loss scale (log2)")
        ax.set_ylabel("gradients (%)")
        ax.set_title("Static loss scale: fp16 underflow and overflow")
        ax.legend(fontsize=8)
        save(fig, out, "sweep", fmt, paths)
    hist = res.get("history", {})
    if hist:
        loss_curves({n: h["loss"] for n, h in hist.items()}, "Training curves per recipe", out, "training", fmt, paths)
        dyn = [(n, h) for n, h in hist.items() if "scale" in h and len(set(map(str, h["scale"]))) > 1]
        if dyn:
            fig, ax = plt.subplots(figsize=(8, 4))
            for name, h in dyn:
                ax.plot(range(1, len(h["scale"]) + 1), [math.log2(num(v)) for v in h["scale"]], label=name)
            ax.set_xlabel("step")
            ax.set_ylabel("loss scale (log2)")
            ax.set_title("Dynamic loss scale history (GradScaler)")
            ax.legend(fontsize=8)
            save(fig, out, "scale_history", fmt, paths)
    gpt = res.get("gpt_history", {})
    if gpt:
        loss_curves({n: h["loss"] for n, h in gpt.items()}, "Tiny GPT on fortunes: training loss per precision policy",
                    out, "gpt", fmt, paths)
    return paths


def plot_dataparallel(doc, out, fmt):
    per_n, paths = doc.get("timings", {}).get("per_n", {}), []
    if per_n:
        few_bars(len(per_n), "rows in timings.per_n")
        rows = sorted(per_n.values(), key=lambda r: int(r["name"][1:]))
        ns = [int(r["name"][1:]) for r in rows]
        hidden = [r["allreduce_ms"] - r["exposed_ms"] for r in rows]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.bar([str(n) for n in ns], [r["compute_ms"] for r in rows], label="compute (incl. hidden all-reduce)")
        ax.bar([str(n) for n in ns], [r["exposed_ms"] for r in rows], bottom=[r["compute_ms"] for r in rows],
               label="exposed all-reduce")
        ax.set_xlabel("processes N")
        ax.set_ylabel("step time (ms)")
        ax.set_title("Data-parallel step time breakdown (run-dependent timings)")
        ax.legend(fontsize=8)
        save(fig, out, "step_time", fmt, paths)
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(ns, [100 * r["efficiency"] for r in rows], "o-", label="measured")
        ax.axhline(100, color="k", ls=":", label="ideal")
        ax.set_xlabel("processes N")
        ax.set_ylabel("scaling efficiency (%)")
        ax.set_title("Scaling efficiency against N = 1")
        ax.legend(fontsize=8)
        save(fig, out, "efficiency", fmt, paths)
        del hidden
    return paths


def plot_pipeline(doc, out, fmt):
    paths = []
    measured = doc.get("timings", {}).get("measured", [])
    sweep = doc["results"].get("sweep", [])
    if sweep:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        meas = {r["name"]: r for r in measured}
        for sched in sorted({r["schedule"] for r in sweep if r["schedule"] != "naive"}):
            rs = sorted([r for r in sweep if r["schedule"] == sched], key=lambda r: r["microbatches"])
            ms = [r["microbatches"] for r in rs]
            got = [100 * meas[r["name"]]["bubble"] for r in rs if r["name"] in meas]
            if len(got) == len(rs):
                ax.plot(ms, got, "o", label=f"{sched} measured")
        # One theory line per formula: (p-1)/(m+p-1), and (p-1)/(v*m+p-1) for interleaved-1f1b.
        for chunked in (False, True):
            th = sorted({(r["microbatches"], r["bubble_theory"]) for r in sweep
                         if r["schedule"] != "zb-h1" and r["bubble_theory"] is not None
                         and (r["schedule"] == "interleaved-1f1b") == chunked})
            if th:
                ax.plot([m for m, _ in th], [100 * b for _, b in th], "k--" if chunked else "k-",
                        label="theory (p-1)/(v*m+p-1), interleaved" if chunked else "theory (p-1)/(m+p-1)")
        # zb-h1's theory column is its time model (the programs replayed with the synthetic cost).
        zb = sorted((r["microbatches"], r["bubble_theory"]) for r in sweep
                    if r["schedule"] == "zb-h1" and r["bubble_theory"] is not None)
        if zb:
            ax.plot([m for m, _ in zb], [100 * b for _, b in zb], "k:", label="zb-h1 time model")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("microbatches m")
        ax.set_ylabel("bubble (% of stage time idle)")
        ax.set_title("Pipeline bubble against microbatches")
        ax.legend(fontsize=8)
        save(fig, out, "bubble", fmt, paths)
    events = doc.get("timings", {}).get("events", {})
    # One timeline per schedule, at the largest m up to 8 (readable labels).
    picks = {}
    for k in events:
        sched, _, m = k.partition(".m")
        if sched in ("gpipe", "1f1b", "interleaved-1f1b") and m.isdigit() and int(m) <= 8 and int(m) > int(picks.get(sched, ".m0").split(".m")[-1]):
            picks[sched] = k
    for name in sorted(picks.values()):
        ev = events[name]
        few_bars(len(ev), f"events in timings.events.{name}")
        fig, ax = plt.subplots(figsize=(10, 3))
        for e in ev:
            color = "#4477aa" if e["op"].startswith("F") else "#ee6677"
            ax.barh(e["stage"], (e["end_s"] - e["start_s"]) * 1e3, left=e["start_s"] * 1e3, color=color,
                    edgecolor="white")
            ax.text((e["start_s"] + e["end_s"]) / 2 * 1e3, e["stage"], e["op"], ha="center", va="center", fontsize=6)
        ax.invert_yaxis()
        ax.set_xlabel("time (ms)")
        ax.set_ylabel("stage")
        ax.set_title(f"Pipeline timeline {name} (F forward, B backward{'; Fj.k: chunk k' if '.' in ev[0]['op'] else ''}; "
                     "gaps are the bubble)" if ev else f"Pipeline timeline {name}")
        save(fig, out, f"gantt_{name}", fmt, paths)
    return paths


def plot_accumulate(doc, out, fmt):
    rows, paths = doc["results"].get("memory", []), []
    if rows:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.plot([r["micro_batch"] for r in rows], [r["peak_bytes"] / 2**20 for r in rows], "o-")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("micro-batch size (samples)")
        ax.set_ylabel("peak bytes above params + grads (MiB)")
        ax.set_title("Gradient accumulation: peak memory against micro-batch size")
        save(fig, out, "memory", fmt, paths)
    return paths


def plot_checkpoint(doc, out, fmt):
    res, paths = doc["results"], []
    sweep = res.get("sweep", [])
    if sweep:
        times = doc.get("timings", {}).get("step_time_s", {})
        fig, ax = plt.subplots(figsize=(8, 4.5))
        ax.plot([r["segments"] for r in sweep], [r["peak_bytes"] / 2**20 for r in sweep], "o-", label="peak memory")
        ax.set_xlabel("segments s")
        ax.set_ylabel("peak bytes during forward+backward (MiB)")
        ax.set_title("Gradient checkpointing: memory against segments (Chen et al.: optimum near sqrt n)")
        if times:
            ax2 = ax.twinx()
            seg = [r for r in res.get("segments", []) if r["name"] in times]
            ax2.plot([r["segments"] for r in seg], [times[r["name"]]["vs_none"] for r in seg], "s--", color="#ee6677",
                     label="step time vs none")
            ax2.set_ylabel("step time / no checkpointing (x)")
            ax2.legend(fontsize=8, loc="upper center")
        ax.legend(fontsize=8, loc="upper right")
        save(fig, out, "memory_time", fmt, paths)
    return paths


def plot_collectives(doc, out, fmt):
    """busbw and time against message size (log-log), one line per operation (timings.<op>)."""
    tim, paths = doc.get("timings", {}), []
    ops = [op for op in doc["config"]["ops"] if tim.get(op)]
    env = doc.get("env", {}).get("collectives", {})
    where = f"{env.get('ranks', '?')} ranks, {env.get('backend', '?')}, {doc['config'].get('dtype', '')}"
    for key, label, name in (("busbw_gbps", "busbw (GB/s)", "busbw"), ("time_us", "time per call (us)", "time")):
        # A value <= 0 has no place on a log axis (busbw is 0 on one rank: nothing crosses a link);
        # such points are left out and said so, in the legend and, for a plot left empty, on stderr.
        if not any(num(r[key]) > 0 for op in ops for r in tim[op]):
            print(f"plot.py: {out.stem}: no {name} plot: every {key} is 0 or less "
                  f"({env.get('ranks', '?')} rank(s); nothing to draw on a log axis)", file=sys.stderr)
            continue
        fig, ax = plt.subplots(figsize=(8, 4.8))
        for op in ops:
            rows = [r for r in tim[op] if num(r[key]) > 0]
            left = len(tim[op]) - len(rows)
            if not rows:
                ax.plot([], [], " ", label=f"{op}: every {key} <= 0, not drawn")
                continue
            via = rows[0].get("via")
            ax.plot([r["size"] for r in rows], [num(r[key]) for r in rows], "-", marker=".",
                    label=op + (f" ({via})" if via else "") + (f" ({left} sizes <= 0 left out)" if left else ""))
            # mpt's send/recv ring timed beside Gloo's native reduce_scatter / all_gather (dashed)
            ring_key = "ring_" + key
            ring = [r for r in rows if num(r.get(ring_key, 0)) > 0]
            if ring:
                ax.plot([r["size"] for r in ring], [num(r[ring_key]) for r in ring], "--", marker=".",
                        label=op + " (ring: send/recv, mpt)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes; nccl-tests' size: the larger buffer)")
        ax.set_ylabel(label)
        ax.set_title(f"mpt collectives: {name} against size ({where}; run-dependent timings)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        save(fig, out, name, fmt, paths)
    return paths


def stacked_bars(ax, labels, series):
    """Stacked bars over `labels`: `series` is a list of (label, values), drawn bottom to top."""
    bottom = [0.0] * len(labels)
    for label, vals in series:
        ax.bar(labels, vals, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, vals)]


def plot_shard(doc, out, fmt):
    """Bytes per rank of each ZeRO stage: measured model states (stacked by role) against this
    implementation's formula and the ZeRO paper's; and the loss curves of the stages."""
    paths, res = [], doc["results"]
    mem = [r for r in res.get("memory", []) if re.fullmatch(r"stage[0-3]", r["name"])]
    if mem:
        few_bars(len(mem), "rows in results.memory")
        names = [r["name"] for r in mem]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        stacked_bars(ax, names, [(f"{label} (measured)", [r[role] / 2**20 for r in mem])
                                 for role, label in (("params", "parameters"), ("grads", "gradients"),
                                                     ("optimizer", "optimizer states"))])
        ax.plot(names, [r["total_formula"] / 2**20 for r in mem], "kD", label="formula (this implementation)")
        ax.plot(names, [r["paper"] / 2**20 for r in mem], "r_", markersize=20, mew=2, label="ZeRO paper")
        ax.set_xlabel("ZeRO stage")
        ax.set_ylabel("model states per rank (MiB)")
        ax.set_title("Bytes per rank vs formula")
        ax.legend(fontsize=8)
        save(fig, out, "bytes_per_rank", fmt, paths)
    loss = res.get("loss", [])
    if loss:
        fig, ax = plt.subplots(figsize=(7, 4))
        for key in [k for k in loss[0] if k.startswith("stage") or k == "single"]:
            ax.plot([r["step"] for r in loss], [num(r[key]) for r in loss], marker=".", label=key)
        ax.set_xlabel("step")
        ax.set_ylabel("loss (cross-entropy)")
        ax.set_title("Loss per step, every ZeRO stage and one process")
        ax.legend(fontsize=8)
        save(fig, out, "loss", fmt, paths)
    return paths


def plot_lowbit_history(doc, out, fmt, paths, title, key="history", name="training"):
    """Training loss per recipe/variant from results.<key> (a list of losses per name)."""
    hist = doc["results"].get(key, {})
    if hist:
        loss_curves(hist, title, out, name, fmt, paths)


def ledger_bars(ledger, title, out, name, fmt, paths):
    """A GEMM ledger's rows (name, rel_error) as horizontal bars, in the table's order."""
    if not ledger:
        return
    few_bars(len(ledger), f"rows in the {name}")
    fig, ax = plt.subplots(figsize=(9, max(4.8, 0.12 * len(ledger))))
    ax.barh(range(len(ledger)), [100 * num(r["rel_error"]) for r in ledger])
    ax.set_yticks(range(len(ledger)), [r["name"] for r in ledger], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("relative error of the GEMM against fp32 (%)")
    ax.set_title(title)
    save(fig, out, name, fmt, paths)


def plot_fp8(doc, out, fmt):
    """fp8: the loss curves per recipe; the GEMM ledger's relative error per recipe, layer and GEMM;
    the outlier window (% of x saturated and flushed per step, current vs delayed scaling); the
    tiny GPT's loss curves and GEMM ledger when its section ran."""
    paths, res = [], doc["results"]
    plot_lowbit_history(doc, out, fmt, paths, "fp8 recipes: training loss")
    ledger_bars(res.get("ledger", []), "GEMM ledger: each recipe's error per layer and GEMM (out, dgrad, wgrad)",
                out, "ledger", fmt, paths)
    plot_lowbit_history(doc, out, fmt, paths, "fp8 recipes on the tiny GPT: training loss", "gpt_history", "gpt_training")
    ledger_bars(res.get("gpt_ledger", []), "Tiny GPT's GEMM ledger: each recipe's error per block GEMM",
                out, "gpt_ledger", fmt, paths)
    outl = res.get("outlier", [])
    if outl:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        steps = [r["step"] for r in outl]
        for key, label in (("current", "current scaling"), ("delayed_max", "delayed (max)"),
                           ("delayed_recent", "delayed (most_recent)")):
            if f"{key}_saturated" in outl[0]:
                ax.plot(steps, [100 * num(r[f"{key}_saturated"]) for r in outl], marker=".", label=f"{label}: saturated")
                ax.plot(steps, [100 * num(r[f"{key}_flushed"]) for r in outl], "--", label=f"{label}: flushed to 0")
        ax.set_xlabel("step")
        ax.set_ylabel("x operand of the watched out GEMM (%)")
        ax.set_title("An outlier batch: current vs delayed scaling")
        ax.legend(fontsize=7)
        save(fig, out, "outlier", fmt, paths)
    return paths


def plot_fp4(doc, out, fmt):
    """fp4: the loss curves of the NVFP4 ablations and MXFP4."""
    paths = []
    plot_lowbit_history(doc, out, fmt, paths, "fp4 variants: training loss")
    return paths


TRACE_COLORS = {"F": "#4477aa", "B": "#ee6677", "W": "#228833", "comm": "#ccbb44", "optimizer": "#aa3377",
                "backward": "#ee6677", "forward": "#4477aa"}


TRACE_BARS = 2000  # bars drawn per row and colour of a timeline, at most; more are drawn as coverage (below)
TRACE_MAX_LABELS = 1000  # slice names drawn at most (each is a text artist: slow, and unreadable by the thousand)
TRACE_MAX_ROWS = 512  # rank and track rows of a timeline, at most (0.45 inch each: 512 are 23,000 pixels tall)


def merged_spans(spans):
    """`spans` (a list of (start, width), any order) sorted, those that overlap or touch merged
    into one: the same area drawn with fewer bars (nested slices, back-to-back operations)."""
    spans.sort()
    out = []
    for start, width in spans:
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], start + width)
        else:
            out.append([start, start + width])
    return [(b, e - b) for b, e in out]


def coverage(spans, span, bins):
    """The fraction of each of `bins` equal intervals of [0, span) that `spans` ((start, width),
    disjoint) cover, as a numpy array of `bins` values in [0, 1]. Exact: it is the difference at
    the bin edges of F(x) = sum_i clamp(x - start_i, 0, width_i), the covered length below x,
    computed from the sorted starts and ends and their prefix sums in O(n log n)."""
    import numpy as np  # matplotlib's own dependency

    a = np.sort(np.array([s for s, _ in spans], dtype=float))
    b = np.sort(np.array([s + w for s, w in spans], dtype=float))
    ca, cb = np.concatenate(([0.0], np.cumsum(a))), np.concatenate(([0.0], np.cumsum(b)))
    x = np.linspace(0.0, span, bins + 1)
    ia, ib = np.searchsorted(a, x), np.searchsorted(b, x)
    covered = (ia * x - ca[ia]) - (ib * x - cb[ib])
    return np.clip(np.diff(covered) / (span / bins), 0.0, 1.0)


def plot_trace(doc, out, fmt):
    """A Chrome Trace Event file (mpt --trace FILE, docs/timelines.md) as a timeline: one row per
    rank and track (compute, communication, optimizer; a pipeline on threads: per stage), a bar
    per complete ("X") slice, send -> recv flow arrows (at most 400 drawn).
    What is drawn is bounded whatever the number of slices, so that time and memory grow with the
    file only while it is read (at most MAX_BYTES): the slices of one row and colour are one
    collection of bars (broken_barh), overlapping ones merged; a row and colour with more than
    TRACE_BARS bars after merging (far more than the plot's ~1000 pixels can tell apart) is drawn
    instead as its coverage in TRACE_BARS columns, each as opaque as the fraction of its time the
    slices cover, so a track busy 10% of the time looks 10% busy; at most TRACE_MAX_LABELS names,
    each on a slice wide enough to hold it. (One barh artist per slice took 190 s and 4.6 GB for
    a 59 MiB trace; this takes about 6 s and 0.5 GB: docs/results.md.)"""
    paths = []
    evs = doc["traceEvents"]
    pname = {e["pid"]: e["args"]["name"] for e in evs if e.get("ph") == "M" and e.get("name") == "process_name"}
    tname = {(e["pid"], e["tid"]): e["args"]["name"] for e in evs
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    xs = [e for e in evs if e.get("ph") == "X" and not str(e.get("name", "")).startswith("mpt ")]
    if not xs:  # a single-process experiment records only its root slice "mpt <experiment>": draw that
        xs = [e for e in evs if e.get("ph") == "X"]
    if not xs:
        raise ValueError("no slices in the trace")
    rows = sorted({(e["pid"], e["tid"]) for e in xs})
    if len(rows) > TRACE_MAX_ROWS:
        raise Unplottable(f"{len(rows)} rank and track rows, more than the {TRACE_MAX_ROWS} a timeline image can "
                         f"show (open it in ui.perfetto.dev)")
    row_of = {k: i for i, k in enumerate(rows)}
    t0 = min(e["ts"] for e in xs)
    span_ms = max(max(e["ts"] + e["dur"] for e in xs) - t0, 1e-9) / 1e3
    bars, labels = {}, []  # (row, colour) -> [(start ms, width ms)]; (x ms, row, name)
    for e in xs:
        name = str(e["name"])
        kind = (e.get("args") or {}).get("kind") if e.get("cat") == "compute" else None
        color = TRACE_COLORS.get(kind) or TRACE_COLORS.get(e.get("cat")) or TRACE_COLORS.get(name, "#999999")
        y = row_of[(e["pid"], e["tid"])]
        start, width = (e["ts"] - t0) / 1e3, e["dur"] / 1e3
        bars.setdefault((y, color), []).append((start, width))
        # about 4 pixels per character at fontsize 5 on a plot about 1000 pixels wide
        if kind and width > 0 and width >= span_ms * len(name) / 250 and len(labels) < TRACE_MAX_LABELS:
            labels.append((start + width / 2, y, name))
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.45 * len(rows)))
    for (y, color), spans in bars.items():
        spans = merged_spans(spans)
        if len(spans) <= TRACE_BARS:
            ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=color, edgecolor="none")
        else:
            import numpy as np  # matplotlib's own dependency
            from matplotlib.colors import to_rgb

            rgba = np.empty((1, TRACE_BARS, 4))
            rgba[..., :3], rgba[..., 3] = to_rgb(color), coverage(spans, span_ms, TRACE_BARS)
            ax.imshow(rgba, extent=(0, span_ms, y + 0.4, y - 0.4), aspect="auto", interpolation="nearest")
    del bars
    for x, y, name in labels:
        ax.text(x, y, name, ha="center", va="center", fontsize=5)
    starts = {e["id"]: e for e in evs if e.get("ph") == "s"}
    drawn = 0
    for e in evs:
        if e.get("ph") != "f" or e["id"] not in starts or drawn >= 400:
            continue
        s = starts[e["id"]]
        if (s["pid"], s["tid"]) in row_of and (e["pid"], e["tid"]) in row_of:
            ax.annotate("", xy=((e["ts"] - t0) / 1e3, row_of[(e["pid"], e["tid"])]),
                        xytext=((s["ts"] - t0) / 1e3, row_of[(s["pid"], s["tid"])]),
                        arrowprops={"arrowstyle": "->", "color": "#444444", "lw": 0.4})
            drawn += 1
    ax.set_xlim(-0.02 * span_ms, 1.02 * span_ms)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # row 0 on top
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{pname.get(p, f'pid {p}')} {tname.get((p, t), f'tid {t}')}" for p, t in rows], fontsize=7)
    ax.set_xlabel("time since the first slice (ms, rank 0's clock)")
    exp = doc.get("otherData", {}).get("experiment", "?")
    ax.set_title(f"Timeline of mpt {exp} (F forward, B backward, W weight gradient; yellow communication; "
                 f"arrows send -> recv)", fontsize=9)
    save(fig, out, "timeline", fmt, paths)
    return paths


def plot_tensorparallel(doc, out, fmt):
    """Activation bytes per layer of one process, TP and TP + SP: measured (timings, when present)
    against the fp32 formula of what runs and Korthikanti's fp16 formula; and each GEMM and
    cross-entropy site's max |diff| / bound (<= 1 passes)."""
    paths, res = [], doc["results"]
    act = res.get("activations", [])
    if act:
        few_bars(len(act), "rows in results.activations")
        names = [r["name"] for r in act]
        measured = {r["name"]: r["measured"] for r in doc.get("timings", {}).get("activations_measured", [])
                    if isinstance(r, dict) and "measured" in r}
        fig, ax = plt.subplots(figsize=(7, 4.5))
        if measured:
            ax.bar(names, [measured.get(n, 0) / 2**10 for n in names], label="measured (allocator)")
        ax.plot(names, [r["formula_fp32"] / 2**10 for r in act], "kD", label="fp32 formula (what runs)")
        ax.plot(names, [r["korthikanti"] / 2**10 for r in act], "r_", markersize=20, mew=2,
                label="Korthikanti (fp16, dropout)")
        ax.set_ylabel("activation bytes per layer (KiB)")
        ax.set_title("Activation bytes per layer vs formula")
        ax.legend(fontsize=8)
        save(fig, out, "activation_bytes", fmt, paths)
    sites = [r for r in res.get("sites", []) if r.get("kind") == "bound"]
    if sites:
        few_bars(len(sites), "bound sites in results.sites")
        fig, ax = plt.subplots(figsize=(8, 4.5))
        ax.barh([r["name"] for r in sites], [num(r["worst_ratio"]) for r in sites])
        ax.axvline(1.0, color="r", label="bound")
        ax.set_xlabel("max |TP - one process| / derived bound")
        ax.set_title("GEMM and cross-entropy sites against their reordering bounds")
        ax.tick_params(axis="y", labelsize=6)
        ax.legend(fontsize=8)
        save(fig, out, "site_bounds", fmt, paths)
    mesh = res.get("mesh", [])
    if mesh:  # a DP x TP x PP mesh run: its loss per step, and how far its parameters are from one process
        steps = list(range(1, len(mesh) + 1))
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
        a1.plot(steps, [num(r["loss"]) for r in mesh], "o-")
        a1.set_xlabel("step")
        a1.set_ylabel("mesh loss (nats)")
        a1.set_title(f"Mesh {doc.get('env', {}).get('mesh', '')}: training loss")
        a2.plot(steps, [num(r["vs_one_process"]) for r in mesh], "o-", label="max |theta_mesh - theta_1proc|")
        a2.plot(steps, [num(r["vs_tp_ref"]) for r in mesh], "s--", label="max |theta_mesh - theta_TP ref|")
        a2.set_xlabel("step")
        a2.set_ylabel("max |d theta|")
        a2.set_title("Parameters against one process")
        a2.legend(fontsize=8)
        fig.tight_layout()
        save(fig, out, "mesh", fmt, paths)
    return paths


def plot_plan(doc, out, fmt):
    """`mpt plan`: the memory per device of the layout, term by term (one stacked bar), or with
    --search the frontier's layouts stacked by term; and the search's frontier: every fitting
    layout's step time against its memory, the frontier drawn through the best."""
    paths, res = [], doc["results"]
    mem = [r for r in res.get("memory", []) if r["name"] != "total"]
    if mem:
        few_bars(len(mem), "rows in results.memory")
        fig, ax = plt.subplots(figsize=(5, 5))
        stacked_bars(ax, ["layout"], [(r["name"], [r["bytes"] / 2**30]) for r in mem])
        ax.set_ylabel("memory per device (GiB)")
        ax.set_title("Memory per device by term")
        ax.legend(fontsize=7)
        save(fig, out, "memory", fmt, paths)
    front = res.get("frontier", [])
    if front:
        few_bars(len(front) * 5, "bars of results.frontier")
        labels = [f"{r['dp']}x{r['tp']}x{r['pp']} mb{r['microbatch']} z{r['zero']} {r['recompute'][:3]}" for r in front]
        fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(front) + 2), 5))
        stacked_bars(ax, labels, [(label, [r[key] for r in front])
                                  for key, label in (("weights_gib", "weights"), ("gradients_gib", "gradients"),
                                                     ("optimizer_gib", "master + optimizer"),
                                                     ("activations_gib", "activations"), ("other_gib", "other"))])
        ax.set_ylabel("memory per device (GiB)")
        ax.set_title("Frontier layouts (dp x tp x pp): memory by term")
        ax.tick_params(axis="x", labelrotation=60, labelsize=7)
        ax.legend(fontsize=7)
        save(fig, out, "memory_by_layout", fmt, paths)
        pts = res.get("search_points", [])
        fig, ax = plt.subplots(figsize=(7, 5))
        if pts:
            ax.scatter([p["memory_gib"] for p in pts], [p["step_s"] for p in pts], s=8, alpha=0.4, label="fitting layouts")
        ax.plot([r["memory_gib"] for r in front], [r["step_s"] for r in front], "r.-", label="frontier")
        ax.set_xlabel("memory per device (GiB)")
        ax.set_ylabel("step time (s)")
        ax.set_title("Search: step time against memory")
        ax.legend(fontsize=8)
        save(fig, out, "frontier", fmt, paths)
    return paths


def plot_contextparallel(doc, out, fmt):
    """Context parallelism: each run's attention error against its derived bound (<= 1 passes), the
    useful and computed query-key pairs per rank of the two splits, and the activation bytes of a
    block per rank (formula, and measured where the timings have it)."""
    paths, res = [], doc["results"]
    att = res.get("attention", [])
    if att:
        few_bars(len(att), "rows in results.attention")
        fig, ax = plt.subplots(figsize=(8, 5))
        ax.barh([r["name"] for r in att], [num(r["worst_ratio"]) for r in att])
        ax.axvline(1.0, color="r", label="bound")
        ax.set_xlabel("max |computed - exact| / derived bound")
        ax.set_title("Attention (y, dq, dk, dv) against the exact float64 attention")
        ax.tick_params(axis="y", labelsize=6)
        ax.legend(fontsize=8)
        save(fig, out, "attention_bounds", fmt, paths)
    bal = res.get("balance", [])
    if bal:
        few_bars(len(bal), "rows in results.balance")
        names = [r["name"] for r in bal]
        x = list(range(len(names)))
        fig, ax = plt.subplots(figsize=(8, 4.5))
        ax.bar([i - 0.2 for i in x], [r["useful"] for r in bal], width=0.4, label="useful (unmasked) pairs")
        ax.bar([i + 0.2 for i in x], [r["computed"] for r in bal], width=0.4, label="pairs the ring computes")
        ax.set_xticks(x)
        ax.set_xticklabels(names, rotation=30, fontsize=8)
        ax.set_ylabel("query-key pairs per rank")
        ax.set_title("Causal load balance: contiguous vs balanced (2c chunks) split")
        ax.legend(fontsize=8)
        save(fig, out, "load_balance", fmt, paths)
    act = res.get("activations", [])
    if act:
        few_bars(len(act), "rows in results.activations")
        names = [r["name"] for r in act]
        measured = {r["name"]: r["max_rank"] for r in doc.get("timings", {}).get("activations_measured", [])
                    if isinstance(r, dict) and "max_rank" in r}
        fig, ax = plt.subplots(figsize=(7, 4.5))
        if measured:
            ax.bar(names, [measured.get(n, 0) / 2**10 for n in names], label="measured (allocator, max over ranks)")
        ax.plot(names, [r["formula"] / 2**10 for r in act], "kD", label="formula")
        ax.set_ylabel("activation bytes per block and rank (KiB)")
        ax.set_title("Activation bytes per rank under context parallelism")
        ax.legend(fontsize=8)
        save(fig, out, "activation_bytes", fmt, paths)
    return paths


def plot_expertparallel(doc, out, fmt):
    """Expert parallelism: the imbalance (max/mean tokens per expert) and the dropped fraction per
    training step of each balancing method, the loss curves, the tokens per expert at the last
    step, and the dropped fraction against the capacity factor."""
    paths, res = [], doc["results"]
    bal = [r for r in res.get("balance", []) if isinstance(r, dict) and "imbalance" in r]
    if bal:
        fig, axes = plt.subplots(1, 3, figsize=(14, 4))
        for r in bal:
            steps = list(range(1, len(r["imbalance"]) + 1))
            axes[0].plot(steps, [num(v) for v in r["imbalance"]], label=r["name"])
            axes[1].plot(steps, [num(v) for v in r["dropped"]], label=r["name"])
            axes[2].plot(steps, [num(v) for v in r["loss"]], label=r["name"])
        axes[0].set_ylabel("max / mean tokens per expert (worst layer)")
        axes[1].set_ylabel("dropped fraction of the token choices")
        axes[2].set_ylabel("training loss (nats)")
        for ax in axes:
            ax.set_xlabel("step")
            ax.legend(fontsize=8)
        fig.suptitle("Load balancing over training: none, Switch's aux loss, DeepSeek-V3's aux-free bias")
        save(fig, out, "balance", fmt, paths)
    tok = res.get("tokens_per_expert", [])
    if tok:
        few_bars(len(tok), "rows in results.tokens_per_expert")
        experts = sorted((k for k in tok[0] if re.fullmatch(r"e\d+", k)), key=lambda k: int(k[1:]))
        fig, ax = plt.subplots(figsize=(8, 4.5))
        width = 0.8 / len(tok)
        for j, r in enumerate(tok):
            ax.bar([i + j * width for i in range(len(experts))], [r[k] for k in experts], width=width, label=r["name"])
        ax.axhline(tok[0]["capacity"], color="r", ls="--", label="capacity x e")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(experts))])
        ax.set_xticklabels(experts)
        ax.set_ylabel("tokens at the last step")
        ax.set_title("Tokens per expert (every rank's)")
        ax.legend(fontsize=7)
        save(fig, out, "tokens_per_expert", fmt, paths)
    drops = res.get("dropped_vs_capacity", [])
    if drops:
        cf = [num(r["capacity_factor"]) for r in drops]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for key in [k for k in drops[0] if k not in ("capacity_factor", "capacity")]:
            ax.plot(cf, [num(r[key]) for r in drops], "o-", label=key if key == "initial" else "trained " + key)
        ax.set_xscale("log")
        ax.set_xlabel("capacity factor")
        ax.set_ylabel("dropped fraction of the token choices")
        ax.set_title("Dropped tokens vs capacity factor")
        ax.legend(fontsize=8)
        save(fig, out, "dropped_vs_capacity", fmt, paths)
    return paths


PLOTTERS = {"underflow": plot_underflow, "lossscale": plot_lossscale, "dataparallel": plot_dataparallel,
            "pipeline": plot_pipeline, "accumulate": plot_accumulate, "checkpoint": plot_checkpoint,
            "collectives": plot_collectives, "shard": plot_shard, "fp8": plot_fp8, "fp4": plot_fp4,
            "tensorparallel": plot_tensorparallel, "contextparallel": plot_contextparallel,
            "expertparallel": plot_expertparallel, "plan": plot_plan}


MAX_BYTES = 64 * 2**20  # the most plot.py reads of one result file


def plot_file(f, names):
    """Plots result file `f` with `names` (its stem set here). Returns None, or one line saying
    why the file could not be plotted (the plots made before a failure stay, in names.made)."""
    names.stem = os.path.basename(f)[:-5] if f.endswith(".json") else os.path.basename(f)
    names.made = []
    try:
        with open(f, "rb") as fh:
            data = fh.read(MAX_BYTES + 1)  # bounded: /dev/zero or a huge file must not fill the memory
    except OSError as e:
        return f"cannot read: {e.strerror}"
    if len(data) > MAX_BYTES:
        return f"too large: more than {MAX_BYTES // 2**20} MiB (mpt result files are far smaller)"
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return f"not a JSON result file: {cut(str(e))}"
    if not isinstance(doc, dict):
        return f"not an mpt result file: expected a JSON object, got {type(doc).__name__}"
    if "traceEvents" in doc:  # a timeline (mpt --trace FILE), not a result file
        try:
            plot_trace(doc, names, names.fmt)
        except OSError as e:
            return f"cannot write a plot to {names.out_dir}: {e.strerror}"
        except Unplottable as e:
            return f"cannot plot: {e}"
        except Exception as e:  # noqa: BLE001 - malformed content: one line, then the next file
            return f"not a valid trace ({cut(f'{type(e).__name__}: {e}')})"
        finally:
            plt.close("all")
        return None
    exp = doc.get("experiment")
    if exp is None:
        return "not an mpt result file (no \"experiment\" key) nor a trace (no \"traceEvents\")"
    if exp not in PLOTTERS:
        return f"no plots for experiment {cut(repr(exp))} (known: {', '.join(PLOTTERS)})"
    try:
        PLOTTERS[exp](doc, names, names.fmt)
        if not names.made:  # e.g. a config whose sections have no plot: said, not a silent exit 0
            return f"no plots in this {exp} result (none of its tables {cut(sorted(doc.get('results', {})))} has one)"
    except OSError as e:
        return f"cannot write a plot to {names.out_dir}: {e.strerror}"
    except Unplottable as e:
        return f"cannot plot: {e}"
    except Exception as e:  # noqa: BLE001 - any malformed content: one line, then the next file
        what = f"missing key {e}" if isinstance(e, KeyError) else f"{type(e).__name__}: {e}"
        return f"not a valid {exp} result ({cut(what)})"
    finally:
        plt.close("all")
    return None


def cut(text, limit=120):
    """`text` on one line, cut to `limit` characters (with "...") for messages."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+")
    ap.add_argument("--out-dir", default="plots")
    ap.add_argument("--format", default="png", choices=["png", "svg"])
    args = ap.parse_args()
    load_matplotlib()  # before --out-dir is made: without matplotlib nothing is written
    made = []  # the folders writable_out_dir is about to make, deepest first
    d = os.path.abspath(args.out_dir)
    while not os.path.exists(d):
        made.append(d)
        d = os.path.dirname(d)
    writable_out_dir("plot", args.out_dir)
    names, failed = PlotNames(args.out_dir, args.format), 0
    stdout_error = None
    for f in args.results:
        why = plot_file(f, names)
        for p in names.made:
            if stdout_error is None:
                try:
                    print(p)
                except OSError as e:  # stdout on a full disk or closed: the plots are still made
                    stdout_error = e
        if why is not None:
            print(f"plot: {f}: {why}", file=sys.stderr)
            failed += 1
    # 0: every file plotted; 1: some files failed (each named above); 2: none could be plotted.
    status = 0 if failed == 0 else 2 if failed == len(args.results) else 1
    if status == 2:  # nothing plotted: take away the folders this run made, while they are empty
        for d in made:
            try:
                os.rmdir(d)
            except OSError:
                break
    if stdout_error is None:
        try:
            sys.stdout.flush()
        except OSError as e:
            stdout_error = e
    if stdout_error is not None:  # the plot names could not be printed
        sys.stdout = None  # nothing more to flush at exit
        print(f"plot: cannot write the plot names to stdout: {stdout_error.strerror}", file=sys.stderr)
        sys.exit(3)
    sys.exit(status)


if __name__ == "__main__":
    main()
