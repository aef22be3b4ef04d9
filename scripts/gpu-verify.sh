#!/usr/bin/env bash
# One GPU-machine call that checks a change of the CUDA code end to end: the GPU tests (with SmolLM2 when its
# file is staged), `bench decode` of the new build against a baseline build (scripts/gpu-ab.sh: 128K, full and
# retro, batch 1 and the largest batch, interleaved), and the main job's question on the GPU with both builds
# (greedy tokens must be equal). At most 8 files come back, so the details travel as one tarball.
#
#   bash scripts/gpu-stage.sh build/cuda-release .gpu-stage/run     # here: the new build
#   scripts/make_long_prompt.sh .gpu-stage/run/long_prompt.txt 3000 60
#   (GPU machine) STAGE=.gpu-stage/run OLD_XZ=.gpu-stage/old/retroinfer.xz MODEL_PARTS=".gpu-stage/m1/part00
#       .gpu-stage/m2/part01" MODEL_SHA256=<sha> OUT=$OUT bash scripts/gpu-verify.sh
#
# TEST_TIMEOUT (default 420 s) bounds the GPU tests; SKIP_AB=1 / SKIP_TESTS=1 leave a part out.
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
OUT=${OUT:-$PWD/gpu-verify-out}
mkdir -p "$OUT" "$OUT/raw"
STAGE=$(cd "${STAGE:?STAGE=the staged new build}" && pwd)
source "$STAGE/scripts/gpu-env.sh"
BIN=$STAGE/bin
status=0
summary=$OUT/summary.txt
: > "$summary"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv > "$OUT/raw/nvidia-smi.csv" 2>&1

# The test binaries read fixtures from the source tree they were configured in (/work/main here).
if [ ! -e /work/main/tests/data ]; then mkdir -p /work && ln -sfn "$repo" /work/main; fi

# SmolLM2 from its staged parts (a call carries 64 MiB), checked by sha256.
if [ -n "${MODEL_PARTS:-}" ]; then
  mkdir -p /tmp/models
  cat $MODEL_PARTS > /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
  got=$(sha256sum /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf | awk '{print $1}')
  if [ "$got" = "${MODEL_SHA256:-}" ]; then
    export RETROINFER_MODEL_DIR=/tmp/models
    echo "model: SmolLM2 assembled, sha256 ok" | tee -a "$summary"
  else
    echo "model: sha256 mismatch ($got), model tests will skip" | tee -a "$summary"; status=1
  fi
fi

OLD=""
if [ -n "${OLD_XZ:-}" ]; then
  xz -dc "$OLD_XZ" > /tmp/retroinfer_old && chmod +x /tmp/retroinfer_old && OLD=/tmp/retroinfer_old
fi

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  echo "== gpu tests"
  timeout "${TEST_TIMEOUT:-420}" "$BIN/gpu_tests" --gtest_brief=1 --gtest_output=json:"$OUT/gpu_tests.json" \
    > "$OUT/raw/gpu_tests.log" 2>&1
  rc=$?
  grep -E "FAILED|Failure|error" "$OUT/raw/gpu_tests.log" | head -40
  python3 - "$OUT/gpu_tests.json" >> "$summary" <<'EOF'
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"gpu tests: no JSON report ({e})"); sys.exit()
skipped = sum(1 for s in j["testsuites"] for t in s["testsuite"] if t.get("result") == "SKIPPED")
print(f"gpu tests: {j['tests']} run, {j['failures']} failed, {skipped} skipped, {j.get('disabled', 0)} disabled, "
      f"{j['time']}")
for s in j["testsuites"]:
    for t in s["testsuite"]:
        if t.get("failures"):
            print(f"  FAILED {s['name']}.{t['name']}")
EOF
  echo "gpu_tests exit code $rc" | tee -a "$summary"
  [ $rc -eq 0 ] || status=1
fi

# The main job's question (scripts/main_job.sh) on the GPU, with both builds: the same greedy tokens.
# The prompt: staged beside the build (the GPU machine has no `bible` command), else made here.
PROMPT=${PROMPT:-$STAGE/long_prompt.txt}
[ -e "$PROMPT" ] || { bash "$here/make_long_prompt.sh" /tmp/long_prompt.txt 3000 60 > /dev/null 2>&1; PROMPT=/tmp/long_prompt.txt; }
for label in new old; do
  bin=$BIN/retroinfer
  [ "$label" = old ] && bin=$OLD
  [ -n "$bin" ] || continue
  timeout 120 "$bin" generate --model smollm2 --prompt-file "$PROMPT" --chat --device cuda \
    --attention retro --max-new-tokens 16 --json "$OUT/raw/main_job_$label.json" > "$OUT/raw/main_job_$label.txt" 2>&1
done
python3 - "$OUT/raw" >> "$summary" <<'EOF'
import json, os, sys
d = sys.argv[1]
got = {}
for label in ("new", "old"):
    p = os.path.join(d, f"main_job_{label}.json")
    if os.path.exists(p):
        j = json.load(open(p))
        got[label] = (j.get("tokens"), j.get("text"), j.get("kv_read_share"))
for label, (tok, text, share) in got.items():
    print(f"main job ({label}, cuda, retro): {text!r} kv_read_share {share}")
if len(got) == 2:
    print("main job: greedy tokens " + ("equal" if got["new"][0] == got["old"][0] else "DIFFER"))
EOF

if [ "${SKIP_AB:-0}" != 1 ] && [ -n "$OLD" ]; then
  OLD=$OLD NEW=$BIN/retroinfer OUT=$OUT/raw bash "$here/gpu-ab.sh" | tee "$OUT/raw/ab_table.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  cp "$OUT/raw/ab_summary.json" "$OUT/" 2>/dev/null
  cat "$OUT/raw/ab_table.txt" >> "$summary"
fi

tar -czf "$OUT/raw.tar.gz" -C "$OUT" raw && rm -rf "$OUT/raw"
echo "== summary"
cat "$summary"
exit $status
