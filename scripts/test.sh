#!/usr/bin/env bash
# Runs every test that needs no GPU: ctest -LE gpu over the given build preset (default: the CUDA build
# when nvcc exists, else cpu-release), building it first if needed.
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-}
if [[ -z "$preset" ]]; then
  if command -v nvcc >/dev/null 2>&1; then preset=cuda-release; else preset=cpu-release; fi
fi
[[ -f "build/$preset/CMakeCache.txt" ]] || cmake --preset "$preset"
cmake --build "build/$preset" -j"$(nproc)"
ctest --test-dir "build/$preset" -LE gpu --output-on-failure -j"$(nproc)" --timeout 600
