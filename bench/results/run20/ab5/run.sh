#!/usr/bin/env bash
# Run 20 call 10: split64r's lean tile loop (RETROINFER_EXACT_LEAN=1: per-lane copy addressing, lazy rescale;
# bit-identical): the exact-grid suite, then off / on in one process each, 32K / 128K batch 1 / 4 / 16 (read flush,
# phase stamps), 128K batch 4 (write), and ncu of the lean kernel alone.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/ab5; rm -rf $W; mkdir -p $W
timeout 240 bin/gpu_tests --gtest_filter='CudaExactGrid*' > $W/exact_tests.log 2>&1; ts "exact tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $W/exact_tests.log | head -20
grep -B3 -A12 "Failure" $W/exact_tests.log | head -40
for L in 0 1; do
  RETROINFER_EXACT_LEAN=$L bin/kernel_bench --only full,retro --lengths 32768,131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/lean${L}_read.jsonl 2>>$W/kb.err; ts "lean$L read"
  RETROINFER_EXACT_LEAN=$L bin/kernel_bench --only retro --lengths 131072 --batches 4 --reps 20 --stages 1 --out $W/lean${L}_write.jsonl 2>>$W/kb.err; ts "lean$L write"
done
RETROINFER_EXACT_LEAN=0 bin/kernel_bench --only retro --lengths 131072 --batches 4 --reps 20 --stages 1 --flush read --out $W/lean0b_read.jsonl 2>>$W/kb.err; ts "lean0 again"
python3 scripts/retro_phase_summary.py $W/lean0_read.jsonl $W/lean1_read.jsonl $W/lean0b_read.jsonl $W/lean0_write.jsonl $W/lean1_write.jsonl > $W/summary.txt 2>&1
cut -c1-300 $W/summary.txt | head -40
RETROINFER_EXACT_LEAN=1 timeout 120 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section InstructionStats -k regex:'decode_exact_capped' --launch-skip 3 -c 1 bin/kernel_bench --only retro --lengths 131072 --batches 4 --reps 1 > $W/ncu_lean.txt 2>&1; ts "ncu rc=$?"
grep -E "Duration|DRAM Throughput|Executed Instructions  |Warp Cycles Per Issued" $W/ncu_lean.txt | head
cd $W && tar czf $OUT/ab5.tgz *
