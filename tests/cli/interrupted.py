#!/usr/bin/python3
"""An interrupted run (SIGINT as Ctrl-C sends it, SIGTERM as a scheduler's kill) leaves no --out
or --trace folder that it created, as a failed run leaves none (probe, stop 31: the empty
folders stayed). One process (lossscale's defaults: seconds of work) and the launcher of
--nproc 2 (collectives); the run dies of the signal (exit -SIG), and no process of it is left.

    interrupted.py MPT
Exit 0 pass, 1 fail."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def case(mpt, args, sig, tmp):
    made = os.path.join(tmp, "made")
    out = os.path.join(made, "a", "r.json")
    trace = os.path.join(made, "b", "t.json")
    p = subprocess.Popen([mpt] + args + ["-q", "--out", out, "--trace", trace], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # The folders exist once the run has checked its outputs (before any work).
    deadline = time.time() + 60
    while time.time() < deadline and not (os.path.isdir(os.path.dirname(out)) and os.path.isdir(os.path.dirname(trace))):
        if p.poll() is not None:
            fail(f"{args[0]}: ended (exit {p.returncode}) before its folders were made: {p.stderr.read()}")
        time.sleep(0.02)
    time.sleep(0.5)
    if p.poll() is not None:
        fail(f"{args[0]}: ended (exit {p.returncode}) before the signal: the case shows nothing")
    p.send_signal(sig)
    try:
        code = p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        fail(f"{args[0]}: still running 60 s after {sig.name}")
    if code != -sig:
        fail(f"{args[0]}: exit {code} after {sig.name}, expected {-sig} (killed by it)")
    if os.path.exists(made):
        fail(f"{args[0]} after {sig.name}: folders left: {[d for d, _, _ in os.walk(made)]}")
    time.sleep(2.5)  # the workers of --nproc notice the launcher's end (PR_SET_PDEATHSIG / the store)
    left = subprocess.run(["pgrep", "-f", "--", made], capture_output=True, text=True).stdout.split()
    if left:
        for pid in left:
            os.kill(int(pid), signal.SIGKILL)
        fail(f"{args[0]} after {sig.name}: processes left: {left}")
    print(f"ok: {args[0]}: {sig.name} -> exit {code}, no folder and no process left")


def main():
    mpt = sys.argv[1]
    for args in (["lossscale"],
                 ["collectives", "--nproc", "2", "--set", "iters=200", "--set", 'ops=["all_reduce"]']):
        for sig in (signal.SIGINT, signal.SIGTERM):
            tmp = tempfile.mkdtemp(prefix="mpt-int-")
            try:
                case(mpt, args, sig, tmp)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
