#!/usr/bin/env bash
# Run 25 call 1: the fixed half-tile patch (run24/p/half_tail_fixed.patch). The wide int8 kernel takes a CTA's last group of fewer than 4 tiles in half tiles on every warp (Nsight in call 16: 22% of
# the int8 score grid's stall samples on the CTA barrier after the loops, warps 0-1 taking 6 tiles and 2-3 five). Score / decode
# tests under int8 scoring; 128K batch 1 / 4 / 16, 1M batch 1 and the stack of 4 with int8 scoring, this build
# against main (2e6d1aa) (bin/kernel_bench_base) interleaved.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r25a; rm -rf $W; mkdir -p $W
RETROINFER_SCORE_CENTROIDS=int8 timeout 200 bin/gpu_tests --gtest_filter='CudaScore*:CudaDecodeRun10*:CudaRetro*:CudaDecodeGraph*:CudaSelectCompact*' > $W/gpu_tests.log 2>&1; ts "gpu_tests int8 rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $W/gpu_tests.log | head
grep -B3 -A12 "FAILED  \]\|Failure" $W/gpu_tests.log | head -60 > $W/failures.log
grep "score q8\] kernel" $W/gpu_tests.log | cut -c1-160 | head -20
for rep in 1 2; do
  for b in base new; do
    kb=bin/kernel_bench; [ $b = base ] && kb=bin/kernel_bench_base
    RETROINFER_SCORE_CENTROIDS=int8 $kb --only retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kb_${b}_$rep.jsonl 2>>$W/kb.err
    RETROINFER_SCORE_CENTROIDS=int8 $kb --only retro --lengths 1048576 --batches 1 --reps 20 --flush read --out $W/kb_long_${b}_$rep.jsonl 2>>$W/kb.err
    RETROINFER_SCORE_CENTROIDS=int8 $kb --only full,retro --lengths 131072 --batches 4 --reps 20 --flush read --stack 4 --out $W/kb_stack_${b}_$rep.jsonl > /dev/null 2>>$W/kb.err
    ts "kb $b $rep"
  done
done
python3 scripts/retro_phase_summary.py $W/kb_base_1.jsonl $W/kb_new_1.jsonl | cut -c1-230
for f in $W/kb_*.jsonl; do echo "$(basename $f): $(grep -h '"retro_graph"\|_stack' $f | python3 -c "
import sys, json
print('; '.join('%s %s b%s %.1f' % (d['method'], d['n'], d['batch'], d['ms']*1e3) for d in map(json.loads, sys.stdin)))")"; done
tar czf $OUT/r25a.tgz -C $W .
