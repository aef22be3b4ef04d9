#!/usr/bin/env bash
# The long-context run on the GPU machine (issues #27 and #28), in sections that fit one device call each.
# The models arrive first in parts (scripts/gpu-model-parts.sh) and are joined into $MODEL_DIR; the staged
# build (scripts/gpu-stage.sh) with data/ (scripts/gpu-accuracy-prep.sh) and prompts/ beside it.
#
#   STAGE=.gpu-stage/run OUT=$OUT SECTIONS="accuracy tests traces" bash scripts/gpu-long-context.sh
#
# Sections (run in the order given; `accuracy` runs in the background while the others run, and the script
# waits for it at the end):
#   accuracy   Qwen2.5-Coder-0.5B on the CUDA runner: the ten tasks at 4K, 8K, 16K (50 samples each) and
#              32K (25), methods full, retro, quest, streaming, oracle at matched exact-token budgets, and the
#              teacher-forced fidelity at 4K/8K/16K/32K prefixes; ACC_BUDGET seconds (default 480) in all;
#              RESUME=<folder with acc32k/ and acc4-16k/ results.jsonl of an earlier call> continues (a method
#              added to METHODS then runs alone on the resumed samples); ACC_JOBS_32K (4) and ACC_JOBS (5)
#              processes share the GPU
#   tests      the GPU tests (with SmolLM2)
#   hosttier   real models through the wave buffer's host tier: greedy tokens of every placement, and
#              `eval tasks` block-cache hit ratios at 2%, 5% and 10% cache
#   traces     retro's cluster selections recorded while decoding Qwen at 16K and 32K, replayed through
#              the block cache at 2%, 5% and 10%
#   bench      Llama-3-8B-shape host-tier decode at 128K with the recorded traces as the query source
#              (BENCH_RUNS picks the runs: gpu host_bf16 host_int8 synthetic joined split_1m by default; split_14:
#              14 x 128K split by the planner; hit80: batch 8 at 64K, host tier at 5/10/20% cache vs GPU-resident
#              (and 20% again with --stage-times);
#              BENCH_STEPS, BENCH_TIMEOUT (per run, 150 s) and SPLIT_1M_TIMEOUT (300 s) bound them)
#              BENCH_WARMUP (3) untimed steps first: more let the block cache reach its steady hit ratio;
#              HIT_FRACTIONS the cache fractions of hit80 ("0.05 0.10 0.20"), HIT_STORES its host stores
#              ("int8"; "int8 int4" runs both), STAGE_FRACTION the cache fraction of its --stage-times runs (0.20),
#              HIT_OLD_BIN a baseline build whose host runs follow each of ours (named *_old);
#              kv8_128k: full and retro over bf16 and int8 KV at 128K, batch 1 and max; kv8_1m: retro, 1M, int8
#   kv8real    SmolLM2 over the 8-bit KV cache: eval ppl of full / retro over int8 against bf16, greedy tokens
#   pplvariants  teacher-forced perplexity of the retro settings in PPL_VARIANT_GROUPS at 4K-32K prefixes
#   storeacc   the host store's element types (bf16, int8, int4) on a real model, every layer on the host tier:
#              teacher-forced perplexity / KL against full and the task average (STORE_TYPES picks them;
#              STORE_OLD_BIN adds the perplexity of a baseline build's STORE_OLD_TYPES, default int4)
# Everything lands in $OUT as at most 8 files (the device returns no more): summary.txt, one tarball per
# section and the accuracy reports.
set -u
here=$(cd "$(dirname "$0")" && pwd)
STAGE=$(cd "${STAGE:?STAGE=the staged build}" && pwd)
OUT=${OUT:?OUT=the result folder}
MODEL_DIR=${MODEL_DIR:-/tmp/models}
source "$STAGE/scripts/gpu-env.sh"
export RETROINFER_MODEL_DIR=$MODEL_DIR
BIN=$STAGE/bin
QWEN=$MODEL_DIR/qwen2.5-coder-0.5b-instruct.gguf
summary=$OUT/summary.txt
work=$OUT/work
mkdir -p "$work"
status=0
note() { echo "$*" | tee -a "$summary"; }
# The test binaries read fixtures from the source tree they were configured in (RETROINFER_TEST_DATA, compiled
# in): SOURCE_ROOT (default /work/main, the path of the build that was staged) is linked to this checkout when it
# does not exist here.
src_root=${SOURCE_ROOT:-/work/main}
if [ ! -e "$src_root/tests/data" ]; then mkdir -p "$(dirname "$src_root")" && ln -sfn "$(cd "$here/.." && pwd)" "$src_root"; fi
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader >> "$summary" 2>&1

acc_pids=()
section_accuracy() {
  local budget=${ACC_BUDGET:-480} d=$work/accuracy
  mkdir -p "$d"
  local resume32=() resume=()
  if [ -n "${RESUME:-}" ]; then
    [ -s "$RESUME/acc32k/results.jsonl" ] && resume32=(RESUME_DIR="$RESUME/acc32k")
    [ -s "$RESUME/acc4-16k/results.jsonl" ] && resume=(RESUME_DIR="$RESUME/acc4-16k")
  fi
  # Three process groups share the GPU: 32K tasks, 4K-16K tasks, the ppl prefixes.
  env "${resume32[@]}" OUT="$d/acc32k" BIN_DIR="$BIN" DATA_DIR="$STAGE/data" BUDGET="$budget" SKIP_PPL=1 \
    CONTEXTS=32768 SAMPLES=25 JOBS=${ACC_JOBS_32K:-4} THREADS=1 bash "$here/gpu-accuracy.sh" "$QWEN" > "$d/acc32k.log" 2>&1 &
  acc_pids+=($!)
  env "${resume[@]}" OUT="$d/acc4-16k" BIN_DIR="$BIN" DATA_DIR="$STAGE/data" BUDGET="$budget" SKIP_PPL=1 \
    CONTEXTS=4096,8192,16384 SAMPLES=50 JOBS=${ACC_JOBS:-5} THREADS=1 bash "$here/gpu-accuracy.sh" "$QWEN" > "$d/acc4-16k.log" 2>&1 &
  acc_pids+=($!)
  if [ "${SKIP_PPL:-0}" != 1 ]; then
    for pw in 4032:8 8128:8 16320:4 32704:2; do
      local p=${pw%:*} w=${pw#*:}
      timeout $(( budget + 30 )) "$BIN/retroinfer" eval ppl --model "$QWEN" --device cuda --threads 1 \
        --prefix "$p" --forced 128 --windows "$w" --text-file "$STAGE/data/ppl_text.txt" \
        --time-budget "$budget" --json "$d/ppl_$p.json" > "$d/ppl_$p.md" 2> "$d/ppl_$p.log" &
      acc_pids+=($!)
    done
  fi
}

finish_accuracy() {
  [ ${#acc_pids[@]} -gt 0 ] || return 0
  local d=$work/accuracy
  for p in "${acc_pids[@]}"; do wait "$p" || true; done
  "$BIN/retroinfer" eval report --results "$d/acc32k/results.jsonl" "$d/acc4-16k/results.jsonl" \
    --summary "$d/tasks_summary.json" --table "$d/tasks_table.md" > /dev/null 2>&1 || status=1
  grep -h "this call\|samples complete\|status" "$d"/acc*/report.md 2>/dev/null | tee -a "$summary"
  cp "$d/tasks_table.md" "$OUT/qwen_tasks_table.md" 2>/dev/null
  for f in "$d"/ppl_*.md; do { echo "## $(basename "$f")"; cat "$f"; } >> "$OUT/qwen_ppl.md"; done
  tar -czf "$OUT/accuracy.tar.gz" -C "$work" accuracy
}

section_tests() {
  local d=$work/tests
  mkdir -p "$d"
  timeout "${TEST_TIMEOUT:-400}" "$BIN/gpu_tests" --gtest_brief=1 ${TEST_FILTER:+--gtest_filter=$TEST_FILTER} \
    --gtest_output=json:"$d/gpu_tests.json" > "$d/gpu_tests.log" 2>&1
  local rc=$?
  python3 - "$d/gpu_tests.json" >> "$summary" <<'EOF'
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"gpu tests: no JSON report ({e})"); sys.exit()
skipped = sum(1 for s in j["testsuites"] for t in s["testsuite"] if t.get("result") == "SKIPPED")
print(f"gpu tests: {j['tests']} run, {j['failures']} failed, {skipped} skipped, {j['time']}")
for s in j["testsuites"]:
    for t in s["testsuite"]:
        if t.get("failures"):
            print(f"  FAILED {s['name']}.{t['name']}: " + t["failures"][0]["failure"].splitlines()[0][:300])
EOF
  note "gpu_tests exit code $rc"
  [ $rc -eq 0 ] || status=1
  tar -czf "$OUT/tests.tar.gz" -C "$work" tests
}

# Greedy tokens of each placement against the GPU placement (same binary), then the block cache's hit ratio
# over task samples at three cache sizes.
section_hosttier() {
  local d=$work/hosttier
  mkdir -p "$d"
  local -a runs=("smollm2 $STAGE/prompts/smollm2_8k.txt" "$QWEN $STAGE/prompts/qwen_32k.txt")
  for r in "${runs[@]}"; do
    local m=${r% *} prompt=${r#* } tag
    tag=$(basename "$prompt" .txt)
    for pl in gpu split host; do
      local extra=()
      [ "$pl" = split ] && extra=(--gpu-layers 8)
      timeout 300 "$BIN/retroinfer" generate --model "$m" --device cuda --prompt-file "$prompt" --chat \
        --attention retro --max-new-tokens 64 --ignore-eos --kv-placement "$pl" "${extra[@]}" \
        --json "$d/${tag}_$pl.json" > "$d/${tag}_$pl.txt" 2> "$d/${tag}_$pl.log" || note "hosttier: $tag $pl failed"
    done
  done
  python3 - "$d" >> "$summary" <<'EOF2'
import json, os, sys
d = sys.argv[1]
for tag in ("smollm2_8k", "qwen_32k"):
    got = {}
    for pl in ("gpu", "split", "host"):
        p = os.path.join(d, f"{tag}_{pl}.json")
        if os.path.exists(p):
            got[pl] = json.load(open(p))
    if "gpu" not in got:
        print(f"hosttier {tag}: no gpu run"); continue
    ref = got["gpu"].get("tokens")
    for pl, j in got.items():
        toks = j.get("tokens")
        same = sum(1 for a, b in zip(toks or [], ref or []) if a == b)
        first = next((i for i, (a, b) in enumerate(zip(toks or [], ref or [])) if a != b), None)
        kv = {k: j.get(k) for k in ("prompt_tokens", "kv_placement", "gpu_layers", "host_layers", "cache_hit_ratio",
                                    "pcie_bytes", "decode_tokens_per_s")}
        print(f"hosttier {tag} {pl}: tokens equal to gpu {same}/{len(ref or [])} (first difference {first}) {kv} "
              f"text {j.get('text', '')[:60]!r}")
EOF2
  # Hit ratio over task samples (retro, every layer on the host tier), three cache sizes in parallel.
  local pids=()
  # Fraction:page tokens; 2-token pages match Qwen's 2-token clusters (head_dim 64).
  local specs=(0.02:8 0.05:8 0.10:8 0.05:2)
  for sp in "${specs[@]}"; do
    local f=${sp%:*} pt=${sp#*:}
    timeout "${HIT_TIMEOUT:-240}" "$BIN/retroinfer" eval tasks --model "$QWEN" --device cuda --threads 1 \
      --methods retro --kv-placement host --cache-fraction "$f" --cache-page-tokens "$pt" --contexts 16384,32768 \
      --samples "${HIT_SAMPLES:-2}" --haystack-file "$STAGE/data/haystack.txt" --word-list "$STAGE/data/words.txt" \
      --time-budget $(( ${HIT_TIMEOUT:-240} - 40 )) --results "$d/hits_${f}_p$pt.jsonl" \
      --summary "$d/hits_${f}_p$pt.json" --table "$d/hits_${f}_p$pt.md" > "$d/hits_${f}_p$pt.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || note "hosttier: an eval tasks run failed"; done
  for sp in "${specs[@]}"; do
    local f=${sp%:*} pt=${sp#*:}
    echo "hosttier eval, cache fraction $f, $pt-token pages:" >> "$summary"
    grep -i "hit\|average" "$d/hits_${f}_p$pt.md" 2>/dev/null | head -6 >> "$summary"
  done
  tar -czf "$OUT/hosttier.tar.gz" -C "$work" hosttier
}

# Retro's selections while Qwen decodes 256 tokens after a 16K and a 32K prompt (every layer on the GPU:
# host-tier layers do not record), replayed through the block cache; the traces stay in $TRACE_DIR for `bench`.
TRACE_DIR=${TRACE_DIR:-/tmp/traces}
section_traces() {
  local d=$work/traces
  mkdir -p "$d" "$TRACE_DIR"
  for n in 16k 32k; do
    timeout 300 "$BIN/retroinfer" generate --model "$QWEN" --device cuda --attention retro --kv-placement gpu \
      --prompt-file "$STAGE/prompts/qwen_retell_$n.txt" --chat --max-new-tokens 256 --ignore-eos \
      --record-trace "$TRACE_DIR/qwen$n.trace" --json "$d/qwen${n}_gen.json" > "$d/qwen${n}_gen.txt" 2> "$d/qwen${n}_gen.log" ||
      { note "traces: recording at $n failed"; status=1; continue; }
    for pt in 8 2; do
      "$BIN/retroinfer" trace replay --trace "$TRACE_DIR/qwen$n.trace" --page-tokens $pt \
        --cache-fraction 0.02,0.05,0.10 --window-steps 32 --json "$d/qwen${n}_replay_page$pt.json" \
        > "$d/qwen${n}_replay_page$pt.txt" 2>&1 || status=1
      { echo "traces: qwen $n, $pt-token pages:"; cat "$d/qwen${n}_replay_page$pt.txt"; } >> "$summary"
    done
  done
  ls -la "$TRACE_DIR" >> "$summary"
  tar -czf "$OUT/traces.tar.gz" -C "$work" traces
}

# Llama-3-8B shape, random weights, synthetic K/V: GPU-resident retro at its largest batch against the host
# tier with the recorded trace as the query source (bf16 and int8 stores), a mixed joined batch, and 1M.
section_bench() {
  local d=$work/bench trace=$TRACE_DIR/qwen32k.trace
  mkdir -p "$d"
  local q=()
  [ -s "$trace" ] && q=(--query-trace "$trace")
  local B=(bench decode --model llama3-8b --steps "${BENCH_STEPS:-30}" --warmup "${BENCH_WARMUP:-3}")
  local bench_bin=$BIN/retroinfer
  run_bench() {  # name, then bench decode arguments
    local name=$1; shift
    timeout "${BENCH_TIMEOUT:-150}" "$bench_bin" "${B[@]}" "$@" --out "$d/$name.jsonl" > "$d/$name.log" 2>&1 ||
      note "bench $name: exit $?"
  }
  # 128K of Llama-3-8B is 16 GiB of bf16 KV per sequence: the GPU holds 7; the pinned host (~100 GiB) 6 in
  # bf16 or 11 in int8. A joined batch of 14 one-sequence sessions: each session plans alone, and a host-tier
  # one keeps ~4.6 GiB on the GPU (cache, execution buffer, index), so beside 10 of them 4 GPU-resident ones fit.
  for sec in ${BENCH_RUNS:-gpu host_bf16 host_int8 synthetic joined split_1m}; do
    case $sec in
      gpu) run_bench gpu_128k --contexts 131072 --batches 1,max --methods full,retro --placement gpu ;;
      host_bf16) run_bench host_128k_bf16 --contexts 131072 --batches 1,6 --methods retro --placement host "${q[@]}" ;;
      host_int8) run_bench host_128k_int8 --contexts 131072 --batches 1,6,11 --methods retro --placement host \
                   --host-store int8 "${q[@]}" ;;
      synthetic) run_bench host_128k_synthetic --contexts 131072 --batches 6 --methods retro --placement host \
                   --host-store int8 ;;
      joined) run_bench joined_128k_14 --contexts 131072 --batches 14 --methods retro --placement host --joined \
                --joined-gpu-sessions 4 --host-store int8 "${q[@]}" ;;
      split_1m) BENCH_TIMEOUT=${SPLIT_1M_TIMEOUT:-300} run_bench split_1m --contexts 1048576 --batches 1,2 --methods retro \
                  --placement split --host-store int8 "${q[@]}" ;;
      # 14 sequences of 128K (twice what HBM holds) in one session, the planner splitting the layers.
      split_14) BENCH_TIMEOUT=240 run_bench split_128k_14 --contexts 131072 --batches 14 --methods retro \
                  --placement split --host-store int8 "${q[@]}" ;;
      # The 8-bit KV cache (--kv-dtype int8) against bf16, every layer on the GPU: 128K at batch 1 and the
      # largest batch each plans, and 1M at batch 1 (66 GiB of int8 K/V: no host tier needed).
      kv8_128k) for kv in bf16 int8; do
                  run_bench kv8_128k_$kv --contexts 131072 --batches 1,max --methods full,retro --placement gpu \
                    --kv-dtype $kv
                done ;;
      kv8_1m) BENCH_TIMEOUT=${KV8_1M_TIMEOUT:-240} run_bench kv8_1m_int8 --contexts 1048576 --batches 1 --methods retro \
                --placement gpu --kv-dtype int8 ;;
      # A host-tier layer step against the GPU-resident step at batch 8 (64K: 8 sequences fit in HBM), the
      # block cache grown until the trace's hits pass ~80%.
      hit80) run_bench gpu_64k_b8 --contexts 65536 --batches 8 --methods retro --placement gpu
             for st in ${HIT_STORES:-int8}; do
               for f in ${HIT_FRACTIONS:-0.05 0.10 0.20}; do
                 run_bench host_64k_b8_${st}_c$f --contexts 65536 --batches 8 --methods retro --placement host \
                   --host-store "$st" --cache-fraction "$f" "${q[@]}"
                 # HIT_OLD_BIN: the same run with a baseline build right after (same call, same machine).
                 if [ -n "${HIT_OLD_BIN:-}" ]; then
                   bench_bin=$HIT_OLD_BIN run_bench host_64k_b8_${st}_c${f}_old --contexts 65536 --batches 8 \
                     --methods retro --placement host --host-store "$st" --cache-fraction "$f" "${q[@]}"
                 fi
               done
               # The wave buffer's stages at one cache size, timed by events (a separate run: the events cost a
               # little).
               local sf=${STAGE_FRACTION:-0.20}
               run_bench host_64k_b8_${st}_c${sf}_stages --contexts 65536 --batches 8 --methods retro --placement host \
                 --host-store "$st" --cache-fraction "$sf" --stage-times "${q[@]}"
             done ;;
    esac
  done
  python3 - "$d" >> "$summary" <<'EOF2'
import glob, json, os, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.jsonl"))):
    for line in open(f):
        try:
            j = json.loads(line)
        except Exception:
            continue
        keys = ("context", "batch", "method", "placement", "mode", "kv_dtype", "host_store", "query_source", "tok_s",
                "ms_per_step", "hit_ratio", "hit_ratio_last_step", "status", "message")
        row = {k: j[k] for k in keys if k in j}
        w = j.get("wave") or {}
        for k in ("pcie_miss_bytes", "pcie_ms"):
            if k in w:
                row[k] = w[k]
        if "plan" in j and isinstance(j["plan"], dict):
            row["gpu_layers"] = j["plan"].get("gpu_layers")
        print(os.path.basename(f), row)
EOF2
  tar -czf "$OUT/bench.tar.gz" -C "$work" bench
}

t0=$(date +%s)
# The teacher-forced fidelity of retro at two retrieval budgets (the default 1.8% of the clusters and twice
# that) against full, at 4K and 8K prefixes, and every method at a 32K prefix (the largest that, with 128
# forced tokens, fits Qwen's 32768 positions); the hit ratios of the default block-cache pages alongside.
section_fidelity() {
  local d=$work/fidelity pids=()
  mkdir -p "$d"
  local ppl=("$BIN/retroinfer" eval ppl --model "$QWEN" --device cuda --threads 1 --forced 128
             --text-file "$STAGE/data/ppl_text.txt")
  for p in 4032 8128; do
    for rf in 0.018 0.036; do
      timeout 420 "${ppl[@]}" --methods full,retro --retrieval-fraction $rf --prefix $p --windows 8 \
        --json "$d/ppl_${p}_rf$rf.json" > "$d/ppl_${p}_rf$rf.md" 2> "$d/ppl_${p}_rf$rf.log" &
      pids+=($!)
    done
  done
  timeout 420 "${ppl[@]}" --prefix 32576 --windows 2 --json "$d/ppl_32576.json" > "$d/ppl_32576.md" \
    2> "$d/ppl_32576.log" &
  pids+=($!)
  for f in 0.02 0.05 0.10; do
    timeout 300 "$BIN/retroinfer" eval tasks --model "$QWEN" --device cuda --threads 1 --methods retro \
      --kv-placement host --cache-fraction "$f" --contexts 16384,32768 --samples "${HIT_SAMPLES:-2}" \
      --haystack-file "$STAGE/data/haystack.txt" --word-list "$STAGE/data/words.txt" --time-budget 250 \
      --results "$d/hits_$f.jsonl" --table "$d/hits_$f.md" > "$d/hits_$f.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || note "fidelity: a run failed"; done
  for f in "$d"/ppl_*.md; do { echo "## $(basename "$f")"; cat "$f"; } >> "$summary"; done
  for f in 0.02 0.05 0.10; do
    echo "hits, cache fraction $f, default pages:" >> "$summary"
    grep -i "hit" "$d/hits_$f.md" | head -3 >> "$summary"
  done
  tar -czf "$OUT/fidelity.tar.gz" -C "$work" fidelity
}

# Teacher-forced perplexity of several retro settings (PPL_VARIANT_GROUPS, method lists with overrides) at
# 4K-32K prefixes: scripts/gpu-ppl-variants.sh.
section_pplvariants() {
  local d=$work/pplvariants
  BIN="$BIN/retroinfer" MODEL="$QWEN" TEXT="$STAGE/data/ppl_text.txt" OUT="$d" BUDGET="${PPL_BUDGET:-360}" \
    METHOD_GROUPS="${PPL_VARIANT_GROUPS:-full,retro}" bash "$here/gpu-ppl-variants.sh" || note "pplvariants: a run failed"
  grep -h "| retro\|| full" "$d"/ppl_*_g*.md >> "$summary" 2>/dev/null
  cp "$d/ppl_variants.md" "$OUT/" 2>/dev/null
  tar -czf "$OUT/pplvariants.tar.gz" -C "$work" pplvariants
}

# The host store's element types against each other on a real model, every layer on the host tier (retro):
# teacher-forced perplexity / KL against full attention and the task average, bf16 / int8 / int4 stores, all
# processes sharing the GPU. STORE_MODEL (default Qwen), STORE_PREFIX (8128), STORE_WINDOWS (8),
# STORE_CONTEXTS (16384), STORE_SAMPLES (10), STORE_TYPES ("bf16 int8 int4").
section_storeacc() {
  local d=$work/storeacc pids=() m=${STORE_MODEL:-$QWEN}
  mkdir -p "$d"
  run_ppl() {  # binary, store type, output name: the perplexity in the background
    timeout 420 "$1" eval ppl --model "$m" --device cuda --threads 1 --methods full,retro \
      --kv-placement host --host-store "$2" --prefix "${STORE_PREFIX:-8128}" --forced 128 \
      --windows "${STORE_WINDOWS:-8}" --text-file "$STAGE/data/ppl_text.txt" --json "$d/$3.json" \
      > "$d/$3.md" 2> "$d/$3.log" &
    pids+=($!)
  }
  # STORE_OLD_BIN: the perplexity of STORE_OLD_TYPES (default int4) with a baseline build too, as ppl_<type>_old.
  if [ -n "${STORE_OLD_BIN:-}" ]; then
    for st in ${STORE_OLD_TYPES:-int4}; do run_ppl "$STORE_OLD_BIN" "$st" "ppl_${st}_old"; done
  fi
  for st in ${STORE_TYPES:-bf16 int8 int4}; do
    run_ppl "$BIN/retroinfer" "$st" "ppl_$st"
    timeout 480 "$BIN/retroinfer" eval tasks --model "$m" --device cuda --threads 1 --methods retro \
      --kv-placement host --host-store "$st" --contexts "${STORE_CONTEXTS:-16384}" --samples "${STORE_SAMPLES:-10}" \
      --haystack-file "$STAGE/data/haystack.txt" --word-list "$STAGE/data/words.txt" --time-budget 420 \
      --results "$d/tasks_$st.jsonl" --summary "$d/tasks_$st.json" --table "$d/tasks_$st.md" \
      > "$d/tasks_$st.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || note "storeacc: a run failed"; done
  for st in ${STORE_TYPES:-bf16 int8 int4}; do
    { echo "## store $st: ppl"; cat "$d/ppl_$st.md"; echo "## store $st: tasks"; cat "$d/tasks_$st.md"; } >> "$summary"
  done
  for f in "$d"/ppl_*_old.md; do [ -f "$f" ] && { echo "## $(basename "$f") (baseline build)"; cat "$f"; } >> "$summary"; done
  tar -czf "$OUT/storeacc.tar.gz" -C "$work" storeacc
}

# The 8-bit KV cache on a real model (SmolLM2-135M, joined into $MODEL_DIR): teacher-forced perplexity / KL of
# full and retro over int8 KV against full over bf16, 4032-token prefixes of KV8_TEXT (default
# out/data/ppl_text.txt, carried), and one greedy generation per (method, KV dtype) from a 7.9K-token prompt.
section_kv8real() {
  local d=$work/kv8real smol=$MODEL_DIR/SmolLM2-135M-Instruct.Q4_1.gguf text=${KV8_TEXT:-out/data/ppl_text.txt}
  mkdir -p "$d"
  timeout 240 "$BIN/retroinfer" eval ppl --model "$smol" --device cuda --prefix 4032 --forced 64 --windows "${KV8_WINDOWS:-8}" \
    --methods full,full:kv_dtype=int8,retro,retro:kv_dtype=int8 --text-file "$text" --json "$d/smollm2_ppl_int8.json" \
    > "$d/ppl.log" 2>&1 || note "kv8real ppl: exit $?"
  head -c 30000 "$text" > "$d/prompt.txt"
  for m in full retro; do
    for kv in bf16 int8; do
      timeout 60 "$BIN/retroinfer" generate --model "$smol" --device cuda --attention $m --kv-dtype $kv \
        --prompt-file "$d/prompt.txt" --max-new-tokens 64 --ignore-eos --json "$d/generate_${m}_$kv.json" \
        > "$d/generate_${m}_$kv.txt" 2>> "$d/generate.log" || note "kv8real generate $m $kv: exit $?"
    done
  done
  python3 - "$d" >> "$summary" <<'EOF2'
import json, os, sys
d = sys.argv[1]
try:
    j = json.load(open(os.path.join(d, "smollm2_ppl_int8.json")))
    for m in j.get("methods", []):
        print("kv8real ppl", {k: m.get(k) for k in ("method", "kv_dtype", "ppl_rel_diff", "ppl_rel_diff_se", "kl_mean",
                                                    "top1_agreement", "exact_tokens_per_head")})
except Exception as e:
    print("kv8real ppl: no JSON", e)
for m in ("full", "retro"):
    toks = {}
    for kv in ("bf16", "int8"):
        try:
            toks[kv] = json.load(open(os.path.join(d, f"generate_{m}_{kv}.json")))
        except Exception as e:
            print("kv8real generate", m, kv, "no JSON", e)
    if len(toks) == 2:
        a, b = (toks[k].get("tokens") or [] for k in ("bf16", "int8"))
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        print("kv8real generate", m, "first", same, "of", len(a), "tokens equal to bf16; prompt",
              toks["int8"].get("prompt_tokens"), "tok/s bf16 / int8", toks["bf16"].get("decode_tok_s"),
              toks["int8"].get("decode_tok_s"))
EOF2
  tar -czf "$OUT/kv8real.tar.gz" -C "$work" kv8real
}

for s in ${SECTIONS:-accuracy tests}; do
  # A section that would start past DEADLINE seconds is left out (the call has a hard limit).
  if [ $(( $(date +%s) - t0 )) -gt "${DEADLINE:-100000}" ]; then note "== $s skipped: past the deadline"; continue; fi
  note "== $s ($(date +%T))"
  if declare -F "section_$s" > /dev/null; then "section_$s"; else note "unknown section $s"; status=1; fi
done
finish_accuracy
note "== done ($(date +%T)), status $status"
exit $status
