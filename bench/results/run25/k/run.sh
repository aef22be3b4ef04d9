#!/usr/bin/env bash
# Run 25 call 13: run 17's exact-grid variants again under the new defaults (int8 scoring, run10s): the default
# split64r against split64e (estimation CTAs first), split64eri, split64ep / split64erp (pre-merged estimation
# states), one kernel_bench process per round (--paths), three rounds; 32K / 128K batch 1 / 4 / 16, 1M batch 1.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r25k; rm -rf $W; mkdir -p $W
P=run10s+split64r,run10s+split64e,run10s+split64eri,run10s+split64ep,run10s+split64erp
for rep in 1 2 3; do
  bin/kernel_bench --only retro --lengths 32768,131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --paths $P --out $W/kb_$rep.jsonl > /dev/null 2>>$W/kb.err
  ts "round $rep"
done
bin/kernel_bench --only retro --lengths 1048576 --batches 1 --reps 20 --stages 1 --flush read --paths $P --out $W/kb_long.jsonl > /dev/null 2>>$W/kb.err
ts long
python3 - $W <<'P'
import json, sys, glob, os, collections
W = sys.argv[1]
rows = collections.defaultdict(list)
for f in sorted(glob.glob(W + '/kb_*.run10s+*.jsonl')):
    v = f.split('run10s+')[1][:-6]
    for l in open(f):
        d = json.loads(l)
        if d['method'] == 'retro_graph': rows[(d['n'], d['batch'], v)].append(d['ms'] * 1e3)
for k in sorted(rows): print(k, ' '.join('%.1f' % x for x in rows[k]))
P
tar czf $OUT/r25k.tgz -C $W .
