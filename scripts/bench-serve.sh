#!/bin/bash
# `retroinfer bench serve` over attention methods and client counts: for each method a fresh
# `retroinfer serve`, then one bench run per client count; one JSON report (and PNG) per pair in OUT.
#
#   scripts/bench-serve.sh OUT [key=value ...]
#     cli=build/cpu-release/bin/retroinfer  model=smollm2  device=cpu  attention="full retro"
#     clients="8 32"  prompt_tokens=4096  max_tokens=16  requests_per_client=1  max_batch=0 (= the most clients)
#     port=18480  extra_serve=""  (more `serve` options)  extra_bench="" (more `bench serve` options)
# The server's stderr (its request log: one JSON line per request) goes to OUT/serve-<method>.log.
#
# CPU (docs/server.md):   scripts/bench-serve.sh bench/results/cpu-bench-serve clients="8 32"
# H200 (the CUDA runner): scripts/bench-serve.sh bench/results/h200-bench-serve cli=build/cuda-release/bin/retroinfer \
#                           device=cuda clients="16 64" max_tokens=256 requests_per_client=4
set -euo pipefail
out=${1:?usage: scripts/bench-serve.sh OUT [key=value ...]}
shift
cli=build/cpu-release/bin/retroinfer model=smollm2 device=cpu attention="full retro" clients="8 32"
prompt_tokens=4096 max_tokens=16 requests_per_client=1 max_batch=0 port=18480 extra_serve="" extra_bench=""
for kv in "$@"; do
  case "$kv" in
    cli=*|model=*|device=*|attention=*|clients=*|prompt_tokens=*|max_tokens=*|requests_per_client=*|max_batch=*|port=*|extra_serve=*|extra_bench=*)
      declare "$kv" ;;
    *) echo "bench-serve.sh: unknown setting '$kv'" >&2; exit 2 ;;
  esac
done
if [[ $max_batch == 0 ]]; then max_batch=$(tr ' ' '\n' <<<"$clients" | sort -n | tail -1); fi
mkdir -p "$out"
for att in $attention; do
  # shellcheck disable=SC2086
  "$cli" serve --model "$model" --device "$device" --attention "$att" --max-batch "$max_batch" --port "$port" \
    $extra_serve 2>"$out/serve-$att.log" &
  pid=$!
  trap 'kill $pid 2>/dev/null || true' EXIT
  for _ in $(seq 300); do
    python3 -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:$port/health').status != 200)" \
      2>/dev/null && break
    sleep 1
  done
  for c in $clients; do
    echo "bench-serve.sh: $att, $c clients, ~$prompt_tokens-token prompts ($(date -u +%H:%M:%S))" >&2
    # shellcheck disable=SC2086
    "$cli" bench serve --base-url "http://127.0.0.1:$port/v1" --label "$model $device $att" --concurrency "$c" \
      --num-requests $((c * requests_per_client)) --prompt-tokens "$prompt_tokens" --max-tokens "$max_tokens" \
      --ignore-eos --json "$out/$att-c$c-p$prompt_tokens.json" --plot "$out/$att-c$c-p$prompt_tokens.png" \
      $extra_bench >/dev/null || echo "bench-serve.sh: $att, $c clients: no request completed" >&2
  done
  kill "$pid"; wait "$pid" || true
  trap - EXIT
  # Requests whose connection ended before the reply was out (the request log's status 499 lines).
  cut=$(grep -c '"status":499' "$out/serve-$att.log" || true)
  echo "bench-serve.sh: $att: $cut request(s) cut short by their connection (status 499 in serve-$att.log)" >&2
done
