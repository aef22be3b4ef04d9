#!/usr/bin/env bash
# Run 27 call 4 (SmolLM2 staged in three parts into /tmp/stage by calls 1-3): the q8p argmax checked exactly
# (k-means and wave parity tests), the k-means build timed per assignment variant and segment-iteration count
# (32K, 128K, 512K) with torch's prefill as the denominator, then the accuracy A/B of the iteration count:
# teacher-forced ppl / KL / top-1 against full attention, SmolLM2 on the CUDA runner, seven processes at once.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=$OUT
mkdir -p /tmp/models && cat /tmp/stage/smol.part00 /tmp/stage/smol.part01 /tmp/stage/smol.part02 > /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
md5sum /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
M=/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
timeout 120 bin/gpu_tests --gtest_filter='CudaKMeans*:CudaWaveParity*' > $W/tests_km.log 2>&1; ts "tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|kmeans q8\]|kmeans parity\]|wave parity\] retro" $W/tests_km.log | cut -c1-200
grep -B3 -A12 "Failure" $W/tests_km.log | head -40
KB="bin/kernel_bench --only kmeans --batches 1"
timeout 150 $KB --lengths 32768,131072 --kmeans-variants q8/fast,q8p/fast --kmeans-iters 9,2,1,0 --kmeans-phases 1 --kmeans-builds 7 --out $W/kmeans.jsonl > /dev/null 2>>$W/kb.err; ts "kb rc=$?"
for t in 22 41b1; do
  RETROINFER_KMEANS_Q8P_TILE=$t timeout 60 $KB --lengths 32768,131072 --kmeans-variants q8p/fast --kmeans-iters 1 --kmeans-builds 7 --out $W/tile_$t.jsonl > /dev/null 2>>$W/kb.err; ts "tile $t rc=$?"
done
timeout 100 $KB --lengths 524288 --kmeans-variants q8p/fast --kmeans-iters 9,1 --kmeans-builds 3 --out $W/kmeans_512k.jsonl > /dev/null 2>>$W/kb.err; ts "kb 512k rc=$?"
timeout 60 python3 scripts/torch_prefill_bench.py --lengths 32768,131072 --out $W/torch_prefill.jsonl > /dev/null 2>>$W/torch.err; ts "torch rc=$?"
python3 - $W <<'PY'
import sys, json, glob
W = sys.argv[1]
torch = {}
for l in open(W + '/torch_prefill.jsonl'):
    d = json.loads(l)
    if d.get('variant') == 'whole' and 'ms' in d: torch[d['n']] = d['ms']
print('torch', torch)
for f in ['kmeans.jsonl', 'tile_22.jsonl', 'tile_41b1.jsonl', 'kmeans_512k.jsonl']:
    for l in open(W + '/' + f):
        d = json.loads(l)
        if d.get('method') == 'kmeans':
            t = torch.get(d['n'])
            print(f, d['n'], d['assign_variant'], 'it', d['segment_iters'], 'ms %.3f min %.3f ours-prefill %.2f' % (d['ms'], d['ms_min'], d['prefill_ms']), 'torch-ratio %.4f' % (d['ms'] / t) if t else '')
        if d.get('method') == 'kmeans_phases':
            print(f, d['n'], d['assign_variant'], 'it', d['segment_iters'], {k: round(v, 3) for k, v in d['phases_ms'].items()}, 'sum %.3f' % d['phases_sum_ms'])
PY
run_ppl() { tag=$1; shift; timeout 280 bin/retroinfer eval ppl --device cuda --model $M --text-file data/ppl_text.txt --methods full,retro --forced 64 --time-budget 230 "$@" --json $W/ppl_$tag.json > $W/ppl_$tag.log 2>&1; }
run_ppl p4032_i9 --prefix 4032 --windows 32 --kmeans-iters 9 &
run_ppl p4032_i1 --prefix 4032 --windows 32 --kmeans-iters 1 &
run_ppl p8128_i9 --prefix 8128 --windows 24 --kmeans-iters 9 &
run_ppl p8128_i1 --prefix 8128 --windows 24 --kmeans-iters 1 &
run_ppl p8128s2k_i9 --prefix 8128 --windows 24 --segment-tokens 2048 --kmeans-iters 9 &
run_ppl p8128s2k_i1 --prefix 8128 --windows 24 --segment-tokens 2048 --kmeans-iters 1 &
run_ppl p8128s2k_i0 --prefix 8128 --windows 24 --segment-tokens 2048 --kmeans-iters 0 &
wait; ts "ppl done"
python3 - $W <<'PY'
import sys, json, glob
for f in sorted(glob.glob(sys.argv[1] + '/ppl_*.json')):
    d = json.load(open(f))
    for m in d['methods']:
        if m['method'] == 'retro':
            print(f.split('/')[-1], 'windows %d/%d' % (d['windows_run'], d['windows']), 'ppl %+.4f kl %.5f top1 %.4f exact %.1f' % (m['ppl_rel_diff'], m['kl_mean'], m['top1_agreement'], m['exact_tokens_per_head']))
PY
