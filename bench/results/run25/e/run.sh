#!/usr/bin/env bash
# Run 25 call 5: run10s with the selection's formation on MUFU.EX2 alone for exponents >= -126 (__expf's bits; its
# own path per item below): 2 quads in flight (bin/kernel_bench) and 1 (bin/kernel_bench_q1), against run10c.
# Tests: CudaDecodeRun10* (run10s bit-identical to run10c, also with a scaled query that takes the exact path).
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r25e; rm -rf $W; mkdir -p $W
timeout 250 bin/gpu_tests --gtest_filter='CudaDecodeRun10*:CudaSelect*' > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $W/gpu_tests.log | head
grep -B3 -A12 "FAILED  \]\|Failure" $W/gpu_tests.log | head -60 > $W/failures.log
grep "selection formation" $W/gpu_tests.log | head
for rep in 1 2; do
  for kb in kernel_bench kernel_bench_q1; do
    RETROINFER_SCORE_CENTROIDS=int8 bin/$kb --only retro --lengths 32768,131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --paths run10c,run10s --out $W/${kb}_int8_$rep.jsonl > /dev/null 2>>$W/kb.err
    ts "$kb int8 $rep"
  done
  RETROINFER_SCORE_CENTROIDS=bf16 bin/kernel_bench --only retro --lengths 32768,131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --paths run10c,run10s --out $W/kernel_bench_bf16_$rep.jsonl > /dev/null 2>>$W/kb.err
  for path in run10c run10s; do
    RETROINFER_DECODE=$path RETROINFER_SCORE_CENTROIDS=int8 bin/kernel_bench --only full,retro --lengths 131072 --batches 4 --reps 20 --flush read --stack 4 --out $W/kb_stack_${path}_$rep.jsonl > /dev/null 2>>$W/kb.err
  done
  ts "bf16 + stack $rep"
done
RETROINFER_SCORE_CENTROIDS=int8 bin/kernel_bench --only full,retro --lengths 524288,1048576 --batches 1 --reps 20 --stages 1 --flush read --paths run10c,run10s --out $W/kb_long_int8.jsonl > /dev/null 2>>$W/kb.err
ts "long"
python3 scripts/retro_phase_summary.py $W/kernel_bench_int8_1.run10c.jsonl $W/kernel_bench_int8_1.run10s.jsonl $W/kernel_bench_q1_int8_1.run10s.jsonl 2>&1 | grep "n=131072 b=4" | cut -c1-250
for f in $W/*.jsonl; do echo "$(basename $f): $(grep -h '"retro_graph"\|_stack\|"method":"full"' $f | python3 -c "
import sys, json
print('; '.join('%s %s b%s %.1f' % (d['method'], d['n'], d['batch'], d['ms']*1e3) for d in map(json.loads, sys.stdin)))")"; done
CO=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump 2>/dev/null)
[ -n "$CO" ] && $CO -sass obj/new.o > $W/sass_new.txt 2>&1
tar czf $OUT/r25e.tgz -C $W .
