#!/usr/bin/env bash
# CI: builds the libFuzzer targets (fuzz/) with clang in their own build folder and runs each for a bounded
# time from the seed corpus that fuzz_make_seeds writes. Prints each target's executions and coverage
# (libFuzzer's -print_final_stats=1); a crash, a sanitizer report, a leak or a timeout fails the script and
# prints the input that caused it (base64).
#   scripts/fuzz_ci.sh                 every target, FUZZ_SECONDS (default 45) each
#   FUZZ_SECONDS=10 scripts/fuzz_ci.sh fuzz_gguf fuzz_tokenizer   chosen targets
# Environment: FUZZ_SECONDS (time per target), FUZZ_BUILD_DIR (default build/fuzz), CXX (default clang++, else
# clang++-14).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-45}
build=${FUZZ_BUILD_DIR:-build/fuzz}
targets=("$@")
if (( ${#targets[@]} == 0 )); then
  targets=(fuzz_gguf fuzz_safetensors fuzz_hf_config fuzz_tokenizer fuzz_chat_template fuzz_openai_request fuzz_snapshot)
fi
# The largest input each target may grow to: the seeds' sizes with room for mutations.
declare -A max_len=([fuzz_gguf]=8192 [fuzz_safetensors]=32768 [fuzz_hf_config]=4096 [fuzz_tokenizer]=16384
                    [fuzz_chat_template]=4096 [fuzz_openai_request]=4096 [fuzz_snapshot]=4096)
declare -A corpus_dir=([fuzz_gguf]=gguf [fuzz_safetensors]=safetensors [fuzz_hf_config]=config
                       [fuzz_tokenizer]=tokenizer [fuzz_chat_template]=chat_template [fuzz_openai_request]=openai_request
                       [fuzz_snapshot]=snapshot)

cxx=${CXX:-}
if [[ -z "$cxx" || "$cxx" != *clang* ]]; then
  cxx=$(command -v clang++ || command -v clang++-14 || true)
fi
[[ -n "$cxx" ]] || { echo "fuzz_ci: clang++ not found (scripts/setup.sh installs clang-14)" >&2; exit 1; }

start=$(date +%s)
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  CXX="$cxx" cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRETROINFER_FUZZ=ON \
    -DRETROINFER_TESTS=OFF -DRETROINFER_BENCH=OFF -DRETROINFER_PYTHON=OFF -DRETROINFER_CUDA=OFF >/dev/null
fi
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" fuzz_make_seeds
echo "fuzz_ci: built in $(( $(date +%s) - start )) s"

work="$build/run"
rm -rf "$work"
mkdir -p "$work"
"$build/fuzz/fuzz_make_seeds" "$work/seeds" >/dev/null

failed=()
summary=()
for t in "${targets[@]}"; do
  sub=${corpus_dir[$t]}
  mkdir -p "$work/corpus/$sub" "$work/artifacts/$t"
  log="$work/$t.log"
  echo "fuzz_ci: $t for ${seconds} s (seeds: $(ls "$work/seeds/$sub" | wc -l) files)"
  set +e
  # The corpus folder first (libFuzzer writes new inputs there), the seeds second (read only).
  "$build/fuzz/$t" "$work/corpus/$sub" "$work/seeds/$sub" -max_total_time="$seconds" -max_len="${max_len[$t]}" \
    -print_final_stats=1 -timeout=25 -rss_limit_mb=2048 -artifact_prefix="$work/artifacts/$t/" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1)
  corpus=$(grep -oE 'corp: [0-9]+/[0-9]+[a-zA-Z]*' "$log" | tail -1)
  line="$t: rc=$rc executions=${execs:-?} exec/s=${rate:-?} ${cov:-cov: ?} ${corpus:-corp: ?}"
  echo "fuzz_ci: $line"
  summary+=("$line")
  if (( rc != 0 )); then
    failed+=("$t")
    echo "fuzz_ci: $t FAILED; the end of its log:"
    tail -60 "$log"
    for f in "$work/artifacts/$t"/*; do
      [[ -f "$f" ]] || continue
      echo "fuzz_ci: input $f ($(stat -c %s "$f") bytes), base64:"
      base64 -w 100 "$f" | head -200
    done
  fi
done
echo "fuzz_ci: summary (${seconds} s per target, $(( $(date +%s) - start )) s in all)"
printf '  %s\n' "${summary[@]}"
if (( ${#failed[@]} )); then
  echo "fuzz_ci: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz_ci: no findings"
