#!/usr/bin/env bash
# A/B of the Hopper prefill kernel on the GPU machine, one call: the CudaPrefill GPU tests of this build, then
# prefill_bench (one layer, Llama-3-8B heads, 8192-token chunks and one call) of this build, of a baseline
# build's prefill_bench (bin/prefill_bench_base, staged beside: the kernel before a change) and torch SDPA on the
# same shapes; a table at the end.
#   STAGE=.gpu-stage/run OUT=$OUT [LEN=32768,131072] [TF='CudaPrefill.*'] bash scripts/gpu-prefill-ab.sh
set -u
STAGE=${STAGE:?STAGE=the staged build (scripts/gpu-stage.sh; add bin/prefill_bench_base)}
OUT=${OUT:?}
source "$STAGE/scripts/gpu-env.sh" > /dev/null
B=$STAGE/bin
src_root=${SOURCE_ROOT:-/work/main}
[ -e "$src_root/tests/data" ] || { mkdir -p "$(dirname "$src_root")" && ln -sfn "$PWD" "$src_root"; }
timeout 200 "$B/gpu_tests" --gtest_brief=1 --gtest_filter="${TF:-CudaPrefill.*}" > "$OUT/tests.log" 2>&1
echo "gpu_tests rc=$?"; grep -E "PASSED|FAILED|^\[prefill" "$OUT/tests.log" | head -30
L=${LEN:-32768,131072}
timeout 120 "$B/prefill_bench" --lengths "$L" --kernels hopper --chunk 8192 --reps 3 --out "$OUT/new.jsonl" > /dev/null 2> "$OUT/new.err"
echo "new rc=$?"
if [ -x "$B/prefill_bench_base" ]; then
  timeout 120 "$B/prefill_bench_base" --lengths "$L" --kernels hopper --chunk 8192 --reps 3 --out "$OUT/base.jsonl" \
    > /dev/null 2> "$OUT/base.err"
  echo "base rc=$?"
fi
[ -n "${NO_SDPA:-}" ] || { timeout 150 python3 "$STAGE/scripts/torch_prefill_bench.py" --out "$OUT/sdpa.jsonl" --lengths "$L" \
  --reps 3 > /dev/null 2> "$OUT/sdpa.err"; echo "sdpa rc=$?"; }
python3 - "$OUT" <<'PY'
import json, os, sys
for name in ("new", "base", "sdpa"):
    p = os.path.join(sys.argv[1], name + ".jsonl")
    if not os.path.exists(p):
        continue
    for line in open(p):
        j = json.loads(line)
        print(name, {k: j[k] for k in j if k in ("n", "length", "chunk", "kernel", "impl", "mode", "ms", "tflops", "tflop_s")})
PY
