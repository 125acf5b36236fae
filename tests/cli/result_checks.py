"""Assertions on result documents (see result_check.sh): `mpt checkpoint`, `mpt accumulate`, and the
thread policy every multi-process run records in env.

usage: result_checks.py CHECK RESULT.json
"""
import json
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
    print(f"ok: peaks {peaks} strictly decreasing; gradients bitwise equal")


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
    intra-op threads unless OMP_NUM_THREADS says otherwise; libgomp waits PASSIVE by mpt's default,
    and a user's OMP_WAIT_POLICY is kept."""
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
        assert p["omp_wait_policy"] == "PASSIVE" and p["omp_wait_policy_source"].startswith("mpt's default"), p
    else:
        assert p["omp_wait_policy"] == wait and p["omp_wait_policy_source"] == "environment", (p, wait)
    print(f"ok: {p['intra_op']} intra-op thread(s) per rank on {cores} core(s), 2 local processes, "
          f"OMP_WAIT_POLICY {p['omp_wait_policy']} ({p['omp_wait_policy_source']})")


if __name__ == "__main__":
    check, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        doc = json.load(f)
    globals()[check](doc)
