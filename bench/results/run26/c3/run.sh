#!/usr/bin/env bash
# Run 26 call 3: the k-means / memory / parity tests (int8 spherical updates, 32-warp counting sort,
# reciprocal quantization, workspace swap); the k-means build at 32K with the q8 tile shapes (A/B) and
# the phase split, 128K with the default.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=$OUT
timeout 200 bin/gpu_tests --gtest_filter='CudaKMeans*:CudaWaveParity*:CudaRetroMemory*' > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran|wave parity\]|kmeans parity\]" $W/gpu_tests.log | cut -c1-220 | head -20
grep -B3 -A15 "Failure" $W/gpu_tests.log | head -60
for t in m2n2b2 m2n2b3 m4n1b2 m4n2b1 m2n2b2; do
  RETROINFER_KMEANS_Q8_TILE=$t timeout 100 bin/kernel_bench --only kmeans --lengths 32768 --batches 1 --kmeans-phases 1 --kmeans-builds 7 --out $W/km_$t.jsonl > /dev/null 2>>$W/kb.err; ts "kb $t rc=$?"
done
timeout 100 bin/kernel_bench --only kmeans --lengths 131072 --batches 1 --kmeans-phases 1 --kmeans-builds 3 --out $W/km_128k.jsonl > /dev/null 2>>$W/kb.err; ts "kb 128k rc=$?"
for f in $W/km_*.jsonl; do python3 - $f <<'PY'
import sys, json
for l in open(sys.argv[1]):
    d = json.loads(l)
    tag = sys.argv[1].split('/')[-1]
    if d.get('method') == 'kmeans':
        print(tag, d['n'], d['assign_variant'], d['group_variant'], 'ms %.3f min %.3f prefill %.2f ratio %.4f' % (d['ms'], d['ms_min'], d['prefill_ms'], d['kmeans_over_prefill']))
    if d.get('method') == 'kmeans_phases':
        print(tag, d['n'], {k: round(v, 3) for k, v in d['phases_ms'].items()}, 'sum %.3f' % d['phases_sum_ms'])
PY
done
