#!/usr/bin/env bash
# Run 20 call 8: split64u (the estimation clusters as virtual tokens of the exact grid's tile loop): the exact-grid
# suite, then split64r against split64u at 32K / 128K batch 1 / 4 / 16 (read flush, phase stamps), 128K batch 4
# (write flush), 1M batch 1, and per layer in a stack of 4 at 128K batch 4.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/ab3; rm -rf $W; mkdir -p $W
timeout 240 bin/gpu_tests --gtest_filter='CudaExactGrid*' > $W/exact_tests.log 2>&1; ts "exact tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $W/exact_tests.log | head -20
grep -E "split64u" $W/exact_tests.log | cut -c1-200 | head -20
grep -B3 -A12 "Failure" $W/exact_tests.log | head -60
for v in split64r split64u; do
  RETROINFER_EXACT=$v bin/kernel_bench --only full,retro --lengths 32768,131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/${v}_read.jsonl 2>>$W/kb.err; ts "kb $v read"
  RETROINFER_EXACT=$v bin/kernel_bench --only retro --lengths 131072 --batches 4 --reps 20 --stages 1 --out $W/${v}_write.jsonl 2>>$W/kb.err; ts "kb $v write"
  RETROINFER_EXACT=$v bin/kernel_bench --only full,retro --lengths 131072 --batches 4 --reps 20 --stack 4 --flush read --out $W/${v}_stack.jsonl 2>>$W/kb.err; ts "kb $v stack"
  RETROINFER_EXACT=$v bin/kernel_bench --only retro --lengths 1048576 --batches 1 --reps 10 --stages 1 --out $W/${v}_1m.jsonl 2>>$W/kb.err; ts "kb $v 1m"
done
python3 scripts/retro_phase_summary.py $W/split64r_read.jsonl $W/split64u_read.jsonl $W/split64r_write.jsonl $W/split64u_write.jsonl $W/split64r_1m.jsonl $W/split64u_1m.jsonl > $W/summary.txt 2>&1
cut -c1-330 $W/summary.txt | head -40
grep -h '"retro_graph"\|"method":"full"\|_stack"' $W/*.jsonl | cut -c1-100
tail -2 $W/kb.err
cd $W && tar czf $OUT/ab3.tgz *
