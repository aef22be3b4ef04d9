#!/usr/bin/env bash
# The prefill checks on the GPU machine (issue "Prefill at the hardware's speed"), in sections that fit one
# device call each, ours and the peers in the same call:
#   tests    the GPU tests (TEST_FILTER narrows them)
#   kernel   prefill_bench (one layer, Llama-3-8B heads) with the portable and the Hopper kernel at KERNEL_LENGTHS
#            (default 32768,131072), whole prompt and 8192-token chunks, then torch SDPA on the same shapes
#   model    `bench decode` with a real prefill of the Llama-3-8B shape (random weights) at MODEL_CONTEXTS (default
#            32768 131072) in chunks of PREFILL_CHUNKS tokens (default 2048), full attention, and Hugging Face
#            transformers' prefill on the same shape (SKIP_HF=1: not)
#   timeline the model prefill of `model` with --prefill-breakdown at TIMELINE_CONTEXTS (default 131072) in chunks
#            of PREFILL_CHUNKS: where the GPU time goes (attention, the layers' other work, chunk starts / ends,
#            between chunks) against the wall time
#   isolated one layer's attention in one call at ISOLATED_LENGTHS (default 32768 131072), ours and every other staged
#            bin/prefill_bench_NAME (impl retroinfer_NAME: bin/prefill_bench_base, the build before, or variants of
#            one build for an A/B) and torch SDPA, each launch profiled alone by Nsight Compute (--clock-control
#            none): time, cycles, SM clock, tensor-pipe activity, DRAM bytes (isolated.jsonl; ncu_kernel_times.py)
#   products model_ops_bench's products at 2048 and 8192 rows, each cuBLAS launch (and the SwiGLU kernel) profiled alone
#            by Nsight Compute: products_ncu_launches.jsonl, one line per launch in order (each op's tuning
#            candidates, then its timed launches), and the same products timed back to back (products_model_ops.jsonl)
#   long     the same real prefill at LONG_CONTEXTS (default 524288) with LONG_METHODS (default full; full,retro gives
#            retro's index build as the difference): time to first token of a long prompt
#
#   STAGE=.gpu-stage/run OUT=$OUT SECTIONS="tests kernel" bash scripts/gpu-prefill-run.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
STAGE=$(cd "${STAGE:?STAGE=the staged build}" && pwd)
FINAL_OUT=${OUT:?OUT=the result folder}
# Everything is written under $OUT/results and packed into results.tar.gz at the end (a device call returns a
# few files only); summary.txt stays beside it.
OUT=$FINAL_OUT/results
source "$STAGE/scripts/gpu-env.sh"
BIN=$STAGE/bin
summary=$FINAL_OUT/summary.txt
mkdir -p "$OUT"
status=0
note() { echo "$*" | tee -a "$summary"; }
src_root=${SOURCE_ROOT:-/work/main}
if [ ! -e "$src_root/tests/data" ]; then mkdir -p "$(dirname "$src_root")" && ln -sfn "${CHECKOUT:-$PWD}" "$src_root"; fi
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader >> "$summary" 2>&1

# What sections isolated and products read of each profiled launch (scripts/ncu_kernel_times.py turns them into JSON).
NCU_METRICS=gpu__time_duration.sum,sm__cycles_elapsed.max,sm__cycles_elapsed.avg.per_second
NCU_METRICS=$NCU_METRICS,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum

section_tests() {
  local filter=${TEST_FILTER:-*}
  timeout "${TEST_TIMEOUT:-400}" "$BIN/gpu_tests" --gtest_brief=1 --gtest_filter="$filter" \
    --gtest_output=json:"$OUT/gpu_tests.json" > "$OUT/gpu_tests.log" 2>&1
  local rc=$?
  # --gtest_brief prints no OK lines: the counts come from gtest's closing summary.
  note "gpu_tests ($filter) exit code $rc: $(grep -E '^\[(==========| +PASSED +| +SKIPPED +| +FAILED +)\] [0-9]+ test' "$OUT/gpu_tests.log" | tr -s ' ' | tr '\n' ' ')"
  grep '^\[prefill' "$OUT/gpu_tests.log" | head -60 >> "$summary"
  [ $rc -eq 0 ] || status=1
}

section_kernel() {
  local lengths=${KERNEL_LENGTHS:-32768,131072}
  timeout 240 "$BIN/prefill_bench" --lengths "$lengths" --kernels portable,hopper --reps 3 \
    --out "$OUT/prefill_kernels.jsonl" > /dev/null 2> "$OUT/prefill_bench.err" || status=1
  note "prefill_bench exit code $?"
  cat "$OUT/prefill_kernels.jsonl" >> "$summary" 2>/dev/null
  PYTHONUNBUFFERED=1 timeout 200 python3 "$here/torch_prefill_bench.py" --out "$OUT/torch_sdpa_prefill.jsonl" \
    --lengths "$lengths" --reps 3 > /dev/null 2> "$OUT/torch_prefill.err"
  note "torch_prefill_bench exit code $?"
  cat "$OUT/torch_sdpa_prefill.jsonl" >> "$summary" 2>/dev/null
}

section_model() {
  for chunk in ${PREFILL_CHUNKS:-2048}; do
    for ctx in ${MODEL_CONTEXTS:-32768 131072}; do
      timeout 200 "$BIN/retroinfer" bench decode --model llama3-8b --contexts "$ctx" --batches 1 --methods full \
        --placement gpu --synthetic never --max-real-prefill "$ctx" --prefill-chunk "$chunk" --steps 4 --warmup 1 \
        --out "$OUT/model_prefill.jsonl" > "$OUT/model_prefill_${ctx}_$chunk.log" 2>&1 || status=1
      note "bench decode prefill $ctx, chunk $chunk: $(tail -1 "$OUT/model_prefill.jsonl" | python3 -c 'import json,sys; j=json.loads(sys.stdin.read()); print(j.get("prefill_tok_s"), "tok/s")' 2>&1)"
    done
  done
  [ -n "${SKIP_HF:-}" ] && return
  PYTHONUNBUFFERED=1 timeout 300 python3 "$here/hf_generate_bench.py" --out "$OUT/hf_prefill.jsonl" \
    --contexts "$(echo ${MODEL_CONTEXTS:-32768 131072} | tr ' ' ',')" --batches 1 --steps 2 > "$OUT/hf_prefill.log" 2>&1
  note "hf_generate_bench exit code $?"
  cat "$OUT/hf_prefill.jsonl" >> "$summary" 2>/dev/null
}

section_timeline() {
  for chunk in ${PREFILL_CHUNKS:-2048}; do
    for ctx in ${TIMELINE_CONTEXTS:-131072}; do
      timeout 200 "$BIN/retroinfer" bench decode --model llama3-8b --contexts "$ctx" --batches 1 --methods full \
        --placement gpu --synthetic never --max-real-prefill "$ctx" --prefill-chunk "$chunk" --steps 2 --warmup 1 \
        --prefill-breakdown --out "$OUT/prefill_timeline.jsonl" > "$OUT/prefill_timeline_${ctx}_$chunk.log" 2>&1 || status=1
      note "prefill timeline $ctx, chunk $chunk: $(tail -1 "$OUT/prefill_timeline.jsonl" | python3 -c 'import json,sys
j = json.loads(sys.stdin.read())
print("fill_s", j.get("fill_s"), "ms:", j.get("prefill_breakdown_ms"))' 2>&1)"
    done
  done
}

section_isolated() {
  local m=$NCU_METRICS
  for n in ${ISOLATED_LENGTHS:-32768 131072}; do
    for bin in "$BIN"/prefill_bench "$BIN"/prefill_bench_*; do
      [ -x "$bin" ] || continue
      local impl=retroinfer${bin#"$BIN"/prefill_bench}
      # The first launch is prefill_bench's warm-up; ISOLATED_LAUNCHES (default 2) after it are profiled.
      timeout 200 ncu --clock-control none -k regex:prefill_hopper --launch-skip 1 --launch-count "${ISOLATED_LAUNCHES:-2}" \
        --metrics "$m" --csv "$bin" --lengths "$n" --kernels hopper --chunk "$n" --reps 2 \
        > "$OUT/ncu_${impl}_$n.csv" 2> "$OUT/ncu_${impl}_$n.err" || status=1
      python3 "$here/ncu_kernel_times.py" --csv "$OUT/ncu_${impl}_$n.csv" --impl "$impl" --n "$n" >> "$OUT/isolated.jsonl" || status=1
    done
    PYTHONUNBUFFERED=1 timeout 200 ncu --clock-control none -k regex:'(?i)(fmha|flash|sdpa)' --launch-count 2 --metrics "$m" \
      --csv python3 "$here/torch_prefill_bench.py" --lengths "$n" --chunk "$n" --reps 1 --out "$OUT/torch_under_ncu.jsonl" \
      > "$OUT/ncu_torch_sdpa_$n.csv" 2> "$OUT/ncu_torch_sdpa_$n.err" || status=1
    python3 "$here/ncu_kernel_times.py" --csv "$OUT/ncu_torch_sdpa_$n.csv" --impl torch_sdpa --n "$n" >> "$OUT/isolated.jsonl" || status=1
  done
  note "isolated kernels: $(python3 -c 'import json,sys
for l in open(sys.argv[1]):
    j = json.loads(l); print(j["impl"], j["n"], j.get("ms"), "ms", j.get("cycles"), "cycles", j.get("sm_ghz"), "GHz;", end=" ")' "$OUT/isolated.jsonl" 2>&1)"
}

section_products() {
  local m=$NCU_METRICS
  timeout 400 ncu --clock-control none -k regex:'(?i)(gemm|xmma|nvjet|cutlass|sm90|swiglu)' --metrics "$m" --csv \
    "$BIN/model_ops_bench" --rows 2048,8192 --variants 0 --layers 2 --reps 2 --out "$OUT/products_under_ncu.jsonl" \
    > "$OUT/ncu_products.csv" 2> "$OUT/ncu_products.err" || status=1
  python3 "$here/ncu_kernel_times.py" --csv "$OUT/ncu_products.csv" --impl model_ops_bench \
    > "$OUT/products_ncu_launches.jsonl" || status=1
  timeout 120 "$BIN/model_ops_bench" --rows 2048,8192 --variants 0 --out "$OUT/products_model_ops.jsonl" \
    > /dev/null 2> "$OUT/products_model_ops.err" || status=1
  note "products: $(wc -l < "$OUT/products_ncu_launches.jsonl") launches profiled"
}

section_long() {
  for ctx in ${LONG_CONTEXTS:-524288}; do
    timeout "${LONG_TIMEOUT:-560}" "$BIN/retroinfer" bench decode --model llama3-8b --contexts "$ctx" --batches 1 \
      --methods "${LONG_METHODS:-full}" \
      --placement gpu --synthetic never --max-real-prefill "$ctx" --steps 4 --warmup 1 \
      --out "$OUT/long_prefill.jsonl" > "$OUT/long_prefill_$ctx.log" 2>&1 || status=1
    note "bench decode prefill $ctx: $(python3 -c 'import json,sys
for l in open(sys.argv[1]):
    j = json.loads(l)
    if j.get("context") == int(sys.argv[2]): print(j.get("method"), j.get("status"), "fill_s", j.get("fill_s"), "tok/s", j.get("tok_s"))' "$OUT/long_prefill.jsonl" "$ctx" 2>&1)"
  done
}

for s in ${SECTIONS:-tests kernel}; do
  t0=$SECONDS
  "section_$s"
  note "section $s: $((SECONDS - t0)) s"
done
tar czf "$FINAL_OUT/results.tar.gz" -C "$FINAL_OUT" results && rm -rf "$OUT"
exit $status
