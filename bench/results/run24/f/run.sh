#!/usr/bin/env bash
# Run 24 call 6: int8 scoring with the head's query copied into shared memory by cp.async before the first
# stages are issued (RETROINFER_SCORE_QFIRST=2) against the default (fragments formed from global after the
# issue). Score / decode tests under it; 128K batch 1 / 4 / 16 and 1M batch 1, read flush; the stack of 4.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r24f; rm -rf $W; mkdir -p $W
RETROINFER_SCORE_QFIRST=2 RETROINFER_SCORE_CENTROIDS=int8 timeout 200 bin/gpu_tests --gtest_filter='CudaScore*:CudaDecodeRun10*:CudaRetro*:CudaDecodeGraph*' > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $W/gpu_tests.log | head
for qf in 0 2; do
  RETROINFER_SCORE_QFIRST=$qf RETROINFER_SCORE_CENTROIDS=int8 bin/kernel_bench --only retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kb_int8_q${qf}.jsonl 2>>$W/kb.err; ts "kb q$qf"
  RETROINFER_SCORE_QFIRST=$qf RETROINFER_SCORE_CENTROIDS=int8 bin/kernel_bench --only retro --lengths 1048576 --batches 1 --reps 20 --stages 1 --flush read --out $W/kb_long_int8_q${qf}.jsonl 2>>$W/kb.err; ts "kb long q$qf"
  RETROINFER_SCORE_QFIRST=$qf RETROINFER_SCORE_CENTROIDS=int8 bin/kernel_bench --only full,retro --lengths 131072 --batches 4 --reps 20 --flush read --stack 4 --out $W/kb_stack_int8_q${qf}.jsonl > /dev/null 2>>$W/kb.err; ts "kb stack q$qf"
done
for f in $W/kb_*int8_q*.jsonl; do grep -h '"retro_phases"' $f | python3 -c "
import sys, json
for l in sys.stdin:
    d = json.loads(l); p = d['phases_ms']
    print('$(basename $f)', d['n'], d['batch'], ' '.join('%s=%.2f' % (k.replace('score_',''), p[k]*1e3) for k in ['score_issued_last','score_q_first','score_q_last','score_first_tile_first','score_first_tile_last','score_loop_end_last','score_end','merge_end'] if k in p))"; done
grep -h '"retro_graph"\|_stack' $W/kb_*.jsonl | cut -c30-100
tar czf $OUT/r24f.tgz -C $W .
