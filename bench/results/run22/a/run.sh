#!/usr/bin/env bash
# Run 22 call 1: int8 centroid scoring (score_stream.cu tma kernel, RetroLayer default): all GPU tests (no
# model), then the retro step at 128K batch 1 / 4 / 16 under the read flush, int8 against bf16 scoring
# (RETROINFER_SCORE_CENTROIDS), and the 4-layer stack at batch 4.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r22a; rm -rf $W; mkdir -p $W
timeout 200 bin/gpu_tests --gtest_filter='CudaScoreQ8.*:CudaScoreStream.*:CudaRetro.*' > $W/q8_tests.log 2>&1; ts "q8 tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|\[score q8\]" $W/q8_tests.log | cut -c1-250
timeout 300 bin/gpu_tests > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]|tests ran" $W/gpu_tests.log | head -30
grep -B3 -A12 "FAILED  \]\|Failure" $W/gpu_tests.log | head -120 > $OUT/failures.log
bin/kernel_bench --only full,retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kb_int8.jsonl 2>$W/kb.err; ts "kb int8"
RETROINFER_SCORE_CENTROIDS=bf16 bin/kernel_bench --only retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kb_bf16.jsonl 2>>$W/kb.err; ts "kb bf16"
bin/kernel_bench --only full,retro --lengths 131072 --batches 4 --reps 20 --flush read --stack 4 --out $W/kb_stack.jsonl 2>>$W/kb.err; ts "kb stack"
python3 scripts/retro_phase_summary.py $W/kb_int8.jsonl $W/kb_bf16.jsonl | cut -c1-260
grep -h '"retro_graph"\|"method":"full"\|_stack' $W/kb_int8.jsonl $W/kb_bf16.jsonl $W/kb_stack.jsonl | cut -c1-160
cp $W/*.jsonl $W/q8_tests.log $OUT/; gzip -c $W/gpu_tests.log > $OUT/gpu_tests.log.gz; cp $W/kb.err $OUT/
