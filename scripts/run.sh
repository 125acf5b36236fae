#!/usr/bin/env bash
# The main job: sets up if needed, then runs every experiment with its default config.
# Tables go to stdout; one result file per experiment under results/.
#
#   scripts/run.sh                       # all experiments, the default route (LibTorch 2.x, build/)
#   scripts/run.sh underflow             # only the ones named
#   scripts/run.sh --torch debian [...]  # Debian's LibTorch 1.13 route (build-debian/)
set -euo pipefail
cd "$(dirname "$0")/.."
torch=pip
names=()
while [ $# -gt 0 ]; do
  case "$1" in
    --torch) torch="${2:-}"; shift 2 || { echo "run: --torch needs a value: debian or pip" >&2; exit 2; } ;;
    --torch=*) torch="${1#--torch=}"; shift ;;
    -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "run: unknown option '$1' (expected --torch debian|pip, or experiment names)" >&2; exit 2 ;;
    *) names+=("$1"); shift ;;
  esac
done
case "$torch" in debian|pip) ;; *) echo "run: --torch: expected debian or pip, got '$torch'" >&2; exit 2 ;; esac
bash scripts/setup.sh --torch "$torch"
build=build
[ "$torch" = debian ] && build=build-debian
mkdir -p results
if [ ${#names[@]} -eq 0 ]; then mapfile -t names < <("$build/mpt" list | awk '{print $1}'); fi
failed=()
for e in "${names[@]}"; do
  echo "=== mpt $e"
  "$build/mpt" "$e" --out "results/$e.json" || failed+=("$e")
  echo
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "run: failed: ${failed[*]}" >&2
  exit 1
fi
echo "run: all ${#names[@]} experiments done; results in results/"
