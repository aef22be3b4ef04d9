#!/usr/bin/env bash
# Run 20 call 2: split64b (the exact kernel's rows by cp.async.bulk): the exact-grid suite (every variant bit-identical
# to split64, graph replays, stage path, the wave buffer) and the retro step under split64r / split64b / split64f at
# 128K batch 1 / 4 / 16 (read flush, phase stamps) and 128K batch 4 (write flush); ncu of the bulk exact kernel.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/ab2; rm -rf $W; mkdir -p $W
timeout 200 bin/gpu_tests --gtest_filter='CudaExactGrid*' > $W/exact_tests.log 2>&1; ts "exact tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $W/exact_tests.log | head -20
grep -E "\[exact grid\]" $W/exact_tests.log | cut -c1-240 | grep -E "split64b|128K|131072|flag|footprint split64b" | head -8
grep -B2 -A10 "Failure" $W/exact_tests.log | head -40
for v in split64r split64b split64f; do
  RETROINFER_EXACT=$v bin/kernel_bench --only full,retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/${v}_read.jsonl 2>>$W/kb.err; ts "kb $v read"
done
for v in split64r split64b; do
  RETROINFER_EXACT=$v bin/kernel_bench --only retro --lengths 131072 --batches 4 --reps 20 --stages 1 --out $W/${v}_write.jsonl 2>>$W/kb.err; ts "kb $v write"
done
python3 scripts/retro_phase_summary.py $W/split64r_read.jsonl $W/split64b_read.jsonl $W/split64f_read.jsonl $W/split64r_write.jsonl $W/split64b_write.jsonl > $W/summary.txt 2>&1
cut -c1-300 $W/summary.txt | head -40
grep -h '"retro_graph"\|"method":"full"' $W/*.jsonl | cut -c1-100
RETROINFER_EXACT=split64b timeout 120 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section InstructionStats --section Occupancy -k regex:'decode_exact_bulk' --launch-skip 3 -c 1 bin/kernel_bench --only retro --lengths 131072 --batches 4 --reps 1 > $W/ncu_bulk.txt 2>&1; ts "ncu rc=$?"
grep -E "Duration|DRAM Throughput|Executed Instructions  |Warp Cycles Per Issued|Achieved Occupancy" $W/ncu_bulk.txt | head
cd $W && tar czf $OUT/ab2.tgz *
