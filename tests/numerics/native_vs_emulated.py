#!/usr/bin/env python3
"""Native vs emulated low-precision compute give the same tables (issue: LibTorch 2.x).

    native_vs_emulated.py MPT FORMAT SCRATCH [DEVICE]     (DEVICE: cpu, the default, or cuda)

Both modes are "FORMAT storage with fp32 arithmetic": native kernels (CPU and CUDA) accumulate
in fp32 and round each result once; emulation computes in fp32 and rounds every stored tensor.
So the tables must agree — up to the order of fp32 summation inside the matrix products, which
can move a result across a rounding boundary of FORMAT. The script runs `mpt lossscale` twice
(--set /train/compute=native, =emulated; for fp16 also the sweep with /sweep/compute) on a small
config and compares:
  - the static loss-scale sweep (fp16): underflow/overflow fractions to 1e-3 absolute (a few of
    the ~5000 gradient elements may sit on a rounding boundary), unscaled errors to 5 % — asserted
    on CUDA only: on the CPU, ATen's Half sigmoid_backward rounds twice (see below);
  - the training recipes: final train loss to 2 % relative, test accuracy to 2 points, skipped
    steps to 2, and both modes at the same final loss scale within a factor 2.
Exits 77 (ctest: skipped, with the reason printed) when this LibTorch has no native kernels for
FORMAT on the CPU (Debian's LibTorch 1.13 has no CPU fp16 matmul); 1 on a mismatch.
"""
import json
import subprocess
import sys

mpt, fmt, tmp = sys.argv[1], sys.argv[2], sys.argv[3]
device = sys.argv[4] if len(sys.argv) > 4 else "cpu"
recipes = {"fp16": ["fp16", "fp16+master", "fp16+master+dynamic"], "bf16": ["bf16", "bf16+master"]}[fmt]
common = ["lossscale", "--device", device, "-q", "--set", "/gpt/enabled=false",
          "--set", "/train/train_samples=2000", "--set", "/train/test_samples=500",
          "--set", "/train/steps=150", "--set", "/train/log_every=50",
          "--set", "/train/recipes=" + json.dumps(recipes)]


def run(mode):
    out = f"{tmp}/{fmt}-{mode}-{device}.json"
    args = [mpt] + common + ["--set", f"/train/compute={mode}", "--out", out]
    if fmt == "fp16":
        args += ["--set", f"/sweep/compute={mode}"]
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode == 3 and "no CUDA device is available" in p.stderr:
        print("SKIPPED: no CUDA device is available")
        sys.exit(77)
    if p.returncode == 3 and mode == "native" and "has no" in p.stderr:
        print(f"SKIPPED: native {fmt} compute is not available here: {p.stderr.strip().splitlines()[-1]}")
        sys.exit(77)
    if p.returncode != 0:
        print(p.stdout, p.stderr)
        sys.exit(f"mpt exited {p.returncode} for compute={mode}")
    with open(out) as f:
        return json.load(f)


def rows(doc, table):
    return {r["name"]: r for r in doc["results"][table]}


def num(v):
    return float(v)  # also reads the result file's "inf" / "-inf" / "nan" strings


nat = run("native")
reason = nat["env"].get(f"{fmt}_compute_reason", "")
# compute=auto also refuses kernels far slower than emulation (still correct: compared here all the same).
if nat["env"].get(f"{fmt}_compute") != "native" and "slower than emulating" not in reason:
    # The kernels run but are not native in mpt's sense (fp32 accumulation): e.g. Debian's 1.13
    # bf16 GEMM without AVX-512 accumulates in bf16, so compute=auto emulates there.
    print(f"SKIPPED: native {fmt} compute is not fp32-accumulating here: {reason}")
    sys.exit(77)
emu = run("emulated")
bad = []
compared = 0
# The one known difference (docs/gpu.md): on the CPU, ATen's sigmoid_backward for Half computes in
# half arithmetic (g·(1−y) rounded to fp16, then ·y rounded again), where emulation and the CUDA
# kernels compute in fp32 and round once. The deep sigmoid sweep magnifies it through 12 layers, so
# on the CPU the fp16 sweep is printed but not asserted; on CUDA it must agree.
assert_sweep = not (fmt == "fp16" and device == "cpu")
if fmt == "fp16":
    assert nat["results"]["sweep_compute"] == "native" and emu["results"]["sweep_compute"] == "emulated"
    a, b = rows(nat, "sweep"), rows(emu, "sweep")
    assert a.keys() == b.keys() and a
    for name in a:
        for k in ("first_underflow", "first_overflow", "all_underflow", "all_overflow"):
            d = abs(num(a[name][k]) - num(b[name][k]))
            compared += 1
            print(f"sweep {name:>5} {k:<16} native {num(a[name][k]):.6f} emulated {num(b[name][k]):.6f}")
            if d > 1e-3 and assert_sweep:
                bad.append(f"sweep {name} {k}: native {a[name][k]} emulated {b[name][k]}")
        for k in ("first_error", "all_error"):
            x, y = num(a[name][k]), num(b[name][k])
            compared += 1
            if x != y and not (abs(x - y) <= 0.05 * max(abs(x), abs(y))) and assert_sweep:
                bad.append(f"sweep {name} {k}: native {x} emulated {y}")
    if not assert_sweep:
        print("sweep: not asserted on the CPU (ATen's Half sigmoid_backward rounds twice there; see docs/gpu.md)")
a, b = rows(nat, "recipes"), rows(emu, "recipes")
for name in recipes:
    ra, rb = a[name], b[name]
    assert ra["compute"] == "native" and rb["compute"] == "emulated", (ra["compute"], rb["compute"])
    la, lb = num(ra["final_train_loss"]), num(rb["final_train_loss"])
    print(f"recipe {name:<20} loss native {la:.6f} emulated {lb:.6f}  acc {ra['test_accuracy']:.4f} / "
          f"{rb['test_accuracy']:.4f}  skipped {ra['skipped_steps']} / {rb['skipped_steps']}  "
          f"lost {ra['lost_updates']:.4f} / {rb['lost_updates']:.4f}")
    compared += 4
    if not abs(la - lb) <= 0.02 * abs(lb):
        bad.append(f"{name}: final train loss native {la} emulated {lb}")
    if abs(ra["test_accuracy"] - rb["test_accuracy"]) > 0.02:
        bad.append(f"{name}: test accuracy native {ra['test_accuracy']} emulated {rb['test_accuracy']}")
    if abs(ra["skipped_steps"] - rb["skipped_steps"]) > 2:
        bad.append(f"{name}: skipped steps native {ra['skipped_steps']} emulated {rb['skipped_steps']}")
    sa, sb = num(ra["final_scale"]), num(rb["final_scale"])
    if not (0.5 <= sa / sb <= 2.0):
        bad.append(f"{name}: final scale native {sa} emulated {sb}")
print(f"{compared} values compared, {len(bad)} outside tolerance")
if bad:
    print("\n".join(bad))
    sys.exit(1)
