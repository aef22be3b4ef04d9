#!/usr/bin/env bash
# Run 23 call 1: CTA-wide score stages (RETROINFER_SCORE=wide) against the per-warp tma stages: the score
# tests, then 128K batch 1 / 4 / 16 (read flush) with bf16 and int8 centroids under both, 1M batch 1, then the
# whole GPU suite under wide.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r23a; rm -rf $W; mkdir -p $W
timeout 200 bin/gpu_tests --gtest_filter='CudaScoreStream*:CudaScoreQ8*' > $W/score_tests.log 2>&1; ts "score tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|\[score (stream|q8)\] kernel" $W/score_tests.log | cut -c1-260 | head -40
bin/kernel_bench --only full --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kb_full.jsonl 2>>$W/kb.err; ts "kb full"
for v in tma wide; do for fmt in bf16 int8; do
  RETROINFER_SCORE=$v RETROINFER_SCORE_CENTROIDS=$fmt bin/kernel_bench --only retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kb_${v}_${fmt}.jsonl 2>>$W/kb.err; ts "kb $v $fmt"
done; done
for v in tma wide; do
  RETROINFER_SCORE=$v RETROINFER_SCORE_CENTROIDS=int8 bin/kernel_bench --only retro --lengths 1048576 --batches 1 --reps 20 --stages 1 --flush read --out $W/kb_long_${v}.jsonl 2>>$W/kb.err; ts "kb long $v"
done
python3 scripts/retro_phase_summary.py $W/kb_tma_bf16.jsonl $W/kb_wide_bf16.jsonl $W/kb_tma_int8.jsonl $W/kb_wide_int8.jsonl | cut -c1-220
grep -h '"retro_graph"\|"method":"full"' $W/kb_*.jsonl | cut -c1-140
cp $W/*.jsonl $OUT/; gzip -c $W/score_tests.log > $OUT/score_tests.log.gz; cp $W/kb.err $OUT/
RETROINFER_SCORE=wide timeout 240 bin/gpu_tests > $W/gpu_tests.log 2>&1; ts "gpu_tests (wide) rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran" $W/gpu_tests.log | cut -c1-300 | head -30
grep -B3 -A12 "FAILED  \]\|Failure" $W/gpu_tests.log | head -150 > $OUT/failures.log
gzip -c $W/gpu_tests.log > $OUT/gpu_tests.log.gz
