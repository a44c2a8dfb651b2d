#!/usr/bin/env bash
# Builds libflash3.so, then runs the benchmark (python -m flash3.bench; needs
# torch and a Hopper GPU, and says so and exits non-zero without them).
# Arguments go to flash3.bench.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${FLASH3_BUILD_DIR:-build}
bash tools/build.sh
PYTHONPATH="$PWD/python" FLASH3_LIBRARY="$PWD/$build_dir/libflash3.so" \
  exec "${PYTHON:-python3}" -m flash3.bench "$@"
