"""Shared by scripts/sweep.py and scripts/plot.py: the output folder, made and checked before any work."""
import os
import sys


def not_a_folder(path):
    """The first of `path` and its ancestors (outermost first) that exists but is not a folder
    (a file, a device, a symbolic link to either or to nothing), or None. Such a path can never be
    made into a folder; os.makedirs would say only "File exists" or "Not a directory"."""
    chain, p = [], os.path.abspath(path)
    while True:
        chain.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    for p in reversed(chain):
        if not os.path.lexists(p):
            return None
        if not os.path.isdir(p):
            return p
    return None


def writable_out_dir(prog, path):
    """Creates `path` (and parents) if needed and checks that a file can be written there.
    On failure prints "<prog>: --out-dir <path>: <reason>" on stderr and exits 2 (bad input, as mpt
    does), instead of a traceback after the work is done: "is a file, not a folder" (or names the
    part of the path that is one), else "cannot write there: <OS error>"."""
    blocker = not_a_folder(path)
    if blocker is not None:
        what = "a broken symbolic link" if not os.path.exists(blocker) else \
            "a file" if os.path.isfile(blocker) else "a device, pipe or socket"
        where = "is" if blocker == os.path.abspath(path) else f"{blocker} is"
        print(f"{prog}: --out-dir {path}: {where} {what}, not a folder", file=sys.stderr)
        sys.exit(2)
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".{prog}-write-test")
        open(probe, "w").close()
        os.remove(probe)
    except OSError as e:
        print(f"{prog}: --out-dir {path}: cannot write there: {e.strerror}", file=sys.stderr)
        sys.exit(2)
