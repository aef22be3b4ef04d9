#!/usr/bin/env bash
# Run 18 call 2: run10s (the selection forms the scores; no cooperative score grid) alone, with the exact grid at 2
# CTAs per multiprocessor, and under head waves (which a plain score grid may let overlap the selections).
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/ab2; rm -rf $W; mkdir -p $W
timeout 240 bin/gpu_tests --gtest_filter='CudaHeadWaves.*' > $W/tests.log 2>&1; ts "tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $W/tests.log | head -30
kb() {  # name, paths, extra args, env...
  local name=$1 paths=$2 extra=$3; shift 3
  env "$@" timeout 120 bin/kernel_bench --only retro --lengths 32768,131072 --batches 1,4,16 --reps 30 --stages 1 \
    --paths $paths $extra --out $W/$name.jsonl 2>$W/$name.err; ts "$name rc=$?"
}
kb base run10c,run10s "" RETROINFER_HEAD_WAVES=1
kb baseR run10c,run10s "--flush read" RETROINFER_HEAD_WAVES=1
kb e2 run10c,run10s "" RETROINFER_EXACT_CTAS_PER_SM=2
kb e2R run10c,run10s "--flush read" RETROINFER_EXACT_CTAS_PER_SM=2
kb w2 run10s "" RETROINFER_HEAD_WAVES=2
kb w2hi run10s "" RETROINFER_HEAD_WAVES=2 RETROINFER_WAVE_PRIORITY=high
kb w4hi run10s "" RETROINFER_HEAD_WAVES=4 RETROINFER_WAVE_PRIORITY=high
kb w2hi5 run10s "" RETROINFER_HEAD_WAVES=2 RETROINFER_WAVE_PRIORITY=high RETROINFER_SCORE_CTAS_PER_SM=5
kb w2hie2 run10s "" RETROINFER_HEAD_WAVES=2 RETROINFER_WAVE_PRIORITY=high RETROINFER_EXACT_CTAS_PER_SM=2
for f in $W/*.run10*.jsonl; do python3 scripts/retro_phase_summary.py $f | sed "s|^|$(basename $f .jsonl) |" | cut -c1-300; done > $W/summary.txt
awk '{print $1, $3, $4, $5}' $W/summary.txt
cp $W/summary.txt $OUT/
cd $W && tar czf $OUT/ab2.tgz *
