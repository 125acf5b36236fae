#!/usr/bin/env bash
# Benchmarks: mpt against the same work in PyTorch-Python (Debian's python3-torch), measured
# side by side in one run, equal results checked before timing (docs/performance.md).
# Needs a built mpt (scripts/setup.sh). Arguments go to bench/bench.py:
#   scripts/bench.sh                          # every benchmark, 5 alternating rounds after a warm-up
#   scripts/bench.sh --quick                  # smaller runs, 1 round (a smoke test)
#   scripts/bench.sh --only mlp --only ddp    # choose: underflow, lossscale, accumulate, dataparallel,
#                                             #   pipeline, checkpoint, mlp, mlp_large, ddp
#   scripts/bench.sh --rounds 9 --out FILE    # default FILE: bench/results/<UTC date>.json
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/mpt ] || bash scripts/setup.sh
exec /usr/bin/python3 bench/bench.py "$@"
