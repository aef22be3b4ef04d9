#!/usr/bin/env bash
# Run 19 final 5: main after capture_graphs (one helper for the session's and the joined decoder's decode graphs): all GPU tests
# (SmolLM2 from /tmp/models) and the retro step at 128K batch 4 / 1M batch 1.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/final5; rm -rf $W; mkdir -p $W
md5sum /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
RETROINFER_MODEL_DIR=/tmp/models timeout 300 bin/gpu_tests > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]" $W/gpu_tests.log | head
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]|tests ran|greedy|\[cuda_joined\]" $W/gpu_tests.log | cut -c1-220 > $OUT/gpu_tests_summary.log
bin/kernel_bench --only full,retro --lengths 131072 --batches 4 --reps 20 --flush read --out $W/kb_read.jsonl 2>$W/kb.err; ts "kb read"
bin/kernel_bench --only full,retro --lengths 1048576 --batches 1 --reps 10 --out $W/kb_1m.jsonl 2>>$W/kb.err; ts "kb 1m"
grep -h '"retro_graph"\|"method":"full"' $W/kb_read.jsonl $W/kb_1m.jsonl | cut -c1-100
cd $W && tar czf $OUT/final5.tgz --exclude=gpu_tests.log *
