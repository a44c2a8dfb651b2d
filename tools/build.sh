#!/usr/bin/env bash
# Configures and builds libflash3.so (Release) in $FLASH3_BUILD_DIR (default
# build/) with $FLASH3_JOBS parallel jobs (default 2). Extra arguments go to
# the CMake configure step, e.g. -DFLASH3_HEAD_DIMS=128 for a fast subset.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${FLASH3_BUILD_DIR:-build}
generator=()
# Ninja when available, but never switch the generator of an existing build dir.
if [[ ! -f "$build_dir/CMakeCache.txt" ]] && command -v ninja >/dev/null; then
  generator=(-G Ninja)
fi
cmake -S . -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$build_dir" -j "${FLASH3_JOBS:-2}"
