#!/usr/bin/env bash
# Run 18 call 5: run10s (the selection forms the scores, now from one 16-byte load per query head and 4 items)
# against the default run10c: the run 10 suite (run10s bit-identical to run10c), then the retro step per flush
# and at 512K / 1M (> 40K clusters: the cluster selection forms its own scores).
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/ab5; rm -rf $W; mkdir -p $W
timeout 200 bin/gpu_tests --gtest_filter='CudaDecodeRun10.*:CudaSelect*' > $W/tests.log 2>&1; ts "tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $W/tests.log | head -20
kb() {  # name, extra args
  local name=$1; shift
  timeout 150 bin/kernel_bench --only retro --reps 30 --stages 1 --paths run10c,run10s "$@" --out $W/$name.jsonl 2>$W/$name.err; ts "$name rc=$?"
}
kb w --lengths 32768,131072 --batches 1,4,16
kb r --lengths 32768,131072 --batches 1,4,16 --flush read
kb w2 --lengths 32768,131072 --batches 1,4,16
kb long --lengths 524288,1048576 --batches 1,4
for f in $W/*.run10*.jsonl; do python3 scripts/retro_phase_summary.py $f | sed "s|^|$(basename $f .jsonl) |" | cut -c1-500; done > $W/summary.txt
awk '{print $1, $3, $4, $5}' $W/summary.txt
grep "n=131072 b=4" $W/summary.txt | cut -c1-330
cp $W/summary.txt $OUT/
cd $W && tar czf $OUT/ab5.tgz *
