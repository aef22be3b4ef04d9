#!/usr/bin/env bash
# Run 18 call 4: the score formation's barrier per head (ScoreParams::head_barrier, the default) against the grid
# barrier (RETROINFER_SCORE_BARRIER=grid): all GPU tests (SmolLM2 skipped), memcheck of the run 10 suite, the
# retro step under both barriers per flush.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/ab4; rm -rf $W; mkdir -p $W
timeout 300 bin/gpu_tests > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $W/gpu_tests.log | head -20
kb() {  # name, extra args, env...
  local name=$1 extra=$2; shift 2
  env "$@" timeout 120 bin/kernel_bench --only full,retro --lengths 32768,131072 --batches 1,4,16 --reps 30 --stages 1 \
    $extra --out $W/$name.jsonl 2>$W/$name.err; ts "$name rc=$?"
}
kb head ""
kb grid "" RETROINFER_SCORE_BARRIER=grid
kb headR "--flush read"
kb gridR "--flush read" RETROINFER_SCORE_BARRIER=grid
kb head2 ""
kb grid2 "" RETROINFER_SCORE_BARRIER=grid
timeout 150 compute-sanitizer --tool memcheck bin/gpu_tests --gtest_filter='CudaDecodeRun10.MatchesRun9:CudaScoreStream.*' > $W/memcheck.log 2>&1; ts "memcheck rc=$?"; tail -2 $W/memcheck.log
for f in head grid headR gridR head2 grid2; do python3 scripts/retro_phase_summary.py $W/$f.jsonl | sed "s|^|$f |" | cut -c1-400; done > $W/summary.txt
awk '{print $1, $3, $4, $5}' $W/summary.txt
cp $W/summary.txt $OUT/
cd $W && tar czf $OUT/ab4.tgz --exclude=gpu_tests.log * && grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]" gpu_tests.log > $OUT/gpu_tests_summary.log
