#!/usr/bin/env bash
# Run 25 calls 22-25 (calls 22-24 staged the SmolLM2 GGUF in three parts into /tmp/stage): the whole GPU suite on
# main's final build (after the last CUDA source change, the tile-epilogue refactor and comment commits: PTX
# identical to call 16's), with the model; then the 128K batch 4 pair (read flush) and the stack of 4 once more.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r25last; rm -rf $W; mkdir -p $W
mkdir -p /tmp/models && cat /tmp/stage/smol.part00 /tmp/stage/smol.part01 /tmp/stage/smol.part02 > /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
md5sum /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
RETROINFER_MODEL_DIR=/tmp/models timeout 300 bin/gpu_tests > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]|tests ran|greedy tokens" $W/gpu_tests.log | cut -c1-200 | head -20
grep -B3 -A12 "FAILED  \]\|Failure" $W/gpu_tests.log | head -100 > $W/failures.log
bin/kernel_bench --only full,retro --lengths 131072 --batches 4 --reps 20 --stages 1 --flush read --out $W/kb.jsonl 2>>$W/kb.err; ts kb
bin/kernel_bench --only full,retro --lengths 131072 --batches 4 --reps 20 --flush read --stack 4 --out $W/kb_stack.jsonl > /dev/null 2>>$W/kb.err; ts stack
for f in $W/kb*.jsonl; do echo "$(basename $f): $(grep -h '"retro_graph"\|_stack\|"method":"full"' $f | python3 -c "
import sys, json
print('; '.join('%s %s b%s %.1f' % (d['method'], d['n'], d['batch'], d['ms']*1e3) for d in map(json.loads, sys.stdin)))")"; done
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]|tests ran|greedy tokens" $W/gpu_tests.log | cut -c1-200 > $W/gpu_tests_summary.log
tar czf $OUT/r25last.tgz -C $W failures.log gpu_tests_summary.log kb.jsonl kb_stack.jsonl kb.err
