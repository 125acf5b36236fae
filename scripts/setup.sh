#!/usr/bin/env bash
# Sets up mpt on a Debian 12 machine: installs what it needs (only what is missing; as root
# or through sudo), then configures and builds.
#
#   scripts/setup.sh                  # the default route: PyPI's LibTorch 2.x     -> build/
#   scripts/setup.sh --torch debian   # Debian's LibTorch 1.13 (CPU, apt only)     -> build-debian/
#   scripts/setup.sh --sanitize       # Debian's LibTorch, mpt built with ASan + UBSan -> build-asan/
#   MPT_JOBS=4 scripts/setup.sh       # more compile jobs (default 2; LibTorch TUs take ~1.5 GB each)
#
# The default route (--torch pip) installs the pinned torch wheel (scripts/torch2-requirements.txt:
# LibTorch 2.x with MKL, oneDNN, CUDA and fp8 dtypes) into the project-local virtual environment
# .venv-torch2/ (pip's cache keeps the wheels for the next run), points CMake at the LibTorch
# inside it, and builds with its CUDA paths compiled (NCCL, CUDA memory statistics). Linking
# needs the CUDA toolkit (nvcc, cudart) at /usr/local/cuda or on PATH; nothing here needs a GPU.
# --torch debian uses Debian's libtorch-dev 1.13.1 instead: apt only, lighter, older, CPU only.
# Re-running is cheap: nothing is installed twice and the build is incremental.
set -euo pipefail
cd "$(dirname "$0")/.."

torch=pip
torch_given=
sanitize=0
while [ $# -gt 0 ]; do
  case "$1" in
    --torch) torch="${2:-}"; torch_given=1; shift 2 || { echo "setup: --torch needs a value: debian or pip" >&2; exit 2; } ;;
    --torch=*) torch="${1#--torch=}"; torch_given=1; shift ;;
    --sanitize) sanitize=1; shift ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup: unknown option '$1' (expected --torch debian|pip, --sanitize)" >&2; exit 2 ;;
  esac
done
case "$torch" in debian|pip) ;; *) echo "setup: --torch: expected debian or pip, got '$torch'" >&2; exit 2 ;; esac
if [ $sanitize = 1 ]; then
  if [ -n "$torch_given" ] && [ "$torch" != debian ]; then
    echo "setup: --sanitize builds against Debian's LibTorch only (got --torch $torch)" >&2; exit 2
  fi
  torch=debian
fi

packages=(
  g++ cmake make pkg-config          # toolchain
  ccache                             # compiler cache: rebuilds of unchanged sources (CMakeLists.txt)
  libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev catch2 zlib1g-dev
  dataset-fashion-mnist              # real data: /usr/share/datasets/fashion-mnist
  fortunes                           # real text: /usr/share/games/fortunes (the tiny GPT's corpus)
  python3-matplotlib                 # scripts/plot.py
  iproute2                           # ip: the network namespaces of tests/cli/multinode.sh
  libgloo-dev                        # Gloo headers for c10d (PyPI's wheel ships ProcessGroupGloo.hpp, not gloo/)
)
if [ "$torch" = debian ]; then
  packages+=(
    libtorch-dev                     # LibTorch 1.13 (CPU)
    python3-torch                    # PyTorch-Python reference for parity tests (/usr/bin/python3)
  )
else
  packages+=(python3-venv)           # .venv-torch2 for the torch wheel (its Python is the parity reference)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  sudo=()
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    sudo=(sudo)
  fi
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if [ "$torch" = debian ]; then
  build=build-debian
  cmake_args=()
  if [ $sanitize = 1 ]; then
    build=build-asan
    cmake_args=(-DMPT_SANITIZE=ON)
  fi
else
  build=build
  venv=.venv-torch2
  req=scripts/torch2-requirements.txt
  # Reinstall only when the pinned requirements changed (the stamp holds a copy of them).
  if ! cmp -s "$req" "$venv/.mpt-requirements" 2>/dev/null; then
    # The wheels unpack to about 5.5 GB here and pip holds the downloads (about 3 GB) in its
    # temporary folder meanwhile: refuse up front, naming the folders, rather than let pip fail
    # half-way with "No space left on device".
    need_kb=$((9 * 1024 * 1024))
    for d in . "${TMPDIR:-/tmp}"; do
      free_kb=$(df -Pk "$d" 2>/dev/null | awk 'NR == 2 { print $4 }')
      if [ -n "$free_kb" ] && [ "$free_kb" -lt "$need_kb" ]; then
        echo "setup: $(( free_kb / 1024 )) MiB free on $(cd "$d" && pwd)'s file system; installing the torch wheel into $venv needs about 9 GiB there (5.5 GiB installed, the downloads meanwhile). Free space there, or use --torch debian (apt only, far smaller)" >&2
        exit 1
      fi
    done
    [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
    echo "setup: installing $(grep -v '^#' "$req" | xargs) into $venv (pip; several GB the first time)" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check --progress-bar off -r "$req"
    cp "$req" "$venv/.mpt-requirements"
  fi
  tdir="$("$venv/bin/python" -W ignore -c 'import os, torch; print(os.path.dirname(torch.__file__))')"
  # The torch folder itself first, so that find_library takes its lib/ before any system
  # LibTorch (Debian's libtorch-dev may be installed too); then its CMake config.
  cmake_args=("-DCMAKE_PREFIX_PATH=$tdir;$tdir/share/cmake" "-DMPT_REF_PYTHON=$PWD/$venv/bin/python")
  if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
  command -v nvcc >/dev/null || { echo "setup: --torch pip needs the CUDA toolkit (nvcc) to link the CUDA LibTorch; none found on PATH or in /usr/local/cuda" >&2; exit 3; }
  # No GPU here to detect: name the architectures for Torch's CMake (it only links; mpt has no kernels).
  export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-8.0;9.0}"
fi

# A build folder configured for the other route (e.g. a build/ made for Debian's LibTorch
# before the default changed) would keep its cached Torch_DIR: start that folder afresh.
route=$torch
if [ $sanitize = 1 ]; then route=$torch+sanitize; fi
if [ -f "$build/CMakeCache.txt" ] && [ "$(cat "$build/.mpt-route" 2>/dev/null)" != "$route" ]; then
  echo "setup: $build/ was configured for another route; reconfiguring it for --torch $torch" >&2
  rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
fi
mkdir -p "$build"
echo "$route" > "$build/.mpt-route"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${cmake_args[@]}" > "$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; exit 1; }
rm -f "$build.configure.log"
cmake --build "$build" -j "${MPT_JOBS:-2}"
