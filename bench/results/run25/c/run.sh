#!/usr/bin/env bash
# Run 25 call 3: run10s with the selection's logits loaded as float4 quads (G <= 4) (run10c with the scores formed by the bins selection from the logits and partials, so the
# score grid has no grid barrier / formation), against run10c (the default) in one kernel_bench process (--paths).
# Tests: CudaDecodeRun10* (run10s bit-identical to run10c, graph replays, stage path) and the selection tests.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r25c; rm -rf $W; mkdir -p $W
timeout 250 bin/gpu_tests --gtest_filter='CudaDecodeRun10*:CudaSelect*:CudaDecodePaths*' > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $W/gpu_tests.log | head
grep -B3 -A12 "FAILED  \]\|Failure" $W/gpu_tests.log | head -60 > $W/failures.log
grep "decode run10\]" $W/gpu_tests.log | cut -c1-150 | head -20
for rep in 1 2; do
  for fmt in int8 bf16; do
    RETROINFER_SCORE_CENTROIDS=$fmt bin/kernel_bench --only retro --lengths 32768,131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --paths run10c,run10s --out $W/kb_${fmt}_$rep.jsonl > /dev/null 2>>$W/kb.err
    ts "kb $fmt $rep"
  done
  for path in run10c run10s; do
    RETROINFER_DECODE=$path RETROINFER_SCORE_CENTROIDS=int8 bin/kernel_bench --only full,retro --lengths 131072 --batches 4 --reps 20 --flush read --stack 4 --out $W/kb_stack_${path}_$rep.jsonl > /dev/null 2>>$W/kb.err
  done
  ts "stack $rep"
done
python3 scripts/retro_phase_summary.py $W/kb_int8_1.run10c.jsonl $W/kb_int8_1.run10s.jsonl 2>&1 | cut -c1-250
for f in $W/*.jsonl; do echo "$(basename $f): $(grep -h '"retro_graph"\|_stack' $f | python3 -c "
import sys, json
print('; '.join('%s %s b%s %.1f' % (d['method'], d['n'], d['batch'], d['ms']*1e3) for d in map(json.loads, sys.stdin)))")"; done
CO=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump 2>/dev/null)
if [ -n "$CO" ]; then for o in old new; do $CO -sass obj/$o.o > $W/sass_$o.txt 2>&1; done; fi
tar czf $OUT/r25c.tgz -C $W .
