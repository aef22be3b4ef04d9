#!/usr/bin/env bash
# Run 22 call 2: int8 scoring with a 4-tile ring per warp; the tests call 1 failed on (fixed), all GPU tests (no
# model), the retro step at 128K (read flush) int8 vs bf16, the 4-layer stack, then the kernel table.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r22b; rm -rf $W; mkdir -p $W
bin/kernel_bench --only full,retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kb_int8.jsonl 2>$W/kb.err; ts "kb int8"
RETROINFER_SCORE_CENTROIDS=bf16 bin/kernel_bench --only retro --lengths 131072 --batches 4 --reps 20 --stages 1 --flush read --out $W/kb_bf16.jsonl 2>>$W/kb.err; ts "kb bf16"
bin/kernel_bench --only full,retro --lengths 131072 --batches 4 --reps 20 --flush read --stack 4 --out $W/kb_stack.jsonl 2>>$W/kb.err; ts "kb stack"
python3 scripts/retro_phase_summary.py $W/kb_int8.jsonl $W/kb_bf16.jsonl | cut -c1-260
grep -h '"retro_graph"\|"method":"full"\|_stack' $W/kb_int8.jsonl $W/kb_bf16.jsonl $W/kb_stack.jsonl | cut -c1-130
timeout 300 bin/gpu_tests > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]|tests ran|\[score q8\] decode" $W/gpu_tests.log | cut -c1-250 | head -30
grep -B3 -A12 "FAILED  \]\|Failure" $W/gpu_tests.log | head -150 > $OUT/failures.log
cp $W/*.jsonl $OUT/; gzip -c $W/gpu_tests.log > $OUT/gpu_tests.log.gz; cp $W/kb.err $OUT/
