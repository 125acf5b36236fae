#!/usr/bin/env bash
# run_parity.sh MPT PYTHON REF_SCRIPT [mpt args...]
# Runs mpt, then the PyTorch-Python reference on mpt's resolved config, and compares.
# Exit 77 (ctest: skipped) with a visible message when PYTHON has no torch.
set -u
mpt=$1 py=$2 ref=$3; shift 3
if ! "$py" -c 'import torch' 2>/dev/null; then
  echo "SKIPPED: $py cannot import torch; install Debian's python3-torch (scripts/setup.sh does) to run parity tests"
  exit 77
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$mpt" "$@" -q --device cpu --out "$tmp/mpt.json" || { echo "FAIL: mpt exited $?"; exit 1; }
"$py" "$ref" "$tmp/mpt.json" > "$tmp/ref.json" || { echo "FAIL: reference script failed"; exit 1; }
"$py" "$(dirname "$0")/compare.py" "$tmp/mpt.json" "$tmp/ref.json"
