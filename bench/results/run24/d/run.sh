#!/usr/bin/env bash
# Run 24 call 4: flat expansion + a load per 2 MiB page of the head's members, offsets and list at the selection's start
# (=items), and the ready scores copied by cp.async (one L2 round trip). Selection / decode tests; 128K batch 1 /
# 4 / 16 (read flush) under both expansions, bf16 and int8 scoring; phase stamps.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r24d; rm -rf $W; mkdir -p $W
timeout 240 bin/gpu_tests --gtest_filter='CudaSelect*:CudaDecodeRun10*' > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]|tests ran" $W/gpu_tests.log | head
grep -B3 -A12 "FAILED  \]\|Failure" $W/gpu_tests.log | head -60 > $W/failures.log
grep "select expand" $W/gpu_tests.log | grep -v "identical; CPU rule and expansion ok" | head -5
for fmt in bf16 int8; do
  for ex in items flat; do
    RETROINFER_SELECT_EXPAND=$ex RETROINFER_SCORE_CENTROIDS=$fmt bin/kernel_bench --only retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kb_${fmt}_${ex}.jsonl 2>>$W/kb.err; ts "kb $fmt $ex"
  done
done
python3 scripts/retro_phase_summary.py $W/kb_*.jsonl | cut -c1-200
for f in $W/kb_*.jsonl; do echo $f; grep -h '"retro_phases"' $f | python3 -c "
import sys, json
for l in sys.stdin:
    d = json.loads(l); p = d['phases_ms']
    print(d['batch'], ' '.join('%s=%.2f' % (k[7:], p[k]*1e3) for k in p if k.startswith('select_')))"; done
grep -h '"retro_graph"' $W/kb_*.jsonl | cut -c1-105
tar czf $OUT/r24d.tgz -C $W .
