#!/usr/bin/env bash
# Sets up mpt on a Debian 12 machine: installs the Debian packages it needs (only the
# missing ones; as root, or through sudo), then configures and builds into build/.
# Re-running it is cheap: nothing is installed twice and the build is incremental.
#
#   scripts/setup.sh            # packages + build
#   MPT_JOBS=4 scripts/setup.sh # more compile jobs (default 2; LibTorch TUs take ~1.5 GB each)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  g++ cmake make pkg-config          # toolchain
  libtorch-dev libgloo-dev           # LibTorch 1.13 (CPU) and Gloo headers for c10d
  libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev catch2 zlib1g-dev
  dataset-fashion-mnist              # real data: /usr/share/datasets/fashion-mnist
  python3-torch                      # PyTorch-Python reference for parity tests (/usr/bin/python3)
  python3-matplotlib                 # scripts/plot.py
)
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

cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo > build.configure.log 2>&1 || { cat build.configure.log; exit 1; }
rm -f build.configure.log
cmake --build build -j "${MPT_JOBS:-2}"
