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
#              RESUME=<folder with results.jsonl of an earlier call> continues
#   tests      the GPU tests (with SmolLM2)
#   hosttier   real models through the wave buffer's host tier: greedy tokens of every placement, and
#              `eval tasks` block-cache hit ratios at 2%, 5% and 10% cache
#   traces     retro's cluster selections recorded while decoding Qwen at 16K and 32K, replayed through
#              the block cache at 2%, 5% and 10%
#   bench      Llama-3-8B-shape host-tier decode at 128K with the recorded traces as the query source
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
# The test binaries read fixtures from the source tree they were configured in (/work/main here).
if [ ! -e /work/main/tests/data ]; then mkdir -p /work && ln -sfn "$(cd "$here/.." && pwd)" /work/main; fi
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
    CONTEXTS=32768 SAMPLES=25 JOBS=4 THREADS=1 bash "$here/gpu-accuracy.sh" "$QWEN" > "$d/acc32k.log" 2>&1 &
  acc_pids+=($!)
  env "${resume[@]}" OUT="$d/acc4-16k" BIN_DIR="$BIN" DATA_DIR="$STAGE/data" BUDGET="$budget" SKIP_PPL=1 \
    CONTEXTS=4096,8192,16384 SAMPLES=50 JOBS=5 THREADS=1 bash "$here/gpu-accuracy.sh" "$QWEN" > "$d/acc4-16k.log" 2>&1 &
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

for s in ${SECTIONS:-accuracy tests}; do
  note "== $s ($(date +%T))"
  if declare -F "section_$s" > /dev/null; then "section_$s"; else note "unknown section $s"; status=1; fi
done
finish_accuracy
note "== done ($(date +%T)), status $status"
exit $status
