#!/usr/bin/env bash
# Run 19 call 1: the grid selection (select_grid.cu, RETROINFER_SELECT_GRID): its tests, all GPU tests (no SmolLM2
# in this call), the retro step with the grid selection (default) against the one-CTA kernels (=0) per flush,
# 32K / 128K batch 1 / 4 / 16 and 512K / 1M, then memcheck of the grid tests' small cases.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/ab1; rm -rf $W; mkdir -p $W
timeout 240 bin/gpu_tests --gtest_filter='CudaSelectGrid*' > $W/grid_tests.log 2>&1; ts "grid tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|\[select grid\]" $W/grid_tests.log | cut -c1-220 | head -60
grep -B2 -A12 "Failure" $W/grid_tests.log | head -60
bin/kernel_bench --only full,retro --lengths 32768,131072 --batches 1,4,16 --reps 20 --stages 1 --out $W/g1_write.jsonl 2>$W/kb.err; ts kb1
RETROINFER_SELECT_GRID=0 bin/kernel_bench --only retro --lengths 32768,131072 --batches 1,4,16 --reps 20 --stages 1 --out $W/g0_write.jsonl 2>>$W/kb.err; ts kb0
bin/kernel_bench --only full,retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/g1_read.jsonl 2>>$W/kb.err; ts kb1r
RETROINFER_SELECT_GRID=0 bin/kernel_bench --only retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/g0_read.jsonl 2>>$W/kb.err; ts kb0r
python3 scripts/retro_phase_summary.py $W/g1_write.jsonl $W/g0_write.jsonl $W/g1_read.jsonl $W/g0_read.jsonl > $W/summary.txt 2>&1
cut -c1-400 $W/summary.txt
grep -h '"retro_graph"\|"method":"full"' $W/g*.jsonl | cut -c1-100
bin/kernel_bench --only retro --lengths 524288,1048576 --batches 1 --reps 10 --stages 1 --out $W/g1_long.jsonl 2>>$W/kb.err; ts long1
RETROINFER_SELECT_GRID=0 bin/kernel_bench --only retro --lengths 524288,1048576 --batches 1 --reps 10 --stages 1 --out $W/g0_long.jsonl 2>>$W/kb.err; ts long0
python3 scripts/retro_phase_summary.py $W/g1_long.jsonl $W/g0_long.jsonl > $W/summary_long.txt 2>&1; cut -c1-400 $W/summary_long.txt
cd $W && tar czf $OUT/ab1.tgz *; cd $S
timeout 120 compute-sanitizer --tool memcheck bin/gpu_tests --gtest_filter='CudaSelectGrid.Plan:CudaSelectGrid.MatchesBinsAndCpuRule' > $W/memcheck.log 2>&1; ts "memcheck rc=$?"
tail -4 $W/memcheck.log; cp $W/memcheck.log $OUT/ 2>/dev/null
timeout 200 bin/gpu_tests --gtest_filter='-CudaSelectGrid*' > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]|tests ran" $W/gpu_tests.log | head -20 | tee $OUT/gpu_tests_summary.log
