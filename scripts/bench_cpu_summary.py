#!/usr/bin/env python3
"""Medians of scripts/bench-cpu-vs-llamacpp.sh's JSON lines: per prompt length and engine (llama.cpp, retroinfer
full, retroinfer retro) the median prefill tok/s, decode tok/s and peak RSS over the repetitions, their ranges, and
the ratios to llama.cpp's medians, as a Markdown table (docs/benchmarks.md, "CPU").

    scripts/bench_cpu_summary.py FILE.jsonl
"""
import collections
import json
import statistics
import sys


def main():
    rows = collections.defaultdict(list)
    loads = []
    for line in open(sys.argv[1]):
        line = line.strip()
        if not line:
            continue
        j = json.loads(line)
        engine = j.get("engine") or "retroinfer " + j["attention"]
        rows[(j["context"], engine)].append(j)
        for k in ("load_avg_before", "load_avg_after"):
            if k in j:
                loads.append(j[k])
    keys = ("prefill_tok_s", "decode_tok_s", "peak_rss_mib")
    med = {k: {f: statistics.median(r[f] for r in v) for f in keys} for k, v in rows.items()}
    print("| prompt | engine | runs | prefill tok/s | decode tok/s | peak RSS MiB | prefill x | decode x | RSS x |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for (ctx, engine) in sorted(rows, key=lambda k: (k[0], k[1] != "llama.cpp", k[1])):
        v, m = rows[(ctx, engine)], med[(ctx, engine)]
        ref = med.get((ctx, "llama.cpp"))
        rng = {f: f"{min(r[f] for r in v):.4g}–{max(r[f] for r in v):.4g}" for f in keys}
        ratios = [f"{m[f] / ref[f]:.2f}" if ref else "" for f in keys]
        print(f"| {ctx} | {engine} | {len(v)} | {m['prefill_tok_s']:.1f} ({rng['prefill_tok_s']}) | "
              f"{m['decode_tok_s']:.1f} ({rng['decode_tok_s']}) | {m['peak_rss_mib']:.0f} ({rng['peak_rss_mib']}) | "
              + " | ".join(ratios) + " |")
    if loads:
        print(f"\nload average during the runs: {min(loads):.2f}–{max(loads):.2f}")


if __name__ == "__main__":
    main()
