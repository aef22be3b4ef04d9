#!/usr/bin/env bash
# The long-context accuracy run (issue #7) on the GPU machine (16 cores, one H200, no network), inside one
# device command: SmolLM2-135M-Instruct on the CUDA runner, RULER-style tasks at 4K and 8K tokens, up to
# 50 samples per task and length, methods full, retro, quest, streaming and oracle at the same exact-token
# budget, plus the teacher-forced fidelity (perplexity / KL / top-1 per method against full) at a 4K and an
# 8K prefix. It stops cleanly when its time budget is spent (default 480 s of work, so the whole command,
# start and copies included, stays under ~9 minutes) and writes the partial report, which says how many
# samples ran; a later call with RESUME_DIR continues where it stopped.
#
#   OUT=/some/folder bash scripts/gpu-accuracy.sh /path/to/SmolLM2-135M-Instruct.Q4_1.gguf
#
# Runs from the checkout (scripts/ beside run_accuracy.sh and accuracy_status.py) or from a staged folder
# holding these three scripts side by side.
#
# Needs (staged by the lead, as for scripts/gpu-check.sh):
#   BIN_DIR    folder holding `retroinfer` from the cuda-release build (default: bin/ beside this script
#              when staged, else build/cuda-release/bin); shared libraries the machine lacks (OpenBLAS,
#              libgomp, ...) gzip-compressed in lib/ beside this script or beside BIN_DIR
#   DATA_DIR   haystack.txt, words.txt, ppl_text.txt written here by scripts/gpu-accuracy-prep.sh (the GPU
#              machine has neither bible-kjv nor wamerican); default: data/ beside this script
# Optional environment: BUDGET (480: seconds of work for the whole script), PPL_BUDGET (40: seconds per
# ppl prefix, run first; 0 = no limit, SKIP_PPL=1 leaves it out), JOBS (4 processes sharing the GPU),
# THREADS (cores / JOBS), SAMPLES (50), CONTEXTS (4096,8192), METHODS, TASKS (all), SEED (42), WEIGHTS
# (bf16), DEVICE (cuda), PPL_WINDOWS (8), PPL_PREFIXES (4032,8128), RESUME_DIR (a folder with results.jsonl
# of an earlier call: its samples are skipped and its lines kept).
#
# Writes to $OUT (7 files; the device tool returns at most 8): report.md (status, task table, ppl tables),
# run.json (status: samples complete per context, budget spent, device), tasks_summary.json,
# results.jsonl (every result line so far: the input of a resumed call), ppl_4032.json, ppl_8128.json,
# log.txt (all progress logs).
set -u
t_start=$(date +%s)
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)  # a checkout: build/cuda-release/bin is the default BIN_DIR
model=${1:-}
if [[ -z $model || ! -f $model ]]; then
  echo "gpu-accuracy: give the model file as the first argument (a .gguf; got '${model}')" >&2
  exit 2
fi
model=$(cd "$(dirname "$model")" && pwd)/$(basename "$model")
OUT=${OUT:-$PWD/gpu-accuracy-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
if [[ -z ${BIN_DIR:-} ]]; then
  if [[ -x $here/bin/retroinfer ]]; then BIN_DIR=$here/bin; else BIN_DIR=$repo/build/cuda-release/bin; fi
fi
BIN_DIR=$(cd "$BIN_DIR" && pwd)
for libdir in "$here/lib" "$BIN_DIR/../lib"; do
  if [[ -d $libdir ]]; then
    for z in "$libdir"/*.gz; do [[ -e $z ]] && gunzip -f "$z"; done
    export LD_LIBRARY_PATH="$(cd "$libdir" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
done
DATA_DIR=${DATA_DIR:-$here/data}
[[ -d $DATA_DIR ]] && DATA_DIR=$(cd "$DATA_DIR" && pwd)  # run_accuracy.sh changes directory
budget=${BUDGET:-480}
ppl_budget=${PPL_BUDGET:-40}
work=$(mktemp -d /tmp/gpu-accuracy.XXXXXX)
[[ ${KEEP_WORK:-0} == 1 ]] || trap 'rm -rf "$work"' EXIT
bin=$BIN_DIR/retroinfer

echo "gpu-accuracy: model $model, bin $bin, data $DATA_DIR, budget ${budget}s, work $work"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader 2>&1 | head -2
"$bin" version || { echo "gpu-accuracy: $bin does not run (missing libraries? see lib/)" >&2; exit 1; }
data_env=()
if [[ -s $DATA_DIR/haystack.txt && -s $DATA_DIR/words.txt && -s $DATA_DIR/ppl_text.txt ]]; then
  data_env=(DATA_DIR="$DATA_DIR")
elif ! command -v bible > /dev/null; then
  echo "gpu-accuracy: no $DATA_DIR/{haystack,words,ppl_text}.txt and no bible command: run" \
    "scripts/gpu-accuracy-prep.sh on a machine with bible-kjv and carry its output" >&2
  exit 1
fi
resume=()
if [[ -n ${RESUME_DIR:-} && -s ${RESUME_DIR:-}/results.jsonl ]]; then
  cp "$RESUME_DIR/results.jsonl" "$work/previous.jsonl"
  resume=(RESUME_FROM="$work/previous.jsonl")
  echo "gpu-accuracy: resuming from $RESUME_DIR/results.jsonl ($(wc -l < "$work/previous.jsonl") lines)"
fi

# ppl first (bounded by PPL_BUDGET per prefix), then the tasks with what is left of BUDGET minus a margin
# for the report (~10 s: eval report, the merge, one process start).
# run_accuracy.sh is called twice so that the task processes get, when they start, what the ppl part left.
status=0
if [[ ${SKIP_PPL:-0} != 1 ]]; then
  env "${data_env[@]}" DEVICE=${DEVICE:-cuda} WEIGHTS=${WEIGHTS:-bf16} MODEL="$model" BIN="$bin" JOBS=${JOBS:-4} \
    THREADS=${THREADS:-} METHODS=${METHODS:-full,retro,quest,streaming,oracle} SKIP_TASKS=1 \
    PPL_TIME_BUDGET=$ppl_budget HARD_TIMEOUT=$(( ppl_budget > 0 ? ppl_budget + 60 : 0 )) PPL_WINDOWS=${PPL_WINDOWS:-8} PPL_PREFIXES=${PPL_PREFIXES:-4032,8128} \
    bash "$here/run_accuracy.sh" "$work" || status=1
fi
task_budget=$(( budget - 10 - ($(date +%s) - t_start) ))
(( task_budget > 30 )) || task_budget=30
echo "gpu-accuracy: tasks with a budget of ${task_budget}s"
env "${data_env[@]}" "${resume[@]}" DEVICE=${DEVICE:-cuda} WEIGHTS=${WEIGHTS:-bf16} MODEL="$model" BIN="$bin" \
  JOBS=${JOBS:-4} THREADS=${THREADS:-} SAMPLES=${SAMPLES:-50} CONTEXTS=${CONTEXTS:-4096,8192} \
  METHODS=${METHODS:-full,retro,quest,streaming,oracle} TASKS=${TASKS:-all} SEED=${SEED:-42} \
  TIME_BUDGET=$task_budget HARD_TIMEOUT=$(( task_budget + 45 )) SKIP_PPL=1 PROGRESS_EVERY=${PROGRESS_EVERY:-60} \
  bash "$here/run_accuracy.sh" "$work" || status=1

# Merge: every result line once (earlier call's lines first), the status, the report.
cat "$work"/*.log > "$OUT/log.txt" 2> /dev/null
python3 "$here/accuracy_status.py" --work "$work" --out "$OUT" --samples "${SAMPLES:-50}" \
  --contexts "${CONTEXTS:-4096,8192}" --methods "${METHODS:-full,retro,quest,streaming,oracle}" \
  --tasks "${TASKS:-all}" --budget "$budget" --elapsed "$(( $(date +%s) - t_start ))" --bin "$bin" || status=1
cat "$OUT/report.md" 2> /dev/null
echo "gpu-accuracy: done in $(( $(date +%s) - t_start ))s (status $status); files in $OUT"
exit $status
