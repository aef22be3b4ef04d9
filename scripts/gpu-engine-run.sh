#!/usr/bin/env bash
# The engine-level checks on the GPU machine, in sections that fit one device call each: the GPU tests, time to
# first token with prefix reuse, `bench serve` against the CUDA runner and against the CPU runner on that
# machine's cores, and the CPU runner's decode over thread counts. SmolLM2 arrives in parts first
# (scripts/gpu-model-parts.sh) and is joined into $MODEL_DIR; the staged build (scripts/gpu-stage.sh) with data/
# (the haystack text) beside it.
#
#   STAGE=.gpu-stage/run OUT=$OUT SECTIONS="tests ttft" bash scripts/gpu-engine-run.sh
#
# Sections (in the order given):
#   tests     every GPU test (TEST_FILTER narrows them)
#   ttft      `bench ttft`: Llama-3-8B shape (random weights) at 32K and 128K on the CUDA runner, retro and full
#             (TTFT_CONTEXTS, TTFT_METHODS); SmolLM2 at ~4K on the CUDA runner when it is there
#   serve     `bench serve` against `serve --device cuda` (SmolLM2, ~4K-token prompts, 256 new tokens), retro and
#             full at 16 and 64 clients, the request log kept (cut-short requests counted)
#   cpuserve  the same against `serve --device cpu` on this machine's cores (8 and 32 clients, 64 new tokens)
#   cpuscale  `bench generate --device cpu` (SmolLM2, 4K prompt, full and retro) at 1, 2, 4, 8 and 16 threads
# Everything lands in $OUT as at most 8 files: summary.txt and one tarball per section.
set -u
here=$(cd "$(dirname "$0")" && pwd)
STAGE=$(cd "${STAGE:?STAGE=the staged build}" && pwd)
OUT=${OUT:?OUT=the result folder}
MODEL_DIR=${MODEL_DIR:-/tmp/models}
source "$STAGE/scripts/gpu-env.sh"
export RETROINFER_MODEL_DIR=$MODEL_DIR
BIN=$STAGE/bin
SMOL=$MODEL_DIR/SmolLM2-135M-Instruct.Q4_1.gguf
TEXT=$STAGE/data/haystack.txt
summary=$OUT/summary.txt
work=$OUT/work
mkdir -p "$work"
status=0
note() { echo "$*" | tee -a "$summary"; }
# The test binaries read fixtures from the source tree they were configured in (compiled in): SOURCE_ROOT
# (default /work/main) is linked to this checkout when it does not exist here.
src_root=${SOURCE_ROOT:-/work/main}
if [ ! -e "$src_root/tests/data" ]; then mkdir -p "$(dirname "$src_root")" && ln -sfn "$(cd "$here/.." && pwd)" "$src_root"; fi
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader >> "$summary" 2>&1
note "cpu: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"

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

section_ttft() {
  local d=$work/ttft
  mkdir -p "$d"
  for ctx in ${TTFT_CONTEXTS:-32768 131072}; do
    for m in ${TTFT_METHODS:-retro full}; do
      timeout 400 "$BIN/retroinfer" bench ttft --model llama3-8b --device cuda --attention "$m" --context "$ctx" \
        --question-tokens 64 --new-tokens 8 --prefix-cache-block 256 --snapshot /tmp/ttft.snapshot \
        --json "$d/ttft_llama3-8b.jsonl" > "$d/ttft_llama3-8b_${m}_$ctx.log" 2>&1 || status=1
      note "ttft llama3-8b $m $ctx: $(tail -1 "$d/ttft_llama3-8b_${m}_$ctx.log")"
      rm -f /tmp/ttft.snapshot
    done
  done
  if [ -f "$SMOL" ]; then
    for m in retro full; do
      timeout 200 "$BIN/retroinfer" bench ttft --model "$SMOL" --device cuda --attention "$m" --context 4096 \
        --question-tokens 64 --new-tokens 16 --text "$TEXT" --json "$d/ttft_smollm2_cuda.jsonl" \
        > "$d/ttft_smollm2_cuda_$m.log" 2>&1 || status=1
      note "ttft smollm2 cuda $m 4096: $(tail -1 "$d/ttft_smollm2_cuda_$m.log")"
    done
  fi
  tar -czf "$OUT/ttft.tar.gz" -C "$work" ttft
}

# bench serve against one server per method: $1 device, $2 client counts, $3 max tokens, $4 requests per client,
# $5 extra serve options.
serve_matrix() {
  local device=$1 clients=$2 max_tokens=$3 per_client=$4 extra=$5 d=$work/serve-$1
  mkdir -p "$d"
  local top
  top=$(tr ' ' '\n' <<<"$clients" | sort -n | tail -1)
  for att in ${SERVE_METHODS:-full retro}; do
    # shellcheck disable=SC2086
    "$BIN/retroinfer" serve --model "$SMOL" --device "$device" --attention "$att" --max-batch "$top" \
      --max-queue 256 --port 18480 $extra 2> "$d/serve-$att.log" &
    local pid=$!
    for _ in $(seq 120); do
      python3 -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:18480/health').status != 200)" \
        2>/dev/null && break
      sleep 1
    done
    for c in $clients; do
      timeout 300 "$BIN/retroinfer" bench serve --base-url http://127.0.0.1:18480/v1 \
        --label "smollm2 $device $att" --concurrency "$c" --num-requests $((c * per_client)) --prompt-tokens 4096 \
        --max-tokens "$max_tokens" --ignore-eos --text-file "$TEXT" --json "$d/$att-c$c-p4096.json" \
        > "$d/bench-$att-c$c.log" 2>&1
      note "serve $device $att c$c: rc=$? $(grep -m1 -o '"completed": [0-9]*' "$d/$att-c$c-p4096.json" 2>/dev/null)"
    done
    kill "$pid"; wait "$pid"
    note "serve $device $att: $(grep -c '"status":499' "$d/serve-$att.log") request(s) cut short by their connection"
    grep '"status":499' "$d/serve-$att.log" | head -5 >> "$summary"
  done
  tar -czf "$OUT/serve-$device.tar.gz" -C "$work" "serve-$device"
}

section_serve() { serve_matrix cuda "16 64" 256 2 ""; }
section_cpuserve() { serve_matrix cpu "8 32" 64 1 "--threads $(nproc)"; }

section_cpuscale() {
  local d=$work/cpuscale
  mkdir -p "$d"
  for t in 1 2 4 8 16; do
    timeout 200 "$BIN/retroinfer" bench generate --model "$SMOL" --device cpu --threads "$t" --context 4096 \
      --new-tokens 32 --attention full,retro --text "$TEXT" --json "$d/cpu_threads.jsonl" > "$d/threads_$t.log" 2>&1
    note "cpuscale $t threads: rc=$?"
  done
  tar -czf "$OUT/cpuscale.tar.gz" -C "$work" cpuscale
}

for s in ${SECTIONS:-tests}; do
  note "== $s ($(date -u +%H:%M:%S))"
  "section_$s"
done
note "== done ($(date -u +%H:%M:%S)), status $status"
rm -rf "$work"
exit $status
