#!/usr/bin/env bash
# Run 20 call 1: the flag-chained grids (RETROINFER_EXACT=split64f): their tests and the exact-grid / selection / decode
# suites, the retro step under split64r (the default) and split64f at 128K batch 1 / 4 / 16 (read flush, phase stamps),
# 128K batch 4 and 32K batch 4 (write flush), then the other GPU tests (no SmolLM2 in this call).
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/ab1; rm -rf $W; mkdir -p $W
timeout 150 bin/gpu_tests --gtest_filter='CudaExactGrid.FlagChainedGrids' > $W/flag_tests.log 2>&1; ts "flag tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|\[exact grid\]" $W/flag_tests.log | cut -c1-260
grep -B2 -A10 "Failure" $W/flag_tests.log | head -40
for v in split64r split64f; do
  RETROINFER_EXACT=$v bin/kernel_bench --only full,retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/${v}_read.jsonl 2>>$W/kb.err; ts "kb $v read"
  RETROINFER_EXACT=$v bin/kernel_bench --only retro --lengths 32768,131072 --batches 4 --reps 20 --stages 1 --out $W/${v}_write.jsonl 2>>$W/kb.err; ts "kb $v write"
done
python3 scripts/retro_phase_summary.py $W/split64r_read.jsonl $W/split64f_read.jsonl $W/split64r_write.jsonl $W/split64f_write.jsonl > $W/summary.txt 2>&1
cut -c1-300 $W/summary.txt | head -80
grep -h '"retro_graph"\|"method":"full"' $W/*.jsonl | cut -c1-110
cd $W && tar czf $OUT/ab1.tgz *; cd $S
timeout 240 bin/gpu_tests --gtest_filter='CudaExactGrid*:CudaSelect*:CudaDecode*:CudaRetro*' > $W/suites.log 2>&1; ts "suites rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran" $W/suites.log | head -60 | tee $OUT/suites_summary.log
grep -B2 -A10 "Failure" $W/suites.log | head -40
cp $W/suites.log $OUT/ 2>/dev/null
