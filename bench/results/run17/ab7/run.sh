#!/usr/bin/env bash
# Run 17 A/B 7: the exact grid capped at 1 / 2 CTAs per multiprocessor (RETROINFER_EXACT_CTAS_PER_SM) against the
# default (3), so the estimation CTAs run beside it; both flushes, 32K / 128K x 1 / 4 / 16.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
for f in write read; do for c in 3 2; do
RETROINFER_EXACT_CTAS_PER_SM=$c bin/kernel_bench --only retro --reps 30 --stages 1 --lengths 32768,131072 --batches 1,4,16 --flush $f --out $OUT/c${c}_$f.jsonl 2>/dev/null >/dev/null
done; done
RETROINFER_EXACT_CTAS_PER_SM=2 bin/kernel_bench --only retro --reps 20 --stages 1 --lengths 524288,1048576 --batches 1,4 --out $OUT/c2_long.jsonl 2>/dev/null >/dev/null
python3 scripts/retro_phase_summary.py $OUT/*.jsonl | awk '{print $1, $2, $3, $4, $9, $10, $11, $14}'
