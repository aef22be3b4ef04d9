#!/usr/bin/env bash
# Run 19 call 3: the grid selection's per-head barrier with release / acquire fences (was __threadfence), the
# default from 24576 items: its tests, then where the grid kernel pays against the bins kernel: forced (force) or
# off (0) against the default at 128K / 256K / 512K, and the default at 1M under both flushes.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/ab3; rm -rf $W; mkdir -p $W
timeout 240 bin/gpu_tests --gtest_filter='CudaSelectGrid*' > $W/grid_tests.log 2>&1; ts "grid tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $W/grid_tests.log | head
grep -B2 -A12 "Failure" $W/grid_tests.log | head -30
for m in force 0 1; do
  RETROINFER_SELECT_GRID=$m bin/kernel_bench --only retro --lengths 131072,262144,524288 --batches 1,4 --reps 20 --stages 1 --flush read --out $W/g${m}_read.jsonl 2>>$W/kb.err; ts "kb $m"
done
bin/kernel_bench --only full,retro --lengths 262144,1048576 --batches 1 --reps 10 --stages 1 --out $W/long_write.jsonl 2>>$W/kb.err; ts long
bin/kernel_bench --only full,retro --lengths 262144,524288,1048576 --batches 1 --reps 10 --stages 1 --flush read --out $W/long_read.jsonl 2>>$W/kb.err; ts longr
python3 - $W/*.jsonl <<'PY'
import json,sys
for f in sys.argv[1:]:
    for l in open(f):
        r=json.loads(l)
        if r.get('method') in ('retro_graph','full'): print(f.split('/')[-1], r['method'], r['n'], r['batch'], round(r['ms']*1000,1))
        if r.get('method')=='retro_phases':
            p=r['phases_ms']; print(f.split('/')[-1], r['n'], r['batch'], {k[7:]:round(v*1000,2) for k,v in p.items() if k.startswith('select_')}, 'score_end', round(p['score_end']*1000,1), 'exact_start', round(p.get('exact_start',0)*1000,1))
PY
cd $W && tar czf $OUT/ab3.tgz *
