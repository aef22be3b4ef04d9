#!/usr/bin/env bash
# Run 26 call 10: q8h (one centroid scale per head: the argmax on packed integers, IMAD + IMNMX per score)
# against q8 and a: the k-means tests (exact host references for q8 / q8h, parity with the CPU for all
# three), the joined-decode test after its near-tie fix, and the k-means build at 32K / 128K.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=$OUT
timeout 200 bin/gpu_tests --gtest_filter='CudaKMeans*:CudaWaveParity*:CudaJoined*:CudaRetroMemory*' > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran|wave parity\]|kmeans parity\]|kmeans q8h\]|cuda_joined\] bf16" $W/gpu_tests.log | cut -c1-230 | head -40
grep -B3 -A15 "Failure" $W/gpu_tests.log | head -60
timeout 150 bin/kernel_bench --only kmeans --lengths 32768,131072 --batches 1 --kmeans-variants a/fast,q8/fast,q8h/fast,q8/fast,q8h/fast --kmeans-phases 1 --kmeans-builds 7 --out $W/kmeans.jsonl > /dev/null 2>>$W/kb.err; ts "kb rc=$?"
python3 - $W/kmeans.jsonl <<'PY'
import sys, json
for l in open(sys.argv[1]):
    d = json.loads(l)
    if d.get('method') == 'kmeans':
        print(d['n'], d['assign_variant'], 'ms %.3f min %.3f prefill %.2f ratio %.4f' % (d['ms'], d['ms_min'], d['prefill_ms'], d['kmeans_over_prefill']))
    if d.get('method') == 'kmeans_phases':
        print(d['n'], d['assign_variant'], {k: round(v, 3) for k, v in d['phases_ms'].items()}, 'sum %.3f' % d['phases_sum_ms'])
PY
