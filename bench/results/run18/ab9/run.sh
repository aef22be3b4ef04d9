#!/usr/bin/env bash
# Run 18 call 9: run10s with form_scores_vec (kC chunks x G 16-byte loads in flight, the first round behind the
# normaliser merge): the run 10 and selection suites, the retro step per flush and at 512K / 1M.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/ab9; rm -rf $W; mkdir -p $W
timeout 200 bin/gpu_tests --gtest_filter='CudaDecodeRun10.*:CudaSelect*:CudaDecodeRun9*:CudaDecodePaths*' > $W/tests.log 2>&1; ts "tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $W/tests.log | head -20
kb() {  # name, extra args
  local name=$1; shift
  timeout 150 bin/kernel_bench --only retro --reps 30 --stages 1 --paths run10c,run10s "$@" --out $W/$name.jsonl 2>$W/$name.err; ts "$name rc=$?"
}
kb w --lengths 32768,131072 --batches 1,4,16
kb r --lengths 32768,131072 --batches 1,4,16 --flush read
kb long --lengths 524288,1048576 --batches 1,4
for f in $W/*.run10*.jsonl; do python3 scripts/retro_phase_summary.py $f | sed "s|^|$(basename $f .jsonl) |" | cut -c1-500; done > $W/summary.txt
awk '{print $1, $3, $4, $5}' $W/summary.txt
python3 - $W/r.run10s.jsonl <<'PY'
import json,sys
for l in open(sys.argv[1]):
    r=json.loads(l)
    if r['method']=='retro_phases' and r['n']==131072: print(r['batch'], {k:round(v*1000,2) for k,v in r['phases_ms'].items() if k.startswith('select')})
PY
cp $W/summary.txt $OUT/
cd $W && tar czf $OUT/ab9.tgz --exclude='*.ncu-rep' *
