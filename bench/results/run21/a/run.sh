#!/usr/bin/env bash
# Run 21 call 1: the cluster selection (select_cl.cu, RETROINFER_SELECT_CL=1): its GPU tests, then the retro step
# at 128K batch 1 / 4 / 16 (read flush) with the switch off and on (phase stamps), full and a stack of 4 with it on.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r21a; rm -rf $W; mkdir -p $W
timeout 200 bin/gpu_tests --gtest_filter='CudaSelectCl.*' > $W/cl_tests.log 2>&1; ts "cl tests rc=$?"
grep -E '^\[select cl\]|FAILED|Failure' $W/cl_tests.log | cut -c1-240 | head -60
tail -3 $W/cl_tests.log
RETROINFER_SELECT_CL=0 bin/kernel_bench --only retro --lengths 131072 --batches 1,4,16 --reps 20 --flush read --out $W/cl0_read.jsonl 2>$W/kb.err; ts "cl0 rc=$?"
RETROINFER_SELECT_CL=1 bin/kernel_bench --only full,retro --lengths 131072 --batches 1,4,16 --reps 20 --stack 4 --flush read --out $W/cl1_read.jsonl 2>>$W/kb.err; ts "cl1 rc=$?"
python3 scripts/retro_phase_summary.py $W/cl0_read.jsonl $W/cl1_read.jsonl
grep -h '"method":"full"\|_stack"' $W/cl1_read.jsonl | cut -c1-160
tail -5 $W/kb.err
cp $W/* $OUT/
