"""Assertions on result documents of `mpt checkpoint` and `mpt accumulate` (see result_check.sh).

usage: result_checks.py CHECK RESULT.json
"""
import json
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


if __name__ == "__main__":
    check, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        doc = json.load(f)
    globals()[check](doc)
