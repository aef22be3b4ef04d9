#!/usr/bin/env bash
# Run 18 call 3: the exact grid at 2 CTAs per multiprocessor for RetroLayer and WaveBufferLayer (exact_splits) and
# combine_states loading 8 states per warp round: every GPU test (SmolLM2 skipped: no model in this call),
# memcheck of the exact-grid and run 10 suites, and the retro step against the former rule (=3) per flush.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/ab3; rm -rf $W; mkdir -p $W
timeout 400 bin/gpu_tests > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran" $W/gpu_tests.log | head -20
kb() {  # name, extra args, env...
  local name=$1 extra=$2; shift 2
  env "$@" timeout 120 bin/kernel_bench --only full,retro --lengths 32768,131072 --batches 1,4,16 --reps 30 --stages 1 \
    $extra --out $W/$name.jsonl 2>$W/$name.err; ts "$name rc=$?"
}
kb c2 ""
kb c3 "" RETROINFER_EXACT_CTAS_PER_SM=3
kb c2R "--flush read"
kb c3R "--flush read" RETROINFER_EXACT_CTAS_PER_SM=3
timeout 150 compute-sanitizer --tool memcheck bin/gpu_tests --gtest_filter='CudaExactGrid.VariantsMatchV1:CudaDecodeRun10.MatchesRun9' > $W/memcheck.log 2>&1; ts "memcheck rc=$?"; tail -2 $W/memcheck.log
for f in c2 c3 c2R c3R; do python3 scripts/retro_phase_summary.py $W/$f.jsonl | sed "s|^|$f |" | cut -c1-400; done > $W/summary.txt
awk '{print $1, $3, $4, $5}' $W/summary.txt
grep -h '"full"' $W/c2.jsonl $W/c2R.jsonl | cut -c1-90
cp $W/summary.txt $OUT/
cd $W && tar czf $OUT/ab3.tgz --exclude=gpu_tests.log * && grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]" gpu_tests.log > $OUT/gpu_tests_summary.log
