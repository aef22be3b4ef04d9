#!/usr/bin/env bash
# Run 22 call 6 (experiment): the int8 score loops with each warp's tiles in a rotated order ((3 h + CTA) mod
# the warp's tiles), against bf16 (unrotated), 128K batch 1 / 4 / 16, read flush.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
for fmt in bf16 int8; do
  RETROINFER_SCORE_CENTROIDS=$fmt bin/kernel_bench --only retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $OUT/kb_${fmt}.jsonl 2>>$OUT/kb.err
done
python3 - <<'PY'
import json, glob, os
for f in sorted(glob.glob(os.environ["OUT"] + "/kb_*.jsonl")):
    for l in open(f):
        d = json.loads(l)
        if d["method"] == "retro_graph": g = d["ms"] * 1e3
        if d["method"] == "retro_phases":
            ph = {k: round(v * 1e3, 1) for k, v in d["phases_ms"].items() if k.startswith("score")}
            print(os.path.basename(f), d["batch"], "graph", round(g, 1), ph)
PY
