#!/bin/sh
# Install.FindPackageConsumer: installs the build tree into a temporary prefix, builds
# examples/receiver_engine against it with find_package(weightcast) and runs it.
# Usage: find_package_consumer.sh CMAKE BUILD_DIR SOURCE_DIR
set -eu
cmake_bin=$1 build_dir=$2 source_dir=$3
tmp=$(mktemp -d) || { echo "SKIP: mktemp unavailable"; exit 77; }
trap 'rm -rf "$tmp"' EXIT INT TERM
"$cmake_bin" --install "$build_dir" --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; exit 1; }
"$cmake_bin" -S "$source_dir/examples/receiver_engine" -B "$tmp/build" \
  -DCMAKE_PREFIX_PATH="$tmp/prefix" >"$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; exit 1; }
"$cmake_bin" --build "$tmp/build" -j2 >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; exit 1; }
"$tmp/build/weightcast-receiver-engine" --help
"$tmp/build/weightcast-receiver-engine"
for p in weightcast-train weightcast-engine weightcast-bench; do
  test -x "$tmp/prefix/bin/$p" || { echo "missing installed program $p"; exit 1; }
done
"$tmp/prefix/bin/weightcast-engine" --help >/dev/null
echo "Install.FindPackageConsumer: ok"
