#!/usr/bin/env bash
# Run 18 call 10 (main, 13d5b9c): the exact grid's knobs under the 2-CTA cap: 3 cp.async stages per warp
# (RETROINFER_DECODE_STAGES=3), 1 CTA per multiprocessor, both, and cluster-contiguous K/V rows (--layout
# clustered: is the exact phase bound by the gather?). Read flush; one kernel_bench process per setting.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/ab10; rm -rf $W; mkdir -p $W
kb() {  # name, extra args, env...
  local name=$1 extra=$2; shift 2
  env "$@" timeout 150 bin/kernel_bench --only retro --lengths 32768,131072 --batches 1,4,16 --reps 30 --stages 1 \
    --flush read $extra --out $W/$name.jsonl 2>$W/$name.err; ts "$name rc=$?"
}
kb base ""
kb st3 "" RETROINFER_DECODE_STAGES=3
kb c1 "" RETROINFER_EXACT_CTAS_PER_SM=1
kb st3c1 "" RETROINFER_DECODE_STAGES=3 RETROINFER_EXACT_CTAS_PER_SM=1
kb lay "--layout clustered"
kb base2 ""
for f in base st3 c1 st3c1 lay base2; do python3 scripts/retro_phase_summary.py $W/$f.jsonl | sed "s|^|$f |" | cut -c1-500; done > $W/summary.txt
awk '{print $1, $3, $4, $5}' $W/summary.txt
grep "n=131072 b=4" $W/summary.txt | cut -c1-420
python3 - $W/lay.jsonl <<'PY'
import json,sys
for l in open(sys.argv[1]):
    r=json.loads(l)
    if r['method'] in ('retro_graph',): print(r.get('layout'), r['n'], r['batch'], round(r['ms']*1000,1))
PY
cp $W/summary.txt $OUT/
cd $W && tar czf $OUT/ab10.tgz *
