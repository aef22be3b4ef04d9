#!/usr/bin/env bash
# Run 17 call: K/V prefetch of the likely retrieval clusters during the selection (RETROINFER_SELECT_PREFETCH=kv).
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
bin/gpu_tests --gtest_filter='CudaSelectPrefetch*' > $OUT/tests.log 2>&1; ts "tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|\[select prefetch\]" $OUT/tests.log | cut -c1-230 | head -40
for pf in off kv kv3 off kv; do
RETROINFER_SELECT_PREFETCH=$pf bin/kernel_bench --only retro --lengths 32768,131072 --batches 1,4,16 --reps 30 --stages 1 --out $OUT/pf_$pf.jsonl 2>/dev/null >/dev/null; ts $pf
python3 - $OUT/pf_$pf.jsonl $pf <<'P'
import json,sys
for l in open(sys.argv[1]):
    d=json.loads(l)
    if d['method']=='retro_graph': print(sys.argv[2], d['n'], d['batch'], round(d['ms']*1e3,1))
    if d['method']=='retro' : print('   moved/req', d.get('moved_over_required'))
    if d['method']=='retro_phases' and d['n']==131072:
        p=d['phases_ms']; print('  ', {k:round(v*1e3,1) for k,v in p.items() if k in ('select_end','exact_start','exact_end','exact_end_first','exact_cta_mean','estimate_end','merge_end')})
P
done
