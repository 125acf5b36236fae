#!/usr/bin/env bash
# Benchmarks: mpt against the same work in PyTorch-Python, measured side by side.
# Needs a built mpt (scripts/setup.sh). Arguments go to bench/bench.py (--rounds N, --only NAME).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/mpt ] || bash scripts/setup.sh
exec /usr/bin/python3 bench/bench.py "$@"
