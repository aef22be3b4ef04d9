#!/usr/bin/env bash
# Run 26 final call (the SmolLM2 GGUF staged before in three parts into /tmp/stage): every GPU test on
# main's final build with the model; the k-means build at 32K / 128K (bf16 a vs int8 q8, the phase split)
# and 512K (q8); torch SDPA causal prefill at 32K and 128K as the peer; the 128K batch-4 decode pair (read
# flush) on the q8-built index.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=$OUT
mkdir -p /tmp/models && cat /tmp/stage/smol.part00 /tmp/stage/smol.part01 /tmp/stage/smol.part02 > /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
md5sum /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
RETROINFER_MODEL_DIR=/tmp/models timeout 330 bin/gpu_tests > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]|tests ran|greedy tokens|kmeans parity\]|wave parity\] retro" $W/gpu_tests.log | cut -c1-220 | head -30
grep -B3 -A12 "Failure" $W/gpu_tests.log | head -60
timeout 150 bin/kernel_bench --only kmeans --lengths 32768,131072 --batches 1 --kmeans-variants a/fast,q8/fast --kmeans-phases 1 --kmeans-builds 7 --out $W/kmeans.jsonl > /dev/null 2>>$W/kb.err; ts "kb kmeans rc=$?"
timeout 150 bin/kernel_bench --only kmeans --lengths 524288 --batches 1 --kmeans-phases 1 --kmeans-builds 3 --out $W/kmeans_512k.jsonl > /dev/null 2>>$W/kb.err; ts "kb 512k rc=$?"
timeout 150 python3 scripts/torch_prefill_bench.py --out $W/torch_prefill.jsonl --lengths 32768,131072 --reps 5 > $W/torch.log 2>&1; ts "torch rc=$?"
timeout 120 bin/kernel_bench --only full,retro --lengths 131072 --batches 4 --reps 20 --flush read --out $W/decode_128k_b4.jsonl > /dev/null 2>>$W/kb.err; ts "kb decode rc=$?"
python3 - $W <<'PY'
import sys, json, glob
W = sys.argv[1]
torch = {}
for l in open(W + '/torch_prefill.jsonl'):
    d = json.loads(l)
    if d.get('variant') == 'whole': torch[d['n']] = d['ms']
    print('torch', d['n'], d.get('variant'), 'ms %.2f' % d['ms'])
for f in ['kmeans.jsonl', 'kmeans_512k.jsonl']:
    for l in open(W + '/' + f):
        d = json.loads(l)
        if d.get('method') == 'kmeans':
            t = torch.get(d['n'])
            print(d['n'], d['assign_variant'], d['group_variant'], 'ms %.3f min %.3f prefill %.2f ratio %.4f' % (d['ms'], d['ms_min'], d['prefill_ms'], d['kmeans_over_prefill']), 'vs torch %.4f' % (d['ms'] / t) if t else '')
        if d.get('method') == 'kmeans_phases':
            print(d['n'], d['assign_variant'], {k: round(v, 3) for k, v in d['phases_ms'].items()}, 'sum %.3f' % d['phases_sum_ms'])
for l in open(W + '/decode_128k_b4.jsonl'):
    d = json.loads(l)
    if d.get('method') in ('full', 'retro', 'retro_graph'): print(d['method'], d['n'], d['batch'], 'us %.1f' % (d['ms'] * 1e3))
PY
