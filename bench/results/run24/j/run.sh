#!/usr/bin/env bash
# Run 24 call 10: as call 9 with per-warp key ranges (no atomics): the bins selection binning with the range
# (RETROINFER_SELECT_RANGE=formation, new default) against finding it itself (=select). Selection / decode / score
# / memory tests; 128K batch 1 / 4 / 16 (read flush), int8 and bf16, both ways; the stack of 4.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r24j; rm -rf $W; mkdir -p $W
timeout 300 bin/gpu_tests --gtest_filter='CudaSelect*:CudaDecode*:CudaScore*:CudaRetro*:CudaWave*:WaveBuffer*' > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $W/gpu_tests.log | head
grep -B3 -A12 "FAILED  \]\|Failure" $W/gpu_tests.log | head -60 > $W/failures.log
grep "select compact\] range" $W/gpu_tests.log
for fmt in int8 bf16; do
  for rg in select formation; do
    RETROINFER_SELECT_RANGE=$rg RETROINFER_SCORE_CENTROIDS=$fmt bin/kernel_bench --only retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kb_${fmt}_${rg}.jsonl 2>>$W/kb.err; ts "kb $fmt $rg"
    RETROINFER_SELECT_RANGE=$rg RETROINFER_SCORE_CENTROIDS=$fmt bin/kernel_bench --only full,retro --lengths 131072 --batches 4 --reps 20 --flush read --stack 4 --out $W/kb_stack_${fmt}_${rg}.jsonl > /dev/null 2>>$W/kb.err; ts "kb stack $fmt $rg"
  done
done
for f in $W/kb_*.jsonl; do grep -h '"retro_phases"' $f | python3 -c "
import sys, json
for l in sys.stdin:
    d = json.loads(l); p = d['phases_ms']
    print('$(basename $f)', d['batch'], ' '.join('%s=%.2f' % (k, p[k]*1e3) for k in ['score_barrier_last','score_end','select_start','select_scores','select_histogram','select_head_total','select_end','merge_end'] if k in p))"; done
for f in $W/kb_*.jsonl; do echo "$(basename $f): $(grep -h '"retro_graph"\|_stack' $f | python3 -c "
import sys, json
print('; '.join('%s b%s %.1f' % (d['method'], d['batch'], d['ms']*1e3) for d in map(json.loads, sys.stdin)))")"; done
tar czf $OUT/r24j.tgz -C $W .
