#!/usr/bin/env bash
# One GPU-machine run for the wave buffer: its GPU tests (one under compute-sanitizer memcheck), then the
# benchmark at 128K tokens (host store, batches 1-16; GPU store at batch 8). Logs and JSON lines go to
# $OUT; a table is printed last.
#
#   BIN_DIR=build/cuda/bin bash bench/wave_buffer_bench.sh
# Env: TEST_TIMEOUT, BENCH_TIMEOUT, GPU_BENCH_TIMEOUT (seconds), SKIP_MEMCHECK=1, LENGTH, BATCHES, STEPS,
# DRIFTS; shared libraries staged gzip-compressed in lib/ beside BIN_DIR are unpacked and put on
# LD_LIBRARY_PATH.
set -u
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$PWD/wave-buffer-out}
mkdir -p "$OUT"
BIN_DIR=${BIN_DIR:-$here/../build/cuda/bin}
if [ -d "$BIN_DIR/../lib" ]; then
  for z in "$BIN_DIR"/../lib/*.gz; do [ -e "$z" ] && gunzip -f "$z"; done
  export LD_LIBRARY_PATH="$(cd "$BIN_DIR/../lib" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/nvidia-smi.csv" 2>&1 || true
cat "$OUT/nvidia-smi.csv"

echo "== wave buffer gpu tests"
timeout ${TEST_TIMEOUT:-120} "$BIN_DIR/gpu_tests" --gtest_filter='WaveBuffer*' > "$OUT/wave_gpu_tests.log" 2>&1
rc=$?; grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED) |Failure|error" "$OUT/wave_gpu_tests.log" | head -40; echo "gpu_tests rc=$rc"
[ $rc -eq 0 ] || status=1
if [ "${SKIP_MEMCHECK:-0}" != 1 ] && command -v compute-sanitizer > /dev/null; then
  echo "== memcheck (full-cache test)"
  timeout 120 compute-sanitizer --tool memcheck "$BIN_DIR/gpu_tests" --gtest_filter='WaveBuffer.FullCache*:WaveBuffer.SmallCache*' > "$OUT/wave_memcheck.log" 2>&1
  rc=$?; grep -E "ERROR SUMMARY|OK \]|FAILED" "$OUT/wave_memcheck.log" | head -10; echo "memcheck rc=$rc"
fi

echo "== wave buffer bench"
timeout ${BENCH_TIMEOUT:-240} "$BIN_DIR/wave_buffer_bench" --length ${LENGTH:-131072} --batches ${BATCHES:-1,4,8,16} \
  --steps ${STEPS:-30} --drifts ${DRIFTS:-0.05,0.2,0.3,0.4,0.6,0.8,1.0} --tiers host --out "$OUT/wave_buffer_bench.jsonl" 2> "$OUT/wave_buffer_bench.err"
rc=$?; echo "bench rc=$rc"; [ $rc -eq 0 ] || status=1
timeout ${GPU_BENCH_TIMEOUT:-120} "$BIN_DIR/wave_buffer_bench" --length ${LENGTH:-131072} --batches 8 --steps ${STEPS:-30} --drifts 0.05,0.4 \
  --tiers gpu --out "$OUT/wave_buffer_bench_gpu.jsonl" 2> "$OUT/wave_buffer_bench_gpu.err"
rc=$?; echo "bench (gpu store) rc=$rc"
cat "$OUT/wave_buffer_bench.err" "$OUT/wave_buffer_bench_gpu.err"
exit $status
