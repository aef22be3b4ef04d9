#!/usr/bin/env bash
# Run 19, the joined decode with CUDA graphs of its non-attention work (per row count, captured at the second
# step): its tests, all GPU tests (SmolLM2 from /tmp/models) and joined_decode_bench on the Llama-3-8B shape and SmolLM2.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/joined2; rm -rf $W; mkdir -p $W
timeout 200 bin/gpu_tests --gtest_filter='CudaJoined*' > $W/joined_tests.log 2>&1; ts "joined tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|\[cuda_joined\]" $W/joined_tests.log | cut -c1-260
grep -B3 -A12 "Failure\|what()" $W/joined_tests.log | head -40
timeout 150 bin/joined_decode_bench llama3-8b 1,4,8,16 1024 16 full > $W/llama3_full.jsonl 2> $W/bench.err; ts "bench full rc=$?"
timeout 150 bin/joined_decode_bench llama3-8b 1,4,8,16 8192 16 retro > $W/llama3_retro.jsonl 2>> $W/bench.err; ts "bench retro rc=$?"
timeout 100 bin/joined_decode_bench /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf 1,4,8,16 512 32 full > $W/smollm2_full.jsonl 2>> $W/bench.err; ts "bench smol rc=$?"
python3 - $W/*.jsonl <<'PY'
import json,sys
for f in sys.argv[1:]:
    for l in open(f):
        r=json.loads(l); print(f.split('/')[-1], r['method'], r['mode'], r['batch'], round(r['ms_per_step'],2), round(r['tokens_per_s'],1))
PY
grep -v autotune $W/bench.err | tail -3
RETROINFER_MODEL_DIR=/tmp/models timeout 240 bin/gpu_tests --gtest_filter='-CudaJoined*' > $W/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]" $W/gpu_tests.log | head -8
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \]|tests ran|greedy|\[cuda_joined\]" $W/joined_tests.log $W/gpu_tests.log | cut -c1-240 > $OUT/gpu_tests_summary.log
cd $W && tar czf $OUT/joined2.tgz --exclude=gpu_tests.log *
