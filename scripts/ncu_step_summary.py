#!/usr/bin/env python3
"""Summarises an Nsight Compute CSV (gpu__time_duration.sum per kernel) of one `retroinfer bench decode`
step: the kernels from the last embed_kernel launch to the end of the run (one decode step), their
per-layer sequence and totals by kernel.

    ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
        retroinfer bench decode ... --steps 1 --warmup 0 > ncu.csv
    python3 scripts/ncu_step_summary.py ncu.csv [--layers 32]
"""
import argparse
import collections
import csv
import re


def short(name):
    name = re.sub(r"\(anonymous namespace\)::|<unnamed>::|retroinfer::cuda::", "", name)
    name = re.sub(r"^void ", "", name)
    return re.sub(r"[<(].*", "", name)[:60]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--layers", type=int, default=32)
    a = ap.parse_args()
    with open(a.csv) as f:
        lines = [l for l in f if l.startswith('"')]
    r = csv.reader(lines)
    hdr = next(r)
    ki, vi, ui = hdr.index("Kernel Name"), hdr.index("Metric Value"), hdr.index("Metric Unit")
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
    rows = [(x[ki], float(x[vi].replace(",", "")) * scale[x[ui]]) for x in r]
    starts = [i for i, (k, _) in enumerate(rows) if "embed_kernel" in k]
    if not starts:
        raise SystemExit("no embed_kernel launch: not a decode-step profile")
    step = rows[starts[-1]:]
    total = sum(v for _, v in step)
    print("decode step: %d kernels, %.1f us of kernel time (serialised by the profiler)" % (len(step), total))
    per_layer = (len(step) - 1) // a.layers
    print("\none layer (the second), us:")
    for k, v in step[1 + per_layer:1 + 2 * per_layer]:
        print("  %8.2f  %s" % (v, short(k)))
    agg = collections.defaultdict(lambda: [0, 0.0])
    for k, v in step:
        agg[short(k)][0] += 1
        agg[short(k)][1] += v
    print("\nby kernel: total us, launches, us per launch")
    for k, (n, t) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print("  %9.1f %5d %8.2f  %s" % (t, n, t / n, k))


if __name__ == "__main__":
    main()
