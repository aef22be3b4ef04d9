#!/usr/bin/env bash
# Run 17 A/B 4: split64 / r / ep at 512K and 1M (batch 1, 4), write flush.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
bin/kernel_bench --only retro --reps 20 --stages 1 --lengths 524288,1048576 --batches 1,4 --paths run10+split64,run10+split64r,run10+split64ep --out $OUT/long.jsonl 2>$OUT/kb.err
python3 - $OUT <<'P'
import json,glob,sys
for fn in sorted(glob.glob(sys.argv[1]+'/*+*.jsonl')):
    for l in open(fn):
        d=json.loads(l)
        if d['method']=='retro_graph': print(fn.split('+')[1][:-6], d['n'], d['batch'], round(d['ms']*1e3,1))
P
cd $OUT && tar czf paths.tgz *+*.jsonl kb.err && rm -f *+*.jsonl kb.err
