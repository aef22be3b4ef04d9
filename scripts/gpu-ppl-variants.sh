#!/usr/bin/env bash
# Teacher-forced perplexity of several attention settings on the GPU machine, every prefix length in parallel,
# one `eval ppl` process per (prefix, method group) so that a setting that fails cannot take the others down.
#
#   MODEL=/tmp/models/m.gguf TEXT=data/ppl_text.txt OUT=$OUT bash scripts/gpu-ppl-variants.sh
#
# PREFIXES: "prefix:windows ..." (default "4032:20 8128:12 16320:6 32576:3"); METHOD_GROUPS: method lists separated by
# spaces, each a comma list for --methods (full is always the reference); FORCED: forced tokens per window
# (default 128); BIN: the retroinfer binary; BUDGET: seconds per process (--time-budget, default 420).
# Writes $OUT/ppl_<prefix>_g<i>.json / .md / .log and $OUT/ppl_variants.md (every table).
set -u
BIN=${BIN:-retroinfer}
MODEL=${MODEL:?MODEL=the model file}
TEXT=${TEXT:?TEXT=the text file}
OUT=${OUT:?OUT=the result folder}
PREFIXES=${PREFIXES:-"4032:20 8128:12 16320:6 32576:3"}
METHOD_GROUPS=${METHOD_GROUPS:-"full,retro"}
FORCED=${FORCED:-128}
BUDGET=${BUDGET:-420}
mkdir -p "$OUT"
pids=()
for pw in $PREFIXES; do
  p=${pw%:*} w=${pw#*:} gi=0
  for g in $METHOD_GROUPS; do
    timeout $(( BUDGET + 60 )) "$BIN" eval ppl --model "$MODEL" --device cuda --threads 1 --prefix "$p" \
      --forced "$FORCED" --windows "$w" --text-file "$TEXT" --methods "$g" --time-budget "$BUDGET" \
      --json "$OUT/ppl_${p}_g$gi.json" > "$OUT/ppl_${p}_g$gi.md" 2> "$OUT/ppl_${p}_g$gi.log" &
    pids+=($!)
    gi=$(( gi + 1 ))
  done
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
for f in "$OUT"/ppl_*_g*.md; do { echo "## $(basename "$f" .md)"; cat "$f"; tail -2 "${f%.md}.log"; echo; } >> "$OUT/ppl_variants.md"; done
exit $status
