#!/usr/bin/env bash
# Run 18 call 12: the score formation's grid barrier done by the kernel itself, launched without the cooperative
# attribute (the default in this build) against the cooperative launch (RETROINFER_SCORE_BARRIER=coop): the
# decode suites, memcheck of the run 10 suite, the retro step per flush (two repeats each).
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/ab12; rm -rf $W; mkdir -p $W
timeout 250 bin/gpu_tests --gtest_filter='CudaDecode*:CudaScoreStream.*:CudaRetro*:CudaExactGrid.*:WaveBuffer*:CudaWave*' > $W/tests.log 2>&1; ts "tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $W/tests.log | head -20
timeout 120 compute-sanitizer --tool memcheck bin/gpu_tests --gtest_filter='CudaDecodeRun10.MatchesRun9' > $W/memcheck.log 2>&1; ts "memcheck rc=$?"; tail -2 $W/memcheck.log
kb() {  # name, extra args, env...
  local name=$1 extra=$2; shift 2
  env "$@" timeout 150 bin/kernel_bench --only retro --lengths 32768,131072 --batches 1,4,16 --reps 30 --stages 1 \
    $extra --out $W/$name.jsonl 2>$W/$name.err; ts "$name rc=$?"
}
kb ownR "--flush read"
kb coopR "--flush read" RETROINFER_SCORE_BARRIER=coop
kb own "" 
kb coop "" RETROINFER_SCORE_BARRIER=coop
kb ownR2 "--flush read"
kb coopR2 "--flush read" RETROINFER_SCORE_BARRIER=coop
for f in ownR coopR own coop ownR2 coopR2; do python3 scripts/retro_phase_summary.py $W/$f.jsonl | sed "s|^|$f |" | cut -c1-500; done > $W/summary.txt
awk '{print $1, $3, $4, $5}' $W/summary.txt
grep "n=131072 b=4" $W/summary.txt | cut -c1-400
cp $W/summary.txt $OUT/
cd $W && tar czf $OUT/ab12.tgz *
