#!/usr/bin/env bash
# Run 21 call 3: the cluster selection with 16-byte logit loads and a two-level histogram merge: its GPU tests,
# then phase stamps at 128K batch 1 / 4 (read flush), switch off and on.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r21c; rm -rf $W; mkdir -p $W
timeout 200 bin/gpu_tests --gtest_filter='CudaSelectCl.*' > $W/cl_tests.log 2>&1; ts "cl tests rc=$?"
grep -E 'DIFFER|FAILED|Failure|NOT' $W/cl_tests.log | cut -c1-240 | head -20
tail -2 $W/cl_tests.log
for v in 0 1; do
  RETROINFER_SELECT_CL=$v bin/kernel_bench --only retro --lengths 131072 --batches 1,4 --reps 20 --stages 1 --flush read --out $W/cl${v}.jsonl 2>>$W/kb.err; ts "cl$v rc=$?"
done
python3 scripts/retro_phase_summary.py $W/cl0.jsonl $W/cl1.jsonl
for f in $W/cl1.jsonl; do echo "== $f"; grep -h '"retro_phases"' $f | python3 -c "
import json,sys
for l in sys.stdin:
    d=json.loads(l); print(d['batch'], ' '.join(f'{k}={v*1e3:.2f}' for k,v in d['phases_ms'].items() if k.startswith('select') or k.startswith('score')))"; done
cp $W/* $OUT/
