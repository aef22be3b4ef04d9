#!/usr/bin/env bash
# Run 23 call 8: the score grid as a programmatic dependent of the kernel before it (RETROINFER_SCORE_PDL=1, new
# default; combine_states triggers its dependents after its wait). The score tests (the new stack test); the
# 4-layer stack at 128K batch 4 with PDL on / off, bf16 and int8; single layers at 128K batch 1 / 4 / 16 and
# 1M batch 1 (defaults, int8); then the whole GPU suite.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r23f; rm -rf $W; mkdir -p $W
timeout 200 bin/gpu_tests --gtest_filter='CudaScoreStream*' > $W/score_tests.log 2>&1; ts "score tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|\[score stream\] stack|Failure" $W/score_tests.log | cut -c1-230 | head -30
for fmt in bf16 int8; do for pdl in 1 0; do
  RETROINFER_SCORE_PDL=$pdl RETROINFER_SCORE_CENTROIDS=$fmt bin/kernel_bench --only full,retro --lengths 131072 --batches 4 --reps 20 --flush read --stack 4 --out $W/kb_stack_${fmt}_pdl$pdl.jsonl > $W/stack_${fmt}_pdl$pdl.txt 2>>$W/kb.err; ts "stack $fmt pdl=$pdl"
done; done
grep -h '_stack' $W/kb_stack_*.jsonl | cut -c1-110
bin/kernel_bench --only full,retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kb_default.jsonl 2>>$W/kb.err; ts "kb default"
RETROINFER_SCORE_CENTROIDS=int8 bin/kernel_bench --only retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kb_int8.jsonl 2>>$W/kb.err; ts "kb int8"
bin/kernel_bench --only full,retro --lengths 1048576 --batches 1 --reps 20 --stages 1 --flush read --out $W/kb_long_default.jsonl 2>>$W/kb.err; ts "kb long"
RETROINFER_SCORE_CENTROIDS=int8 bin/kernel_bench --only retro --lengths 524288,1048576 --batches 1 --reps 20 --stages 1 --flush read --out $W/kb_long_int8.jsonl 2>>$W/kb.err; ts "kb long int8"
python3 scripts/retro_phase_summary.py $W/kb_default.jsonl $W/kb_int8.jsonl | cut -c1-200
grep -h '"retro_graph"\|"method":"full"' $W/kb_*.jsonl | cut -c1-120
timeout 260 bin/gpu_tests > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran" $W/gpu_tests.log | head
grep -B3 -A12 "FAILED  \]\|Failure" $W/gpu_tests.log | head -100 > $W/failures.log
tar czf $OUT/r23f.tgz -C $W .
