#!/usr/bin/env bash
# Run 24 call 5 (diagnostic): where the score grid's first ~9 us go. New stamps inside the score CTAs (latest CTA
# past the issue of its first stages; earliest / latest with the query fragments formed), and the query
# fragments formed before the stages are issued (RETROINFER_SCORE_QFIRST=1) against after (default). 128K batch
# 1 / 4 / 16, read flush, bf16 and int8 scoring.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r24e; rm -rf $W; mkdir -p $W
timeout 200 bin/gpu_tests --gtest_filter='CudaScore*:CudaDecodeRun10*' > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $W/gpu_tests.log | head
for fmt in bf16 int8; do
  for qf in 0 1; do
    RETROINFER_SCORE_QFIRST=$qf RETROINFER_SCORE_CENTROIDS=$fmt bin/kernel_bench --only retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kb_${fmt}_q${qf}.jsonl 2>>$W/kb.err; ts "kb $fmt q$qf"
  done
done
for f in $W/kb_*.jsonl; do grep -h '"retro_phases"' $f | python3 -c "
import sys, json
for l in sys.stdin:
    d = json.loads(l); p = d['phases_ms']
    print('$(basename $f)', d['batch'], ' '.join('%s=%.2f' % (k.replace('score_',''), p[k]*1e3) for k in ['score_start_last','score_issued_last','score_q_first','score_q_last','score_first_tile_first','score_first_tile_last','score_loop_end_first','score_loop_end_last','score_end','merge_end'] if k in p))"; done
grep -h '"retro_graph"' $W/kb_*.jsonl | cut -c40-100
tar czf $OUT/r24e.tgz -C $W .
