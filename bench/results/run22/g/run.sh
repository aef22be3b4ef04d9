#!/usr/bin/env bash
# Run 22 call 9 (after two calls that stage the SmolLM2 GGUF in parts into /tmp/stage): the model GPU tests with
# the real model, then accuracy with retro scoring bf16 (default) against int8 (RETROINFER_SCORE_CENTROIDS):
# scripts/gpu-accuracy.sh, retro only, 20 samples per task and length at 4K / 8K, ppl at 4032 / 8128.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
mkdir -p /tmp/models && cat /tmp/stage/smol.part00 /tmp/stage/smol.part01 > /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
md5sum /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
RETROINFER_MODEL_DIR=/tmp/models timeout 200 bin/gpu_tests --gtest_filter='CudaModel*:CudaPlacement*:CudaJoined*' > $OUT/model_tests.log 2>&1; echo "model tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]|greedy" $OUT/model_tests.log | cut -c1-200 | head
for fmt in bf16 int8; do
  mkdir -p /tmp/acc_$fmt
  RETROINFER_SCORE_CENTROIDS=$fmt BIN_DIR=$S/bin DATA_DIR=$S/data OUT=/tmp/acc_$fmt BUDGET=230 PPL_BUDGET=40 \
    METHODS=retro SAMPLES=20 bash scripts/gpu-accuracy.sh /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf > /tmp/acc_$fmt.stdout 2>&1
  echo "accuracy $fmt rc=$?"
  (cd /tmp && tar czf $OUT/acc_$fmt.tgz acc_$fmt acc_$fmt.stdout)
  grep -A8 "| method\|^| retro" /tmp/acc_$fmt/report.md | grep "retro\|method" | head -8
done
