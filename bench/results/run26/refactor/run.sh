#!/usr/bin/env bash
# Run 26 call 15: every GPU test (without the model file) on main after the kmeans_assign.cu refactor
# (write-out and launcher shared; PTX identical but whitespace), and the 32K k-means build once more.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=$OUT
timeout 300 bin/gpu_tests > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]|tests ran|kmeans q8\]|kmeans parity\]|wave parity\] retro" $W/gpu_tests.log | cut -c1-220 > $W/gpu_tests_summary.log; cat $W/gpu_tests_summary.log | head -30
grep -B3 -A12 "Failure" $W/gpu_tests.log | head -40
timeout 100 bin/kernel_bench --only kmeans --lengths 32768 --batches 1 --kmeans-phases 1 --kmeans-builds 7 --out $W/kmeans.jsonl > /dev/null 2>>$W/kb.err; ts "kb rc=$?"
grep -h '"method":"kmeans"' $W/kmeans.jsonl | cut -c1-200
