#!/usr/bin/env bash
# Installs the Debian packages weightcast needs, if any are missing (Debian's python3-torch is
# the real torch.distributed peer of the interop tests; pybind11 builds the Python module). As root it runs apt-get;
# otherwise it prints the exact command to run and stops with status 1.
set -euo pipefail

packages=(
  g++ cmake make pkg-config
  libopenmpi-dev openmpi-bin
  libgloo-dev
  nlohmann-json3-dev
  libcpp-httplib-dev
  libgtest-dev libgmock-dev
  libcli11-dev
  libxxhash-dev libzstd-dev liblz4-dev
  iproute2 procps
  python3-torch python3-xxhash python3-numpy
  python3-dev pybind11-dev
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

cmd="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "setup: missing packages: ${missing[*]}" >&2
  echo "setup: run as root:  $cmd" >&2
  exit 1
fi
echo "setup: installing ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
