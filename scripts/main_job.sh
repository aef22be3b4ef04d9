#!/usr/bin/env bash
# The main job on a fresh machine: install, build, then ask SmolLM2-135M-Instruct about a fact planted
# deep inside a long public-domain prompt, decoding with the wave index (--attention retro). Runs on the
# GPU (cuda-release build, --device auto) when an NVIDIA GPU and nvcc are present, else on the CPU.
#   bash scripts/main_job.sh [--attention METHOD] [--words N] [--depth PERCENT]
set -euo pipefail
cd "$(dirname "$0")/.."
attention=retro
words=3000   # ~4K tokens with SmolLM2's tokenizer
depth=60
while (( $# )); do
  case "$1" in
    --attention) attention=$2; shift 2 ;;
    --words) words=$2; shift 2 ;;
    --depth) depth=$2; shift 2 ;;
    *) echo "main_job: unknown option $1" >&2; exit 2 ;;
  esac
done
scripts/setup.sh
preset=cpu-release
device=cpu
if command -v nvcc > /dev/null && command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then
  preset=cuda-release
  device=auto  # cuda when the device is usable, else the CPU
fi
[[ -f build/$preset/CMakeCache.txt ]] || cmake --preset $preset >/dev/null
cmake --build build/$preset -j"$(nproc)" --target retroinfer_cli
mkdir -p out
scripts/make_long_prompt.sh out/long_prompt.txt "$words" "$depth"
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
build/$preset/bin/retroinfer generate --model smollm2 --prompt-file out/long_prompt.txt --chat \
  --device "$device" --attention "$attention" --max-new-tokens 16 --json out/main_job_summary.json
echo "main_job: expected answer 4817; summary in out/main_job_summary.json" >&2
