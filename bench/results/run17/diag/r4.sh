#!/usr/bin/env bash
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
for f in write read; do
bin/kernel_bench --only full,retro --lengths 131072 --batches 1,4,16 --reps 30 --stages 1 --flush $f --out $OUT/flush_$f.jsonl 2>/dev/null >/dev/null
done
python3 - $OUT <<'P'
import json,sys
for f in ('write','read'):
    for l in open(f'{sys.argv[1]}/flush_{f}.jsonl'):
        d=json.loads(l)
        if d['method'] in ('full','retro_graph'): print(f, d['method'], d['n'], d['batch'], round(d['ms']*1e3,1))
        if d['method']=='retro_phases':
            p=d['phases_ms']; print('  ', {k:round(v*1e3,1) for k,v in p.items() if not k.startswith('select_') or k in ('select_start','select_end')})
P
