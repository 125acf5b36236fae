"""Assertions on result documents (see result_check.sh): `mpt checkpoint`, `mpt accumulate`, and the
thread policy every multi-process run records in env.

usage: result_checks.py CHECK RESULT.json
"""
import json
import math
import os
import sys


def rows(doc, table):
    return {r["name"]: r for r in doc["results"][table]}


def checkpoint_peak_decreasing(doc):
    """Peak bytes fall strictly from s=1 up to s=round(sqrt(n)); gradients are exactly equal."""
    n = doc["config"]["model"]["depth"]
    s_sqrt = round(n ** 0.5)
    sweep = sorted(doc["results"]["sweep"], key=lambda r: r["segments"])
    peaks = [r["peak_bytes"] for r in sweep if r["segments"] <= s_sqrt]
    assert len(peaks) == s_sqrt, peaks
    assert all(a > b for a, b in zip(peaks, peaks[1:])), f"not strictly decreasing up to sqrt(n)={s_sqrt}: {peaks}"
    seg = doc["results"]["segments"]
    none = next(r for r in seg if r["name"] == "none")
    for r in seg:
        if r["rng"] == "restored":
            assert r["max_abs_diff"] == 0.0, r
            assert r["peak_bytes"] <= none["peak_bytes"], r
    kernel = doc["env"]["dropout"]  # which dropout kernel the run's p got (core/models/mlp' dropout_kernel)
    assert kernel.split(" ")[0] in ("mpt", "aten") and "(" in kernel, kernel
    print(f"ok: peaks {peaks} strictly decreasing; gradients bitwise equal; dropout kernel: {kernel}")


def checkpoint_rng_mismatch(doc):
    """Without RNG restoration (and with dropout) the gradients differ; with it they are equal."""
    d = doc["results"]["no_rng_restore_max_abs_diff"]
    rel = doc["results"]["no_rng_restore_rel_diff"]
    assert rel > 1e-3, f"no-rng-restore difference {d} (relative {rel}) should be clearly non-zero"
    print(f"ok: no rng restore -> max|dg| = {d:g} (relative {rel:g})")


def accumulate_normalisation(doc):
    """Only sum/N and sum/total_tokens match the full-batch gradient; the 'k' rules do not."""
    tol = doc["config"]["tolerance"]
    v = rows(doc, "normalisation")
    for good in ("sum/N", "sum/total_tokens"):
        assert v[good]["max_abs_diff"] <= tol and v[good]["verdict"] == "yes", v[good]
    for bad in ("mean/k", "token_mean/k", "seq_mean/N"):
        assert v[bad]["max_abs_diff"] > 100 * tol and v[bad]["verdict"] == "no", v[bad]
    print("ok: " + ", ".join(f"{k} {r['max_abs_diff']:.3g}" for k, r in v.items()))


def accumulate_batchnorm(doc):
    """With BatchNorm the accumulated gradient differs from the big batch; without, it matches."""
    tol = doc["config"]["tolerance"]
    b = rows(doc, "batchnorm")
    assert b["with_batchnorm"]["max_abs_diff"] > 100 * tol, b
    assert b["without_batchnorm"]["max_abs_diff"] <= tol, b
    print(f"ok: with BN {b['with_batchnorm']['max_abs_diff']:.3g}, without {b['without_batchnorm']['max_abs_diff']:.3g}")


def accumulate_memory(doc):
    """Peak bytes shrink as the micro-batch shrinks (each row has more micro-batches than the last)."""
    m = sorted(doc["results"]["memory"], key=lambda r: r["micro_batches"])
    peaks = [r["peak_bytes"] for r in m]
    assert all(a > b for a, b in zip(peaks, peaks[1:])), peaks
    print(f"ok: peaks {peaks}")


def threads_policy_two_ranks(doc):
    """env.threads_policy of a 2-process run (issue 16, item 3): each process takes max(1, cores / 2)
    intra-op threads unless OMP_NUM_THREADS says otherwise; the wait policy is mpt's choice from the
    other processes' runnable threads the launcher counted at its start (PASSIVE at 0.5 or more, else
    libgomp's default: src/app/main.cpp), the same in both ranks, and a user's OMP_WAIT_POLICY is kept."""
    p = doc["env"]["threads_policy"]
    cores = len(os.sched_getaffinity(0))
    assert p["cores"] == cores, (p, cores)
    assert p["local_processes"] == 2, p
    if os.environ.get("OMP_NUM_THREADS"):
        assert p["source"] == "OMP_NUM_THREADS" and p["intra_op"] == int(os.environ["OMP_NUM_THREADS"]), p
    else:
        assert p["source"] == "auto" and p["intra_op"] == max(1, cores // 2), (p, cores)
    wait = os.environ.get("OMP_WAIT_POLICY")
    if wait is None:
        others = p["runnable_others_at_start"]
        assert isinstance(others, (int, float)) and others >= 0, p
        assert p["omp_wait_policy_source"].startswith("mpt's default"), p
        assert p["omp_wait_policy"] == ("PASSIVE" if others >= 0.5 else None), p
    else:
        assert p["omp_wait_policy"] == wait and p["omp_wait_policy_source"] == "environment", (p, wait)
    # Rank 0 (which writes the result) bound to the first intra_op of the allowed CPUs where both
    # ranks' threads fit them (core/runtime's bind_cpus), unless MPT_CPU_BIND=none.
    allowed = sorted(os.sched_getaffinity(0))
    others = p["runnable_others_at_start"]
    if os.environ.get("MPT_CPU_BIND") == "none":
        assert p["cpu_bind"] == "none: MPT_CPU_BIND=none", p
    elif 2 * p["intra_op"] > cores:
        assert p["cpu_bind"].startswith("none: 2 process(es) x"), p
    elif others is not None and others >= 0.5:
        assert p["cpu_bind"].startswith("none: ") and "other runnable threads at start" in p["cpu_bind"], p
    else:
        assert p["cpu_bind"].startswith(f"cpus {_cpu_list(allowed[:p['intra_op']])} of {_cpu_list(allowed)} "
                                        "(local rank 0 of 2)"), (p, allowed)
    print(f"ok: {p['intra_op']} intra-op thread(s) per rank on {cores} core(s), 2 local processes, "
          f"OMP_WAIT_POLICY {p['omp_wait_policy']} ({p['omp_wait_policy_source']}), bound: {p['cpu_bind']}")


def _cpu_list(cpus):
    """"0-3,6" for [0, 1, 2, 3, 6], as env.threads_policy.cpu_bind writes a set of CPUs."""
    out, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


def _finite(v):
    return isinstance(v, (int, float)) and math.isfinite(v)


def lossscale_gpt_sharp(doc):
    """configs/lossscale_gpt_sharp.json: with q/k initialised large, attention scores overflow fp16
    (>= 65520 rounds to inf). Every fp16 policy that stores the scores in fp16 has a non-finite loss
    from step 1 and counts overflowed scores; every policy whose scores are held in fp32 or bf16 trains:
    all losses finite and the mean of the last 5 below the first loss."""
    hist = doc["results"]["gpt_history"]
    pol = rows(doc, "gpt_policies")
    sites = {(r["policy"], r["site"]): r for r in doc["results"]["gpt_site_counts"]}
    low_scores, kept = [], []
    for name, r in pol.items():
        loss = hist[name]["loss"]
        if r["format"] == "fp16" and "scores" not in r["fp32_sites"]:
            assert not _finite(loss[0]), (name, loss[:3])
            assert not any(_finite(v) for v in loss), (name, "a finite loss", loss)
            assert sites[(name, "scores")]["overflowed"] > 0, (name, sites[(name, "scores")])
            low_scores.append(name)
        else:
            assert all(_finite(v) for v in loss), (name, loss)
            tail = sum(loss[-5:]) / len(loss[-5:])
            assert tail < loss[0], (name, loss[0], tail)
            if (name, "scores") in sites:
                assert sites[(name, "scores")]["overflowed"] == 0, (name, sites[(name, "scores")])
            kept.append(f"{name} {loss[0]:.3f}->{tail:.3f}")
    assert low_scores and kept, (low_scores, kept)
    print(f"ok: non-finite from step 1: {low_scores}; trained: {kept}")


def _memory_tables(doc):
    return [t for t in ("memory", "gpt_memory") if t in doc["results"]]


def quant_memory_measured(doc):
    """Every memory row's measured bytes (LibTorch's low-bit dtypes, counted by the allocator) equal the
    computed bytes, part by part, where measurable; on LibTorch >= 2.8 (float4_e2m1fn_x2, float8_e8m0fnu)
    every row of the fp8 and fp4 recipes is measurable."""
    ver = tuple(int(x) for x in doc["env"]["torch"].split("+")[0].split(".")[:2])
    n = 0
    for t in _memory_tables(doc):
        for r in doc["results"][t]:
            if r["measured"] is None:  # this LibTorch lacks a dtype of the row
                assert r["measured_parts"] is None, r
                assert ver < (2, 8), (ver, t, r)
                continue
            assert r["measured"] == r["total"], (t, r)
            for part in ("weights", "activations", "gradients", "scales"):
                assert r["measured_parts"][part] == r[part], (t, r["name"], part, r)
            n += 1
    assert n > 0 or ver < (2, 1), "no measurable row"
    print(f"ok: {n} rows measured == computed (LibTorch {doc['env']['torch']})")


def fp4_gpt_rows(doc):
    """mpt fp4's GPT section: a row per variant with finite losses; the fp32 row's GEMMs are exact
    (errors 0: its GEMMs are the reference), bf16's are below every 4-bit variant's (bf16 keeps 8
    mantissa bits, E2M1 1), and bf16's validation loss is within 0.05 of fp32's (bf16's rounding
    of the operands moves a 4-step run's loss by far less)."""
    v = rows(doc, "gpt_variants")
    assert set(v) == set(doc["config"]["variants"]), (sorted(v), doc["config"]["variants"])
    for name, r in v.items():
        for k in ("train_loss", "val_loss", "out_error", "dgrad_error", "wgrad_error"):
            assert _finite(r[k]), (name, k, r)
    for g in ("out_error", "dgrad_error", "wgrad_error"):
        assert v["fp32"][g] == 0, v["fp32"]
        for name, r in v.items():
            if name not in ("fp32", "bf16"):
                assert v["bf16"][g] < r[g], (g, v["bf16"][g], name, r[g])
    if "bf16" in v:
        assert abs(v["bf16"]["val_loss"] - v["fp32"]["val_loss"]) < 0.05, (v["bf16"], v["fp32"])
    hist = doc["results"]["gpt_history"]
    assert all(len(h) == doc["config"]["gpt"]["steps"] for h in hist.values()), {k: len(h) for k, h in hist.items()}
    print("ok: " + ", ".join(f"{n} {r['val_loss']:.4f} (out err {r['out_error']:.3g})" for n, r in v.items()))


if __name__ == "__main__":
    check, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        doc = json.load(f)
    globals()[check](doc)
