#!/usr/bin/env bash
# Runs the main job's prompt through every attention method and keeps each run's JSON summary (answer
# text, KV read share, speeds) in OUT_DIR (default bench/results/cpu-smollm2). Assumes scripts/main_job.sh ran once
# (dependencies installed, build/cpu-release built).
#   scripts/main_job_compare.sh [OUT_DIR] [METHODS]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/cpu-smollm2}
methods=${2:-full retro quest streaming oracle}
mkdir -p "$out"
scripts/make_long_prompt.sh /tmp/retroinfer_main_job_prompt.txt 3000 60
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
for m in $methods; do
  build/cpu-release/bin/retroinfer generate --model smollm2 --prompt-file /tmp/retroinfer_main_job_prompt.txt \
    --chat --attention "$m" --max-new-tokens 16 --json "$out/main_job_$m.json" >/dev/null
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(f\"{d['attention']:10s} answer={d['text']!r:28s} kv_read={100*d['kv_read_share']:.2f}% decode={d['decode_tok_s']:.1f} tok/s\")" "$out/main_job_$m.json"
done
