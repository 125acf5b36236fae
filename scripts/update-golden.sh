#!/usr/bin/env bash
# Regenerates tests/golden/<experiment>.json from tests/golden/<experiment>.config.json (small,
# fixed configs). Run it on purpose when a change of numbers is intended; review the diff.
#   scripts/update-golden.sh            # all
#   scripts/update-golden.sh underflow  # only these
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/mpt ] || bash scripts/setup.sh
if [ $# -gt 0 ]; then names=("$@"); else names=(); for f in tests/golden/*.config.json; do n=$(basename "$f" .config.json); names+=("$n"); done; fi
for e in "${names[@]}"; do
  build/mpt "$e" -q --device cpu --set threads=1 --config "tests/golden/$e.config.json" --out "tests/golden/$e.json"
  echo "updated tests/golden/$e.json"
done
