#!/usr/bin/env bash
# Run 22 call 10: after the review's tidy-up (one tensor-map encoding for bf16 and int8, one stage count, the
# wave buffer's int8 copy helper): all GPU tests (no model), and the retro step at 128K batch 1 / 4 (read flush)
# with bf16 and int8 scoring, to check the figures did not move.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
timeout 300 bin/gpu_tests > /tmp/gt.log 2>&1; echo "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]" /tmp/gt.log | head; gzip -c /tmp/gt.log > $OUT/gpu_tests.log.gz
for fmt in bf16 int8; do
  RETROINFER_SCORE_CENTROIDS=$fmt bin/kernel_bench --only full,retro --lengths 131072 --batches 1,4 --reps 20 --flush read --out $OUT/kb_$fmt.jsonl 2>>$OUT/kb.err
done
grep -h '"retro_graph"\|"method":"full"' $OUT/kb_*.jsonl | cut -c1-110
