#!/usr/bin/env bash
# Run 17 A/B 3: the pre-merged estimation (split64ep / erp) against split64 / r / e, both flushes; with the
# selection split; the exact-grid tests (pre-merge cases) and their memcheck.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
bin/gpu_tests --gtest_filter='CudaExactGrid*' > $OUT/tests.log 2>&1; ts "tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/tests.log | head
timeout 120 compute-sanitizer --tool memcheck bin/gpu_tests --gtest_filter='CudaExactGrid.VariantsMatchV1' > $OUT/memcheck.log 2>&1; ts "memcheck rc=$?"; tail -2 $OUT/memcheck.log
KB="bin/kernel_bench --only retro --reps 30 --stages 1"
P=run10+split64,run10+split64r,run10+split64e,run10+split64ep,run10+split64erp
for f in write read; do
$KB --lengths 32768,131072 --batches 1,4,16 --flush $f --paths $P --out $OUT/ex_$f.jsonl 2>>$OUT/kb.err; ts "paths $f"
RETROINFER_SELECT_SPLIT=1 $KB --lengths 32768,131072 --batches 1,4,16 --flush $f --paths $P --out $OUT/exs_$f.jsonl 2>>$OUT/kb.err; ts "paths split $f"
done
python3 scripts/retro_phase_summary.py $OUT/*+*.jsonl > $OUT/summary.txt
python3 - $OUT <<'P'
import json,glob,sys,re
res={}
for fn in glob.glob(sys.argv[1]+'/*+*.jsonl'):
    name=fn.split('/')[-1]; stem,path=name.split('.',1)[0],name.split('+')[1][:-6]
    for l in open(fn):
        d=json.loads(l)
        if d['method']=='retro_graph': res[(stem,path,d['n'],d['batch'])]=d['ms']*1e3
for stem in sorted({k[0] for k in res}):
    for n in (32768,131072):
        print(stem, n, '  '.join(f"{p}:"+'/'.join(f"{res.get((stem,p,n,b),0):.1f}" for b in (1,4,16)) for p in ('split64','split64r','split64e','split64ep','split64erp')))
P
cd $OUT && tar czf paths.tgz *+*.jsonl kb.err tests.log && rm -f *+*.jsonl kb.err tests.log
