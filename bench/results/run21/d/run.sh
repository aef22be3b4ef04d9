#!/usr/bin/env bash
# Run 21 call 4: the cluster selection with the first logit loads issued before the normalisers': its GPU tests,
# phase stamps at 128K batch 1 / 4 (read flush), and Nsight Compute source counters of the kernel at batch 4.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r21d; rm -rf $W; mkdir -p $W
timeout 200 bin/gpu_tests --gtest_filter='CudaSelectCl.*' > $W/cl_tests.log 2>&1; ts "cl tests rc=$?"
grep -E 'DIFFER|FAILED|Failure|NOT' $W/cl_tests.log | cut -c1-240 | head -20
tail -1 $W/cl_tests.log
RETROINFER_SELECT_CL=1 bin/kernel_bench --only retro --lengths 131072 --batches 1,4 --reps 20 --stages 1 --flush read --out $W/cl1.jsonl 2>>$W/kb.err; ts "cl1 rc=$?"
python3 scripts/retro_phase_summary.py $W/cl1.jsonl
grep -h '"retro_phases"' $W/cl1.jsonl | python3 -c "
import json,sys
for l in sys.stdin:
    d=json.loads(l); print(d['batch'], ' '.join(f'{k}={v*1e3:.2f}' for k,v in d['phases_ms'].items() if k.startswith('select')))"
RETROINFER_SELECT_CL=1 timeout 200 ncu --clock-control none --import-source no --section SourceCounters --section WarpStateStats --section SpeedOfLight -k regex:'select_cl' --launch-skip 2 -c 1 -o $W/sel bin/kernel_bench --only retro --lengths 131072 --batches 4 --reps 1 > $W/ncu.log 2>&1; ts "ncu rc=$?"
ncu -i $W/sel.ncu-rep --page source --csv --print-source sass > $W/src.csv 2>>$W/ncu.log
python3 scripts/ncu_sass_top.py $W/src.csv 30 3 > $W/sass_top.txt 2>>$W/ncu.log
head -90 $W/sass_top.txt | cut -c1-200
ncu -i $W/sel.ncu-rep --page details > $W/details.txt 2>>$W/ncu.log; grep -E "Duration|Warp Cycles|Stall|Throughput" $W/details.txt | head -20
rm -f $W/src.csv
cp $W/* $OUT/ 2>/dev/null
