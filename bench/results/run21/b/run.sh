#!/usr/bin/env bash
# Run 21 call 2: phase stamps of the retro step at 128K batch 1 / 4 (read flush): the default, the cluster
# selection, and run 9's path with the bins kernel forming the scores (RETROINFER_DECODE=run9est: the same
# score grid without formation as under the cluster selection).
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r21b; rm -rf $W; mkdir -p $W
for v in 0 1; do
  RETROINFER_SELECT_CL=$v bin/kernel_bench --only retro --lengths 131072 --batches 1,4 --reps 20 --stages 1 --flush read --out $W/cl${v}.jsonl 2>>$W/kb.err; ts "cl$v rc=$?"
done
RETROINFER_DECODE=run9est bin/kernel_bench --only retro --lengths 131072 --batches 1,4 --reps 20 --stages 1 --flush read --out $W/run9est.jsonl 2>>$W/kb.err; ts "run9est rc=$?"
python3 scripts/retro_phase_summary.py $W/cl0.jsonl $W/cl1.jsonl $W/run9est.jsonl
for f in $W/*.jsonl; do echo "== $f"; grep -h '"retro_phases"' $f | python3 -c "
import json,sys
for l in sys.stdin:
    d=json.loads(l); print(d['batch'], ' '.join(f'{k}={v*1e3:.2f}' for k,v in d['phases_ms'].items() if k.startswith('select') or k.startswith('score')))"; done
cp $W/* $OUT/
