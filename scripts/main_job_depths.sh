#!/usr/bin/env bash
# The main-job question with the fact at several depths: full attention and retro with the outlier zone
# on (0.1%) and off. One JSON line per run in OUT (default bench/results/cpu-smollm2/main_job_depths.jsonl).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/cpu-smollm2/main_job_depths.jsonl}
: > "$out"
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
tmp=$(mktemp -d)
for depth in 10 25 40 60 80; do
  scripts/make_long_prompt.sh "$tmp/p.txt" 3000 "$depth" 2>/dev/null
  for run in "full 0.001" "retro 0.001" "retro 0"; do
    set -- $run
    build/cpu-release/bin/retroinfer generate --model smollm2 --prompt-file "$tmp/p.txt" --chat --attention "$1" \
      --outlier-fraction "$2" --max-new-tokens 12 --json "$tmp/r.json" >/dev/null 2>&1
    python3 - "$tmp/r.json" "$depth" "$1" "$2" >> "$out" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["depth_percent"] = int(sys.argv[2])
d["outlier_fraction"] = float(sys.argv[4]) if sys.argv[3] == "retro" else None
d["correct"] = "4817" in d["text"]
print(json.dumps(d))
PY
  done
done
rm -rf "$tmp"
