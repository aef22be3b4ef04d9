#!/usr/bin/env bash
# Run 23 call 11: the int8 score tests with two more wide-stage cases (G 8 and G 1).
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
timeout 200 bin/gpu_tests --gtest_filter='CudaScoreQ8*:CudaScoreStream*' > $OUT/score_tests.log 2>&1; echo "score tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|\[score q8\] kernel" $OUT/score_tests.log | cut -c1-200
