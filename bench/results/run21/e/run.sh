#!/usr/bin/env bash
# Run 21 call 5: the cluster selection with 8 CTAs per head past 40960 items: its GPU tests (512K / 1M layers
# included), then the retro step at 128K-1M (read flush, phase stamps) with RETROINFER_SELECT_CL=0 and =1, and full.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r21e; rm -rf $W; mkdir -p $W
timeout 300 bin/gpu_tests --gtest_filter='CudaSelectCl.*' > $W/cl_tests.log 2>&1; ts "cl tests rc=$?"
grep -E 'DIFFER|FAILED|Failure|NOT|8 CTAs|65532|81920|layer' $W/cl_tests.log | cut -c1-260 | head -30
tail -1 $W/cl_tests.log
for v in 0 1; do
  RETROINFER_SELECT_CL=$v bin/kernel_bench --only retro --lengths 131072,262144,524288 --batches 1,4 --reps 20 --stages 1 --flush read --out $W/cl${v}.jsonl 2>>$W/kb.err; ts "cl$v rc=$?"
  RETROINFER_SELECT_CL=$v bin/kernel_bench --only retro --lengths 1048576 --batches 1 --reps 20 --stages 1 --flush read --out $W/cl${v}_1m.jsonl 2>>$W/kb.err; ts "cl$v 1m rc=$?"
done
bin/kernel_bench --only full --lengths 262144,524288,1048576 --batches 1,4 --reps 10 --flush read --out $W/full.jsonl 2>>$W/kb.err; ts "full rc=$?"
python3 scripts/retro_phase_summary.py $W/cl0.jsonl $W/cl1.jsonl $W/cl0_1m.jsonl $W/cl1_1m.jsonl | cut -c1-200
grep -h '"method":"full"' $W/full.jsonl | cut -c1-110
tail -3 $W/kb.err
cp $W/* $OUT/ 2>/dev/null
