#!/usr/bin/env bash
# Run 23 call 2: 4 CTA-wide stages for the int8 tiles (32 KiB per CTA, the bf16 stages' bytes). The score tests;
# 128K batch 1 / 4 / 16 (read flush): tma bf16 (the default so far), tma int8, wide int8, wide bf16; 1M batch 1;
# the 4-layer stack at 128K batch 4; then the whole GPU suite under wide + int8 (the candidate defaults).
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r23b; rm -rf $W; mkdir -p $W
timeout 200 bin/gpu_tests --gtest_filter='CudaScoreStream*:CudaScoreQ8*' > $W/score_tests.log 2>&1; ts "score tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $W/score_tests.log | head
bin/kernel_bench --only full --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kb_full.jsonl 2>>$W/kb.err; ts "kb full"
for c in tma:bf16 tma:int8 wide:int8 wide:bf16; do v=${c%%:*}; fmt=${c##*:}
  RETROINFER_SCORE=$v RETROINFER_SCORE_CENTROIDS=$fmt bin/kernel_bench --only retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kb_${v}_${fmt}.jsonl 2>>$W/kb.err; ts "kb $v $fmt"
done
for c in tma:bf16 wide:int8; do v=${c%%:*}; fmt=${c##*:}
  RETROINFER_SCORE=$v RETROINFER_SCORE_CENTROIDS=$fmt bin/kernel_bench --only retro --lengths 524288,1048576 --batches 1 --reps 20 --stages 1 --flush read --out $W/kb_long_${v}_${fmt}.jsonl 2>>$W/kb.err; ts "kb long $v $fmt"
done
RETROINFER_SCORE=wide RETROINFER_SCORE_CENTROIDS=int8 bin/kernel_bench --only full,retro --lengths 131072 --batches 4 --reps 20 --flush read --stack 4 --out $W/kb_stack_wide_int8.jsonl > $W/stack_stdout.txt 2>>$W/kb.err; ts "kb stack"
python3 scripts/retro_phase_summary.py $W/kb_tma_bf16.jsonl $W/kb_tma_int8.jsonl $W/kb_wide_int8.jsonl $W/kb_wide_bf16.jsonl $W/kb_long_*.jsonl | cut -c1-200
grep -h '"retro_graph"\|"method":"full"\|_stack' $W/kb_*.jsonl | cut -c1-130
RETROINFER_SCORE=wide RETROINFER_SCORE_CENTROIDS=int8 timeout 260 bin/gpu_tests > $W/gpu_tests.log 2>&1; ts "gpu_tests (wide, int8) rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran|cuda_joined\]|cuda_placement prefill\]" $W/gpu_tests.log | cut -c1-300 | head -30
grep -B3 -A12 "FAILED  \]\|Failure" $W/gpu_tests.log | head -150 > $W/failures.log
tar czf $OUT/r23b.tgz -C $W .
