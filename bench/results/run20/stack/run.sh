#!/usr/bin/env bash
# Run 20 call 7: per-layer time inside a stack of layers (kernel_bench --stack L: L layers back to back in one graph,
# each with its own K / V and index, L2 evicted once per replay) against the single-layer call, main's kernels.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/stack; rm -rf $W; mkdir -p $W
bin/kernel_bench --only full,retro --lengths 131072 --batches 1,4,16 --reps 20 --stack 4 --flush read --out $W/stack4_read.jsonl 2>$W/kb.err; ts "stack4 read"
bin/kernel_bench --only full,retro --lengths 131072 --batches 4 --reps 20 --stack 4 --out $W/stack4_write.jsonl 2>>$W/kb.err; ts "stack4 write"
bin/kernel_bench --only full,retro --lengths 131072 --batches 4 --reps 20 --stack 8 --flush read --out $W/stack8_read.jsonl 2>>$W/kb.err; ts "stack8 read"
bin/kernel_bench --only full,retro --lengths 32768 --batches 4,16 --reps 20 --stack 4 --flush read --out $W/stack4_32k_read.jsonl 2>>$W/kb.err; ts "32k"
grep -h '"retro_graph"\|"method":"full"\|_stack"' $W/*.jsonl | cut -c1-120
tail -3 $W/kb.err
cp $W/*.jsonl $W/kb.err $OUT/
