#!/usr/bin/env bash
# Run 17 final, part a: all GPU tests (SmolLM2 when /tmp/models holds it), the kernel table (write and read
# flush), retro at 512K / 1M, k-means at 512K; one tarball plus the logs' summaries.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/final_a; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $W/nvidia-smi.csv
RETROINFER_MODEL_DIR=/tmp/models bin/gpu_tests > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]" $W/gpu_tests.log | head -20
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]|tests ran|\[gguf|greedy|SmolLM2" $W/gpu_tests.log > $OUT/gpu_tests_summary.log
bin/kernel_bench --lengths 32768,131072 --batches 1,4,16 --reps 20 --stages 1 --out $W/kernel_bench.jsonl 2>$W/kb.err; ts "kernel_bench rc=$?"
bin/kernel_bench --only full,retro --lengths 32768,131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kernel_bench_read.jsonl 2>>$W/kb.err; ts "kernel_bench read"
bin/kernel_bench --only full,retro --lengths 524288,1048576 --batches 1,4 --reps 20 --stages 1 --out $W/kernel_bench_long.jsonl 2>>$W/kb.err; ts "long"
bin/kernel_bench --only kmeans --lengths 524288 --batches 1 --out $W/kmeans_512k.jsonl 2>>$W/kb.err; ts "kmeans 512k"
python3 scripts/retro_phase_summary.py $W/kernel_bench.jsonl $W/kernel_bench_read.jsonl $W/kernel_bench_long.jsonl > $W/retro_summary.txt
cut -c1-200 $W/retro_summary.txt
grep -h '"full"' $W/kernel_bench.jsonl $W/kernel_bench_read.jsonl $W/kernel_bench_long.jsonl | cut -c1-110
cp $W/retro_summary.txt $OUT/
cd $W && tar czf $OUT/final_a.tgz *
