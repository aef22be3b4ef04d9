#!/usr/bin/env python3
"""Summarise Nsight Compute's per-instruction stall samples.

Input: the CSV of `ncu -i REPORT.ncu-rep --page source --csv --print-source sass` (a report collected with
`--section SourceCounters`). For every kernel in it: the total stall samples, the stall reasons' shares, and
the instructions with the most samples (with the reasons that make up >= 15% of each).

    python3 scripts/ncu_sass_top.py src.csv [TOP=12] [CONTEXT=0]

CONTEXT > 0 also prints that many instructions before each hot one (a stall is charged to the instruction
that waits, so the producer of the awaited value is usually just above it).
"""
import csv
import sys


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    fn = sys.argv[1]
    topn = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    ctx = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    kernels, kern, hdr = {}, None, None
    with open(fn, newline="") as f:
        for r in csv.reader(f):
            if not r:
                continue
            if r[0] == "Kernel Name":
                kern, hdr = r[1], None
                kernels.setdefault(kern, [])
            elif r[0] == "Address":
                hdr = r
            elif hdr and kern:
                kernels[kern].append(dict(zip(hdr, r)))
    if not kernels:
        sys.exit(f"{fn}: no kernel sections (is it `ncu --page source --csv` output?)")
    col = "Warp Stall Sampling (All Samples)"
    for name, rows in kernels.items():
        reasons = [h for h in rows[0] if h.startswith("stall_") and "Not Issued" not in h]
        num = lambda x, k: float(x.get(k) or 0)
        tot = sum(num(x, col) for x in rows) or 1.0
        agg = {q: sum(num(x, q) for x in rows) for q in reasons}
        print("=====", name[:100], "samples", int(tot))
        print("   reasons:", ", ".join(f"{q[6:]}={v / tot * 100:.0f}%" for q, v in
                                      sorted(agg.items(), key=lambda a: -a[1]) if v / tot > 0.02))
        order = sorted(range(len(rows)), key=lambda i: -num(rows[i], col))
        for i in order[:topn]:
            x = rows[i]
            s = num(x, col)
            why = ",".join(f"{q[6:]}:{num(x, q):.0f}" for q in reasons if num(x, q) >= max(2, s * 0.15))
            print(f'{s / tot * 100:5.1f}% [{i}] {x["Source"][:60]:60} ex={x["Instructions Executed"]} {why}')
            for j in range(max(0, i - ctx), i):
                print(f'          [{j}] {rows[j]["Source"][:60]}')


if __name__ == "__main__":
    main()
