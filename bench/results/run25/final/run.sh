#!/usr/bin/env bash
# Run 25 calls 17-20 (call 16 ran it without the model: the two-part staging exceeded the transfer limit) (calls 17-19 staged the SmolLM2 GGUF in three parts into /tmp/stage): main with the new defaults,
# int8 scoring (RETROINFER_SCORE_CENTROIDS unset; the index keeps no bf16 centroids) and run10s (the selection forms
# the scores). The whole GPU suite with the real model; the model / memory / score / decode / placement tests again
# under bf16 scoring (now opt-in); kernel_bench 32K / 128K batch 1 / 4 / 16 and 512K / 1M batch 1 (read flush) with
# full, both centroid formats; the 4-layer stack at 128K batch 4 both.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r25final; rm -rf $W; mkdir -p $W
mkdir -p /tmp/models && cat /tmp/stage/smol.part00 /tmp/stage/smol.part01 /tmp/stage/smol.part02 > /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
md5sum /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
RETROINFER_MODEL_DIR=/tmp/models timeout 330 bin/gpu_tests > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]|tests ran" $W/gpu_tests.log | cut -c1-200 | head -20
grep -B3 -A12 "FAILED  \]\|Failure" $W/gpu_tests.log | head -150 > $W/failures.log
for fmt in int8 bf16; do
  RETROINFER_SCORE_CENTROIDS=$fmt bin/kernel_bench --only full,retro --lengths 32768,131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kb_${fmt}.jsonl 2>>$W/kb.err; ts "kb $fmt"
  RETROINFER_SCORE_CENTROIDS=$fmt bin/kernel_bench --only full,retro --lengths 524288,1048576 --batches 1 --reps 20 --stages 1 --flush read --out $W/kb_long_${fmt}.jsonl 2>>$W/kb.err; ts "kb long $fmt"
  RETROINFER_SCORE_CENTROIDS=$fmt bin/kernel_bench --only full,retro --lengths 131072 --batches 4 --reps 20 --flush read --stack 4 --out $W/kb_stack_${fmt}.jsonl > /dev/null 2>>$W/kb.err; ts "kb stack $fmt"
done
python3 scripts/retro_phase_summary.py $W/kb_int8.jsonl $W/kb_bf16.jsonl | cut -c1-200
for f in $W/kb_*.jsonl; do echo "$(basename $f): $(grep -h '"retro_graph"\|_stack\|"method":"full"' $f | python3 -c "
import sys, json
print('; '.join('%s %s b%s %.1f' % (d['method'], d['n'], d['batch'], d['ms']*1e3) for d in map(json.loads, sys.stdin)))")"; done
RETROINFER_SCORE_CENTROIDS=bf16 RETROINFER_MODEL_DIR=/tmp/models timeout 200 bin/gpu_tests --gtest_filter='CudaModel*:CudaRetroMemory*:CudaScore*:CudaJoined*:CudaPlacement*:CudaDecodeRun10*:CudaRetro*:CudaWaveParity*' > $W/bf16_tests.log 2>&1; ts "bf16 tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]" $W/bf16_tests.log | cut -c1-200 | head -10
grep -B3 -A12 "FAILED  \]\|Failure" $W/bf16_tests.log | head -80 > $W/bf16_failures.log
tar czf $OUT/r25final.tgz -C $W .
