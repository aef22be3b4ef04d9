#!/usr/bin/env bash
# Run 22 call 5 (diagnostic): when the score grid's tiles land at 128K batch 4 (read flush), cooperative grid
# (default path) against run 9's plain score launch, bf16 and int8 scoring.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
for path in default run9; do for fmt in bf16 int8; do
  if [ $path = default ]; then unset RETROINFER_DECODE; else export RETROINFER_DECODE=$path; fi
  RETROINFER_SCORE_CENTROIDS=$fmt bin/kernel_bench --only retro --lengths 131072 --batches 4 --reps 20 --stages 1 --flush read --out $OUT/kb_${path}_${fmt}.jsonl 2>>$OUT/kb.err
done; done
python3 - <<'PY'
import json, glob, os
for f in sorted(glob.glob(os.environ["OUT"] + "/kb_*.jsonl")):
    for l in open(f):
        d = json.loads(l)
        if d["method"] == "retro_graph": g = d["ms"] * 1e3
        if d["method"] == "retro_phases":
            ph = {k: round(v * 1e3, 1) for k, v in d["phases_ms"].items() if k.startswith("score") or k in ("select_end",)}
    print(os.path.basename(f), "graph", round(g, 1), ph)
PY
