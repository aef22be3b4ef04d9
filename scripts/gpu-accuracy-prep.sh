#!/usr/bin/env bash
# Run HERE (a machine with bible-kjv and wamerican, scripts/setup.sh) before scripts/gpu-accuracy.sh: writes
# the task haystack, the word list and the ppl text as files into DIR (default out/gpu-accuracy/data, about
# 1.3 MB), the same texts `eval tasks` / `eval ppl` read by default, so the prompts (and their hashes) are
# those of a CPU run. Stage DIR as data/ beside gpu-accuracy.sh (or pass DATA_DIR=... there).
#   scripts/gpu-accuracy-prep.sh [DIR]      env: BIN (default build/cpu-release/bin/retroinfer)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-out/gpu-accuracy/data}
bin=${BIN:-build/cpu-release/bin/retroinfer}
[[ -x $bin ]] || bin=build/cuda-release/bin/retroinfer
"$bin" eval inputs --out "$dir"
ls -la "$dir"
