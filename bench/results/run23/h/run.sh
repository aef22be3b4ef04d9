#!/usr/bin/env bash
# Run 23 call 10: main's final state (RETROINFER_SCORE default wide: CTA-wide stages for the int8 tiles, the tma
# kernel for bf16; bf16 scoring the default). All GPU tests (no model staged); 128K batch 1 / 4 / 16 and 512K /
# 1M batch 1 (read flush), bf16 (default) and int8 scoring, with full; the 4-layer stack at 128K batch 4, both.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r23h; rm -rf $W; mkdir -p $W
timeout 300 bin/gpu_tests > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]|tests ran" $W/gpu_tests.log | head
grep -B3 -A12 "FAILED  \]\|Failure" $W/gpu_tests.log | head -100 > $W/failures.log
for fmt in bf16 int8; do
  RETROINFER_SCORE_CENTROIDS=$fmt bin/kernel_bench --only full,retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kb_${fmt}.jsonl 2>>$W/kb.err; ts "kb $fmt"
  RETROINFER_SCORE_CENTROIDS=$fmt bin/kernel_bench --only full,retro --lengths 524288,1048576 --batches 1 --reps 20 --stages 1 --flush read --out $W/kb_long_${fmt}.jsonl 2>>$W/kb.err; ts "kb long $fmt"
  RETROINFER_SCORE_CENTROIDS=$fmt bin/kernel_bench --only full,retro --lengths 131072 --batches 4 --reps 20 --flush read --stack 4 --out $W/kb_stack_${fmt}.jsonl > /dev/null 2>>$W/kb.err; ts "kb stack $fmt"
done
python3 scripts/retro_phase_summary.py $W/kb_bf16.jsonl $W/kb_int8.jsonl $W/kb_long_bf16.jsonl $W/kb_long_int8.jsonl | cut -c1-170
grep -h '"retro_graph"\|"method":"full"\|_stack' $W/kb_*.jsonl | cut -c1-105
tar czf $OUT/r23h.tgz -C $W .
