#!/usr/bin/env bash
# Run 17 check 1: main after the merges, the tmadyn revert and the clean-up (TensorMapCache, item_tokens):
# all GPU tests (SmolLM2 skipped: not staged), memcheck / racecheck of the new selection and exact-grid tests.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
bin/gpu_tests > $OUT/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran" $OUT/gpu_tests.log | head -20
timeout 200 compute-sanitizer --tool memcheck bin/gpu_tests --gtest_filter='CudaSelectSplit.MatchesDefaultAndCpuRule:CudaSelectCompact.*' > $OUT/memcheck_split.log 2>&1; ts "memcheck split rc=$?"
tail -3 $OUT/memcheck_split.log
timeout 200 compute-sanitizer --tool memcheck bin/gpu_tests --gtest_filter='CudaExactGrid.VariantsMatchV1:CudaExactGrid.Run17*' > $OUT/memcheck_exact.log 2>&1; ts "memcheck exact rc=$?"
tail -3 $OUT/memcheck_exact.log
timeout 120 compute-sanitizer --tool racecheck bin/gpu_tests --gtest_filter='CudaExactGrid.VariantsMatchV1' > $OUT/racecheck_exact.log 2>&1; ts "racecheck exact rc=$?"
tail -3 $OUT/racecheck_exact.log
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran|^\[[a-z ]+\]" $OUT/gpu_tests.log > $OUT/gpu_tests_summary.log
rm -f $OUT/gpu_tests.log
