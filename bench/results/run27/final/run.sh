#!/usr/bin/env bash
# Run 27 final call (SmolLM2 staged in three parts into /tmp/stage by the calls before): every GPU test with
# the model on main's build; the k-means build at 32K / 128K (phases) and 512K with torch's prefill (32K /
# 128K whole-sequence and chunked; 512K whole, 2 reps) in the same call; the 128K batch-4 decode pair (our
# full against retro on the default, 1-iteration index).
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r27f; mkdir -p $W
mkdir -p /tmp/models && cat /tmp/stage/smol.part00 /tmp/stage/smol.part01 /tmp/stage/smol.part02 > /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
md5sum /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
RETROINFER_MODEL_DIR=/tmp/models timeout 330 bin/gpu_tests > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]|tests ran|greedy tokens|kmeans parity\]|wave parity\] retro|cuda_joined\] bf16" $W/gpu_tests.log | cut -c1-220 > $W/gpu_tests_summary.log; cat $W/gpu_tests_summary.log
grep -B3 -A12 "Failure" $W/gpu_tests.log | head -60
KB="bin/kernel_bench --only kmeans --batches 1"
timeout 120 $KB --lengths 32768,131072 --kmeans-phases 1 --kmeans-builds 15 --out $W/kmeans.jsonl > /dev/null 2>>$W/kb.err; ts "kb kmeans rc=$?"
timeout 100 $KB --lengths 524288 --kmeans-builds 3 --out $W/kmeans_512k.jsonl > /dev/null 2>>$W/kb.err; ts "kb 512k rc=$?"
timeout 90 python3 scripts/torch_prefill_bench.py --lengths 32768,131072 --out $W/torch_prefill.jsonl > /dev/null 2>>$W/torch.err; ts "torch rc=$?"
timeout 90 python3 scripts/torch_prefill_bench.py --lengths 524288 --chunk 524288 --reps 2 --out $W/torch_prefill_512k.jsonl > /dev/null 2>>$W/torch.err; ts "torch 512k rc=$?"
timeout 120 bin/kernel_bench --only full,retro --lengths 131072 --batches 4 --reps 20 --flush read --out $W/decode_128k_b4.jsonl > /dev/null 2>>$W/kb.err; ts "kb decode rc=$?"
python3 - $W <<'PY'
import sys, json
W = sys.argv[1]
torch = {}
for f in ['torch_prefill.jsonl', 'torch_prefill_512k.jsonl']:
    for l in open(W + '/' + f):
        d = json.loads(l)
        if d.get('variant') == 'whole' and 'ms' in d: torch[d['n']] = d['ms']
        if d.get('variant') == 'chunked' and 'ms' in d: print('torch chunked', d['n'], d['chunk'], '%.2f ms' % d['ms'])
print('torch whole', torch)
for f in ['kmeans.jsonl', 'kmeans_512k.jsonl']:
    for l in open(W + '/' + f):
        d = json.loads(l)
        if d.get('method') == 'kmeans':
            t = torch.get(d['n'])
            print(d['n'], d['assign_variant'], 'it', d['segment_iters'], 'ms %.3f min %.3f ours-prefill %.2f (%.4f)' % (d['ms'], d['ms_min'], d['prefill_ms'], d['kmeans_over_prefill']), 'torch %.2f ratio %.4f' % (t, d['ms'] / t) if t else '')
        if d.get('method') == 'kmeans_phases':
            print(d['n'], {k: round(v, 3) for k, v in d['phases_ms'].items()}, 'sum %.3f' % d['phases_sum_ms'])
for l in open(W + '/decode_128k_b4.jsonl'):
    d = json.loads(l)
    if d.get('method') in ('full', 'retro', 'retro_graph'): print(d['method'], d['n'], d['batch'], 'us %.1f' % (d['ms'] * 1e3), 'GB/s %.0f' % d.get('gbps', 0), {k: d[k] for k in ('bytes', 'bytes_required') if k in d})
PY
cd /tmp && tar czf $OUT/r27f.tgz r27f
