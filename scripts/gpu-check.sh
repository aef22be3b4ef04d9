#!/usr/bin/env bash
# One GPU-machine run: the GPU parity tests, the kernel benchmark, torch SDPA on the same shapes, and a
# table of both (printed last). Logs and JSON lines go to $OUT (the folder whose files come back).
#
#   BIN_DIR=build/cuda/bin bash scripts/gpu-check.sh [extra kernel_bench args]
#
# BIN_DIR holds gpu_tests and kernel_bench (default: build/cuda/bin, or bin/ beside this script when
# staged); SKIP_TESTS=1 / SKIP_BENCH=1 / SKIP_TORCH=1 leave a part out. Never changes clocks or modes.
set -u
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
if [ -z "${BIN_DIR:-}" ]; then
  if [ -x "$here/bin/gpu_tests" ]; then BIN_DIR=$here/bin; else BIN_DIR=$here/../build/cuda/bin; fi
fi
# Shared libraries the GPU machine lacks (OpenBLAS, libgomp, libgfortran, libquadmath) may be staged in
# lib/ beside this script, gzip-compressed to fit the transfer limit.
if [ -d "$here/lib" ]; then
  for z in "$here"/lib/*.gz; do [ -e "$z" ] && gunzip -f "$z"; done
  export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
LENGTHS=${LENGTHS:-32768,131072,524288,1048576}
BATCHES=${BATCHES:-1,4,16}
REPS=${REPS:-30}
status=0

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv > "$OUT/nvidia-smi.csv" 2>&1 || true
cat "$OUT/nvidia-smi.csv"

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  echo "== gpu tests"
  timeout "${TEST_TIMEOUT:-240}" "$BIN_DIR/gpu_tests" --gtest_brief=1 --gtest_output=json:"$OUT/gpu_tests.json" > "$OUT/gpu_tests.log" 2>&1
  rc=$?
  grep -E "^\[parity|FAILED|Failure|PASSED|error" "$OUT/gpu_tests.log" | head -60
  echo "gpu_tests exit code $rc"
  [ $rc -eq 0 ] || status=1
fi

if [ "${SKIP_BENCH:-0}" != 1 ]; then
  echo "== kernel bench"
  rm -f "$OUT/kernel_bench.jsonl"
  timeout "${BENCH_TIMEOUT:-300}" "$BIN_DIR/kernel_bench" --lengths "$LENGTHS" --batches "$BATCHES" --reps "$REPS" --out "$OUT/kernel_bench.jsonl" "$@" \
    2> "$OUT/kernel_bench.err"
  rc=$?
  tail -5 "$OUT/kernel_bench.err"
  echo "kernel_bench exit code $rc"
  [ $rc -eq 0 ] || status=1
fi

if [ "${SKIP_TORCH:-0}" != 1 ]; then
  echo "== torch sdpa"
  rm -f "$OUT/torch_sdpa.jsonl"
  PYTHONUNBUFFERED=1 timeout "${TORCH_TIMEOUT:-200}" python3 "$here/torch_sdpa_bench.py" --out "$OUT/torch_sdpa.jsonl" --lengths "$LENGTHS" \
    --batches "$BATCHES" --reps "$REPS" 2> "$OUT/torch_sdpa.err"
  rc=$?
  tail -3 "$OUT/torch_sdpa.err"
  echo "torch_sdpa_bench exit code $rc"
fi

echo "== table"
python3 "$here/torch_sdpa_bench.py" --summarize "$OUT/kernel_bench.jsonl" "$OUT/torch_sdpa.jsonl" | tee "$OUT/table.md"
exit $status
