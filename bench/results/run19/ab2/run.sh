#!/usr/bin/env bash
# Run 19 call 2: the grid selection with 16-byte histogram and score loads, the default past 40960 items: its tests,
# the grid forced at 32K / 128K against the one-CTA kernel (read flush), the default (grid) against the cluster kernel
# (RETROINFER_SELECT_GRID=0) at 512K / 1M, memcheck of the grid tests' small cases, then all other GPU tests.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/ab2; rm -rf $W; mkdir -p $W
timeout 240 bin/gpu_tests --gtest_filter='CudaSelectGrid*' > $W/grid_tests.log 2>&1; ts "grid tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $W/grid_tests.log | head
grep -E "\[select grid\]" $W/grid_tests.log | grep -v "identical; CPU rule and expansion ok" | cut -c1-250 | head -20
grep -B2 -A12 "Failure" $W/grid_tests.log | head -40
RETROINFER_SELECT_GRID=force bin/kernel_bench --only retro --lengths 32768,131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/force_read.jsonl 2>$W/kb.err; ts kbf
bin/kernel_bench --only retro --lengths 131072 --batches 4 --reps 20 --stages 1 --flush read --out $W/def_read.jsonl 2>>$W/kb.err; ts kbd
bin/kernel_bench --only full,retro --lengths 524288,1048576 --batches 1,4 --reps 10 --stages 1 --out $W/long_write.jsonl 2>>$W/kb.err; ts long
RETROINFER_SELECT_GRID=0 bin/kernel_bench --only retro --lengths 524288,1048576 --batches 1,4 --reps 10 --stages 1 --out $W/long_write_g0.jsonl 2>>$W/kb.err; ts long0
bin/kernel_bench --only full,retro --lengths 1048576 --batches 1 --reps 10 --stages 1 --flush read --out $W/long_read.jsonl 2>>$W/kb.err; ts longr
python3 scripts/retro_phase_summary.py $W/force_read.jsonl $W/def_read.jsonl $W/long_write.jsonl $W/long_write_g0.jsonl $W/long_read.jsonl > $W/summary.txt 2>&1
cut -c1-330 $W/summary.txt
python3 - $W/*.jsonl <<'PY'
import json,sys
for f in sys.argv[1:]:
    for l in open(f):
        r=json.loads(l)
        if r.get('method') in ('retro_graph','full'): print(f.split('/')[-1], r['method'], r['n'], r['batch'], round(r['ms']*1000,1))
        if r.get('method')=='retro_phases':
            p=r['phases_ms']; print(f.split('/')[-1], r['n'], r['batch'], {k[7:]:round(v*1000,2) for k,v in p.items() if k.startswith('select_')})
PY
tail -3 $W/kb.err
cd $W && tar czf $OUT/ab2.tgz --exclude=gpu_tests.log *; cd $S
timeout 100 compute-sanitizer --tool memcheck bin/gpu_tests --gtest_filter='CudaSelectGrid.Plan:CudaSelectGrid.MatchesBinsAndCpuRule' > $W/memcheck.log 2>&1; ts "memcheck rc=$?"
tail -3 $W/memcheck.log; cp $W/memcheck.log $OUT/ 2>/dev/null
timeout 200 bin/gpu_tests --gtest_filter='-CudaSelectGrid*' > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]|tests ran" $W/gpu_tests.log | head -20 | tee $OUT/gpu_tests_summary.log
