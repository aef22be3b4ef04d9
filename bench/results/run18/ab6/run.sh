#!/usr/bin/env bash
# Run 18 call 6: run10s with the logits loaded through L2 (__ldcg) in the selection's formation; its run 10 suite;
# the retro step per flush; Nsight Compute stall samples of the selection kernel under run10s at 128K batch 4.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/ab6; rm -rf $W; mkdir -p $W
timeout 200 bin/gpu_tests --gtest_filter='CudaDecodeRun10.*' > $W/tests.log 2>&1; ts "tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $W/tests.log | head -20
kb() {  # name, extra args
  local name=$1; shift
  timeout 150 bin/kernel_bench --only retro --reps 30 --stages 1 --paths run10c,run10s "$@" --out $W/$name.jsonl 2>$W/$name.err; ts "$name rc=$?"
}
kb w --lengths 32768,131072 --batches 1,4,16
kb r --lengths 32768,131072 --batches 1,4,16 --flush read
for f in $W/*.run10*.jsonl; do python3 scripts/retro_phase_summary.py $f | sed "s|^|$(basename $f .jsonl) |" | cut -c1-500; done > $W/summary.txt
awk '{print $1, $3, $4, $5}' $W/summary.txt
python3 - $W/r.run10s.jsonl <<'PY'
import json,sys
for l in open(sys.argv[1]):
    r=json.loads(l)
    if r['method']=='retro_phases' and r['n']==131072: print(r['batch'], {k:round(v*1000,2) for k,v in r['phases_ms'].items() if k.startswith('select')})
PY
RETROINFER_DECODE=run10s timeout 200 ncu --clock-control none --import-source no --section SourceCounters --section WarpStateStats -k regex:'select_bins' -c 1 -o $W/sel bin/kernel_bench --only retro --lengths 131072 --batches 4 --reps 1 > $W/ncu.log 2>&1; ts "ncu rc=$?"
ncu -i $W/sel.ncu-rep --page source --csv --print-source sass > $W/src.csv 2>>$W/ncu.log
python3 scripts/ncu_sass_top.py $W/src.csv 30 4 > $W/sass_top.txt 2>>$W/ncu.log
head -60 $W/sass_top.txt
ncu -i $W/sel.ncu-rep --page details > $W/details.txt 2>>$W/ncu.log; grep -E "Duration|Warp Cycles|Stall" $W/details.txt | head -20
rm -f $W/src.csv
cp $W/summary.txt $W/sass_top.txt $OUT/
cd $W && tar czf $OUT/ab6.tgz --exclude='*.ncu-rep' *
