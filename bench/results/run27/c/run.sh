#!/usr/bin/env bash
# Run 27 call 6: the fused finalize without FMA contraction (bit-equal to update + finalize), the retrieval
# capacity by nth_element in place; tests, the build timed (32K / 128K, 1 and 0 segment iterations), and
# Nsight Systems on five 32K builds: where the time between the kernels goes.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r27c; mkdir -p $W
timeout 200 bin/gpu_tests --gtest_filter='CudaKMeans*:CudaWaveParity*:CudaRetro*:CudaLayers*' > $W/tests.log 2>&1; ts "tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|wave parity\] retro|kmeans fast\]" $W/tests.log | cut -c1-200 | head -30
grep -B3 -A12 "Failure" $W/tests.log | head -40
KB="bin/kernel_bench --only kmeans --batches 1"
timeout 120 $KB --lengths 32768,131072 --kmeans-iters 1,0 --kmeans-phases 1 --kmeans-builds 15 --out $W/kmeans.jsonl > /dev/null 2>>$W/kb.err; ts "kb rc=$?"
python3 - $W <<'PY'
import sys, json
W = sys.argv[1]
for l in open(W + '/kmeans.jsonl'):
    d = json.loads(l)
    if d.get('method') == 'kmeans':
        print(d['n'], d['assign_variant'], 'it', d['segment_iters'], 'ms %.3f min %.3f ours-prefill %.2f' % (d['ms'], d['ms_min'], d['prefill_ms']))
    if d.get('method') == 'kmeans_phases':
        print(d['n'], 'it', d['segment_iters'], {k: round(v, 3) for k, v in d['phases_ms'].items()}, 'sum %.3f' % d['phases_sum_ms'])
PY
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1); echo "nsys: $NSYS"
if [ -n "$NSYS" ]; then
  timeout 150 $NSYS profile -t cuda -o $W/prof --force-overwrite true bin/kernel_bench --only kmeans --lengths 32768 --batches 1 --kmeans-builds 5 --kmeans-iters 1 --out /tmp/kb_nsys.jsonl > $W/nsys.log 2>&1; ts "nsys rc=$?"
  timeout 100 $NSYS stats -r cuda_api_sum,cuda_gpu_trace -f csv -o $W/stats $W/prof.nsys-rep > $W/nsys_stats.log 2>&1; ts "stats rc=$?"
  ls $W
fi
cd /tmp && tar czf $OUT/r27c.tgz --exclude='*.sqlite' r27c
