#!/usr/bin/env bash
# Run 16 final, part a: all GPU tests (SmolLM2 when /tmp/models holds it), the kernel table, full vs torch.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $OUT/nvidia-smi.csv
RETROINFER_MODEL_DIR=/tmp/models bin/gpu_tests > $OUT/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]" $OUT/gpu_tests.log | head
bin/kernel_bench --lengths 32768,131072 --batches 1,4,16 --reps 20 --stages 1 --out $OUT/kernel_bench.jsonl 2>$OUT/kb.err; ts "kernel_bench rc=$?"
L=32768,131072,524288,1048576
bin/kernel_bench --only full --lengths $L --batches 1,4,16 --reps 20 --out $OUT/full_write.jsonl 2>>$OUT/kb.err; ts "full write"
bin/kernel_bench --only full --lengths $L --batches 1,4,16 --reps 20 --flush read --out $OUT/full_read.jsonl 2>>$OUT/kb.err; ts "full read"
python3 scripts/torch_sdpa_bench.py --out $OUT/torch_write.jsonl --lengths $L --batches 1,4,16 --reps 20 --prefill-lengths 32768,131072,524288 --prefill-reps 2 > $OUT/torch.log 2>&1; ts "torch write"
python3 scripts/torch_sdpa_bench.py --out $OUT/torch_read.jsonl --lengths $L --batches 1,4,16 --reps 20 --prefill-lengths "" --flush read >> $OUT/torch.log 2>&1; ts "torch read"
bin/kernel_bench --only full,retro --lengths 524288,1048576 --batches 1,4 --reps 20 --stages 1 --out $OUT/kernel_bench_long.jsonl 2>>$OUT/kb.err; ts "long"
bin/kernel_bench --only kmeans --lengths 524288 --batches 1 --out $OUT/kmeans_512k.jsonl 2>>$OUT/kb.err; ts "kmeans 512k"
python3 scripts/torch_sdpa_bench.py --summarize $OUT/kernel_bench.jsonl $OUT/torch_write.jsonl > $OUT/table.md
python3 scripts/torch_sdpa_bench.py --summarize $OUT/full_write.jsonl $OUT/torch_write.jsonl | cut -d'|' -f1-8 > $OUT/full_vs_torch_write.md
python3 scripts/torch_sdpa_bench.py --summarize $OUT/full_read.jsonl $OUT/torch_read.jsonl | cut -d'|' -f1-8 > $OUT/full_vs_torch_read.md
cat $OUT/table.md $OUT/full_vs_torch_write.md $OUT/full_vs_torch_read.md
grep -h retro_graph $OUT/kernel_bench_long.jsonl | cut -c1-120; grep -h '"full"' $OUT/kernel_bench_long.jsonl | cut -c1-100
cd $OUT && tar czf logs.tgz gpu_tests.log kb.err torch.log && rm -f gpu_tests.log kb.err torch.log
