#!/usr/bin/env bash
# Run 22 call 4: the score tests after their shared helpers moved to gpu_test_util.h (no kernel change).
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
timeout 200 bin/gpu_tests --gtest_filter='CudaScore*:CudaRetro.*' > $OUT/score_tests.log 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]" $OUT/score_tests.log
