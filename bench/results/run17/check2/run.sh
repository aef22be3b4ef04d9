#!/usr/bin/env bash
# Run 17 check 2: main after the last clean-up (shared merge pieces, test helpers): all GPU tests (SmolLM2 when
# /tmp/models holds it), memcheck of the exact-grid and selection variant tests, the 128K kernel case.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
RETROINFER_MODEL_DIR=/tmp/models bin/gpu_tests > $OUT/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]" $OUT/gpu_tests.log | head
timeout 150 compute-sanitizer --tool memcheck bin/gpu_tests --gtest_filter='CudaExactGrid.VariantsMatchV1:CudaSelectSplit.MatchesDefaultAndCpuRule' > $OUT/memcheck.log 2>&1; ts "memcheck rc=$?"; tail -2 $OUT/memcheck.log
bin/kernel_bench --only full,retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --out $OUT/kb.jsonl 2>/dev/null; ts kb
python3 scripts/retro_phase_summary.py $OUT/kb.jsonl | cut -c1-120
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]|tests ran|greedy" $OUT/gpu_tests.log > $OUT/gpu_tests_summary.log
rm -f $OUT/gpu_tests.log
