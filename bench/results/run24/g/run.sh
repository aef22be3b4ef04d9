#!/usr/bin/env bash
# Run 24 call 7: the query staged in shared memory by the score kernels (RETROINFER_SCORE_QUERY=smem, new default;
# bf16 centroids up to 4 query heads, int8 up to 8) against run 23's read from global. Score / decode / select
# tests; 128K batch 1 / 4 / 16 and 1M batch 1 with full (read flush), bf16 and int8, both ways; stack of 4.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r24g; rm -rf $W; mkdir -p $W
timeout 300 bin/gpu_tests --gtest_filter='CudaScore*:CudaDecode*:CudaRetro*:CudaSelect*:CudaExactGrid*' > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $W/gpu_tests.log | head
grep -B3 -A12 "FAILED  \]\|Failure" $W/gpu_tests.log | head -60 > $W/failures.log
grep "query switch" $W/gpu_tests.log
for fmt in bf16 int8; do
  for qm in global smem; do
    RETROINFER_SCORE_QUERY=$qm RETROINFER_SCORE_CENTROIDS=$fmt bin/kernel_bench --only full,retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kb_${fmt}_${qm}.jsonl 2>>$W/kb.err; ts "kb $fmt $qm"
    RETROINFER_SCORE_QUERY=$qm RETROINFER_SCORE_CENTROIDS=$fmt bin/kernel_bench --only retro --lengths 1048576 --batches 1 --reps 20 --stages 1 --flush read --out $W/kb_long_${fmt}_${qm}.jsonl 2>>$W/kb.err; ts "kb long $fmt $qm"
    RETROINFER_SCORE_QUERY=$qm RETROINFER_SCORE_CENTROIDS=$fmt bin/kernel_bench --only full,retro --lengths 131072 --batches 4 --reps 20 --flush read --stack 4 --out $W/kb_stack_${fmt}_${qm}.jsonl > /dev/null 2>>$W/kb.err; ts "kb stack $fmt $qm"
  done
done
python3 scripts/retro_phase_summary.py $W/kb_bf16_*.jsonl $W/kb_int8_*.jsonl $W/kb_long_*.jsonl | cut -c1-260
for f in $W/kb_*.jsonl; do echo "$(basename $f): $(grep -h '"retro_graph"\|_stack\|"method":"full"' $f | python3 -c "
import sys, json
print('; '.join('%s %s b%s %.1f' % (d['method'], d['n'], d['batch'], d['ms']*1e3) for d in map(json.loads, sys.stdin)))")"; done
tar czf $OUT/r24g.tgz -C $W .
