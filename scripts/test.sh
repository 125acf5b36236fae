#!/usr/bin/env bash
# Sets up if needed, then runs the whole test suite through ctest: Catch2 unit tests,
# CLI runs on tiny configs, bad-config cases and parity checks against python3-torch.
#
#   scripts/test.sh               # everything
#   scripts/test.sh -R parity     # extra arguments go to ctest
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ctest --test-dir build -j "${MPT_JOBS:-2}" --output-on-failure --timeout 600 "$@"
