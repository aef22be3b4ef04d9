#!/usr/bin/env bash
# Run 24 call 8: the score tests after the query-switch test's fix; the merge grid launched early by the estimation
# grid's trigger (RETROINFER_EST_TRIGGER=1) against the default, int8 and bf16 scoring, 128K batch 1 / 4 / 16 and
# the stack of 4 (read flush).
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r24h; rm -rf $W; mkdir -p $W
timeout 200 bin/gpu_tests --gtest_filter='CudaScore*:CudaSelect*' > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $W/gpu_tests.log | head
grep -B3 -A12 "FAILED  \]\|Failure" $W/gpu_tests.log | head -40 > $W/failures.log
grep "query switch" $W/gpu_tests.log
RETROINFER_EST_TRIGGER=1 timeout 100 bin/gpu_tests --gtest_filter='CudaExactGrid*:CudaRetro.Graph*:CudaDecodeGraphs*' > $W/gpu_tests_trig.log 2>&1; ts "gpu_tests trigger rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $W/gpu_tests_trig.log | head
for fmt in int8 bf16; do
  for tr in 0 1; do
    RETROINFER_EST_TRIGGER=$tr RETROINFER_SCORE_CENTROIDS=$fmt bin/kernel_bench --only retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kb_${fmt}_t${tr}.jsonl 2>>$W/kb.err; ts "kb $fmt t$tr"
    RETROINFER_EST_TRIGGER=$tr RETROINFER_SCORE_CENTROIDS=$fmt bin/kernel_bench --only full,retro --lengths 131072 --batches 4 --reps 20 --flush read --stack 4 --out $W/kb_stack_${fmt}_t${tr}.jsonl > /dev/null 2>>$W/kb.err; ts "kb stack $fmt t$tr"
  done
done
for f in $W/kb_*.jsonl; do grep -h '"retro_phases"' $f | python3 -c "
import sys, json
for l in sys.stdin:
    d = json.loads(l); p = d['phases_ms']
    print('$(basename $f)', d['batch'], ' '.join('%s=%.2f' % (k, p[k]*1e3) for k in ['exact_end','estimate_start_last','estimate_end','merge_end'] if k in p))"; done
for f in $W/kb_*.jsonl; do echo "$(basename $f): $(grep -h '"retro_graph"\|_stack' $f | python3 -c "
import sys, json
print('; '.join('%s b%s %.1f' % (d['method'], d['batch'], d['ms']*1e3) for d in map(json.loads, sys.stdin)))")"; done
tar czf $OUT/r24h.tgz -C $W .
