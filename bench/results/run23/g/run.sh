#!/usr/bin/env bash
# Run 23 call 9: each lane's query line prefetched into L1 as the score kernel's first request
# (RETROINFER_SCORE_QPREFETCH=1) against none (=0): 128K batch 1 / 4 / 16 (read flush), bf16 and int8, and the
# 4-layer stack at 128K batch 4 with int8; the score tests.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r23g; rm -rf $W; mkdir -p $W
timeout 200 bin/gpu_tests --gtest_filter='CudaScoreStream*:CudaScoreQ8*' > $W/score_tests.log 2>&1; ts "score tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $W/score_tests.log | head
bin/kernel_bench --only full --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kb_full.jsonl 2>>$W/kb.err
for rep in a b; do for fmt in bf16 int8; do for pf in 1 0; do
  RETROINFER_SCORE_QPREFETCH=$pf RETROINFER_SCORE_CENTROIDS=$fmt bin/kernel_bench --only retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kb_${fmt}_pf${pf}_$rep.jsonl 2>>$W/kb.err; ts "kb $fmt pf=$pf $rep"
done; done; done
for pf in 1 0; do
  RETROINFER_SCORE_QPREFETCH=$pf RETROINFER_SCORE_CENTROIDS=int8 bin/kernel_bench --only retro --lengths 131072 --batches 4 --reps 20 --flush read --stack 4 --out $W/kb_stack_int8_pf$pf.jsonl > /dev/null 2>>$W/kb.err; ts "stack pf=$pf"
done
python3 scripts/retro_phase_summary.py $W/kb_*_a.jsonl $W/kb_*_b.jsonl | cut -c1-150
grep -h '_stack' $W/kb_stack_*.jsonl | cut -c1-110
tar czf $OUT/r23g.tgz -C $W .
