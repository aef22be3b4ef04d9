#!/usr/bin/env bash
# Run 17 A/B 1: the helpers' variants (score tmadyn, exact-grid split64r/i/ri/rh/rih/e/eri, selection split) with
# their GPU tests, one warm H200.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
bin/gpu_tests --gtest_filter='CudaScoreDyn*:CudaScoreStream*:CudaExactGrid*:CudaSelectSplit*:CudaSelectCompact*' > $OUT/tests.log 2>&1; ts "tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/tests.log | head -20
KB="bin/kernel_bench --only retro --reps 30 --stages 1"
$KB --lengths 32768,131072 --batches 1,4,16 --out $OUT/base.jsonl 2>>$OUT/kb.err; ts base
RETROINFER_SCORE=tmadyn $KB --lengths 32768,131072 --batches 1,4,16 --out $OUT/tmadyn.jsonl 2>>$OUT/kb.err; ts tmadyn
RETROINFER_SELECT_SPLIT=1 $KB --lengths 32768,131072 --batches 1,4,16 --out $OUT/split.jsonl 2>>$OUT/kb.err; ts split
$KB --lengths 131072 --batches 1,4,16 --paths run10+split64,run10+split64r,run10+split64i,run10+split64ri,run10+split64rh,run10+split64rih,run10+split64e,run10+split64eri --out $OUT/ex.jsonl 2>>$OUT/kb.err; ts exact
for x in split64ri split64rih; do
RETROINFER_SCORE=tmadyn RETROINFER_SELECT_SPLIT=1 RETROINFER_EXACT=$x $KB --lengths 32768,131072 --batches 1,4,16 --out $OUT/all_$x.jsonl 2>>$OUT/kb.err; ts "all $x"
done
RETROINFER_SCORE=tmadyn $KB --lengths 131072 --batches 4 --out $OUT/tmadyn_b.jsonl 2>>$OUT/kb.err; ts tmadyn2
$KB --lengths 131072 --batches 4 --out $OUT/base_b.jsonl 2>>$OUT/kb.err; ts base2
python3 scripts/retro_phase_summary.py $OUT/*.jsonl > $OUT/summary.txt
cut -c1-330 $OUT/summary.txt
cd $OUT && tar czf logs.tgz tests.log kb.err *+*.jsonl && rm -f tests.log kb.err *+*.jsonl
