#!/usr/bin/env bash
# Run 23 call 12: after the review's tidy-up (a shared score test launcher, variant predicates in kernels.h): all
# GPU tests (no model staged), and 128K batch 1 / 4 / 16 (read flush), bf16 and int8, to confirm the figures.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r23j; rm -rf $W; mkdir -p $W
timeout 300 bin/gpu_tests > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]|tests ran" $W/gpu_tests.log | head
grep -B3 -A12 "FAILED  \]\|Failure" $W/gpu_tests.log | head -100 > $W/failures.log
for fmt in bf16 int8; do
  RETROINFER_SCORE_CENTROIDS=$fmt bin/kernel_bench --only full,retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kb_${fmt}.jsonl 2>>$W/kb.err; ts "kb $fmt"
done
grep -h '"retro_graph"\|"method":"full"' $W/kb_*.jsonl | cut -c1-105
gzip $W/gpu_tests.log; tar czf $OUT/r23j.tgz -C $W .
