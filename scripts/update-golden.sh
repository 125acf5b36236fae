#!/usr/bin/env bash
# Regenerates the golden results from tests/golden/<experiment>.config.json (small, fixed
# configs). Run it on purpose when a change of numbers is intended; review the diff.
#   scripts/update-golden.sh                       # all, the default route's LibTorch 2.x (build/) -> tests/golden/torch2/<exp>.json
#   scripts/update-golden.sh underflow             # only these
#   scripts/update-golden.sh --torch debian [...]  # Debian's LibTorch 1.13 (build-debian/) -> tests/golden/<exp>.json
set -euo pipefail
cd "$(dirname "$0")/.."
build=build dir=tests/golden/torch2 torch=pip
if [ "${1:-}" = --torch ]; then torch=${2:?--torch needs debian or pip}; shift 2; fi
if [ "$torch" = debian ]; then build=build-debian dir=tests/golden; fi
[ -x "$build/mpt" ] || bash scripts/setup.sh --torch "$torch"
mkdir -p "$dir"
if [ $# -gt 0 ]; then names=("$@"); else names=(); for f in tests/golden/*.config.json; do n=$(basename "$f" .config.json); names+=("$n"); done; fi
for e in "${names[@]}"; do
  # compute=auto picks by this CPU's kernels and their speed: the LibTorch 2.x golden pins the native path
  extra=(); if [ "$torch" = pip ] && [ "$e" = lossscale ]; then extra=(--set train.compute=native); fi
  "$build/mpt" "$e" -q --device cpu --set threads=1 --config "tests/golden/$e.config.json" "${extra[@]}" --out "$dir/$e.json"
  echo "updated $dir/$e.json"
done
