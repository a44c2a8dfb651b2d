#!/usr/bin/env bash
# The test command (README, CI). Builds, then runs the C++ tests (ctest), the
# Python tests (GPU parts skip without a GPU) and the SASS check of the
# forward kernels. Every test step runs; the exit code is non-zero if any failed.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${FLASH3_BUILD_DIR:-build}
python=${PYTHON:-python3}

bash tools/build.sh -DFLASH3_BUILD_TESTS=ON

failed=()
step() {  # step NAME COMMAND...: runs it, records a failure instead of stopping
  local name=$1
  shift
  echo "== $name"
  if "$@"; then echo "== $name: ok"; else echo "== $name: FAILED"; failed+=("$name"); fi
}

step ctest ctest --test-dir "$build_dir" --output-on-failure -j "${FLASH3_JOBS:-2}"
step pytest env PYTHONPATH="$PWD/python" FLASH3_LIBRARY="$PWD/$build_dir/libflash3.so" \
  "$python" -m pytest tests/python -q
step check_sass "$python" tools/check_sass.py "$build_dir/libflash3.so"

echo "steps: $((3 - ${#failed[@]})) passed, ${#failed[@]} failed"
if ((${#failed[@]})); then
  echo "tools/test.sh: FAILED: ${failed[*]}"
  exit 1
fi
