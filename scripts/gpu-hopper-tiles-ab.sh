#!/usr/bin/env bash
# A/B of the Hopper prefill kernel's tile width on the GPU machine, one call (~5 min): the new build's CudaKvInt8 and
# CudaPrefill GPU tests with 176-key tiles (the default of this branch) and CudaPrefill again with 128
# (RETROINFER_HOPPER_KEYS=128); prefill_bench (one layer, Llama-3-8B heads, 32K and 128K, 8192-token chunks and one
# call) of main's build (bin/prefill_bench_base, staged beside), of this build at 176 and at 128; torch SDPA on the
# same shapes; the model prefill (Llama-3-8B shape, full, 128K, 2048-token chunks) of this build and of main's
# (bin/retroinfer_base); 2048-token chunks of the kernel; model_ops_bench's products at 2048 and 8192 rows.
# Results under $OUT/r, packed into $OUT/r.tgz after every step (a killed call still returns what it has).
# Staging here (main's binaries from a CUDA build of main, e.g. a fresh-clone CI build):
#   BINARIES="retroinfer gpu_tests prefill_bench model_ops_bench" XZ_LEVEL=6 bash scripts/gpu-stage.sh build/cuda-release
#   for b in prefill_bench retroinfer; do strip -o /tmp/$b MAIN_BUILD/bin/$b && xz -6 -c /tmp/$b > .gpu-stage/run/bin/${b}_base.xz; done
# (~30 MB: carry [".gpu-stage/run"]). There:
#   STAGE=.gpu-stage/run OUT=$OUT bash scripts/gpu-hopper-tiles-ab.sh
set -u
T0=$(date +%s)
STAGE=$(cd "${STAGE:?STAGE=the staged build}" && pwd)
el() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; [ -d "$OUT/r" ] && tar czf "$OUT/r.tgz" -C "$OUT" r 2>/dev/null; }
source "$STAGE/scripts/gpu-env.sh"
B=$STAGE/bin
R=$OUT/r; mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$R/gpu.txt" 2>&1; cat "$R/gpu.txt"
src_root=${SOURCE_ROOT:-/work/main}
[ -e "$src_root/tests/data" ] || { mkdir -p "$(dirname "$src_root")" && ln -sfn "$PWD" "$src_root"; }
timeout 150 "$B/gpu_tests" --gtest_brief=1 --gtest_filter='CudaKvInt8.*:CudaPrefill.*' > "$R/tests_176.log" 2>&1
el "tests 176 rc=$?"; grep -E "FAILED|PASSED|^\[prefill" "$R/tests_176.log" | head -40
L=32768,131072
bench() {  # name binary chunk [env]
  env ${4:-} timeout 60 "$2" --lengths $L --kernels hopper --chunk "$3" --reps 3 --out "$R/$1.jsonl" > /dev/null \
    2>> "$R/$1.err"
  el "$1 rc=$?"
}
bench base "$B/prefill_bench_base" 8192
bench new176 "$B/prefill_bench" 8192
bench new128 "$B/prefill_bench" 8192 RETROINFER_HOPPER_KEYS=128
timeout 120 python3 "$STAGE/scripts/torch_prefill_bench.py" --out "$R/sdpa.jsonl" --lengths $L --reps 3 > /dev/null \
  2> "$R/sdpa.err"
el "sdpa rc=$?"
summary() {
  python3 - "$R" <<'PY'
import json, os, sys
for name in ("base", "new128", "new176", "base_c2048", "new176_c2048", "sdpa", "model_new", "model_base"):
    p = os.path.join(sys.argv[1], name + ".jsonl")
    if not os.path.exists(p):
        continue
    for line in open(p):
        j = json.loads(line)
        print(name, {k: j[k] for k in j if k in ("n", "chunk", "impl", "mode", "ms", "tflops", "context", "prefill_tok_s")})
PY
}
summary
model() {  # name binary
  timeout 100 "$2" bench decode --model llama3-8b --contexts 131072 --batches 1 --methods full --placement gpu \
    --synthetic never --max-real-prefill 131072 --prefill-chunk 2048 --steps 2 --warmup 1 --out "$R/model_$1.jsonl" \
    > "$R/model_$1.log" 2>&1
  el "model $1 rc=$?"
}
model new "$B/retroinfer"
model base "$B/retroinfer_base"
RETROINFER_HOPPER_KEYS=128 timeout 60 "$B/gpu_tests" --gtest_brief=1 --gtest_filter='CudaPrefill.*' > "$R/tests_128.log" 2>&1
el "tests 128 rc=$?"; grep -E "FAILED|PASSED" "$R/tests_128.log" | head -10
bench base_c2048 "$B/prefill_bench_base" 2048
bench new176_c2048 "$B/prefill_bench" 2048
summary
timeout 90 "$B/model_ops_bench" --rows 2048,8192 --variants 0 --out "$R/model_ops.jsonl" > "$R/model_ops.log" 2>&1
el "model_ops rc=$?"
