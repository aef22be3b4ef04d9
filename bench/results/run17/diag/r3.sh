#!/usr/bin/env bash
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
for v in tma2d bulk; do for n in 2432 4864; do
RETROINFER_FULL_DECODE=$v bin/kernel_bench --only full --lengths $n --batches 4 --reps 30 2>/dev/null | grep '"full"' | cut -c1-200
RETROINFER_FULL_DECODE=$v ncu --clock-control none --section SpeedOfLight -k regex:dense -c 1 bin/kernel_bench --only full --lengths $n --batches 4 --reps 1 2>&1 | grep -E "dense_decode|Duration|DRAM Throughput"
done; done
