#!/usr/bin/env bash
# Run 26 call 2: the k-means / memory / parity tests after the planner and test fixes; Nsight Compute on
# one 32K k-means build (every kernel's duration, then the q8 assignment, the counting sort and the update
# in detail).
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=$OUT
timeout 200 bin/gpu_tests --gtest_filter='CudaKMeans*:CudaWaveParity*:CudaRetroMemory*' > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran|wave parity\] retro" $W/gpu_tests.log | cut -c1-220 | head -20
grep -B3 -A15 "Failure" $W/gpu_tests.log | head -60
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); echo "ncu: $NCU"
KB="bin/kernel_bench --only kmeans --lengths 32768 --batches 1 --kmeans-builds 1 --out /tmp/kb_ncu.jsonl"
timeout 200 $NCU --kernel-name regex:'kmeans|assign|centre|mean_|init_kernel|update_|finalize|group|offsets|Radix|quantize|outlier|split|residual|pick' --metrics gpu__time_duration.sum --csv $KB > $W/ncu_durations.csv 2> $W/ncu1.err; ts "ncu durations rc=$?"
python3 - $W/ncu_durations.csv <<'PY'
import sys, csv, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]; ki = hdr.index('Kernel Name'); vi = hdr.index('Metric Value'); ii = hdr.index('ID')
# the last build only: kernels after the last mean_partial launch
ids = [r for r in rows[1:]]
last = max(i for i, r in enumerate(ids) if 'mean_partial' in r[ki])
tot = collections.OrderedDict(); cnt = collections.Counter()
for r in ids[last:]:
    name = r[ki].split('(')[0].split('<')[0][-60:]
    v = float(r[vi].replace(',', '')); tot[name] = tot.get(name, 0) + v; cnt[name] += 1
s = sum(tot.values())
for k, v in tot.items(): print('%-60s %4d launches %9.1f us' % (k, cnt[k], v / 1e3))
print('sum %.1f us' % (s / 1e3))
PY
timeout 200 $NCU --kernel-name regex:'assign_q8|group_segment|update_fast' --launch-count 4 --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section Occupancy --section MemoryWorkloadAnalysis $KB > $W/ncu_detail.txt 2> $W/ncu2.err; ts "ncu detail rc=$?"
grep -E "assign_q8|group_segment|update_fast|Duration|Throughput|Issue Slots|Executed Ipc|Stall|Achieved Occupancy|Registers|Block Limit|Warp Cycles Per Issued" $W/ncu_detail.txt | head -120
