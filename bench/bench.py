#!/usr/bin/env python3
"""mpt against the same work in PyTorch-Python on the same LibTorch (MPT_REF_PYTHON: the default
route's .venv-torch2 Python with LibTorch 2.x, or Debian's python3-torch 1.13 for build-debian/;
scripts/bench.sh sets it), so what differs is the front end; side by side, in one run (issue 8).

Every benchmark first runs mpt once and its PyTorch-Python twin once and checks that both
computed the same numbers; only then does it time them, alternately (mpt, Python, mpt,
Python, ...) for --rounds rounds after one warm-up round, and report the median of each and
the median of the per-round ratios mpt/Python. Absolute times drift on a shared machine;
ratios measured side by side drift much less. Timings are reported, never asserted.

Benchmarks (--only NAME, repeatable; default: all):
  whole-process pairs: `mpt <experiment>` vs tests/parity/<experiment>_ref.py on mpt's resolved
  config, every value of the reference checked equal by tests/parity/compare.py first; wall
  time and peak RSS (wait4 rusage); the defaults (issue 16's target <= 0.5) and, unless --quick, one
  larger config. Where the reference covers part of an experiment, both sides run that part:
  underflow    defaults; configs/underflow_depth_sweep.json
  lossscale    the static loss-scale sweep (train.enabled=false, gpt.enabled=false); defaults and a 64-128x24-1 net
  accumulate   every section but the memory table, which mpt shrinks to one row of batch 1
               (timing.repeats=1); defaults and hidden 256, batch 128
  dataparallel sections 1-2, shard equivalence and uneven shards (train.enabled=false, --nproc 1);
               defaults and a 256-512-1 MLP, batch 2048
  pipeline     exact splits and the microbatch sweep with no synthetic cost (cost.forward_us=0,
               pipeline.steps=1); defaults and a 128-256x7-1 MLP, batch 256
  checkpoint   gradients of every segment row, 1 timed step per row on both sides (the reference
               with --timed; checkpoint.sweep=false); defaults and width 64, batch 512.
               Then the inner loop: see below
  mlp          inner loop: the lossscale MLP (784-64x2-10, batch 128, SGD) trained by
               `mpt lossscale` (recipes fp32, bf16, fp16, fp16+master+dynamic) vs
               bench/mlp_train.py (the same loop op for op): step time per recipe; loss of
               every step checked equal first. Also emulated fp16 (and bf16) step / fp32 step
               within each (issue 16's target: fp16 <= 1.5x fp32)
  mlp_large    the same for a large model, fp32 only: 784-512x2-10, batch 256, 10 steps
  mlp_native   the mlp pair with train.compute=native: bf16 and fp16 tensors and LibTorch's own
               kernels for them (oneDNN; AMX and AVX512-FP16 where the CPU has them) on both
               sides, recipes bf16 and fp16 (fp16 only where this LibTorch has a CPU fp16 matmul)
               beside fp32; losses, lost-update and gradient-underflow counts checked equal first
  ddp          inner loop: `mpt dataparallel --nproc 2` (N = 2, Gloo) vs torch's
               DistributedDataParallel (bench/dataparallel_ddp.py), same model, batches and
               buckets: step time; the final loss checked equal (to roundoff) first
  accumulate_step  inner loop: the accumulated step `mpt accumulate` times in its memory table
               (zero the gradients, then batch B in k micro-batches, forward + backward + loss.item()
               each; MLP 784-H-H-10) vs bench/accumulate_step.py (the same step in PyTorch-Python):
               k = 1 and 4, B = 512, H = 128, median of 21 steps; checked equal first: every value
               the accumulate parity reference computes on the same run (the gradients, training,
               normalisation and BatchNorm sections use the same accumulate_grad), bit for bit. The
               memory rows themselves hold no value to compare (allocator bytes, times). Rows
               *_gemm_floor: the step's GEMMs alone, timed in the twin (its 'mpt' column), against the
               Python step: the lowest ratio any front end running the same kernels could reach;
               rows *_gemm_rate: the GF/s a step of nothing but these GEMMs would need to meet
               <= 0.67 vs the GF/s they reach alone (above 1: out of reach of these kernels); rows
               *_floor_sum: those GEMMs less their per-call cost + the other kernels' size-dependent
               work (the twin's elementwise_floor) + mpt's fixed overhead (the same step at batch 4,
               hidden 1), each timed hot and alone, against the Python step: the lowest ratio
               LibTorch's kernels and autograd engine leave
  pipeline_step    inner loop: one `mpt pipeline` step on the threads executor, no synthetic cost
               (1f1b, m = 8, 4 stages on min(4, cores) threads, env.pipeline_workers;
               timings.measured step_ms, median of 5 steps) vs
               bench/pipeline_step.py (the same microbatch loop in one Python thread, what a user
               without a pipeline runtime writes); the step's loss and max |g - g_full| checked
               equal (bit for bit) first
  zero2        inner loop: `mpt shard --nproc 2` (N = 2, Gloo) with stages 0 and 2 in one run:
               the ZeRO-2 step (reduce-scatter + sharded Adam + all-gather) / the DDP step
               (all-reduce + Adam), issue 19's target <= 1.1; both equal bitwise (the run's own
               checks, exit 0) before timing. 'mpt' = ZeRO-2, 'python' = DDP (both mpt)
  zero2_ring   the same with --set dist.gloo_algorithm=ring (mpt's send/recv ring reduce-scatter and
               all-gather instead of Gloo's native ones; each direction on its own Gloo process group)
  gemm         this machine's GEMM ceilings: torch.mm 2048^3 in fp32, bf16, fp16 at the bench's threads;
               with mlp_large, that step's GFLOP/s and its fraction of the fp32 ceiling
  defaults     what a user sees: mpt at its defaults (threads and OpenMP wait policy its own choice)
               vs PyTorch-Python at PyTorch's (threads and wait policy untouched, no bench settings):
               the lossscale fp32 MLP (784-64x2-10) at batch 64, 256, 1024 vs a plain loop, quiet
               and beside a process spinning on one core; the pipeline step (1f1b, m = 8) vs its
               one-thread Python loop. First loss / step loss checked equal first. Target: quiet <= 1.0
  busy         mpt's fp32 MLP step on every core while another process spins on one: OMP_WAIT_POLICY
               ACTIVE (spinning waiters) vs PASSIVE (what mpt picks when it starts beside a busy
               process); the losses checked equal first
  trace        --trace overhead (issue 20's target <= 5 %): `mpt dataparallel --nproc 2` (N = 2) step
               time and `mpt pipeline` (1f1b, m = 8, threads; 200 us/layer synthetic cost, and none)
               step time with --trace FILE vs without, alternately; the results checked equal first. 'mpt' = traced,
               'python' = untraced (both mpt)
  compare      `mpt compare BASE NEW` on two generated result files (bench/gen_results.py: named rows
               {"name", "v", "n"}, 10 values of NEW perturbed by 1e-9 relative) vs bench/compare_join.py
               (json.load, flatten, a dict join: what a user without mpt writes): wall time and peak RSS
               of the whole process, reading included; 400,000 rows, and unless --quick a file of
               about 250 MB (5 M rows, near compare's 256 MiB cap); --quick: 100,000 rows. Both must
               count the same compared and differing values first
  checkpoint   (after its whole-run pairs) inner loop: `mpt checkpoint` vs
               torch.utils.checkpoint.checkpoint_sequential (bench/checkpoint_time.py): plain and sqrt(n)-segment step time, their ratio,
               and mpt's peak bytes (counting allocator) checkpointed / plain; gradients
               checked equal first (tests/parity/checkpoint_ref.py + compare.py)

    scripts/bench.sh                       # everything: about 25 minutes on the shared 2-core VM
    scripts/bench.sh --quick               # smaller runs, one timed round, no warm-up
    scripts/bench.sh --only mlp --rounds 9 --out /tmp/b.json

Writes bench/results/<UTC date>.json (gitignored) unless --out says otherwise; stdout has
the table only, context and progress go to stderr.
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
# The PyTorch-Python side must run the same LibTorch as mpt: Debian's interpreter (python3-torch)
# for the Debian build, the virtual environment's for the LibTorch 2.x build (MPT_REF_PYTHON).
REF_PY = os.environ.get("MPT_REF_PYTHON", "/usr/bin/python3")
BENCH = os.path.join(ROOT, "bench")
PARITY = os.path.join(ROOT, "tests", "parity")
SCHEMA_VERSION = 2
ALL = ["underflow", "lossscale", "accumulate", "dataparallel", "pipeline", "checkpoint", "mlp", "mlp_large", "mlp_native", "ddp",
       "accumulate_step", "pipeline_step", "zero2", "zero2_ring", "gemm", "busy", "defaults", "trace", "compare"]
# Variables the bench itself sets for its controlled rows (main); the `defaults` rows run
# without them, as a user's shell does.
BENCH_SET = {}


def cpu_kind():
    """This machine's CPU as the bench reports it: model name, family/model and the instruction
    sets that pick LibTorch's kernels (AMX, AVX512-FP16, AVX512-BF16, AVX-512, AVX2), with any
    cap set in the environment (ONEDNN_MAX_CPU_ISA, DNNL_MAX_CPU_ISA, ATEN_CPU_CAPABILITY)."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break
                k, _, v = line.partition(":")
                info[k.strip()] = v.strip()
    except OSError:
        return {"kind": platform.processor() or platform.machine()}
    flags = set(info.get("flags", "").split())
    isa = [n for n, f in (("AMX", "amx_tile"), ("AVX512-FP16", "avx512_fp16"), ("AVX512-BF16", "avx512_bf16"),
                          ("AVX-512", "avx512f"), ("AVX2", "avx2")) if f in flags]
    caps = {k: os.environ[k] for k in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY") if k in os.environ}
    kind = f"{info.get('model name', '?')} (family {info.get('cpu family', '?')}, model {info.get('model', '?')}): " \
           f"{', '.join(isa) or 'no AVX2'}" + (f"; capped: {caps}" if caps else "")
    return {"kind": kind, "model_name": info.get("model name"), "family": info.get("cpu family"),
            "model": info.get("model"), "isa": isa, "caps": caps}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


class Mismatch(Exception):
    """mpt and the Python twin did not compute the same numbers: nothing is timed."""


def run(cmd, stdout=subprocess.DEVNULL, ok=(0,), env=None):
    """Runs cmd in the repository root (environment `env`, default the bench's); returns (wall
    seconds, peak RSS bytes, stdout text). Raises RuntimeError on an exit code not in `ok`."""
    with tempfile.TemporaryFile(mode="w+") as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=stdout, stderr=err, text=True, env=env)
        out = p.stdout.read() if stdout == subprocess.PIPE else ""
        _, status, ru = os.wait4(p.pid, 0)  # wait4: the child's own peak RSS
        wall = time.perf_counter() - t0
        p.returncode = code = os.waitstatus_to_exitcode(status)
        if code not in ok:
            err.seek(0)
            raise RuntimeError(f"{' '.join(cmd)} exited {code}: {err.read()[-800:]}")
    return wall, ru.ru_maxrss * 1024, out


def load(path):
    with open(path) as f:
        return json.load(f)


def median(xs):
    return statistics.median(xs) if xs else None


class Bench:
    def __init__(self, args):
        self.args = args
        self.mpt = args.mpt
        self.tmp = tempfile.mkdtemp(prefix="mpt-bench-")
        self.rows = []
        self.threads = ["--set", f"threads={args.threads}"]

    def mpt_cmd(self, name, *a):
        out = os.path.join(self.tmp, name + ".json")
        return [self.mpt, *a, *self.threads, "-q", "--device", "cpu", "--out", out], out

    def rounds(self, one_round):
        """Warm-up (unless --quick), then --rounds calls of one_round(); returns their results."""
        if not self.args.quick:
            one_round()
        return [one_round() for _ in range(self.args.rounds)]

    def add(self, name, group, metric, unit, mpt, py, ratios=None, target=None, note="", legend="", **extra):
        """One row: medians of mpt's and Python's samples and of the per-round ratios mpt/Python, and
        the smallest and largest per-round ratio (how far single rounds scatter). `legend`: what the
        'mpt' and 'python' columns hold where that is not mpt and its Python twin; printed under
        the table."""
        row = {"name": name, "group": group, "metric": metric, "unit": unit,
               "mpt": median(mpt), "python": median(py),
               "ratio": median(ratios) if ratios else None,
               "ratio_min": min(ratios) if ratios else None, "ratio_max": max(ratios) if ratios else None,
               "rounds": len(mpt), "mpt_samples": mpt, "python_samples": py}
        if target is not None:
            row["target"] = target
        if note:
            row["note"] = note
        if legend:
            row["legend"] = legend
        row.update(extra)
        self.rows.append(row)

    def equal_to_reference(self, name, out, ref_cmd):
        """Runs the parity reference `ref_cmd` (its JSON on stdout) and compares every value it
        computes with mpt's result file `out` (tests/parity/compare.py, bit for bit); raises
        Mismatch when they differ, else returns compare.py's summary line."""
        _, _, ref_json = run(ref_cmd, stdout=subprocess.PIPE)
        ref_out = os.path.join(self.tmp, name + ".ref.json")
        with open(ref_out, "w") as f:
            f.write(ref_json)
        same = subprocess.run([REF_PY, os.path.join(PARITY, "compare.py"), out, ref_out], cwd=ROOT,
                              capture_output=True, text=True)
        if same.returncode != 0:
            raise Mismatch(f"{name}: results differ:\n{same.stdout[-1500:]}")
        return same.stdout.strip()

    # ------------------------------------------------------------------------------------
    # whole processes (wall time, peak RSS): mpt <experiment> vs tests/parity/<experiment>_ref.py
    # ------------------------------------------------------------------------------------
    def whole(self, name, mpt_args, ref, what, ref_args=(), target=None):
        """One whole-run pair: mpt and the parity reference on mpt's resolved config; every value
        the reference computes checked equal (compare.py) before timing."""
        cmd, out = self.mpt_cmd(name, *mpt_args)
        run(cmd)
        ref_cmd = [REF_PY, os.path.join(PARITY, ref), out, *ref_args]
        log(f"{name}: {self.equal_to_reference(name, out, ref_cmd)}")

        def one():
            return run(cmd), run(ref_cmd)
        res = self.rounds(one)
        self.add(name, "whole", "wall", "s", [r[0][0] for r in res], [r[1][0] for r in res],
                 [r[0][0] / r[1][0] for r in res], target=target, note=what,
                 mpt_rss_bytes=max(r[0][1] for r in res), python_rss_bytes=max(r[1][1] for r in res),
                 mpt_args=list(mpt_args), reference=[ref, *ref_args])

    def pairs(self, default, larger):
        """The defaults pair (issue 16's target <= 0.5), then, unless --quick, the larger config."""
        self.whole(*default, target="<= 0.5")
        if not self.args.quick:
            self.whole(*larger)

    def underflow(self):
        self.pairs(("underflow", ["underflow"], "underflow_ref.py", "defaults: every result"),
                   ("underflow_depth_sweep", ["underflow", "--config", "configs/underflow_depth_sweep.json"],
                    "underflow_ref.py", "depths 4, 8, 12, 16: every result"))

    def lossscale(self):
        # The reference covers section 1 (the static loss-scale sweep); training is off on both sides.
        off = ["lossscale", "--set", "train.enabled=false", "--set", "gpt.enabled=false"]
        self.pairs(("lossscale_sweep", off, "lossscale_ref.py", "defaults, sweep only (train.enabled=false)"),
                   ("lossscale_sweep_large", off + ["--set", "sweep.model.width=128", "--set", "sweep.model.depth=24",
                                                    "--set", "sweep.model.input_dim=64", "--set", "sweep.data.batch=512"],
                    "lossscale_ref.py", "sweep only, net 64-128x24-1, batch 512"))

    def accumulate(self):
        # The reference computes every section but the memory table (allocator bytes): mpt's is
        # shrunk to one row of batch 1, hidden 1, one timed step (timing.repeats=1).
        base = ["accumulate", "--set", "timing.repeats=1", "--set", "memory.micro_batches=[1]",
                "--set", "memory.batch=1", "--set", "memory.hidden=1"]
        self.pairs(("accumulate", base, "accumulate_ref.py",
                    "defaults, memory table shrunk to 1 row of batch 1 (not compared)"),
                   ("accumulate_large", base + ["--set", "model.hidden=256", "--set", "batch=128",
                                                "--set", "data.samples=4096"],
                    "accumulate_ref.py", "hidden 256, batch 128, 4096 samples; memory table as above"))

    def dataparallel(self):
        # The reference covers sections 1-2 (shard equivalence, uneven shards), in one process:
        # training is off, and so are mpt's worker processes (with training off they only start
        # and wait: --nproc 1).
        off = ["dataparallel", "--set", "train.enabled=false", "--nproc", "1"]
        self.pairs(("dataparallel_equiv", off, "dataparallel_ref.py",
                    "defaults, sections 1-2 only (train.enabled=false, 1 process)"),
                   ("dataparallel_equiv_large", off + ["--set", "equivalence.in_dim=256", "--set", "equivalence.hidden=512",
                                                       "--set", "equivalence.batch=2048", "--set", "equivalence.shards=8",
                                                       "--set", "equivalence.uneven_samples=2051",
                                                       "--set", "equivalence.uneven_shards=7"],
                    "dataparallel_ref.py", "sections 1-2, MLP 256-512-1, batch 2048 in 8 shards, 2051 in 7"))

    def pipeline(self):
        # No synthetic sleep (cost.forward_us=0) and one timed step per run (pipeline.steps=1, plus
        # mpt's warm-up step): mpt runs each of the 11 sweep runs once with a thread per stage, the
        # reference runs the same microbatch loop once, sequentially.
        base = ["pipeline", "--set", "cost.forward_us=0", "--set", "pipeline.steps=1"]
        self.pairs(("pipeline", base, "pipeline_ref.py",
                    "defaults but no synthetic cost, 1 step per run: exact splits + sweep"),
                   ("pipeline_large", base + ["--set", "pipeline.widths=[128,256,256,256,256,256,256,256,1]",
                                              "--set", "pipeline.batch=256"],
                    "pipeline_ref.py", "as above, sweep MLP 128-256x7-1, batch 256"))

    # ------------------------------------------------------------------------------------
    # mlp: the lossscale training loop, per recipe
    # ------------------------------------------------------------------------------------
    def mlp(self, name="mlp", width=64, batch=128, steps=None, samples=None,
            recipes=("fp32", "bf16", "fp16", "fp16+master+dynamic"), compute="emulated"):
        steps = steps or (30 if self.args.quick else 200)
        samples = samples or (2048 if self.args.quick else 10000)
        recipes = list(recipes)
        twin = [r for r in ["fp32", "bf16", "fp16"] if r in recipes]
        cmd, out = self.mpt_cmd(name, "lossscale", "--set", "train.recipes=" + json.dumps(recipes),
                                "--set", f"train.hidden.width={width}",
                                "--set", f"train.batch={batch}", "--set", f"train.steps={steps}",
                                "--set", "sweep.scales=[1]", "--set", f"train.train_samples={samples}",
                                "--set", "train.test_samples=100",
                                # the twin follows train.compute op for op: compare like with like
                                "--set", f"train.compute={compute}")
        plain = "fp32" in recipes
        py = [REF_PY, os.path.join(BENCH, "mlp_train.py"), out, *twin, *(["plain"] if plain else [])]

        def one():
            return pair_once(cmd, out, py)
        m, p = one()  # the check run
        rows = {r["name"]: r for r in m["results"]["recipes"]}
        for r in twin:
            a, b = m["results"]["history"][r]["loss"], p[r]["loss"]
            diff = max(abs(float(x) - float(y)) for x, y in zip(a, b)) if len(a) == len(b) else float("inf")
            if diff != 0.0 or rows[r]["lost_update_count"] != p[r]["lost_update_count"]:
                raise Mismatch(f"{name} {r}: loss curves differ by {diff:g} or lost updates "
                               f"{rows[r]['lost_update_count']} != {p[r]['lost_update_count']}")
            if "grad_total" in p[r]:  # the native twin also reports the underflow count's denominator
                want = p[r]["grad_underflow_count"] / p[r]["grad_total"] if p[r]["grad_total"] else 0.0
                if rows[r]["grad_underflow"] != want:
                    raise Mismatch(f"{name} {r}: gradient underflow {rows[r]['grad_underflow']!r} != {want!r}")
            log(f"{name} {r}: {steps} losses and {p[r]['lost_update_count']} lost updates equal (bit for bit)")
        if plain:
            # The same model, batches and first forward: the first loss must be equal bit for bit,
            # and both run the same number of steps. The updates differ in their last bit:
            # optim.SGD adds -lr*g in one fused multiply-add, mpt rounds lr*g first (the product
            # whose loss to rounding it counts); over many steps those last bits grow as training
            # does, with no bound to check against, so the last loss's difference is reported only.
            a, b = m["results"]["history"]["fp32"]["loss"], p["plain"]["loss"]
            rel = abs(float(a[-1]) - float(b[-1])) / abs(float(b[-1]))
            if len(a) != len(b) or float(a[0]) != float(b[0]):
                raise Mismatch(f"{name}: mpt's fp32 run and the plain PyTorch loop differ: {len(a)} vs {len(b)} "
                               f"steps, first loss {a[0]} vs {b[0]}")
            log(f"{name} fp32: first loss equal to a plain PyTorch loop's (nn.Linear, optim.SGD) bit for bit; "
                f"after {len(a)} steps the losses differ by {rel:.1g} (relative; fused vs two-rounding update)")
        res = self.rounds(one)
        mt = {r: [x[0]["timings"]["recipes"][r]["step_time_s"] * 1e3 for x in res] for r in recipes}
        pt = {r: [x[1][r]["step_time_s"] * 1e3 for x in res] for r in twin}
        small = width <= 64
        if plain:
            pl = [x[1]["plain"]["step_time_s"] * 1e3 for x in res]
            self.add(f"{name}_fp32_vs_plain", "mlp", "step", "ms", mt["fp32"], pl,
                     [a / b for a, b in zip(mt["fp32"], pl)], target="<= 1.0",
                     note="mpt's fp32 step (counting lost updates) vs a plain PyTorch loop that counts nothing")
        for r in twin:
            self.add(f"{name}_{r}", "mlp", "step", "ms", mt[r], pt[r], [a / b for a, b in zip(mt[r], pt[r])],
                     target="<= 0.67" if small else "<= 1.0",
                     note=f"784-{width}x2-10, batch {batch}, {steps} steps, compute={compute}")
            if compute == "native" and r != "fp32" and "gemm_floor_s" in res[0][1][r]:
                # The floor: the step's GEMMs alone (timed in the twin), against the Python step: the
                # lowest ratio any front end running these kernels could reach.
                ft = [x[1][r]["gemm_floor_s"] * 1e3 for x in res]
                self.add(f"{name}_{r}_gemm_floor", "mlp", "step", "ms", ft, pt[r], [a / b for a, b in zip(ft, pt[r])],
                         note="'mpt' column: the step's GEMMs alone (the same kernels on both sides), vs the Python step",
                         legend="'mpt' = the step's GEMMs alone (timed in the twin), 'python' = the Python step")
        if compute != "emulated":
            return  # the step ratios below are the emulation's (issue 16's fp16 <= 1.5x fp32)
        for r in [r for r in ["bf16", "fp16", "fp16+master+dynamic"] if r in recipes and "fp32" in recipes]:
            mr = [a / b for a, b in zip(mt[r], mt["fp32"])]
            pr = [a / b for a, b in zip(pt[r], pt["fp32"])] if r in pt else []
            self.add(f"{r}_vs_fp32" if name == "mlp" else f"{name}_{r}_vs_fp32", "mlp", "step/fp32 step", "x", mr, pr,
                     [a / b for a, b in zip(mr, pr)] if pr else None,
                     target="<= 1.5 (mpt)" if r.startswith("fp16") else None,
                     note="emulated: fp32 math, rounded storage, counting hooks")

    def mlp_native(self):
        # fp16 natively only where this LibTorch multiplies fp16 on the CPU (not Debian's 1.13):
        # asked of the reference Python, the same LibTorch as mpt.
        probe = subprocess.run([REF_PY, "-c", "import torch; a = torch.ones(2, 2, dtype=torch.half); torch.mm(a, a)"],
                               capture_output=True)
        recipes = ("fp32", "bf16", "fp16") if probe.returncode == 0 else ("fp32", "bf16")
        if probe.returncode != 0:
            log("mlp_native: no CPU fp16 matmul in this LibTorch: fp16 left out")
        self.mlp("mlp_native", recipes=recipes, compute="native")

    def mlp_large(self):
        # A model where the matrix products dominate: 784-512x2-10, batch 256, fp32 (10 steps: a
        # step takes about 0.4 s on the 2-core VM).
        self.mlp("mlp_large", width=512, batch=256, steps=3 if self.args.quick else 10,
                 samples=768 if self.args.quick else 2560, recipes=("fp32",))

    # ------------------------------------------------------------------------------------
    # ddp: N = 2 over Gloo, mpt's reducer vs torch DDP
    # ------------------------------------------------------------------------------------
    def ddp(self):
        n, steps = 2, (12 if self.args.quick else 60)
        samples = 2048 if self.args.quick else 60000
        cmd, out = self.mpt_cmd("ddp", "dataparallel", "--nproc", str(n), "--set", f"train.nprocs=[{n}]",
                                "--set", f"train.max_steps={steps}", "--set", f"train.samples={samples}",
                                "--set", "train.nosync_steps=0")
        py = [REF_PY, os.path.join(BENCH, "dataparallel_ddp.py"), out, str(n), str(steps)]

        def one():
            return pair_once(cmd, out, py)
        m, p = one()
        row = next(r for r in m["results"]["training"] if r["name"] == f"n{n}")
        if row["steps"] != steps:
            raise Mismatch(f"ddp: mpt ran {row['steps']} steps, not {steps}")
        rel = abs(row["final_loss"] - p["final_loss"]) / abs(p["final_loss"])
        if rel > 1e-5:
            raise Mismatch(f"ddp: final loss mpt {row['final_loss']!r} vs DDP {p['final_loss']!r} (rel {rel:.2g})")
        log(f"ddp: final loss after {steps} steps: relative difference {rel:.1g} (mpt {row['final_loss']:.9g}, "
            f"DDP {p['final_loss']:.9g}; allowed 1e-5: summation orders may differ)")
        res = self.rounds(one)
        mt = [x[0]["timings"]["per_n"][f"n{n}"]["step_ms"] for x in res]
        pt = [x[1]["step_ms"] for x in res]
        self.add(f"ddp_n{n}", "ddp", "step", "ms", mt, pt, [a / b for a, b in zip(mt, pt)], target="<= 0.8",
                 note=f"784-128-10, global batch 64, Gloo, {steps} steps, 1 thread per rank")

    # ------------------------------------------------------------------------------------
    # accumulate_step / pipeline_step: the inner loops of accumulate and pipeline
    # ------------------------------------------------------------------------------------
    def accumulate_step(self):
        repeats = 5 if self.args.quick else 21
        ks = [1, 4]
        cmd, out = self.mpt_cmd("accumulate_step", "accumulate", "--set", f"timing.repeats={repeats}",
                                "--set", f"memory.micro_batches={json.dumps(ks)}", "--set", "memory.batch=512",
                                "--set", "memory.hidden=128")
        run(cmd)
        # The same accumulate_grad on the same data: every deterministic section equal to the
        # parity reference, bit for bit (tests/parity/compare.py), before timing.
        same = self.equal_to_reference("accumulate_step", out, [REF_PY, os.path.join(PARITY, "accumulate_ref.py"), out])
        log(f"accumulate_step: {same}")
        py = [REF_PY, os.path.join(BENCH, "accumulate_step.py"), out]
        # The step's fixed overhead in mpt (LibTorch's dispatcher and autograd engine, the ops' per-call
        # cost): the same step at batch max(ks) and hidden 1, where the kernels have next to nothing
        # to compute, in the same k micro-batches (k = 4: one sample each).
        tiny_cmd, tiny_out = self.mpt_cmd("accumulate_step_tiny", "accumulate", "--set", "timing.repeats=201",
                                          "--set", f"memory.micro_batches={json.dumps(ks)}",
                                          "--set", f"memory.batch={max(ks)}", "--set", "memory.hidden=1")

        def one():
            run(tiny_cmd)
            return (*pair_once(cmd, out, py), load(tiny_out)["timings"]["memory_step_time"])
        res = self.rounds(one)
        for k in ks:
            key = f"B/{k}"
            mt = [x[0]["timings"]["memory_step_time"][key]["step_s"] * 1e3 for x in res]
            pt = [x[1][key]["step_s"] * 1e3 for x in res]
            self.add(f"accumulate_step_k{k}", "accumulate", "step", "ms", mt, pt, [a / b for a, b in zip(mt, pt)],
                     target="<= 0.67", note=f"784-128-128-10, batch 512 in {k} micro-batch(es), median of {repeats}")
            # The floor: the step's GEMMs alone (bench/accumulate_step.py gemm_floor), timed in the
            # same Python process; 'mpt' = that floor, so the ratio is the lowest any front end
            # running these kernels could reach against the Python step.
            ft = [x[1][key]["gemm_floor_s"] * 1e3 for x in res]
            self.add(f"accumulate_step_k{k}_gemm_floor", "accumulate", "step", "ms", ft, pt,
                     [a / b for a, b in zip(ft, pt)],
                     note="'mpt' column: the step's GEMMs alone (same MKL kernels on both sides), vs the Python step",
                     legend="'mpt' = the step's GEMMs alone (timed in the twin), 'python' = the Python step")
            # The same floor as a rate: the GF/s a step made of nothing but these GEMMs would need to
            # meet the target ('mpt': the step's GEMM flops / (0.67 x the Python step)), against the
            # GF/s they reach alone ('python'). Above 1, the target asks the GEMMs to run faster
            # than they do on their own (compare gemm_fp32_2048, this core's ceiling).
            fl = [x[1][key]["gemm_flops"] for x in res]
            have = [f / (t * 1e-3) / 1e9 for f, t in zip(fl, ft)]
            need = [f / (0.67 * t * 1e-3) / 1e9 for f, t in zip(fl, pt)]
            self.add(f"accumulate_step_k{k}_gemm_rate", "accumulate", "rate needed", "GF/s", need, have,
                     [a / b for a, b in zip(need, have)],
                     note=f"{fl[0] / 1e6:.1f} MFLOP of GEMM per step; 'mpt': the rate the <= 0.67 target needs with "
                          "no time outside the GEMMs, 'python': the rate the GEMMs reach alone",
                     legend="'mpt' = the GF/s the <= 0.67 target needs with no time outside the GEMMs, 'python' = "
                            "the GF/s they reach alone; above 1: out of reach of these kernels")
            # The sum of the step's floors: its GEMMs' work (alone, less their per-call cost, which
            # the fixed overhead holds), its other kernels' size-dependent work (elementwise_floor,
            # timed in the twin) and mpt's fixed overhead (the tiny step, the same k micro-batches):
            # the lowest step LibTorch's kernels and autograd engine allow, each part hot and alone.
            # 'mpt' = that sum, against the Python step.
            gw = [x[1][key]["gemm_floor_s"] * 1e3 - x[1][key]["gemm_calls_s"] * 1e3 for x in res]
            ew = [x[1][key]["elementwise_s"] * 1e3 for x in res]
            fixed = [x[2][key]["step_s"] * 1e3 for x in res]
            fsum = [a + b + c for a, b, c in zip(gw, ew, fixed)]
            self.add(f"accumulate_step_k{k}_floor_sum", "accumulate", "step", "ms", fsum, pt,
                     [a / b for a, b in zip(fsum, pt)],
                     note=f"GEMM work {median(gw):.3f} + other kernels' work {median(ew):.3f} + mpt's fixed "
                          f"overhead (batch {max(ks)}, hidden 1) {median(fixed):.3f} ms, vs the Python step",
                     legend=f"'mpt' = GEMM work {median(gw):.3f} + other kernels' work {median(ew):.3f} + mpt's fixed "
                            f"overhead {median(fixed):.3f} ms (each hot and alone), 'python' = the Python step")

    def pipeline_step(self):
        steps = 3 if self.args.quick else 5
        m_micro, sched = 8, "1f1b"
        cmd, out = self.mpt_cmd("pipeline_step", "pipeline", "--set", f'pipeline.schedules=["{sched}"]',
                                "--set", f"pipeline.microbatches=[{m_micro}]", "--set", f"pipeline.steps={steps}",
                                "--set", "cost.forward_us=0")
        py = [REF_PY, os.path.join(BENCH, "pipeline_step.py"), out, sched, str(m_micro), str(steps)]
        name = f"{sched}.m{m_micro}"

        def one():
            return pair_once(cmd, out, py)
        m, p = one()
        row = {r["name"]: r for r in m["results"]["sweep"]}[name]
        if row["loss"] != p["loss"] or row["grad_max_abs_diff"] != p["grad_max_abs_diff"]:
            raise Mismatch(f"pipeline_step: loss {row['loss']!r} vs {p['loss']!r}, max|g - g_full| "
                           f"{row['grad_max_abs_diff']!r} vs {p['grad_max_abs_diff']!r}")
        log(f"pipeline_step: loss and max|g - g_full| of {name} equal (bit for bit)")
        res = self.rounds(one)
        mt = [{r["name"]: r for r in x[0]["timings"]["measured"]}[name]["step_ms"] for x in res]
        pt = [x[1]["step_ms"] for x in res]
        self.add("pipeline_step_1f1b_m8", "pipeline", "step", "ms", mt, pt, [a / b for a, b in zip(mt, pt)],
                 target="<= 0.67", note=f"16-64x7-1, batch 64, 4 stages on min(4, cores) threads vs one Python thread, "
                                        f"median of {steps} steps")

    # ------------------------------------------------------------------------------------
    # zero2: N = 2 over Gloo, ZeRO stage 2 vs stage 0 (DDP) in one mpt shard run
    # ------------------------------------------------------------------------------------
    def zero2(self, algorithm="native"):
        steps = 12 if self.args.quick else 60
        name = "zero2" if algorithm == "native" else "zero2_" + algorithm
        cmd, out = self.mpt_cmd(name, "shard", "--nproc", "2", "--set", "train.stages=[0,2]",
                                "--set", f"train.steps={steps}", "--set", f"train.samples={64 * steps}",
                                "--set", "train.micro_batches=1", "--set", "mixed.compare=false",
                                "--set", "zero.compare_every_micro_batch=false",
                                "--set", f"dist.gloo_algorithm={algorithm}")

        def one():
            run(cmd)  # exit 0: every check held (stage 2 equal to DDP bitwise at every step)
            return load(out)
        first = one()
        if not all(c["ok"] for c in first["checks"]):
            raise Mismatch(f"{name}: a check of mpt shard failed")
        res = self.rounds(one)
        step = lambda r, name: next(x["step_ms"] for x in r["timings"]["memory_peak"] if x["name"] == name)
        z, d = [step(r, "stage2") for r in res], [step(r, "stage0") for r in res]
        self.add(f"{name}_vs_ddp_n2", name, "step", "ms", z, d, [a / b for a, b in zip(z, d)], target="<= 1.1",
                 note=f"784-128-10, global batch 64, Adam, Gloo ({first['env']['dist']['reduce_scatter']}; all-gather "
                      f"{first['env']['dist']['all_gather']}), {steps} steps, 1 thread per rank; "
                      "'mpt' = ZeRO-2, 'python' = DDP (stage 0), both mpt shard",
                 legend="'mpt' = ZeRO-2, 'python' = DDP (stage 0), both mpt shard")

    def zero2_ring(self):
        """zero2 with dist.gloo_algorithm = ring: mpt's send/recv ring for reduce-scatter and all-gather."""
        self.zero2("ring")

    # ------------------------------------------------------------------------------------
    # checkpoint: plain vs sqrt(n) segments
    # ------------------------------------------------------------------------------------
    def checkpoint(self):
        # Whole runs: the reference computes the gradients of every segment row; mpt also
        # times timing.repeats=1 step per row, which the reference repeats (--timed). The
        # peak-bytes sweep (mpt's counting allocator, no Python figure) is off.
        base = ["checkpoint", "--set", "timing.repeats=1", "--set", "checkpoint.sweep=false"]
        self.pairs(("checkpoint", base, "checkpoint_ref.py",
                    "defaults, no peak-bytes sweep (checkpoint.sweep=false), 1 timed step per row",
                    ["--timed"]),
                   ("checkpoint_large", base + ["--set", "model.width=64", "--set", "data.batch=512"],
                    "checkpoint_ref.py", "as above, 32 blocks of width 64, batch 512", ["--timed"]))
        repeats = 5 if self.args.quick else 21
        cmd, out = self.mpt_cmd("checkpoint", "checkpoint", "--set", "checkpoint.sweep=false",
                                "--set", "checkpoint.no_rng_row=false", "--set", 'checkpoint.segments=["sqrt"]',
                                "--set", f"timing.repeats={repeats}")
        run(cmd)
        self.equal_to_reference("checkpoint", out, [REF_PY, os.path.join(PARITY, "checkpoint_ref.py"), out])
        log("checkpoint: loss, gradient differences and recomputed blocks equal torch.utils.checkpoint's")
        py = [REF_PY, os.path.join(BENCH, "checkpoint_time.py"), out]

        def one():
            return pair_once(cmd, out, py)
        res = self.rounds(one)
        m0 = res[-1][0]
        ck = next(k for k in m0["timings"]["step_time_s"] if k != "none")
        seg = {r["name"]: r for r in m0["results"]["segments"]}
        mp = [x[0]["timings"]["step_time_s"]["none"]["step_s"] * 1e3 for x in res]
        pp = [x[1]["step_time_s"]["none"]["step_s"] * 1e3 for x in res]
        mc = [x[0]["timings"]["step_time_s"][ck]["step_s"] * 1e3 for x in res]
        pc = [x[1]["step_time_s"][ck]["step_s"] * 1e3 for x in res]
        cfg = m0["config"]
        note = f"{cfg['model']['depth']} blocks of {cfg['model']['width']}, batch {cfg['data']['batch']}"
        self.add("ckpt_plain", "checkpoint", "step", "ms", mp, pp, [a / b for a, b in zip(mp, pp)], note=note)
        self.add(f"ckpt_{ck.split()[0]}", "checkpoint", "step", "ms", mc, pc, [a / b for a, b in zip(mc, pc)],
                 target="<= 0.67", note=f"{ck}; " + note)
        mr, pr = [a / b for a, b in zip(mc, mp)], [a / b for a, b in zip(pc, pp)]
        self.add("ckpt_vs_plain", "checkpoint", "step/plain step", "x", mr, pr, [a / b for a, b in zip(mr, pr)],
                 note=f"{ck}: {seg[ck]['recomputed_blocks']} of {cfg['model']['depth']} blocks run twice")
        self.add("ckpt_peak_vs_plain", "checkpoint", "peak bytes/plain", "x", [seg[ck]["peak_ratio"]], [], None,
                 note=f"mpt's counting allocator: {seg[ck]['peak_bytes']} vs {seg['none']['peak_bytes']} bytes; "
                      "deterministic, no Python figure", mpt_peak_bytes=seg[ck]["peak_bytes"],
                 mpt_plain_peak_bytes=seg["none"]["peak_bytes"])


    # ------------------------------------------------------------------------------------
    # gemm: this machine's GEMM ceilings, and the large MLP's share of fp32's
    # ------------------------------------------------------------------------------------
    def gemm(self):
        """torch.mm of two n x n matrices in fp32, bf16 and fp16 (the same MKL / oneDNN kernels as
        mpt links), median of --rounds after a warm-up, at the bench's thread count; then the large
        MLP's fp32 step (mlp_large, if it ran) as GFLOP/s and as a fraction of the fp32 ceiling."""
        n = 1024 if self.args.quick else 2048
        code = ("import json, sys, time, torch\n"
                "torch.set_num_threads(int(sys.argv[1])) if int(sys.argv[1]) > 0 else None\n"
                "n, reps, out = int(sys.argv[2]), int(sys.argv[3]), {}\n"
                "for name, dt in [('fp32', torch.float32), ('bf16', torch.bfloat16), ('fp16', torch.float16)]:\n"
                "    a, b = torch.randn(n, n, dtype=dt), torch.randn(n, n, dtype=dt)\n"
                "    torch.mm(a, b); ts = []\n"
                "    for _ in range(reps if name != 'fp16' else 1):\n"
                "        t0 = time.perf_counter(); torch.mm(a, b); ts.append(time.perf_counter() - t0)\n"
                "    ts.sort(); out[name] = 2 * n ** 3 / ts[len(ts) // 2] / 1e9\n"
                "out['threads'] = torch.get_num_threads()\n"
                "print(json.dumps(out))\n")
        _, _, text = run([REF_PY, "-c", code, str(self.args.threads), str(n), str(max(3, self.args.rounds))],
                         stdout=subprocess.PIPE)
        c = json.loads(text)
        for f in ("fp32", "bf16", "fp16"):
            self.add(f"gemm_{f}_{n}", "gemm", "rate", "GF/s", [], [c[f]], None,
                     note=f"torch.mm {n}x{n}x{n}, {c['threads']} thread(s): the ceiling")
        large = next((r for r in self.rows if r["name"] == "mlp_large_fp32"), None)
        if large:
            # 784-512x2-10, batch 256: forward and weight gradient of every layer, input gradient
            # of all but the first (2*B*in*out each)
            dims = [(784, 512), (512, 512), (512, 10)]
            flops = sum(2 * 256 * i * o * (2 if k == 0 else 3) for k, (i, o) in enumerate(dims))
            rates = [flops / (ms * 1e-3) / 1e9 for ms in large["mpt_samples"]]
            self.add("mlp_large_fp32_rate", "gemm", "rate", "GF/s", rates, [], None,
                     note=f"{flops / 1e6:.0f} MFLOP per step; {median(rates) / c['fp32']:.0%} of the fp32 ceiling "
                          f"(target >= 50 %)", fraction_of_ceiling=median(rates) / c["fp32"])

    # ------------------------------------------------------------------------------------
    # trace: what --trace FILE adds to a step (recording, not writing: the file is written after the run)
    # ------------------------------------------------------------------------------------
    def trace(self):
        """Step time with --trace vs without, alternately: dataparallel (N = 2, timings.per_n.n2.step_ms)
        and pipeline on threads (1f1b, m = 8, timings.measured step_ms). The deterministic results of
        both runs are checked equal first (tracing must not change a number)."""
        steps = 12 if self.args.quick else 40
        cases = [("trace_ddp_n2", ["dataparallel", "--nproc", "2", "--config", "configs/dataparallel_quick.json",
                                   "--set", "train.nprocs=[2]", "--set", "train.nosync_steps=0",
                                   "--set", f"train.max_steps={steps}", "--set", "train.samples=4096"],
                  lambda d: d["timings"]["per_n"]["n2"]["step_ms"], "dataparallel N = 2, 784-32-10, batch 64"),
                 ("trace_pipeline_1f1b", ["pipeline", "--set", 'pipeline.schedules=["1f1b"]',
                                          "--set", "pipeline.microbatches=[8]", "--set", "pipeline.steps=5",
                                          "--set", "cost.forward_us=200"],
                  lambda d: {r["name"]: r for r in d["timings"]["measured"]}["1f1b.m8"]["step_ms"],
                  "pipeline 1f1b m = 8 on 4 threads, 200 us/layer synthetic forward"),
                 # The worst case: no synthetic cost, the step is the MLP's own compute (a few ms), so the
                 # per-message and per-op recording is the largest fraction of it.
                 ("trace_pipeline_1f1b_nocost", ["pipeline", "--set", 'pipeline.schedules=["1f1b"]',
                                                 "--set", "pipeline.microbatches=[8]", "--set", "pipeline.steps=9",
                                                 "--set", "cost.forward_us=0", "--set", "sync.enabled=false"],
                  lambda d: {r["name"]: r for r in d["timings"]["measured"]}["1f1b.m8"]["step_ms"],
                  "pipeline 1f1b m = 8 on 4 threads, no synthetic cost (the MLP's compute only)")]
        for name, a, step, note in cases:
            plain, out_p = self.mpt_cmd(name + "_off", *a)
            traced, out_t = self.mpt_cmd(name + "_on", *a)
            traced += ["--trace", os.path.join(self.tmp, name + ".trace.json")]
            run(plain)
            run(traced)
            if load(out_p)["results"] != load(out_t)["results"]:
                raise Mismatch(f"{name}: --trace changed the results")

            def one():
                run(traced)
                t = step(load(out_t))
                run(plain)
                return t, step(load(out_p))
            res = self.rounds(one)
            on, off = [r[0] for r in res], [r[1] for r in res]
            self.add(name, "trace", "step", "ms", on, off, [a / b for a, b in zip(on, off)], target="<= 1.05",
                     note=note + "; 'mpt' = with --trace, 'python' = without",
                     legend="'mpt' = with --trace, 'python' = without, both mpt")

    # ------------------------------------------------------------------------------------
    # compare: reading and joining two large result files
    # ------------------------------------------------------------------------------------
    def compare(self):
        """`mpt compare` vs bench/compare_join.py on generated files; both must count the same
        values compared and differing (10 perturbed values differ under --rtol 1e-12) first."""
        sizes = [("compare_100k", ["--rows", "100000"])] if self.args.quick else \
            [("compare_400k", ["--rows", "400000"]), ("compare_cap", ["--bytes", "250e6"])]
        for name, size in sizes:
            base, new = (os.path.join(self.tmp, f"{name}_{s}.json") for s in ("base", "new"))
            gen = os.path.join(BENCH, "gen_results.py")
            _, _, info = run([sys.executable, gen, base, *size], stdout=subprocess.PIPE)
            run([sys.executable, gen, new, *size, "--perturb", "10"])
            info = json.loads(info)
            cmd = [self.mpt, "compare", base, new, "--rtol", "1e-12", "-q"]
            py = [REF_PY, os.path.join(BENCH, "compare_join.py"), base, new, "--rtol", "1e-12"]
            _, _, summary = run(cmd, stdout=subprocess.PIPE, ok=(0, 1))
            _, _, twin = run(py, stdout=subprocess.PIPE)
            twin = json.loads(twin)
            words = summary.split()  # "compare: K of N values differ beyond tolerance ..."
            if [int(words[1]), int(words[3])] != [twin["differ"], twin["compared"]] or twin["differ"] != 10:
                raise Mismatch(f"{name}: mpt says {summary.strip()!r}, the twin {twin}")
            log(f"{name}: {summary.strip()} ({info['rows']} rows, {info['bytes'] / 1e6:.0f} MB per file)")

            def one():
                return run(cmd, ok=(0, 1)), run(py)
            res = self.rounds(one)
            self.add(name, "compare", "wall", "s", [r[0][0] for r in res], [r[1][0] for r in res],
                     [r[0][0] / r[1][0] for r in res],
                     note=f"{info['rows']} rows, {info['bytes'] / 1e6:.0f} MB per file, reading included",
                     mpt_rss_bytes=max(r[0][1] for r in res), python_rss_bytes=max(r[1][1] for r in res),
                     rows=info["rows"], file_bytes=info["bytes"])
            for f in (base, new):
                os.remove(f)

    def defaults(self):
        defaults_bench(self)

    # ------------------------------------------------------------------------------------
    # busy: a second process takes a core; spinning vs sleeping OpenMP waiters
    # ------------------------------------------------------------------------------------
    def busy(self):
        """mpt's fp32 MLP step (lossscale, 784-64x2-10) with the thread policy's intra-op threads
        (--set threads=0: every core) while another process spins on one core, under
        OMP_WAIT_POLICY=ACTIVE (libgomp's spinning waiters) and PASSIVE (what mpt picks when it
        starts beside a busy process: src/app/main.cpp), alternately. Same numbers either way (checked); the step times are
        what differs."""
        steps = 50 if self.args.quick else 300
        base = [self.mpt, "lossscale", "-q", "--device", "cpu", "--set", "threads=0", "--set", 'train.recipes=["fp32"]',
                "--set", f"train.steps={steps}", "--set", "sweep.scales=[1]", "--set", "train.train_samples=10000"]
        outs = {w: os.path.join(self.tmp, f"busy_{w}.json") for w in ("ACTIVE", "PASSIVE")}
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            def one():
                res = {}
                for w, out in outs.items():
                    subprocess.run(base + ["--out", out], check=True, env={**os.environ, "OMP_WAIT_POLICY": w})
                    res[w] = load(out)
                return res
            first = one()
            if first["ACTIVE"]["results"]["history"] != first["PASSIVE"]["results"]["history"]:
                raise Mismatch("busy: the loss curves differ between wait policies")
            res = self.rounds(one)
        finally:
            spinner.kill()
            spinner.wait()
        t = {w: [r[w]["timings"]["recipes"]["fp32"]["step_time_s"] * 1e3 for r in res] for w in outs}
        threads = res[-1]["PASSIVE"]["env"]["threads_policy"]["intra_op"]
        self.add("busy_fp32_passive_vs_active", "busy", "step", "ms", t["PASSIVE"], t["ACTIVE"],
                 [a / b for a, b in zip(t["PASSIVE"], t["ACTIVE"])],
                 note=f"{threads} threads, one core taken by another process; 'mpt' = PASSIVE, 'python' = ACTIVE",
                 legend="'mpt' = OMP_WAIT_POLICY PASSIVE, 'python' = ACTIVE, both mpt")


def user_env():
    """The environment a user's shell gives mpt and Python: the bench's own settings (BENCH_SET) removed."""
    env = dict(os.environ)
    for k, v in BENCH_SET.items():
        if env.get(k) == v:
            del env[k]
    return env


def defaults_bench(b):
    """mpt at its defaults (threads and OpenMP wait policy its own) against the plain PyTorch loop at
    PyTorch's defaults (bench/mlp_train.py plain --torch-defaults: threads and wait policy untouched),
    the lossscale fp32 MLP (784-64x2-10, SGD, 200 steps) at batch 64, 256 and 1024, on the machine as
    it is ("quiet") and beside a process spinning on one core ("busy"); and the pipeline step at mpt's
    defaults against its one-thread Python loop at PyTorch's. The first loss checked equal bit for bit first."""
    env = user_env()
    steps = 30 if b.args.quick else 200
    for busy in (False, True):
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        try:
            for batch in (64, 256, 1024):
                name = f"defaults_mlp_fp32_b{batch}_{'busy' if busy else 'quiet'}"
                out = os.path.join(b.tmp, name + ".json")
                cmd = [b.mpt, "lossscale", "-q", "--device", "cpu", "--set", 'train.recipes=["fp32"]',
                       "--set", f"train.batch={batch}", "--set", f"train.steps={steps}", "--set", "sweep.scales=[1]",
                       "--set", "gpt.enabled=false", "--set", "train.test_samples=100", "--out", out]
                py = [REF_PY, os.path.join(BENCH, "mlp_train.py"), out, "plain", "--torch-defaults"]

                def one(cmd=cmd, out=out, py=py):
                    return pair_once(cmd, out, py, env)
                m, p = one()
                a, c = m["results"]["history"]["fp32"]["loss"], p["plain"]["loss"]
                if len(a) != len(c) or float(a[0]) != float(c[0]):
                    raise Mismatch(f"{name}: first loss {a[0]} vs {c[0]}, {len(a)} vs {len(c)} steps")
                res = b.rounds(one)
                mt = [x[0]["timings"]["recipes"]["fp32"]["step_time_s"] * 1e3 for x in res]
                pt = [x[1]["plain"]["step_time_s"] * 1e3 for x in res]
                pol = res[-1][0]["env"]["threads_policy"]
                b.add(name, "defaults", "step", "ms", mt, pt, [x / y for x, y in zip(mt, pt)], target="<= 1.0" if not busy else None,
                      note=f"mpt at its defaults ({pol['intra_op']} threads, OMP_WAIT_POLICY {pol['omp_wait_policy']}) vs "
                           f"a plain PyTorch loop at PyTorch's defaults; {'a process spinning on one core' if busy else 'as the machine is'}",
                      threads_policy=pol)
        finally:
            if spinner:
                spinner.kill()
                spinner.wait()
    # The pipeline step: mpt's threads executor at its defaults vs the microbatch loop in one Python thread.
    steps = 3 if b.args.quick else 5
    out = os.path.join(b.tmp, "defaults_pipeline.json")
    cmd = [b.mpt, "pipeline", "-q", "--device", "cpu", "--set", 'pipeline.schedules=["1f1b"]', "--set", "pipeline.microbatches=[8]",
           "--set", f"pipeline.steps={steps}", "--set", "cost.forward_us=0", "--out", out]
    py = [REF_PY, os.path.join(BENCH, "pipeline_step.py"), out, "1f1b", "8", str(steps), "--torch-defaults"]

    def one():
        return pair_once(cmd, out, py, env)
    m, p = one()
    row = {r["name"]: r for r in m["results"]["sweep"]}["1f1b.m8"]
    if row["loss"] != p["loss"] or row["grad_max_abs_diff"] != p["grad_max_abs_diff"]:
        raise Mismatch(f"defaults_pipeline: loss {row['loss']!r} vs {p['loss']!r}")
    res = b.rounds(one)
    mt = [{r["name"]: r for r in x[0]["timings"]["measured"]}["1f1b.m8"]["step_ms"] for x in res]
    pt = [x[1]["step_ms"] for x in res]
    b.add("defaults_pipeline_step_1f1b_m8", "defaults", "step", "ms", mt, pt, [x / y for x, y in zip(mt, pt)],
          target="<= 0.67", note=f"mpt pipeline at its defaults ({res[-1][0]['env'].get('pipeline_workers')}) vs one Python "
                                  "thread at PyTorch's defaults")


def fmt(v, width):
    if v is None:
        return f"{'-':>{width}}"
    for prec in (3, 2, 1, 0):
        s = f"{v:{width}.{prec}f}"
        if len(s) <= width:
            return s
    return f"{v:{width}.3g}"


def pair_once(cmd, out, py, env=None):
    """One round of an inner-loop pair: runs mpt (`cmd`, result file `out`), then its Python twin
    `py` (JSON on stdout), both in environment `env` (default the bench's); returns (mpt's result
    document, the twin's document)."""
    run(cmd, env=env)
    m = load(out)
    _, _, text = run(py, stdout=subprocess.PIPE, env=env)
    return m, json.loads(text)


def table(rows, rounds, quick):
    w = max([28] + [len(r["name"]) for r in rows])  # the name column fits the longest name
    lines = [f"# mpt vs PyTorch-Python (same LibTorch), medians of {rounds} alternating round(s)"
             f"{' (--quick)' if quick else ''}; equal results checked before timing",
             f"# {'name':<{w}} {'metric':<16} {'unit':>4} {'mpt':>9} {'python':>9} {'mpt/py':>7} {'min':>6} {'max':>6}"
             f" {'target':>10}"]
    for r in rows:
        lines.append(f"  {r['name']:<{w}} {r['metric']:<16} {r['unit']:>4} {fmt(r['mpt'], 9)} {fmt(r['python'], 9)} "
                     f"{fmt(r['ratio'], 7)} {fmt(r.get('ratio_min'), 6)} {fmt(r.get('ratio_max'), 6)} "
                     f"{r.get('target', '-'):>10}")
    for r in rows:
        if r.get("legend"):
            lines.append(f"# {r['name']}: {r['legend']}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds after the warm-up (default 5; --quick: 1)")
    ap.add_argument("--quick", action="store_true", help="smaller runs, 1 round, no warm-up (a smoke test)")
    ap.add_argument("--only", action="append", default=[], help=f"benchmarks to run ({', '.join(ALL)}); repeatable")
    ap.add_argument("--threads", type=int, default=1, help="LibTorch threads per process, both sides (default 1)")
    ap.add_argument("--mpt", default=os.path.join(ROOT, "build", "mpt"))
    ap.add_argument("--out", help="result file (default bench/results/<UTC date>.json)")
    args = ap.parse_args()
    if args.rounds is None:
        args.rounds = 1 if args.quick else 5
    only = [x for o in args.only for x in o.split(",") if x] or ALL
    for o in only:
        if o not in ALL:
            ap.error(f"--only {o}: unknown benchmark (one of {', '.join(ALL)})")
    # The controlled rows: both sides under the same OpenMP wait policy, PASSIVE unless the caller
    # set one (mpt would pick PASSIVE only beside a busy process, src/app/main.cpp; a twin left
    # spinning would lose whole time slices whenever another process runs). The `defaults` rows
    # run without it (user_env).
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = BENCH_SET["OMP_WAIT_POLICY"] = "PASSIVE"
    b = Bench(args)
    version = subprocess.run([args.mpt, "--version"], capture_output=True, text=True).stdout.strip()
    torch_version = subprocess.run([REF_PY, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                                   text=True).stdout.strip()
    context = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "host": platform.node(), "cpus": os.cpu_count(), "machine": platform.machine(),
               "mpt": version, "python": platform.python_version(), "python_torch": torch_version,
               "threads": args.threads, "rounds": args.rounds, "quick": args.quick,
               "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "cpu": cpu_kind(),
               "loadavg_start": os.getloadavg()}
    log(f"# context: {json.dumps(context)}")
    t0 = time.perf_counter()
    failed = []
    for name in ALL:
        if name not in only:
            continue
        log(f"== {name}")
        try:
            getattr(b, name)()
        except Mismatch as e:
            log(f"{name}: NOT TIMED: {e}")
            failed.append(name)
    context["loadavg_end"] = os.getloadavg()
    context["elapsed_s"] = time.perf_counter() - t0
    print(table(b.rows, args.rounds, args.quick))
    print(f"# {'FAILED: results differ in ' + ', '.join(failed) if failed else 'OK: equal results in every benchmark'}")
    # Other work on the machine skews both sides unequally (a round of --quick under a load of 3
    # on 2 cores once gave a Python step 2.7x its quiet time): say so where the ratios are read.
    # The bench's own processes add about `threads` to the end's 1-minute average.
    others = max(context["loadavg_start"][0], context["loadavg_end"][0] - context["threads"])
    if others > 0.5 * context["cpus"]:
        print(f"# WARNING: load average {context['loadavg_start'][0]:.1f} at the start, "
              f"{context['loadavg_end'][0]:.1f} at the end, on {context['cpus']} CPUs: other work shared them, "
              "so single rounds and their ratios can be far off; rerun on a quiet machine"
              + (" without --quick" if args.quick else ""))
    path = args.out or os.path.join(ROOT, "bench", "results",
                                    datetime.datetime.now(datetime.timezone.utc).date().isoformat() + ".json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    doc = {"schema_version": SCHEMA_VERSION, "context": context, "benchmarks": only, "mismatches": failed,
           "rows": b.rows}
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, indent=2)
    os.replace(path + ".tmp", path)
    log(f"wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
