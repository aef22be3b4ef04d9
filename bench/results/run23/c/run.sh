#!/usr/bin/env bash
# Run 23 call 5 (after calls 3-4 staged the SmolLM2 GGUF in two parts into /tmp/stage): main's candidate state
# (RETROINFER_SCORE default wide: CTA-wide stages for int8 centroids, the tma kernel for bf16; bf16 scoring the
# default, int8 opt-in) with a stamp of the score grid's last CTA start. The whole GPU suite with the real
# model; 128K batch 1 / 4 / 16 (read flush): defaults (+ full) and int8 scoring; 512K / 1M batch 1; the 4-layer
# stack at 128K batch 4 with int8; then the model / memory / q8 tests again under int8 scoring.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r23c; rm -rf $W; mkdir -p $W
mkdir -p /tmp/models && cat /tmp/stage/smol.part00 /tmp/stage/smol.part01 > /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
md5sum /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
RETROINFER_MODEL_DIR=/tmp/models timeout 300 bin/gpu_tests > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]|tests ran|cuda_joined\] bf16|SmolLM2.*greedy" $W/gpu_tests.log | cut -c1-260 | head -30
grep -B3 -A12 "FAILED  \]\|Failure" $W/gpu_tests.log | head -150 > $W/failures.log
bin/kernel_bench --only full,retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kb_default.jsonl 2>>$W/kb.err; ts "kb default"
RETROINFER_SCORE_CENTROIDS=int8 bin/kernel_bench --only retro --lengths 131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kb_int8.jsonl 2>>$W/kb.err; ts "kb int8"
bin/kernel_bench --only full,retro --lengths 524288,1048576 --batches 1 --reps 20 --stages 1 --flush read --out $W/kb_long_default.jsonl 2>>$W/kb.err; ts "kb long default"
RETROINFER_SCORE_CENTROIDS=int8 bin/kernel_bench --only retro --lengths 524288,1048576 --batches 1 --reps 20 --stages 1 --flush read --out $W/kb_long_int8.jsonl 2>>$W/kb.err; ts "kb long int8"
RETROINFER_SCORE_CENTROIDS=int8 bin/kernel_bench --only full,retro --lengths 131072 --batches 4 --reps 20 --flush read --stack 4 --out $W/kb_stack_int8.jsonl > $W/stack_stdout.txt 2>>$W/kb.err; ts "kb stack int8"
python3 scripts/retro_phase_summary.py $W/kb_default.jsonl $W/kb_int8.jsonl $W/kb_long_default.jsonl $W/kb_long_int8.jsonl | cut -c1-240
grep -h '"retro_graph"\|"method":"full"\|_stack' $W/kb_*.jsonl | cut -c1-130
RETROINFER_SCORE_CENTROIDS=int8 RETROINFER_MODEL_DIR=/tmp/models timeout 200 bin/gpu_tests --gtest_filter='CudaModel*:CudaRetroMemory*:CudaScoreQ8*:CudaJoined*:CudaPlacement*' > $W/int8_tests.log 2>&1; ts "int8 tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]|SmolLM2.*greedy|cuda_placement prefill\]" $W/int8_tests.log | cut -c1-260 | head -20
tar czf $OUT/r23c.tgz -C $W .
