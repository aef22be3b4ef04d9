#!/usr/bin/env bash
# Run 23 call 7: the int8 score path on integer tensor cores (s8 query hi / lo parts x u8 centroids). The score
# tests; 128K batch 1 / 4 / 16 (read flush): bf16 (default) and int8; 512K / 1M batch 1 int8; the 4-layer stack
# with int8; Nsight Compute on the int8 score grid at 128K batch 4; then the whole GPU suite under int8 scoring.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r23e; rm -rf $W; mkdir -p $W
timeout 200 bin/gpu_tests --gtest_filter='CudaScoreStream*:CudaScoreQ8*' > $W/score_tests.log 2>&1; ts "score tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|\[score q8\] (kernel|decode)" $W/score_tests.log | cut -c1-230 | head -30
bin/kernel_bench --only full,retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kb_default.jsonl 2>>$W/kb.err; ts "kb default"
RETROINFER_SCORE_CENTROIDS=int8 bin/kernel_bench --only retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kb_int8.jsonl 2>>$W/kb.err; ts "kb int8"
RETROINFER_SCORE_CENTROIDS=int8 bin/kernel_bench --only retro --lengths 524288,1048576 --batches 1 --reps 20 --stages 1 --flush read --out $W/kb_long_int8.jsonl 2>>$W/kb.err; ts "kb long int8"
RETROINFER_SCORE_CENTROIDS=int8 bin/kernel_bench --only full,retro --lengths 131072 --batches 4 --reps 20 --flush read --stack 4 --out $W/kb_stack_int8.jsonl > $W/stack_stdout.txt 2>>$W/kb.err; ts "kb stack int8"
python3 scripts/retro_phase_summary.py $W/kb_default.jsonl $W/kb_int8.jsonl $W/kb_long_int8.jsonl | cut -c1-240
grep -h '"retro_graph"\|"method":"full"\|_stack' $W/kb_*.jsonl | cut -c1-130
RETROINFER_SCORE_CENTROIDS=int8 timeout 200 ncu --clock-control none --import-source no --section SourceCounters --section WarpStateStats --section SpeedOfLight --section SchedulerStats -k regex:'score_stream_form' --launch-skip 2 -c 1 -o $W/sc_int8 bin/kernel_bench --only retro --lengths 131072 --batches 4 --reps 1 > $W/ncu_int8.log 2>&1; ts "ncu rc=$?"
ncu -i $W/sc_int8.ncu-rep --page source --csv --print-source sass > $W/src_int8.csv 2>>$W/ncu_int8.log
python3 scripts/ncu_sass_top.py $W/src_int8.csv 40 3 > $W/sass_top_int8.txt 2>>$W/ncu_int8.log
ncu -i $W/sc_int8.ncu-rep --page details > $W/details_int8.txt 2>>$W/ncu_int8.log
grep -E "Duration|DRAM Throughput|Warp Cycles Per Issued|No Eligible|Eligible Warps" $W/details_int8.txt | head
rm -f $W/*.ncu-rep
RETROINFER_SCORE_CENTROIDS=int8 timeout 240 bin/gpu_tests > $W/gpu_tests_int8.log 2>&1; ts "gpu_tests (int8) rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran" $W/gpu_tests_int8.log | head
grep -B3 -A12 "FAILED  \]\|Failure" $W/gpu_tests_int8.log | head -100 > $W/failures.log
tar czf $OUT/r23e.tgz -C $W .
