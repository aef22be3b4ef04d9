#!/usr/bin/env python3
"""Nsight Compute CSV (`ncu --csv --metrics ...`) -> one JSON object per profiled kernel launch.

ncu replays each launch alone, after the previous one has finished and the GPU has idled, so its times are those
of the kernel in isolation at the clock the card picks for it (run with --clock-control none: the card's clocks
stay as found). The cycle count does not depend on that clock, which under a long full-GPU load falls from ~1.7
to ~1.4-1.5 GHz on an H100 (power), and makes comparisons of medians over back-to-back repetitions bimodal.

  ncu_kernel_times.py --csv FILE [--impl NAME] [--n TOKENS] [--heads-q 32] [--head-dim 128] [--min-ms 0] >> out.jsonl

Metrics read (any that are missing are left out): gpu__time_duration.sum, sm__cycles_elapsed.max,
sm__cycles_elapsed.avg.per_second, sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,
dram__bytes_read.sum. With --n, TFLOP/s counts the causal work of one layer's prefill of n tokens:
4 * D * Hq * n (n + 1) / 2 (without it, e.g. for products, none is computed). Launches shorter than --min-ms (a
warm-up on a shorter prompt) are dropped.
"""
import argparse
import collections
import csv
import json
import sys

NAMES = {
    "gpu__time_duration.sum": "ns",
    "sm__cycles_elapsed.max": "cycles",
    "sm__cycles_elapsed.avg.per_second": "sm_hz",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed": "tensor_active_pct",
    "dram__bytes_read.sum": "dram_read_bytes",
}


def number(s):
    return float(s.replace(",", ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv", required=True)
    ap.add_argument("--impl", default="")
    ap.add_argument("--n", type=int, default=0)
    ap.add_argument("--heads-q", type=int, default=32)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--min-ms", type=float, default=0.0)
    a = ap.parse_args()
    lines = [l for l in open(a.csv, errors="replace") if l.startswith('"')]
    rows = list(csv.reader(lines))
    if not rows:
        sys.exit(f"ncu_kernel_times: no CSV rows in {a.csv}")
    hdr = rows[0]
    try:
        col = {k: hdr.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
    except ValueError as e:
        sys.exit(f"ncu_kernel_times: {a.csv} is not ncu's --csv output ({e})")
    launches = collections.OrderedDict()
    for r in rows[1:]:
        rec = launches.setdefault(r[col["ID"]], {"kernel": r[col["Kernel Name"]][:120],
                                                 "grid": r[hdr.index("Grid Size")] if "Grid Size" in hdr else ""})
        name = NAMES.get(r[col["Metric Name"]])
        if name:
            rec[name] = number(r[col["Metric Value"]])
    flops = 4.0 * a.head_dim * a.heads_q * (a.n * (a.n + 1) / 2.0)
    for i, rec in launches.items():
        out = {"bench": "ncu_launch", "impl": a.impl, "n": a.n, "launch": int(i), "kernel": rec["kernel"],
               "grid": rec["grid"]}
        if "ns" in rec:
            ms = rec["ns"] / 1e6
            if ms < a.min_ms:
                continue
            out["ms"] = round(ms, 4)
            if a.n > 0:
                out["tflops"] = round(flops / (ms * 1e-3) / 1e12, 1)
        if "cycles" in rec:
            out["cycles"] = int(rec["cycles"])
        if "sm_hz" in rec:
            out["sm_ghz"] = round(rec["sm_hz"] / 1e9, 3)
        if "tensor_active_pct" in rec:
            out["tensor_active_pct"] = rec["tensor_active_pct"]
        if "dram_read_bytes" in rec:
            out["dram_read_gb"] = round(rec["dram_read_bytes"] / 1e9, 3)
        print(json.dumps(out))


if __name__ == "__main__":
    main()
