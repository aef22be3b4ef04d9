#!/usr/bin/env bash
# Run 27 call 14: after the review clean-up (the segment-table upload as one helper, the finalize launcher, kernel_bench's
# --kmeans-iters on bench_args.h parse_list): the k-means tests, the 32K build with 1 and 9 iterations, torch.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r27h; mkdir -p $W
timeout 120 bin/gpu_tests --gtest_filter='CudaKMeans*:CudaTopSizes*:CudaWaveParity*:CudaRetro*' > $W/tests.log 2>&1; ts "tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $W/tests.log | head -5
timeout 90 bin/kernel_bench --only kmeans --batches 1 --lengths 32768 --kmeans-iters 1,9 --kmeans-builds 15 --out $W/kmeans.jsonl > /dev/null 2>>$W/kb.err; ts "kb rc=$?"
timeout 60 python3 scripts/torch_prefill_bench.py --lengths 32768 --out $W/torch_prefill.jsonl > /dev/null 2>>$W/torch.err; ts "torch rc=$?"
python3 - $W <<'PY'
import sys, json
W = sys.argv[1]
torch = {json.loads(l)['n']: json.loads(l)['ms'] for l in open(W + '/torch_prefill.jsonl') if json.loads(l).get('variant') == 'whole'}
print('torch', torch)
for l in open(W + '/kmeans.jsonl'):
    d = json.loads(l)
    if d.get('method') == 'kmeans':
        print(d['n'], 'it', d['segment_iters'], 'ms %.3f min %.3f ratio %.4f' % (d['ms'], d['ms_min'], d['ms'] / torch[d['n']]))
PY
cd /tmp && tar czf $OUT/r27h.tgz r27h
