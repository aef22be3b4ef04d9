#!/usr/bin/env python3
"""Prints the retro graph time and the main phase stamps of kernel_bench JSON lines (retro_graph / retro_phases).

    python3 scripts/retro_phase_summary.py FILE.jsonl [...]

One line per (file, path, n, batch): graph us, then, where present (us from the first score CTA's start): inside the
score grid the last CTA's start, the last CTA past the issue of its first stages, the first / last CTA with its
query fragments, the first / last CTA's first tile, the score loops' first / last ends and the grid's end; then
select_end, exact_start / _end, estimate_end, merge_end and the exact / estimation CTAs' mean durations.
"""

import json
import sys

KEYS = ["score_start_last", "score_issued_last", "score_q_first", "score_q_last", "score_first_tile_first",
        "score_first_tile_last", "score_loop_end_first", "score_loop_end_last", "score_end",
        "select_end", "exact_start", "exact_end", "exact_cta_mean", "estimate_start_last", "estimate_end", "estimate_cta_mean", "merge_end"]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for fn in sys.argv[1:]:
        rows = {}
        for line in open(fn):
            d = json.loads(line)
            key = (d.get("path", ""), d["n"], d["batch"])
            if d["method"] == "retro_graph":
                rows.setdefault(key, {})["graph"] = d["ms"] * 1e3
            elif d["method"] == "retro_phases":
                rows.setdefault(key, {})["ph"] = d["phases_ms"]
        for (path, n, b), r in rows.items():
            ph = r.get("ph", {})
            parts = " ".join(f"{k}={ph[k] * 1e3:.1f}" for k in KEYS if k in ph)
            g = r.get("graph")
            print(f"{fn.split('/')[-1]} {path} n={n} b={b} graph={g:.1f} {parts}" if g is not None else
                  f"{fn.split('/')[-1]} {path} n={n} b={b} {parts}")


if __name__ == "__main__":
    main()
