#!/usr/bin/env bash
# Sets up if needed, then runs the whole test suite through ctest: Catch2 unit tests,
# CLI runs on tiny configs, bad-config cases and parity checks against PyTorch-Python.
#
#   scripts/test.sh                   # the default route: LibTorch 2.x (build/), reference .venv-torch2's
#                                     # Python; CUDA tests run on a GPU, and are reported as skipped without one
#   scripts/test.sh --torch debian    # Debian's LibTorch 1.13 build (build-debian/), reference /usr/bin/python3
#   scripts/test.sh --sanitize        # ASan + UBSan build (build-asan/) of Debian's route; runs the unit
#                                     # tests and the CLI cases (-R '^(unit|cli)\.' unless -R is given),
#                                     # but not those labelled unsanitized (-LE unsanitized unless -L or
#                                     # -LE is given: tests/CMakeLists.txt, MPT_UNSANITIZED_TESTS)
#   scripts/test.sh -R parity         # other arguments go to ctest
set -euo pipefail
cd "$(dirname "$0")/.."
torch=pip
torch_args=()
sanitize=0
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --torch) torch="${2:-}"; torch_args=(--torch "$torch"); shift 2 || { echo "test: --torch needs a value: debian or pip" >&2; exit 2; } ;;
    --torch=*) torch="${1#--torch=}"; torch_args=(--torch "$torch"); shift ;;
    --sanitize) sanitize=1; shift ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
case "$torch" in debian|pip) ;; *) echo "test: --torch: expected debian or pip, got '$torch'" >&2; exit 2 ;; esac
if [ $sanitize = 1 ]; then
  bash scripts/setup.sh "${torch_args[@]}" --sanitize
  build=build-asan
  # Sanitized runs are 2-5x slower: the unit tests and the CLI cases, unless a selection is given,
  # without the tests labelled `unsanitized` (full-size lessons, repeated runs, timing ratios, a
  # sub-second timeout: tests/CMakeLists.txt says why each), which run in the ordinary builds.
  [[ " ${args[*]-} " == *" -R "* ]] || args+=(-R '^(unit|cli)\.')
  [[ " ${args[*]-} " == *" -L "* || " ${args[*]-} " == *" -LE "* ]] || args+=(-LE unsanitized)
else
  bash scripts/setup.sh --torch "$torch"
  build=build
  [ "$torch" = debian ] && build=build-debian
fi
ctest --test-dir "$build" -j "${MPT_JOBS:-2}" --output-on-failure --timeout 600 "${args[@]}"
