#!/usr/bin/env bash
# Decode throughput of two builds of `retroinfer` in one GPU call: `bench decode` at one context (default
# 128K, Llama-3-8B shape, random weights, synthetic K/V, KV on the GPU), full and retro, batch 1 and the
# largest batch the plan accepts, the two binaries interleaved ROUNDS times (A B A B ...) so that clock and
# thermal drift fall on both. Writes $OUT/ab_<label>_<round>.jsonl and $OUT/ab_summary.json (median tok/s per
# configuration and binary, and new / old), and prints the table last.
#
#   OLD=path/to/old/retroinfer NEW=path/to/new/retroinfer OUT=dir bash scripts/gpu-ab.sh
#   CONTEXT=131072 BATCHES=1,max METHODS=full,retro ROUNDS=2 STEPS=20 WARMUP=3 (defaults)
# Never changes clocks or modes.
set -u
OUT=${OUT:-$PWD/gpu-ab-out}
mkdir -p "$OUT"
: "${OLD:?OLD=path of the baseline binary}" "${NEW:?NEW=path of the binary under test}"
CONTEXT=${CONTEXT:-131072}
BATCHES=${BATCHES:-1,max}
METHODS=${METHODS:-full,retro}
ROUNDS=${ROUNDS:-2}
STEPS=${STEPS:-20}
WARMUP=${WARMUP:-3}
status=0
for r in $(seq 1 "$ROUNDS"); do
  for label in old new; do
    bin=$OLD
    [ "$label" = new ] && bin=$NEW
    echo "== round $r: $label ($bin)"
    if ! timeout "${AB_TIMEOUT:-240}" "$bin" bench decode --model llama3-8b --contexts "$CONTEXT" --batches "$BATCHES" \
        --methods "$METHODS" --placement gpu --synthetic always --steps "$STEPS" --warmup "$WARMUP" \
        --out "$OUT/ab_${label}_${r}.jsonl" > "$OUT/ab_${label}_${r}.log" 2>&1; then
      echo "bench decode ($label, round $r) failed:"; tail -5 "$OUT/ab_${label}_${r}.log"; status=1
    fi
  done
done
python3 - "$OUT" <<'EOF'
import glob, json, os, statistics, sys
out = sys.argv[1]
runs = {}  # (method, batch) -> label -> [tok/s]
for path in sorted(glob.glob(os.path.join(out, "ab_*_*.jsonl"))):
    label = os.path.basename(path).split("_")[1]
    for line in open(path):
        j = json.loads(line)
        if j.get("bench") != "decode" or "tok_s" not in j:
            continue
        runs.setdefault((j["method"], j["batch"]), {}).setdefault(label, []).append(j["tok_s"])
rows = []
for (method, batch), by in sorted(runs.items()):
    old = statistics.median(by.get("old", [float("nan")]))
    new = statistics.median(by.get("new", [float("nan")]))
    rows.append({"method": method, "batch": batch, "old_tok_s": old, "new_tok_s": new, "new_over_old": new / old,
                 "old_runs": by.get("old", []), "new_runs": by.get("new", [])})
json.dump({"bench": "gpu_ab", "rows": rows}, open(os.path.join(out, "ab_summary.json"), "w"), indent=1)
print(f"{'method':8} {'batch':>5} {'old tok/s':>10} {'new tok/s':>10} {'new/old':>8}")
for r in rows:
    print(f"{r['method']:8} {r['batch']:>5} {r['old_tok_s']:10.1f} {r['new_tok_s']:10.1f} {r['new_over_old']:8.3f}")
EOF
exit $status
