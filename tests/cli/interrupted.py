#!/usr/bin/python3
"""An interrupted run (SIGINT as Ctrl-C sends it, SIGTERM as a scheduler's kill) leaves no --out
or --trace folder that it created, as a failed run leaves none (probe, stop 31: the empty
folders stayed). One process (lossscale's defaults: seconds of work) and the launcher of
--nproc 2 (collectives); the run dies of the signal (exit -SIG), and no process of it is left.
A run interrupted while it writes (its trace a FIFO nobody reads: the write blocks with the
result staged) leaves no temporary file either (issue 38), in one process and under --nproc.

    interrupted.py MPT            # interrupted while it runs
    interrupted.py MPT writing    # interrupted while it writes its files
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


def case_writing(mpt, args, tmp):
    """SIGTERM while the run writes its files: the result is staged in a temporary file beside it
    and the trace goes into a FIFO that nobody reads, so the write blocks there (issue 38: the
    staged .r.json.tmp.XXXXXX stayed behind). Under --nproc rank 0 writes and the signal goes to
    the launcher. The run dies of the signal and leaves no temporary file and no folder."""
    made = os.path.join(tmp, "made")
    out = os.path.join(made, "a", "r.json")
    fifo = os.path.join(tmp, "t.fifo")
    os.mkfifo(fifo)
    p = subprocess.Popen([mpt] + args + ["-q", "--out", out, "--trace", fifo], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def staged():
        d = os.path.dirname(out)
        return os.path.isdir(d) and any(n.startswith(".r.json.tmp.") for n in os.listdir(d))

    deadline = time.time() + 120
    while time.time() < deadline and not staged():
        if p.poll() is not None:
            fail(f"{args[0]}: ended (exit {p.returncode}) before it staged its result: {p.stderr.read()}")
        time.sleep(0.02)
    if not staged():
        p.kill()
        fail(f"{args[0]}: no staged result within 120 s: the case shows nothing")
    time.sleep(0.3)  # blocked in opening the FIFO for writing
    if p.poll() is not None:
        fail(f"{args[0]}: ended (exit {p.returncode}) before the signal: the case shows nothing")
    p.send_signal(signal.SIGTERM)
    try:
        code = p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        fail(f"{args[0]}: still running 60 s after SIGTERM")
    if code != -signal.SIGTERM:
        fail(f"{args[0]}: exit {code} after SIGTERM while writing, expected {-signal.SIGTERM}")
    time.sleep(2.5)  # as case(): workers the launcher's end reaches late
    left_files = [os.path.join(d, n) for d, _, names in os.walk(tmp) for n in names if n != "t.fifo"]
    if left_files or os.path.exists(made):
        fail(f"{args[0]} after SIGTERM while writing: left {left_files or [d for d, _, _ in os.walk(made)]}")
    left = subprocess.run(["pgrep", "-f", "--", made], capture_output=True, text=True).stdout.split()
    if left:
        for pid in left:
            os.kill(int(pid), signal.SIGKILL)
        fail(f"{args[0]} after SIGTERM while writing: processes left: {left}")
    print(f"ok: {args[0]}: SIGTERM while writing -> exit {code}, no temporary file, folder or process left")


def main():
    mpt = sys.argv[1]
    if sys.argv[2:] == ["writing"]:
        for args in (["underflow", "--set", "model.depth=2", "--set", "data.batch=4"],
                     ["collectives", "--config", "configs/collectives_quick.json", "--nproc", "2"]):
            tmp = tempfile.mkdtemp(prefix="mpt-int-")
            try:
                case_writing(mpt, args, tmp)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return
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
