#!/usr/bin/env bash
# Run 25 call 21: the end-to-end decode at 128K batch 7 (Llama-3-8B shape, random weights, synthetic K/V, decode
# graphs, KV on the GPU) with run 25's defaults (int8 scoring without bf16 centroids, run10s), full and retro, and
# retro again with RETROINFER_SCORE_CENTROIDS=bf16; the same command as run 19's final call.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r25e2e; rm -rf $W; mkdir -p $W
timeout 250 bin/retroinfer bench decode --model llama3-8b --steps 20 --warmup 3 --contexts 131072 --placement gpu \
  --synthetic always --batches 7 --methods full,retro --out $W/e2e_128k_b7.jsonl > $W/e2e.log 2>&1; ts "e2e rc=$?"
RETROINFER_SCORE_CENTROIDS=bf16 timeout 200 bin/retroinfer bench decode --model llama3-8b --steps 20 --warmup 3 \
  --contexts 131072 --placement gpu --synthetic always --batches 7 --methods retro --out $W/e2e_128k_b7_bf16.jsonl \
  > $W/e2e_bf16.log 2>&1; ts "e2e bf16 rc=$?"
python3 - $W <<'P'
import json, sys
for f in ('e2e_128k_b7.jsonl', 'e2e_128k_b7_bf16.jsonl'):
    for l in open(sys.argv[1] + '/' + f):
        d = json.loads(l)
        print(f, d.get('method'), d.get('status'), 'tok/s %.1f' % d.get('tok_s', 0), 'ms/step %.2f' % d.get('ms_per_step', 0),
              'breakdown', d.get('breakdown_ms'), 'gpu_used', d.get('gpu_used_bytes'), 'plan gpu', d.get('plan', {}).get('gpu_bytes'))
P
tail -3 $W/e2e.log
tar czf $OUT/r25e2e.tgz -C $W .
