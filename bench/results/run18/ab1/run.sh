#!/usr/bin/env bash
# Run 18 call 1: head waves (RETROINFER_HEAD_WAVES): their GPU tests, then the retro step under W = 1 / 2 / 4 / 8
# and the knobs (wave stream priority, score CTAs per multiprocessor), one kernel_bench process per setting.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/ab1; rm -rf $W; mkdir -p $W
timeout 240 bin/gpu_tests --gtest_filter='CudaHeadWaves.*:CudaDecodeRun10.*' > $W/tests.log 2>&1; ts "tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|head waves\]" $W/tests.log | head -30
kb() {  # name, env...
  local name=$1; shift
  env "$@" timeout 120 bin/kernel_bench --only retro --lengths 32768,131072 --batches 1,4,16 --reps 30 --stages 1 \
    --out $W/$name.jsonl 2>$W/$name.err; ts "$name rc=$?"
}
kb w1 RETROINFER_HEAD_WAVES=1
kb w2 RETROINFER_HEAD_WAVES=2
kb w4 RETROINFER_HEAD_WAVES=4
kb w4hi RETROINFER_HEAD_WAVES=4 RETROINFER_WAVE_PRIORITY=high
kb w4hi5 RETROINFER_HEAD_WAVES=4 RETROINFER_WAVE_PRIORITY=high RETROINFER_SCORE_CTAS_PER_SM=5
kb w2hi RETROINFER_HEAD_WAVES=2 RETROINFER_WAVE_PRIORITY=high
kb w8hi RETROINFER_HEAD_WAVES=8 RETROINFER_WAVE_PRIORITY=high
kb w4lay RETROINFER_HEAD_WAVES=4 RETROINFER_WAVE_SPLITS=layer
for f in w1 w2 w4 w4hi w4hi5 w2hi w8hi w4lay; do python3 scripts/retro_phase_summary.py $W/$f.jsonl | sed "s/^/$f /" | cut -c1-200; done > $W/summary.txt
cat $W/summary.txt | awk '{print $1, $3, $4, $5}'
cp $W/summary.txt $OUT/
cd $W && tar czf $OUT/ab1.tgz *
