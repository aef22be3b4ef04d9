#!/usr/bin/env bash
# Run 17 A/B 5: run10c (no fused merge; combine_states chained by PDL) against the default, both flushes; its tests.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
bin/gpu_tests --gtest_filter='CudaDecodeRun10*:CudaDecodeRun9*:CudaExactGrid.VariantsMatchV1' > $OUT/tests.log 2>&1; ts "tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|run10c" $OUT/tests.log | cut -c1-100 | head -20
for f in write read; do
bin/kernel_bench --only retro --reps 30 --stages 1 --lengths 32768,131072 --batches 1,4,16 --flush $f --paths run10+split64r,run10c+split64r --out $OUT/c_$f.jsonl 2>>$OUT/kb.err; ts $f
done
bin/kernel_bench --only retro --reps 20 --stages 1 --lengths 524288,1048576 --batches 1,4 --paths run10+split64r,run10c+split64r --out $OUT/c_long.jsonl 2>>$OUT/kb.err; ts long
python3 - $OUT <<'P'
import json,glob,sys
res={}
for fn in glob.glob(sys.argv[1]+'/*+*.jsonl'):
    name=fn.split('/')[-1]; stem=name.split('.')[0]; path=name[len(stem)+1:-6]
    for l in open(fn):
        d=json.loads(l)
        if d['method']=='retro_graph': res.setdefault((stem,d['n'],d['batch']),{})[path]=d['ms']*1e3
        if d['method']=='retro_phases': res.setdefault((stem,d['n'],d['batch']),{})[path+'_tail']=(d['phases_ms'].get('merge_end',0)-max(d['phases_ms'].get('estimate_end',0),d['phases_ms'].get('exact_end',0)))*1e3
for k in sorted(res): print(k, {p:round(v,1) for p,v in sorted(res[k].items())})
P
python3 scripts/retro_phase_summary.py $OUT/*+*.jsonl > $OUT/summary.txt
cd $OUT && tar czf paths.tgz *+*.jsonl kb.err tests.log && rm -f *+*.jsonl kb.err tests.log
