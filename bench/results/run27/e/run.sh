#!/usr/bin/env bash
# Run 27 call 12: init_kernel on a (cluster blocks x heads) grid with the segment table in shared memory and a
# binary search (a linear walk of dependent global loads before): the k-means / parity / retro / layer tests
# (no model), the build at 32K / 128K (phases) and 512K, torch's prefill in the same call.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r27e; mkdir -p $W
timeout 240 bin/gpu_tests --gtest_filter='CudaKMeans*:CudaTopSizes*:CudaWaveParity*:CudaRetro*:CudaLayers*:CudaJoined*:CudaWave*' > $W/tests.log 2>&1; ts "tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED|wave parity\] retro" $W/tests.log | cut -c1-200 | head -20
grep -B3 -A12 "Failure" $W/tests.log | head -40
KB="bin/kernel_bench --only kmeans --batches 1"
timeout 120 $KB --lengths 32768,131072 --kmeans-phases 1 --kmeans-builds 15 --out $W/kmeans.jsonl > /dev/null 2>>$W/kb.err; ts "kb rc=$?"
timeout 100 $KB --lengths 524288 --kmeans-builds 3 --out $W/kmeans_512k.jsonl > /dev/null 2>>$W/kb.err; ts "kb 512k rc=$?"
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
            print(d['n'], 'it', d['segment_iters'], 'ms %.3f min %.3f prefill %.2f host enqueue %.3f wait %.3f after %.3f' % (d['ms'], d['ms_min'], d['prefill_ms'], d['host_enqueue_ms'], d['host_wait_ms'], d['host_after_ms']), 'torch-ratio %.4f' % (d['ms'] / t) if t else '')
        if d.get('method') == 'kmeans_phases':
            print(d['n'], {k: round(v, 3) for k, v in d['phases_ms'].items()}, 'sum %.3f' % d['phases_sum_ms'])
PY
cd /tmp && tar czf $OUT/r27e.tgz r27e
