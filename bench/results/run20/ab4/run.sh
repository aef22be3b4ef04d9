#!/usr/bin/env bash
# Run 20 call 9: split64u at 1 / 2 / 3 stages per warp (4 / 3 / 2 CTAs per multiprocessor: 16 / 12 / 8 warps),
# against split64r, 128K batch 1 / 4 / 16 (read flush, phase stamps) and batch 4 (write); the exact-grid suite at
# the default (1 stage).
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/ab4; rm -rf $W; mkdir -p $W
timeout 240 bin/gpu_tests --gtest_filter='CudaExactGrid*' > $W/exact_tests.log 2>&1; ts "exact tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $W/exact_tests.log | head -20
grep -E "split64u" $W/exact_tests.log | cut -c1-200 | head -14
grep -B3 -A12 "Failure" $W/exact_tests.log | head -40
RETROINFER_EXACT=split64r bin/kernel_bench --only full,retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/r_read.jsonl 2>>$W/kb.err; ts "r"
for st in 1 2 3; do
  RETROINFER_EXACT=split64u RETROINFER_UNIFIED_STAGES=$st bin/kernel_bench --only retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/u${st}_read.jsonl 2>>$W/kb.err; ts "u$st"
done
RETROINFER_EXACT=split64u RETROINFER_UNIFIED_STAGES=1 bin/kernel_bench --only retro --lengths 131072 --batches 4 --reps 20 --stages 1 --out $W/u1_write.jsonl 2>>$W/kb.err; ts "u1 write"
python3 scripts/retro_phase_summary.py $W/r_read.jsonl $W/u1_read.jsonl $W/u2_read.jsonl $W/u3_read.jsonl $W/u1_write.jsonl > $W/summary.txt 2>&1
cut -c1-300 $W/summary.txt | head -40
grep -h '"retro_graph"\|"method":"full"' $W/*.jsonl | cut -c1-100
cd $W && tar czf $OUT/ab4.tgz *
