#!/usr/bin/env bash
# Run 24 call 2 (diagnostic): the selection's phases with warm caches (--stages 2: a replay right after another,
# no L2 flush) under both expansions, 128K batch 1 / 4, bf16 and int8 scoring.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
W=/tmp/r24b; rm -rf $W; mkdir -p $W
for fmt in bf16 int8; do
  for ex in items flat; do
    RETROINFER_SELECT_EXPAND=$ex RETROINFER_SCORE_CENTROIDS=$fmt bin/kernel_bench --only retro --lengths 131072 --batches 1,4 --reps 20 --stages 2 --flush read --out $W/kbw_${fmt}_${ex}.jsonl 2>>$W/kb.err
  done
done
python3 scripts/retro_phase_summary.py $W/kbw_*.jsonl | cut -c1-250
for f in $W/kbw_*.jsonl; do echo $f; grep -h '"retro_phases"' $f | python3 -c "
import sys, json
for l in sys.stdin:
    d = json.loads(l); p = d['phases_ms']
    print(d['batch'], ' '.join('%s=%.2f' % (k[7:], p[k]*1e3) for k in p if k.startswith('select_')), 'est_end=%.2f merge_end=%.2f' % (p['estimate_end']*1e3, p['merge_end']*1e3))"; done
tar czf $OUT/r24b.tgz -C $W .
