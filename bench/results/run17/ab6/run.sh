#!/usr/bin/env bash
# Run 17 A/B 6: the exact-grid variants again, now with run10c's PDL combine (the default merge), both flushes.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
for f in write read; do
bin/kernel_bench --only retro --reps 30 --stages 1 --lengths 32768,131072 --batches 1,4,16 --flush $f --paths run10c+split64r,run10c+split64e,run10c+split64eri,run10c+split64rih --out $OUT/x_$f.jsonl 2>>$OUT/kb.err
done
bin/kernel_bench --only retro --reps 20 --stages 1 --lengths 524288,1048576 --batches 1,4 --paths run10c+split64r,run10c+split64e --out $OUT/x_long.jsonl 2>>$OUT/kb.err
python3 - $OUT <<'P'
import json,glob,sys
res={}
for fn in glob.glob(sys.argv[1]+'/*+*.jsonl'):
    name=fn.split('/')[-1]; stem=name.split('.')[0]; path=name[len(stem)+1:-6].split('+')[1]
    for l in open(fn):
        d=json.loads(l)
        if d['method']=='retro_graph': res.setdefault((stem,d['n'],d['batch']),{})[path]=round(d['ms']*1e3,1)
for k in sorted(res): print(k, res[k])
P
cd $OUT && tar czf paths.tgz *+*.jsonl kb.err && rm -f *+*.jsonl kb.err
