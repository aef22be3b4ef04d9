#!/usr/bin/env bash
# Run 26 calls 16-19 (SmolLM2 staged in three parts into /tmp/stage): every GPU test on main's final build (after the host-side clean-up of the k-means run)
# with the model; the k-means build at 32K / 128K (default q8 + count) and the 128K batch-4 decode pair.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=$OUT
mkdir -p /tmp/models && cat /tmp/stage/smol.part00 /tmp/stage/smol.part01 /tmp/stage/smol.part02 > /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
md5sum /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
RETROINFER_MODEL_DIR=/tmp/models timeout 330 bin/gpu_tests > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]|tests ran|greedy tokens|kmeans parity\]|wave parity\] retro|cuda_joined\] bf16" $W/gpu_tests.log | cut -c1-220 > $W/gpu_tests_summary.log; cat $W/gpu_tests_summary.log
grep -B3 -A12 "Failure" $W/gpu_tests.log | head -60
timeout 120 bin/kernel_bench --only kmeans --lengths 32768,131072 --batches 1 --kmeans-phases 1 --kmeans-builds 7 --out $W/kmeans.jsonl > /dev/null 2>>$W/kb.err; ts "kb kmeans rc=$?"
timeout 120 bin/kernel_bench --only full,retro --lengths 131072 --batches 4 --reps 20 --flush read --out $W/decode_128k_b4.jsonl > /dev/null 2>>$W/kb.err; ts "kb decode rc=$?"
python3 - $W <<'PY'
import sys, json
W = sys.argv[1]
for l in open(W + '/kmeans.jsonl'):
    d = json.loads(l)
    if d.get('method') == 'kmeans':
        print(d['n'], d['assign_variant'], d['group_variant'], 'ms %.3f min %.3f prefill %.2f ratio %.4f' % (d['ms'], d['ms_min'], d['prefill_ms'], d['kmeans_over_prefill']))
    if d.get('method') == 'kmeans_phases':
        print(d['n'], {k: round(v, 3) for k, v in d['phases_ms'].items()}, 'sum %.3f' % d['phases_sum_ms'])
for l in open(W + '/decode_128k_b4.jsonl'):
    d = json.loads(l)
    if d.get('method') in ('full', 'retro', 'retro_graph'): print(d['method'], d['n'], d['batch'], 'us %.1f' % (d['ms'] * 1e3))
PY
