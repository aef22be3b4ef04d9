#!/usr/bin/env bash
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
bin/tlb_probe | tee $OUT/tlb_probe.txt
timeout 200 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy -k regex:'decode_exact_capped' --launch-skip 3 -c 1 bin/kernel_bench --only retro --lengths 131072 --batches 4 --reps 1 > $OUT/ncu_exact.txt 2>&1; echo "ncu rc=$?"
grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Hit|L1/TEX Hit|Achieved Occupancy|Stall|Warp Cycles|Mem Busy|Max Bandwidth|Elapsed" $OUT/ncu_exact.txt | head -40
