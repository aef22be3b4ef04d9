#!/usr/bin/env bash
# Run 27 call 7: the retrieval capacity summed on the device (top_sizes_sum) instead of on the host; the host
# split of every timed build (enqueue, GPU wait, after); tests; the build at 32K / 128K / 512K (1 and 0
# segment iterations) with torch's prefill in the same call.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r27d; mkdir -p $W
timeout 200 bin/gpu_tests --gtest_filter='CudaKMeans*:CudaTopSizes*:CudaWaveParity*:CudaRetro*:CudaLayers*' > $W/tests.log 2>&1; ts "tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|wave parity\] retro|retro device bytes" $W/tests.log | cut -c1-200 | head -30
grep -B3 -A12 "Failure" $W/tests.log | head -40
KB="bin/kernel_bench --only kmeans --batches 1"
timeout 150 $KB --lengths 32768,131072 --kmeans-iters 1,0 --kmeans-phases 1 --kmeans-builds 15 --out $W/kmeans.jsonl > /dev/null 2>>$W/kb.err; ts "kb rc=$?"
timeout 100 $KB --lengths 524288 --kmeans-iters 1 --kmeans-builds 3 --out $W/kmeans_512k.jsonl > /dev/null 2>>$W/kb.err; ts "kb 512k rc=$?"
timeout 60 python3 scripts/torch_prefill_bench.py --lengths 32768,131072 --out $W/torch_prefill.jsonl > /dev/null 2>>$W/torch.err; ts "torch rc=$?"
python3 - $W <<'PY'
import sys, json
W = sys.argv[1]
torch = {}
for l in open(W + '/torch_prefill.jsonl'):
    d = json.loads(l)
    if d.get('variant') == 'whole' and 'ms' in d: torch[d['n']] = d['ms']
print('torch', torch)
for f in ['kmeans.jsonl', 'kmeans_512k.jsonl']:
    for l in open(W + '/' + f):
        d = json.loads(l)
        if d.get('method') == 'kmeans':
            t = torch.get(d['n'])
            print(f, d['n'], 'it', d['segment_iters'], 'ms %.3f min %.3f prefill %.2f host enqueue %.3f wait %.3f after %.3f' % (d['ms'], d['ms_min'], d['prefill_ms'], d['host_enqueue_ms'], d['host_wait_ms'], d['host_after_ms']), 'torch-ratio %.4f' % (d['ms'] / t) if t else '')
        if d.get('method') == 'kmeans_phases':
            print(f, d['n'], 'it', d['segment_iters'], {k: round(v, 3) for k, v in d['phases_ms'].items()}, 'sum %.3f' % d['phases_sum_ms'])
PY
cd /tmp && tar czf $OUT/r27d.tgz r27d
