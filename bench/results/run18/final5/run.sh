#!/usr/bin/env bash
# Run 18 final 5: main after the session refactor (ready_for_prompt, check_prefill_step; CPU code, the CUDA session takes the
# default): all GPU tests (SmolLM2 from /tmp/models) and the retro step at 128K batch 4 per flush.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/final5; rm -rf $W; mkdir -p $W
md5sum /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
RETROINFER_MODEL_DIR=/tmp/models timeout 300 bin/gpu_tests > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]" $W/gpu_tests.log | head
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]|tests ran|greedy" $W/gpu_tests.log > $OUT/gpu_tests_summary.log
bin/kernel_bench --only full,retro --lengths 131072 --batches 4 --reps 20 --out $W/kb.jsonl 2>$W/kb.err; ts kb
bin/kernel_bench --only full,retro --lengths 131072 --batches 4 --reps 20 --flush read --out $W/kb_read.jsonl 2>>$W/kb.err; ts "kb read"
grep -h '"retro_graph"\|"full"' $W/kb.jsonl $W/kb_read.jsonl | cut -c1-90
cd $W && tar czf $OUT/final5.tgz --exclude=gpu_tests.log *
