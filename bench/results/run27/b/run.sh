#!/usr/bin/env bash
# Run 27 call 5: after centre_q8 per head, the last mean update fused into the finalize and the segment tables
# uploaded only when they change: the k-means / parity / retro tests, the build timed at 32K / 128K / 512K
# (1 and 0 segment iterations; phases), torch's prefill, and Nsight Compute's kernel durations of one 32K build.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r27b; mkdir -p $W
timeout 200 bin/gpu_tests --gtest_filter='CudaKMeans*:CudaWaveParity*:CudaRetro*' > $W/tests.log 2>&1; ts "tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|kmeans parity\]|wave parity\] retro|kmeans fast\]" $W/tests.log | cut -c1-200 | head -30
grep -B3 -A12 "Failure" $W/tests.log | head -40
KB="bin/kernel_bench --only kmeans --batches 1"
timeout 120 $KB --lengths 32768,131072 --kmeans-iters 1,0 --kmeans-phases 1 --kmeans-builds 9 --out $W/kmeans.jsonl > /dev/null 2>>$W/kb.err; ts "kb rc=$?"
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
            print(f, d['n'], d['assign_variant'], 'it', d['segment_iters'], 'ms %.3f min %.3f p90 %.3f ours-prefill %.2f' % (d['ms'], d['ms_min'], d.get('ms_p90', 0), d['prefill_ms']), 'torch-ratio %.4f' % (d['ms'] / t) if t else '')
        if d.get('method') == 'kmeans_phases':
            print(f, d['n'], d['assign_variant'], 'it', d['segment_iters'], {k: round(v, 3) for k, v in d['phases_ms'].items()}, 'sum %.3f' % d['phases_sum_ms'])
PY
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
timeout 150 $NCU --kernel-name regex:'kmeans|assign|centre|mean_|init_kernel|update_|finalize|group|offsets|Radix|quantize|outlier|residual' --metrics gpu__time_duration.sum --csv bin/kernel_bench --only kmeans --lengths 32768 --batches 1 --kmeans-builds 1 --kmeans-iters 1 --out /tmp/kb_ncu.jsonl > $W/ncu_durations.csv 2> $W/ncu.err; ts "ncu rc=$?"
python3 - $W/ncu_durations.csv <<'PY' | tee $W/ncu_summary.txt
import sys, csv, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]; ki = hdr.index('Kernel Name'); vi = hdr.index('Metric Value')
ids = rows[1:]
last = max(i for i, r in enumerate(ids) if 'mean_partial' in r[ki])
tot = collections.OrderedDict(); cnt = collections.Counter()
for r in ids[last:]:
    name = r[ki].split('(')[0].split('<')[0][-60:]
    v = float(r[vi].replace(',', '')); tot[name] = tot.get(name, 0) + v; cnt[name] += 1
for k, v in tot.items(): print('%-60s %4d launches %9.1f us' % (k, cnt[k], v / 1e3))
print('sum %.1f us (the last build: every kernel from its mean_partial on; Nsight Compute locks clocks)' % (sum(tot.values()) / 1e3))
PY
cd /tmp && tar czf $OUT/r27b.tgz r27b
