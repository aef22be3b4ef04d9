#!/usr/bin/env bash
# Run 21 call 6: the score grid's fixed-bin histogram for the bins selection (RETROINFER_SELECT_FIXED_BINS): its
# GPU tests, the retro step at 32K / 128K (read flush, phase stamps) with the switch off and on, then every GPU test.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r21f; rm -rf $W; mkdir -p $W
timeout 200 bin/gpu_tests --gtest_filter='CudaSelectFixed.*' > $W/fixed_tests.log 2>&1; ts "fixed tests rc=$?"
grep -E 'DIFFER|FAILED|Failure|NOT|layer|parse' $W/fixed_tests.log | cut -c1-240 | head -20
grep -c 'fixed bins;.*identical' $W/fixed_tests.log; tail -1 $W/fixed_tests.log
for v in 0 1; do
  RETROINFER_SELECT_FIXED_BINS=$v bin/kernel_bench --only retro --lengths 32768,131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/fx${v}.jsonl 2>>$W/kb.err; ts "fx$v rc=$?"
done
python3 scripts/retro_phase_summary.py $W/fx0.jsonl $W/fx1.jsonl | cut -c1-150
for f in $W/fx0.jsonl $W/fx1.jsonl; do echo "== $f"; grep -h '"retro_phases"' $f | python3 -c "
import json,sys
for l in sys.stdin:
    d=json.loads(l); ph=d['phases_ms']; print(d['n'], d['batch'], ' '.join(f'{k[7:]}={v*1e3:.2f}' for k,v in ph.items() if k.startswith('select_') and k not in ('select_start','select_end')))"; done
timeout 330 bin/gpu_tests > $W/all_tests.log 2>&1; ts "all gpu tests rc=$?"
grep -E '^\[  (PASSED|FAILED|SKIPPED) |tests ran|FAILED  \]' $W/all_tests.log | head -20
cp $W/* $OUT/ 2>/dev/null
