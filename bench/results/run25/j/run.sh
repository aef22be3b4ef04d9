#!/usr/bin/env bash
# Run 25 call 12: the selection issues the normaliser's first partials before its logit loads (merge_head_normaliser_first) in its
# formation, against call 9's build (main) (bin/kernel_bench_base), interleaved; the selection /
# decode / score tests.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r25j; rm -rf $W; mkdir -p $W
timeout 250 bin/gpu_tests --gtest_filter='CudaDecodeRun10*:CudaSelect*:CudaScoreQ8*:CudaDecodeRun9*:CudaRetro*:CudaWaveParity*' > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $W/gpu_tests.log | head
grep -B3 -A12 "FAILED  \]\|Failure" $W/gpu_tests.log | head -60 > $W/failures.log
grep "selection formation" $W/gpu_tests.log | head
for rep in 1 2 3; do
  for b in base new; do
    kb=bin/kernel_bench; [ $b = base ] && kb=bin/kernel_bench_base
    $kb --only full,retro --lengths 32768,131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kb_${b}_$rep.jsonl 2>>$W/kb.err
    $kb --only full,retro --lengths 131072 --batches 4 --reps 20 --flush read --stack 4 --out $W/kb_stack_${b}_$rep.jsonl > /dev/null 2>>$W/kb.err
    ts "kb $b $rep"
  done
done
python3 scripts/retro_phase_summary.py $W/kb_base_1.jsonl $W/kb_new_1.jsonl | grep "131072 b=4" | cut -c1-200
for f in $W/kb_*.jsonl; do echo "$(basename $f): $(grep -h '"retro_graph"\|_stack\|"method":"full"' $f | python3 -c "
import sys, json
print('; '.join('%s %s b%s %.1f' % (d['method'], d['n'], d['batch'], d['ms']*1e3) for d in map(json.loads, sys.stdin)))")"; done
CO=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump 2>/dev/null)
[ -n "$CO" ] && $CO -sass obj/new.o > $W/sass_new.txt 2>&1
tar czf $OUT/r25j.tgz -C $W .
