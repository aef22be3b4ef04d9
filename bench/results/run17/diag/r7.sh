#!/usr/bin/env bash
# Run 17: Nsight Compute per-instruction stall samples of the exact grid (and the estimation grid) at 128K batch 4.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
ncu --clock-control none --import-source no --section SourceCounters --section WarpStateStats -k regex:'decode_exact|estimate_chained' -c 2 -o $OUT/exact bin/kernel_bench --only retro --lengths 131072 --batches 4 --reps 1 > $OUT/ncu.log 2>&1
ncu -i $OUT/exact.ncu-rep --page source --csv --print-source sass > $OUT/src.csv 2>>$OUT/ncu.log
python3 scripts/ncu_sass_top.py $OUT/src.csv 14 4 > $OUT/sass_top.txt
head -150 $OUT/sass_top.txt
rm -f $OUT/src.csv
