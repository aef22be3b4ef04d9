#!/usr/bin/env bash
# End-to-end GPU run of issue #6 on the H200 (Llama-3-8B shape, random weights): `retroinfer bench decode`
# over contexts 32K, 128K, 512K and 1M, batches up to the largest the plan accepts, full (KV on the GPU)
# and retro (KV on the GPU, split between GPU and host, all on the host), the planner's refusal path, then
# the peers measured in the same run: Hugging Face transformers generate (32K and 128K, batch 1 and 4) and
# torch SDPA causal prefill attention (32K and 128K). JSON lines and logs go to $OUT; a table is printed last.
#
#   OUT=/some/dir BIN_DIR=build/cuda-release/bin bash scripts/gpu-e2e.sh
#   bash scripts/gpu-stage.sh && (on the GPU machine) OUT=$OUT bash .gpu-stage/run/scripts/gpu-e2e.sh
#
# Measured run time on the H200 (run 13): the bench parts 269 s (128K 16 s, 128K split / host 119 s, 1M
# 40 s, prefill 21 s, 32K 11 s, 512K cut at its then 60 s limit while filling its largest batch, now 150 s),
# HF generate ~80 s at 16 steps. The earlier estimate: ~15 s per bench invocation for the random 8B weights and bandwidth probes, 20 timed steps per
# configuration, synthetic K/V above 32K (one layer generated on 16 cores, ~3 s at 1M, copied to every
# layer), HF generate ~3 minutes (its 128K prefills dominate). Hard bounds, so that one device command
# (10 minutes at most) holds it all: the bench parts share BENCH_BUDGET seconds (default 330; a part that
# would start with less than 20 s left is skipped and says so, each part also has its own timeout), then
# HF generate HF_TIMEOUT (200) and torch SDPA SDPA_TIMEOUT (40): at most ~580 s. The parts run in order of
# importance (128K, 1M, prefill, refusal, 32K, 512K). STEPS / WARMUP / SKIP_BENCH=1 / SKIP_HF=1 /
# SKIP_SDPA=1 adjust it (e.g. two device commands: SKIP_HF=1 SKIP_SDPA=1, then SKIP_BENCH=1).
# Never changes clocks or modes.
set -u
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$PWD/gpu-e2e-out}
mkdir -p "$OUT"
# A staged build (scripts/gpu-stage.sh: <stage>/bin, <stage>/lib, this script in <stage>/scripts): unpack it
# and set the library paths (gpu-env.sh); else BIN_DIR or the cuda-release build beside the sources.
if [ -z "${BIN_DIR:-}" ] && { [ -e "$here/../bin/retroinfer" ] || [ -e "$here/../bin/retroinfer.gz" ]; }; then
  STAGE=$(cd "$here/.." && pwd) source "$here/gpu-env.sh"
  BIN_DIR=$here/../bin
fi
BIN_DIR=${BIN_DIR:-$here/../build/cuda-release/bin}
STEPS=${STEPS:-20}
WARMUP=${WARMUP:-3}
bench_deadline=$((SECONDS + ${BENCH_BUDGET:-330}))
JSON=$OUT/bench_decode.jsonl
rm -f "$JSON" "$OUT/hf_generate.jsonl" "$OUT/torch_sdpa_prefill.jsonl"
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total,memory.used \
  --format=csv > "$OUT/nvidia-smi.csv" 2>&1 || true
free -g > "$OUT/free.txt" 2>&1 || true

# bench NAME TIMEOUT ARGS...: one `retroinfer bench decode` invocation appending to $JSON, bounded by its
# timeout and by what is left of BENCH_BUDGET.
bench() {
  local name=$1 limit=$2
  shift 2
  [ "${SKIP_BENCH:-0}" = 1 ] && return
  local left=$((bench_deadline - SECONDS))
  if [ $left -lt 20 ]; then
    echo "== bench decode: $name skipped (BENCH_BUDGET spent)"
    status=1
    return
  fi
  [ $left -lt "$limit" ] && limit=$left
  echo "== bench decode: $name (at most $limit s)"
  local t0=$SECONDS
  timeout "$limit" "$BIN_DIR/retroinfer" bench decode --model llama3-8b --steps "$STEPS" --warmup "$WARMUP" \
    --out "$JSON" "$@" > /dev/null 2> "$OUT/bench_$name.err"
  local rc=$?
  tail -3 "$OUT/bench_$name.err"
  echo "$name: exit code $rc, $((SECONDS - t0)) s"
  [ $rc -eq 0 ] || status=1
}

# 128K: full and retro with the KV on the GPU (batch 1 up to the largest the plan accepts), retro split
# between GPU and host and all on the host; synthetic K/V (prefilling dozens of 128K sequences would not
# fit the time).
bench ctx128k 100 --contexts 131072 --batches 1,4,max --methods full,retro --placement gpu --synthetic always
bench ctx128k_host 120 --contexts 131072 --batches 1,max --methods retro --placement split,host --synthetic always
# 1M on one H200: full refuses (recorded), retro with the KV split between GPU and host.
bench ctx1m 150 --contexts 1048576 --batches 1 --methods full,retro --placement gpu,split --synthetic always
# Prefill tokens/s (a real prefill of random tokens, batch 1) at 32K and 128K, and decode right after.
bench prefill32k 45 --contexts 32768 --batches 1 --methods full,retro --synthetic never
bench prefill128k 70 --contexts 131072 --batches 1 --methods full --synthetic never --steps 5 --warmup 1
# The planner's refusal path: more context than GPU plus host memory holds (refused before allocating;
# --check-refusal also calls the CudaSession constructor and records that it allocated nothing).
bench refusal 30 --contexts 1048576 --batches 8 --methods retro --placement split --synthetic always --check-refusal
bench ctx32k 60 --contexts 32768 --batches 4,16,max --methods full,retro --placement gpu --synthetic always
bench ctx512k 150 --contexts 524288 --batches 1,max --methods full,retro --placement gpu,split --synthetic always

if [ "${SKIP_HF:-0}" != 1 ]; then
  echo "== hf generate (peer)"
  t0=$SECONDS
  PYTHONUNBUFFERED=1 timeout "${HF_TIMEOUT:-200}" python3 "$here/hf_generate_bench.py" --out "$OUT/hf_generate.jsonl" \
    --contexts 32768,131072 --batches 1,4 --steps 32 > /dev/null 2> "$OUT/hf_generate.err"
  rc=$?
  tail -3 "$OUT/hf_generate.err"
  echo "hf_generate: exit code $rc, $((SECONDS - t0)) s"
fi

if [ "${SKIP_SDPA:-0}" != 1 ]; then
  echo "== torch SDPA causal prefill attention (peer)"
  t0=$SECONDS
  if [ -f "$here/torch_prefill_bench.py" ]; then
    PYTHONUNBUFFERED=1 timeout "${SDPA_TIMEOUT:-40}" python3 "$here/torch_prefill_bench.py" \
      --out "$OUT/torch_sdpa_prefill.jsonl" --lengths 32768,131072 --reps 3 > /dev/null 2> "$OUT/torch_sdpa_prefill.err"
  else
    PYTHONUNBUFFERED=1 timeout "${SDPA_TIMEOUT:-40}" python3 "$here/torch_sdpa_bench.py" \
      --out "$OUT/torch_sdpa_prefill.jsonl" --lengths 32768 --batches 1 --reps 3 \
      --prefill-lengths 32768,131072 --prefill-reps 3 \
      > /dev/null 2> "$OUT/torch_sdpa_prefill.err"
  fi
  echo "torch sdpa prefill: exit code $?, $((SECONDS - t0)) s"
fi

python3 - "$JSON" "$OUT/hf_generate.jsonl" "$OUT/torch_sdpa_prefill.jsonl" <<'EOF'
import json, os, sys

def rows(path):
    if not os.path.exists(path):
        return []
    out = []
    for line in open(path):
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out

bench, hf, sdpa = rows(sys.argv[1]), rows(sys.argv[2]), rows(sys.argv[3])
print("\n%-8s %-6s %-6s %5s %-9s %9s %9s %9s %8s %8s %7s %6s %s" % (
    "context", "method", "place", "batch", "status", "tok/s", "ms/step", "floor%", "GPU GiB", "host GiB", "KV%",
    "hit%", "kv source / prefill tok/s"))
best_full = {}
for j in bench:
    if j.get("bench") != "decode":
        continue
    st = j.get("status")
    plan = j.get("plan", {})
    fl = j.get("floor", {})
    src = j.get("kv_source", "")
    if "prefill_tok_s" in j:
        src += " %.0f" % j["prefill_tok_s"]
    if st == "ok" and j["method"] == "full":
        best_full[j["context"]] = max(best_full.get(j["context"], 0), j["tok_s"])
    hit = j.get("hit_ratio")
    print("%-8d %-6s %-6s %5s %-9s %9s %9s %9s %8.1f %8.1f %7s %6s %s" % (
        j["context"], j["method"], j["placement"], j.get("batch", j.get("batch_spec")), st,
        "%.1f" % j["tok_s"] if st == "ok" else "-", "%.2f" % j["ms_per_step"] if st == "ok" else "-",
        "%.0f" % (100 * fl["fraction"]) if fl else "-", plan.get("gpu_bytes", 0) / 2**30,
        plan.get("host_bytes", 0) / 2**30, "%.2f" % (100 * j["kv_read_share"]) if st == "ok" else "-",
        "%.1f" % (100 * hit) if hit is not None else "-",
        src if st == "ok" else j.get("message", "")[:90]))
print("\nbest full tok/s per context:", {k: round(v, 1) for k, v in sorted(best_full.items())})
for j in bench:
    if j.get("bench") == "decode" and j.get("status") == "ok" and j["method"] == "retro" and j["context"] in best_full:
        print("retro %s %s batch %s: %.2fx best full" % (j["context"], j["placement"], j["batch"],
                                                        j["tok_s"] / best_full[j["context"]]))
print("\nprefill tokens/s (batch 1, random tokens):")
for j in bench:
    if j.get("bench") == "decode" and j.get("status") == "ok" and "prefill_tok_s" in j:
        print("  ours %s %d: %.0f tok/s (%.1f s)" % (j["method"], j["context"], j["prefill_tok_s"], j["fill_s"]))
for j in hf:
    if j.get("bench") == "hf_generate" and j.get("status") == "ok" and j["batch"] == 1:
        print("  HF transformers (SDPA) %d: %.0f tok/s (%.1f s)" % (j["context"], j["prefill_tok_s"], j["prefill_s"]))
for j in sdpa:
    if j.get("impl") == "torch_sdpa" and j.get("variant") == "whole" and "ms" in j:
        print("  torch SDPA causal attention alone %d: %.2f ms per layer, x32 layers = %.2f s" % (
            j["n"], j["ms"], 32 * j["ms"] / 1e3))
print("\nHF transformers generate (peer):")
for j in hf:
    if j.get("bench") == "hf_generate":
        if j.get("status") == "ok":
            print("  context %d batch %d: decode %.1f tok/s (%.1f ms/step), prefill %.0f tok/s" % (
                j["context"], j["batch"], j["tok_s"], j["ms_per_step"], j["prefill_tok_s"]))
        else:
            print("  context %d batch %d: %s %s" % (j["context"], j["batch"], j.get("status"),
                                                    j.get("message", "")[:80]))
EOF
exit $status
