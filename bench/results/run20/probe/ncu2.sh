#!/usr/bin/env bash
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
W=/tmp/ncu2; rm -rf $W; mkdir -p $W
timeout 200 ncu --clock-control none --import-source no --section SourceCounters --section WarpStateStats --section InstructionStats -k regex:'decode_exact_capped' --launch-skip 3 -c 1 -o $W/ex bin/kernel_bench --only retro --lengths 131072 --batches 4 --reps 1 > $W/ncu.log 2>&1; echo "ncu rc=$?"
ncu -i $W/ex.ncu-rep --page source --csv --print-source sass > $OUT/ex_src.csv 2>>$W/ncu.log
ncu -i $W/ex.ncu-rep --page details > $OUT/ex_details.txt 2>>$W/ncu.log
grep -E "Duration|Executed Instructions|Issued Instructions|Stall" $OUT/ex_details.txt | head -20
ls -la $OUT; tail -3 $W/ncu.log
