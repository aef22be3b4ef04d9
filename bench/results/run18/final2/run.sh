#!/usr/bin/env bash
# Run 18 final 2: main after the selection's shared compaction chunk (select_common.cuh CompactChunk: the radix
# kernel and the bins kernel's v1 compaction): all GPU tests (SmolLM2 from /tmp/models), memcheck of the selection
# suites, the retro step per flush (the default path does not run the changed code; a check that nothing moved).
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/final2; rm -rf $W; mkdir -p $W
md5sum /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
RETROINFER_MODEL_DIR=/tmp/models timeout 300 bin/gpu_tests > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]" $W/gpu_tests.log | head
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]|tests ran|greedy" $W/gpu_tests.log > $OUT/gpu_tests_summary.log
grep -E "^\[ *(OK|FAILED) *\] CudaSelect" $W/gpu_tests.log | head -20
timeout 150 compute-sanitizer --tool memcheck bin/gpu_tests --gtest_filter='CudaSelect.*:CudaSelectCompact.*' > $W/memcheck.log 2>&1; ts "memcheck rc=$?"; tail -2 $W/memcheck.log
bin/kernel_bench --only full,retro --lengths 32768,131072 --batches 1,4,16 --reps 20 --stages 1 --out $W/kb.jsonl 2>$W/kb.err; ts kb
bin/kernel_bench --only full,retro --lengths 32768,131072 --batches 1,4,16 --reps 20 --stages 1 --flush read --out $W/kb_read.jsonl 2>>$W/kb.err; ts "kb read"
python3 scripts/retro_phase_summary.py $W/kb.jsonl $W/kb_read.jsonl > $W/retro_summary.txt; cut -c1-60 $W/retro_summary.txt
cp $W/retro_summary.txt $OUT/
cd $W && tar czf $OUT/final2.tgz --exclude=gpu_tests.log *
