"""Shared by scripts/sweep.py and scripts/plot.py: the output folder, made and checked before any work."""
import os
import sys


def writable_out_dir(prog, path):
    """Creates `path` (and parents) if needed and checks that a file can be written there.
    On failure prints "<prog>: --out-dir <path>: cannot write there: <reason>" on stderr and
    exits 2 (bad input, as mpt does), instead of a traceback after the work is done."""
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".{prog}-write-test")
        open(probe, "w").close()
        os.remove(probe)
    except OSError as e:
        print(f"{prog}: --out-dir {path}: cannot write there: {e.strerror}", file=sys.stderr)
        sys.exit(2)
