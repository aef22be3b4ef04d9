#!/usr/bin/env bash
# Run 17 final, part c: full vs torch SDPA in one call (both flushes), the end-to-end decode; one tarball.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/final_c; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $W/nvidia-smi.csv
L=32768,131072,524288,1048576
bin/kernel_bench --only full --lengths $L --batches 1,4,16 --reps 20 --out $W/full_write.jsonl 2>/dev/null; ts "full write"
bin/kernel_bench --only full --lengths $L --batches 1,4,16 --reps 20 --flush read --out $W/full_read.jsonl 2>/dev/null; ts "full read"
python3 scripts/torch_sdpa_bench.py --out $W/torch_write.jsonl --lengths $L --batches 1,4,16 --reps 20 --prefill-lengths 32768,131072,524288 --prefill-reps 2 > $W/torch.log 2>&1; ts "torch write"
python3 scripts/torch_sdpa_bench.py --out $W/torch_read.jsonl --lengths $L --batches 1,4,16 --reps 20 --prefill-lengths "" --flush read >> $W/torch.log 2>&1; ts "torch read"
python3 scripts/torch_sdpa_bench.py --summarize $W/full_write.jsonl $W/torch_write.jsonl | cut -d'|' -f1-8 > $W/full_vs_torch_write.md
python3 scripts/torch_sdpa_bench.py --summarize $W/full_read.jsonl $W/torch_read.jsonl | cut -d'|' -f1-8 > $W/full_vs_torch_read.md
cat $W/full_vs_torch_write.md $W/full_vs_torch_read.md
[ -f /tmp/final_a/kernel_bench.jsonl ] && python3 scripts/torch_sdpa_bench.py --summarize /tmp/final_a/kernel_bench.jsonl $W/torch_write.jsonl > $W/table.md && cat $W/table.md
timeout 300 bin/retroinfer bench decode --model llama3-8b --steps 20 --warmup 3 --contexts 131072 --placement gpu \
  --synthetic always --batches 7 --methods full,retro --out $W/e2e_128k_b7.jsonl > $W/e2e.log 2>&1; ts "e2e rc=$?"
grep -o '"method":"[a-z]*"\|"tok_per_s":[0-9.]*\|"tokens_per_s":[0-9.]*' $W/e2e_128k_b7.jsonl | tr '\n' ' '; echo
tail -3 $W/e2e.log
cd $W && tar czf $OUT/final_c.tgz *
