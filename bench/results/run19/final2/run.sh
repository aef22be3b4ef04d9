#!/usr/bin/env bash
# Run 19 final 2: main after the expansion rounds (expand_items) and 8 score loads in flight in the bins kernel: all GPU tests (SmolLM2 from
# /tmp/models), the kernel table under both flushes, 512K / 1M, and the end-to-end decode at 128K batch 7.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/final2; rm -rf $W; mkdir -p $W
md5sum /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
RETROINFER_MODEL_DIR=/tmp/models timeout 300 bin/gpu_tests > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]" $W/gpu_tests.log | head
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]|tests ran|greedy|\[select grid\] layer" $W/gpu_tests.log | cut -c1-200 > $OUT/gpu_tests_summary.log
bin/kernel_bench --lengths 32768,131072 --batches 1,4,16 --reps 20 --stages 1 --out $W/kernel_bench.jsonl 2>$W/kb.err; ts kb
bin/kernel_bench --only full,retro --lengths 32768,131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kernel_bench_read.jsonl 2>>$W/kb.err; ts "kb read"
bin/kernel_bench --only full,retro --lengths 524288,1048576 --batches 1,4 --reps 20 --stages 1 --out $W/kernel_bench_long.jsonl 2>>$W/kb.err; ts long
bin/kernel_bench --only full,retro --lengths 524288,1048576 --batches 1,4 --reps 20 --stages 1 --flush read --out $W/kernel_bench_long_read.jsonl 2>>$W/kb.err; ts "long read"
timeout 200 bin/retroinfer bench decode --model llama3-8b --steps 20 --warmup 3 --contexts 131072 --placement gpu \
  --synthetic always --batches 7 --methods full,retro --out $W/e2e_128k_b7.jsonl > $W/e2e.log 2>&1; ts "e2e rc=$?"
python3 scripts/retro_phase_summary.py $W/kernel_bench.jsonl $W/kernel_bench_read.jsonl $W/kernel_bench_long.jsonl $W/kernel_bench_long_read.jsonl > $W/retro_summary.txt
cut -c1-100 $W/retro_summary.txt
grep -o '"method":"[a-z]*","model"\|"tok_s":[0-9.]*,"unix' $W/e2e_128k_b7.jsonl
cp $W/retro_summary.txt $OUT/
cd $W && tar czf $OUT/final2.tgz --exclude=gpu_tests.log *
