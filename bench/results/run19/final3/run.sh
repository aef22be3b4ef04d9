#!/usr/bin/env bash
# Run 19 final 3: the selection test suites after CudaSelectSplit took the shared case table (test change only).
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
timeout 300 bin/gpu_tests --gtest_filter='CudaSelect*' > /tmp/sel.log 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran" /tmp/sel.log | tee $OUT/select_tests_summary.log
grep -E "\[select split\]" /tmp/sel.log | cut -c1-200 >> $OUT/select_tests_summary.log
grep -B2 -A10 "Failure" /tmp/sel.log | head -40
