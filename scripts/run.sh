#!/usr/bin/env bash
# The main job: sets up if needed, then runs every experiment with its default config.
# Tables go to stdout; one result file per experiment under results/.
#
#   scripts/run.sh                 # all experiments
#   scripts/run.sh underflow       # only the ones named
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mkdir -p results
if [ $# -gt 0 ]; then names=("$@"); else mapfile -t names < <(build/mpt list | awk '{print $1}'); fi
failed=()
for e in "${names[@]}"; do
  echo "=== mpt $e"
  build/mpt "$e" --out "results/$e.json" || failed+=("$e")
  echo
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "run: failed: ${failed[*]}" >&2
  exit 1
fi
echo "run: all ${#names[@]} experiments done; results in results/"
