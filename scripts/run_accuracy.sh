#!/usr/bin/env bash
# The full long-context accuracy run of docs/accuracy.md: SmolLM2-135M-Instruct on the CPU model runner,
# RULER-style tasks at 4K and 8K tokens, 50 samples per task and length, methods full, retro, quest,
# streaming and oracle at the same exact-token budget; then teacher-forced fidelity on real text.
# Resumable: rerun the same command after an interruption and finished samples are skipped.
#
#   scripts/run_accuracy.sh [OUT_DIR]          (default out/accuracy)
# Environment: JOBS (parallel processes, default: cores / 4), THREADS (per process, default 4),
# SAMPLES (50), CONTEXTS (4096,8192), METHODS (full,retro,quest,streaming,oracle), BUILD (build/release),
# MODEL (smollm2), SEED (42).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-out/accuracy}
build=${BUILD:-build/release}
threads=${THREADS:-4}
jobs=${JOBS:-$(( $(nproc) / threads > 0 ? $(nproc) / threads : 1 ))}
samples=${SAMPLES:-50}
contexts=${CONTEXTS:-4096,8192}
methods=${METHODS:-full,retro,quest,streaming,oracle}
model=${MODEL:-smollm2}
seed=${SEED:-42}
mkdir -p "$out"
if [[ ! -x "$build/bin/retroinfer" ]]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRETROINFER_CUDA=OFF
  cmake --build "$build" -j "$(nproc)"
fi
bin="$build/bin/retroinfer"
echo "run_accuracy: $jobs jobs x $threads threads, $samples samples, contexts $contexts, methods $methods -> $out" >&2

# Tasks: job j takes sample indices [j * per, (j + 1) * per) into its own results file (no shared writes).
per=$(( (samples + jobs - 1) / jobs ))
pids=()
results=()
for (( j = 0; j < jobs; ++j )); do
  first=$(( j * per ))
  (( first < samples )) || break
  n=$(( samples - first < per ? samples - first : per ))
  f="$out/tasks.part$j.jsonl"
  results+=("$f")
  "$bin" eval tasks --model "$model" --threads "$threads" --contexts "$contexts" --methods "$methods" \
    --samples "$n" --first-sample "$first" --seed "$seed" --results "$f" > /dev/null 2> "$out/tasks.part$j.log" &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
(( status == 0 )) || { echo "run_accuracy: a task job failed; see $out/tasks.part*.log (rerun to resume)" >&2; exit 1; }
"$bin" eval report --results "${results[@]}" --summary "$out/tasks_summary.json" --table "$out/tasks_table.md"

# Teacher-forced fidelity on real text (Isaiah, not used as a haystack): 8 windows each at a 4K and an 8K
# prefix, 64 forced tokens.
for prefix in 4032 8128; do
  "$bin" eval ppl --model "$model" --threads "$((threads * jobs))" --methods "$methods" --prefix "$prefix" \
    --forced 64 --windows 8 --bible "Isaiah1:1-66:24" "Jeremiah1:1-52:34" --json "$out/ppl_$prefix.json" \
    > "$out/ppl_$prefix.md"
  cat "$out/ppl_$prefix.md"
done
echo "run_accuracy: done; tables in $out/tasks_table.md and $out/ppl_*.md" >&2
