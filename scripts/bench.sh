#!/usr/bin/env bash
# Benchmarks: mpt against the same work in PyTorch-Python on the same LibTorch, measured side
# by side in one run, equal results checked before timing (docs/performance.md). Sets up the
# route if its mpt is not built. Arguments other than --torch go to bench/bench.py:
#   scripts/bench.sh                          # the default route: build/mpt vs .venv-torch2's Python (LibTorch 2.x)
#   scripts/bench.sh --torch debian           # build-debian/mpt vs Debian's python3-torch (LibTorch 1.13)
#   scripts/bench.sh --quick                  # smaller runs, 1 round: a smoke test, not figures to quote
#   scripts/bench.sh --only mlp --only ddp    # choose: underflow, lossscale, accumulate, dataparallel,
#                                             #   pipeline, checkpoint, mlp, mlp_large, mlp_native, ddp,
#                                             #   accumulate_step, pipeline_step, zero2, zero2_ring, gemm,
#                                             #   busy, defaults, trace, compare (mpt compare on generated files
#                                             #   of 400,000 rows and near the 256 MiB cap)
#   scripts/bench.sh --rounds 9 --out FILE    # default FILE: bench/results/<UTC date>.json
# What each benchmark and each row measures: bench/bench.py's help (the default route's Python:
# .venv-torch2/bin/python bench/bench.py --help) and docs/performance.md.
set -euo pipefail
cd "$(dirname "$0")/.."
torch=pip
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --torch) torch="${2:-}"; shift 2 || { echo "bench: --torch needs a value: debian or pip" >&2; exit 2; } ;;
    --torch=*) torch="${1#--torch=}"; shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
case "$torch" in
  pip) build=build; export MPT_REF_PYTHON=${MPT_REF_PYTHON:-$PWD/.venv-torch2/bin/python} ;;
  debian) build=build-debian; export MPT_REF_PYTHON=${MPT_REF_PYTHON:-/usr/bin/python3} ;;
  *) echo "bench: --torch: expected debian or pip, got '$torch'" >&2; exit 2 ;;
esac
[ -x "$build/mpt" ] || bash scripts/setup.sh --torch "$torch"
exec /usr/bin/python3 bench/bench.py --mpt "$build/mpt" "${args[@]}"
