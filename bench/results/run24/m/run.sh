#!/usr/bin/env bash
# Run 24 call 15 (after calls 13-14 staged the SmolLM2 GGUF in two parts into /tmp/stage): main's final state (the
# score grid's query in shared memory, the default). The whole GPU suite with the real model; 128K batch 1 / 4 /
# 16 (read flush) bf16 (default, + full) and int8 scoring; 512K / 1M batch 1 both; the 4-layer stack at 128K
# batch 4 both; then the model / memory / q8 / joined / placement tests again under int8 scoring.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r24m; rm -rf $W; mkdir -p $W
mkdir -p /tmp/models && cat /tmp/stage/smol.part00 /tmp/stage/smol.part01 > /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
md5sum /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
RETROINFER_MODEL_DIR=/tmp/models timeout 330 bin/gpu_tests > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]|tests ran" $W/gpu_tests.log | cut -c1-200 | head -20
grep -B3 -A12 "FAILED  \]\|Failure" $W/gpu_tests.log | head -150 > $W/failures.log
for fmt in bf16 int8; do
  RETROINFER_SCORE_CENTROIDS=$fmt bin/kernel_bench --only full,retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kb_${fmt}.jsonl 2>>$W/kb.err; ts "kb $fmt"
  RETROINFER_SCORE_CENTROIDS=$fmt bin/kernel_bench --only full,retro --lengths 524288,1048576 --batches 1 --reps 20 --stages 1 --flush read --out $W/kb_long_${fmt}.jsonl 2>>$W/kb.err; ts "kb long $fmt"
  RETROINFER_SCORE_CENTROIDS=$fmt bin/kernel_bench --only full,retro --lengths 131072 --batches 4 --reps 20 --flush read --stack 4 --out $W/kb_stack_${fmt}.jsonl > /dev/null 2>>$W/kb.err; ts "kb stack $fmt"
done
python3 scripts/retro_phase_summary.py $W/kb_bf16.jsonl $W/kb_int8.jsonl $W/kb_long_bf16.jsonl $W/kb_long_int8.jsonl | cut -c1-200
for f in $W/kb_*.jsonl; do echo "$(basename $f): $(grep -h '"retro_graph"\|_stack\|"method":"full"' $f | python3 -c "
import sys, json
print('; '.join('%s %s b%s %.1f' % (d['method'], d['n'], d['batch'], d['ms']*1e3) for d in map(json.loads, sys.stdin)))")"; done
RETROINFER_SCORE_CENTROIDS=int8 RETROINFER_MODEL_DIR=/tmp/models timeout 200 bin/gpu_tests --gtest_filter='CudaModel*:CudaRetroMemory*:CudaScoreQ8*:CudaJoined*:CudaPlacement*' > $W/int8_tests.log 2>&1; ts "int8 tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]" $W/int8_tests.log | cut -c1-200 | head -10
tar czf $OUT/r24m.tgz -C $W .
