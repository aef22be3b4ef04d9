#!/usr/bin/env bash
# Run 25 call 11 (diagnostics of the selection's scores phase under run10s, 128K batch 4 and 32K batch 4, read flush):
# main (bin/kernel_bench), a throwaway build without the normaliser merge (bin/kernel_bench_nomerge: wrong scores,
# timing only), one loading the logits by __ldcg (bin/kernel_bench_ldcg), and main with RETROINFER_SELECT_SPLIT=1
# (two CTAs per head) and with run10c; interleaved, three rounds.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r25i; rm -rf $W; mkdir -p $W
for rep in 1 2 3; do
  for v in main nomerge ldcg split run10c; do
    kb=bin/kernel_bench; env=""
    case $v in nomerge) kb=bin/kernel_bench_nomerge;; ldcg) kb=bin/kernel_bench_ldcg;; split) env="RETROINFER_SELECT_SPLIT=1";; run10c) env="RETROINFER_DECODE=run10c";; esac
    env $env $kb --only retro --lengths 32768,131072 --batches 4,16 --reps 20 --stages 1 --flush read --out $W/kb_${v}_$rep.jsonl > /dev/null 2>>$W/kb.err
  done
  ts "round $rep"
done
python3 - $W <<'P'
import json, sys, glob, os
W = sys.argv[1]
for v in ['main', 'nomerge', 'ldcg', 'split', 'run10c']:
    for rep in (1, 2, 3):
        out = []
        for l in open(f'{W}/kb_{v}_{rep}.jsonl'):
            d = json.loads(l)
            if d['method'] == 'retro_graph': out.append('%s b%d %.1f' % (d['n'], d['batch'], d['ms'] * 1e3))
            if d['method'] == 'retro_phases' and d['batch'] == 4:
                ph = d['phases_ms']
                out.append('[%s b4 scores %.2f sel %.2f..%.2f merge_end %.2f]' % (d['n'], ph['select_scores'] * 1e3, ph['select_start'] * 1e3, ph['select_end'] * 1e3, ph['merge_end'] * 1e3))
        print(v, rep, '; '.join(out))
P
tar czf $OUT/r25i.tgz -C $W .
