#!/usr/bin/env bash
# Runs every test that needs no GPU: ctest -LE gpu over the given build preset (default: the CUDA build
# when nvcc exists, else cpu-release), building it first if needed, then the Python bindings' tests
# (pytest tests/python) against that build's module when the build has one (RETROINFER_PYTHON).
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-}
if [[ -z "$preset" ]]; then
  if command -v nvcc >/dev/null 2>&1; then preset=cuda-release; else preset=cpu-release; fi
fi
[[ -f "build/$preset/CMakeCache.txt" ]] || cmake --preset "$preset"
cmake --build "build/$preset" -j"$(nproc)"
# TEST_EXCLUDE: a ctest -E regex of tests to leave out (scripts/sanitize_ci.sh: the real-model tests, too slow
# under ASan at -O0).
ctest --test-dir "build/$preset" -LE gpu ${TEST_EXCLUDE:+-E "$TEST_EXCLUDE"} --output-on-failure -j"$(nproc)" --timeout 600

# Python bindings: the interpreter the module was built for (CMake's Python3_EXECUTABLE), this build's
# module and CLI.
cache="build/$preset/CMakeCache.txt"
pydir="$PWD/build/$preset/python"
if compgen -G "$pydir/retroinfer/_retroinfer*.so" >/dev/null; then
  py=$(sed -n 's/^Python3_EXECUTABLE:[A-Z]*=//p' "$cache")
  py_env=(PYTHONPATH="$pydir${PYTHONPATH:+:$PYTHONPATH}" RETROINFER_CLI="$PWD/build/$preset/bin/retroinfer")
  if grep -q '^RETROINFER_SANITIZE:BOOL=ON' "$cache"; then
    # An ASan module in an uninstrumented interpreter: its runtime must be loaded first, and libstdc++ with
    # it (else ASan's __cxa_throw interceptor finds no real function and the first C++ exception aborts);
    # the interpreter's own allocations at exit are not leaks of ours.
    cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$cache")
    cxx=${cxx:-c++}
    py_env+=(LD_PRELOAD="$("$cxx" -print-file-name=libasan.so):$("$cxx" -print-file-name=libstdc++.so)"
             ASAN_OPTIONS=detect_leaks=0)
  fi
  env "${py_env[@]}" "${py:-python3}" -m pytest -q -p no:cacheprovider tests/python
else
  echo "test.sh: build/$preset has no Python module (RETROINFER_PYTHON=OFF): Python tests skipped"
fi
