#!/usr/bin/env bash
# Usage: check_flags_script.sh <scripts/mpirun-flags.sh> "<expected flags, space-separated>"
# Fails when the script prints anything but the flags CMake uses.
set -eu
got=$("$1")
if [ "$got" != "$2" ]; then
  printf 'mpirun-flags.sh prints:\n  %s\nCMake default is:\n  %s\n' "$got" "$2" >&2
  exit 1
fi
echo "mpirun-flags.sh matches WEIGHTCAST_MPIRUN_FLAGS: $got"
