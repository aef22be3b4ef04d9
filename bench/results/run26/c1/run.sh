#!/usr/bin/env bash
# Run 26 call 1: the k-means tests (q8 assignment, counting-sort grouping, parity with the CPU), then the
# k-means build at 32K / 128K batch 1: a/fast vs q8/fast, radix vs count grouping, with the phase split;
# torch SDPA causal prefill at 32K as the peer.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=$OUT
timeout 240 bin/gpu_tests --gtest_filter='CudaKMeans*:CudaWaveParity*:CudaRetroMemory*' > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran|kmeans q8\]|kmeans parity\]|wave parity\] k-means" $W/gpu_tests.log | cut -c1-220 | head -60
grep -B3 -A15 "Failure" $W/gpu_tests.log | head -80
for g in radix count; do
  RETROINFER_KMEANS_GROUP=$g timeout 150 bin/kernel_bench --only kmeans --lengths 32768,131072 --batches 1 --kmeans-variants a/fast,q8/fast --kmeans-phases 1 --kmeans-builds 5 --out $W/km_$g.jsonl > /dev/null 2>>$W/kb.err; ts "kb $g rc=$?"
done
python3 - $W/km_radix.jsonl $W/km_count.jsonl <<'PY'
import sys, json
for f in sys.argv[1:]:
    for l in open(f):
        d = json.loads(l)
        if d.get('method') == 'kmeans':
            print(f.split('/')[-1], d['n'], d['assign_variant'], d['group_variant'], 'ms %.3f prefill %.2f ratio %.4f' % (d['ms'], d['prefill_ms'], d['kmeans_over_prefill']))
        if d.get('method') == 'kmeans_phases':
            print(f.split('/')[-1], d['n'], d['assign_variant'], d['group_variant'], {k: round(v, 3) for k, v in d['phases_ms'].items()}, 'sum %.3f' % d['phases_sum_ms'])
PY
timeout 120 python3 scripts/torch_prefill_bench.py --out $W/torch_prefill.jsonl --lengths 32768 --reps 5 > $W/torch.log 2>&1; ts "torch rc=$?"; cat $W/torch_prefill.jsonl | cut -c1-300
