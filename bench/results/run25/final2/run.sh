#!/usr/bin/env bash
# Run 25 call 20 (calls 17-19 staged the SmolLM2 GGUF in three parts into /tmp/stage; call 16 = ../final ran the whole
# suite on the same build without the model): the tests that need the model, CudaModel*, under the defaults (int8
# scoring, run10s) and again under bf16 scoring.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/r25final2; rm -rf $W; mkdir -p $W
mkdir -p /tmp/models && cat /tmp/stage/smol.part00 /tmp/stage/smol.part01 /tmp/stage/smol.part02 > /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
md5sum /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
RETROINFER_MODEL_DIR=/tmp/models timeout 200 bin/gpu_tests --gtest_filter='CudaModel*' > $W/model_tests.log 2>&1; ts "model tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]|greedy" $W/model_tests.log | cut -c1-220 | head -20
RETROINFER_SCORE_CENTROIDS=bf16 RETROINFER_MODEL_DIR=/tmp/models timeout 200 bin/gpu_tests --gtest_filter='CudaModel*' > $W/model_tests_bf16.log 2>&1; ts "bf16 model tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]|greedy" $W/model_tests_bf16.log | cut -c1-220 | head -20
tar czf $OUT/r25final2.tgz -C $W .
