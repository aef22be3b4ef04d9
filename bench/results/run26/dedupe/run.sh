#!/usr/bin/env bash
# Run 26 call 20: after kmeans_assign.cu took async_copy.cuh's cp_async4_zfill instead of its own copy:
# the k-means, parity, memory and joined tests, and the 32K / 128K k-means build.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=$OUT
timeout 200 bin/gpu_tests --gtest_filter='CudaKMeans*:CudaWaveParity*:CudaRetroMemory*:CudaJoined*:CudaRetro*:CudaWave*' > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran|kmeans parity\] q8|wave parity\] retro" $W/gpu_tests.log | cut -c1-220 > $W/gpu_tests_summary.log; cat $W/gpu_tests_summary.log
grep -B3 -A12 "Failure" $W/gpu_tests.log | head -40
timeout 100 bin/kernel_bench --only kmeans --lengths 32768,131072 --batches 1 --kmeans-builds 7 --out $W/kmeans.jsonl > /dev/null 2>>$W/kb.err; ts "kb rc=$?"
grep -h '"method":"kmeans"' $W/kmeans.jsonl | cut -c1-120
