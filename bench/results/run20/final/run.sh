#!/usr/bin/env bash
# Run 20 call 11: main at its last change (kernel_bench's timing loops shared through time_calls): the retro step
# and full at 128K batch 1 / 4 / 16 (read flush) with a stack of 4, and batch 4 under the write flush.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/final; rm -rf $W; mkdir -p $W
bin/kernel_bench --only full,retro --lengths 131072 --batches 1,4,16 --reps 20 --stack 4 --flush read --out $W/final_read.jsonl 2>$W/kb.err; ts "read rc=$?"
bin/kernel_bench --only full,retro --lengths 131072 --batches 4 --reps 20 --stack 4 --out $W/final_write.jsonl 2>>$W/kb.err; ts "write rc=$?"
bin/kernel_bench --stack 0 2>&1 | tail -1
grep -h '"retro_graph"\|"method":"full"\|_stack"' $W/*.jsonl | cut -c1-100
cp $W/* $OUT/
