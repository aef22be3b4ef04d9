#!/usr/bin/env bash
# Run 24 call 16 (diagnostic): Nsight Compute on the score grid alone at 128K batch 4 after the query moved into shared
# memory: the wide int8 kernel and the tma bf16 kernel (speed of light, memory, warp states, scheduler, SASS stall samples).
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r24n; rm -rf $W; mkdir -p $W
for fmt in int8 bf16; do
  RETROINFER_SCORE_CENTROIDS=$fmt timeout 200 ncu --clock-control none --import-source no --section SourceCounters --section WarpStateStats --section SpeedOfLight --section MemoryWorkloadAnalysis --section SchedulerStats --section Occupancy -k regex:'score_stream_form' --launch-skip 2 -c 1 -o $W/sc_$fmt bin/kernel_bench --only retro --lengths 131072 --batches 4 --reps 1 > $W/ncu_$fmt.log 2>&1; ts "ncu $fmt rc=$?"
  ncu -i $W/sc_$fmt.ncu-rep --page source --csv --print-source sass > $W/src_$fmt.csv 2>>$W/ncu_$fmt.log
  python3 scripts/ncu_sass_top.py $W/src_$fmt.csv 40 3 > $W/sass_top_$fmt.txt 2>>$W/ncu_$fmt.log
  ncu -i $W/sc_$fmt.ncu-rep --page details > $W/details_$fmt.txt 2>>$W/ncu_$fmt.log
  grep -E "Duration|DRAM Throughput|Memory Throughput|Issue Slots|Issued Ipc|Warp Cycles Per Issued|Achieved Occupancy|No Eligible|Active Warps|Eligible Warps|L2 Hit|Mem Busy|Max Bandwidth" $W/details_$fmt.txt | head -24
  head -30 $W/sass_top_$fmt.txt | cut -c1-200
done
rm -f $W/*.ncu-rep
tar czf $OUT/r24n.tgz -C $W .
