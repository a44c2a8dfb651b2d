#!/usr/bin/env bash
# One call on the GPU machine (the device tool): GPU tests, compute-sanitizer
# memcheck, racecheck and synccheck on small odd shapes, then the benchmark. Expects a
# build/ carried from the CPU machine; logs and results go to $OUT.
# A hung kernel (a barrier bug) would otherwise eat the whole device budget:
# every step has a timeout.
# Usage: bash tools/device_run.sh [pytest|fp8|sanitize|overhead|bench|bench_fp8|bench_decode|bench_bwd|bench_bwd_sinks|bench_bwd_det|window|varlen|ablation]...
#        (default: pytest sanitize bench bench_bwd)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/flash3-device}
mkdir -p "$out"
export PYTHONPATH=$PWD/python FLASH3_LIBRARY=$PWD/build/libflash3.so PYTHONUNBUFFERED=1
steps=${*:-pytest sanitize bench bench_bwd}
# The device tool brings back at most 8 files: pick steps so that their logs fit.
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv
for step in $steps; do
  case $step in
    pytest)
      timeout 420 python3 -m pytest tests/python -q -x -rs 2>&1 | tee "$out/pytest.log" ;;
    sanitize)
      for tool in memcheck racecheck synccheck; do
        timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 python3 tools/sanitizer_cases.py \
          >"/tmp/sanitizer-$tool.log" 2>&1
        echo "compute-sanitizer $tool: exit $?" | tee -a "$out/sanitizer.log"
        tail -3 "/tmp/sanitizer-$tool.log" | tee -a "$out/sanitizer.log"
      done ;;
    bench)
      timeout 300 python3 -m flash3.bench --json "$out/bench.json" --plot "$out/bench.png" 2>&1 |
        tee "$out/bench.log" ;;
    fp8)  # the FP8 GPU tests alone
      timeout 300 python3 -m pytest tests/python/test_fp8_gpu.py -q -x -rs 2>&1 | tee "$out/fp8.log" ;;
    bench_decode)
      timeout 400 python3 -m flash3.bench_decode --json "$out/bench_decode.json" 2>&1 | tee "$out/bench_decode.log" ;;
    bench_fp8)
      timeout 300 python3 -m flash3.bench_fp8 --json "$out/bench_fp8.json" 2>&1 | tee "$out/bench_fp8.log" ;;
    bench_bwd)
      timeout 300 python3 -m flash3.bench --bwd --json "$out/bench_bwd.json" 2>&1 |
        tee "$out/bench_bwd.log" ;;
    bench_bwd_sinks)  # flash3's backward with a sink per head and its gradient
      timeout 300 python3 -m flash3.bench --bwd --sinks --backends flash3,cudnn \
        --json "$out/bench_bwd_sinks.json" 2>&1 | tee "$out/bench_bwd_sinks.log" ;;
    bench_bwd_det)
      timeout 300 python3 -m flash3.bench --bwd --deterministic --json "$out/bench_bwd_det.json" 2>&1 |
        tee "$out/bench_bwd_det.log" ;;
    window)  # sliding window (4096, 0) at s = 32k against causal and full, forward and backward
      { timeout 120 python3 -m flash3.bench --window 4096 --hdims 64,128,256 --json "$out/window.json"
        timeout 120 python3 -m flash3.bench --window 4096 --hdims 64,128,256 --bwd \
          --json "$out/window_bwd.json"; } 2>&1 | tee "$out/window.log" ;;
    varlen)  # 64 uneven sequences packed vs fixed length at the mean and cuDNN padded, fwd and bwd
      { timeout 150 python3 -m flash3.bench --varlen --json "$out/varlen.json"
        timeout 200 python3 -m flash3.bench --varlen --bwd --json "$out/varlen_bwd.json"; } 2>&1 |
        tee "$out/varlen.log" ;;
    overhead)  # host time per call: from Python (flash3 and SDPA), then the C/C++ API
      { timeout 120 python3 -m flash3.bench --overhead; timeout 60 build/flash3_host_overhead; } 2>&1 |
        tee "$out/overhead.log" ;;
    ablation)  # variants carried in build-ablation/<name>/libflash3.so; shapes from $ABLATION_ARGS
      for lib in build-ablation/*/libflash3.so; do
        name=$(basename "$(dirname "$lib")")
        echo "== ablation: $name" | tee -a "$out/ablation.log"
        # shellcheck disable=SC2086 # ABLATION_ARGS is a list of bench options
        FLASH3_LIBRARY=$PWD/$lib timeout 200 python3 -m flash3.bench \
          ${ABLATION_ARGS:---hdims 128 --seqlens 8192 --causal no} \
          --json "$out/ablation-$name.json" 2>&1 | grep -v "^wrote" | tee -a "$out/ablation.log"
      done ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
