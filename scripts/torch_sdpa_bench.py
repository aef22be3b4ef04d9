#!/usr/bin/env python3
"""Peer baseline for bench/kernel_bench.cpp: torch scaled_dot_product_attention on the same shapes.

Decode: q [B, 32, 1, 128], k/v [B, 8, n, 128] bf16 (enable_gqa), CUDA events, warm-up, L2 evicted before
every timed call, median. Prefill: causal SDPA over [1, 32|8, n, 128] (the dense prefill attention of one
layer; kernel_bench times our own PrefillAttention in its run, and the summary shows k-means against both).
One JSON object per line.

  torch_sdpa_bench.py --out FILE [--lengths ...] [--batches ...] [--prefill-lengths ...] [--reps N] [--flush read]
  torch_sdpa_bench.py --summarize KERNEL_JSONL TORCH_JSONL   # the markdown table of both runs
"""
import argparse
import json
import sys


def ints(s):
    return [int(x) for x in s.split(",") if x]


def median_stats(ts):
    ts = sorted(ts)
    return ts[len(ts) // 2], ts[0], ts[min(len(ts) - 1, len(ts) * 9 // 10)]


def bench(args):
    import torch
    import torch.nn.functional as F

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    l2 = getattr(props, "L2_cache_size", 50 * 2**20)
    flush = torch.empty(2 * l2, dtype=torch.uint8, device=dev)
    # --flush read: evict L2 by reading twice its size (a reduction; leaves clean lines), like kernel_bench
    # --flush read; the default (write) memsets it, leaving dirty lines the timed call's reads write back.
    flush_src = torch.ones(l2, dtype=torch.float16, device=dev) if args.flush == "read" else None

    def evict():
        if flush_src is not None:
            flush_src.sum()
        else:
            flush.zero_()
    out = open(args.out, "a")

    def emit(rec):
        out.write(json.dumps(rec) + "\n")
        out.flush()

    def timed(fn, warm, reps):
        for _ in range(warm):
            fn()
        ts = []
        for _ in range(reps):
            evict()
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        return median_stats(ts)

    hq, hkv, d = 32, 8, 128
    for n in args.lengths:
        for bsz in args.batches:
            kv_gib = bsz * hkv * n * d * 2 * 2 / 2**30
            if kv_gib > 70:
                print(f"skip torch decode n={n} batch={bsz}: {kv_gib:.0f} GiB", file=sys.stderr)
                continue
            try:
                g = torch.Generator(device=dev).manual_seed(n + bsz)
                k = torch.randn(bsz, hkv, n, d, device=dev, dtype=torch.bfloat16, generator=g)
                v = torch.randn(bsz, hkv, n, d, device=dev, dtype=torch.bfloat16, generator=g)
                qs = [torch.randn(bsz, hq, 1, d, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(8)]
                it = [0]

                def call():
                    it[0] += 1
                    return F.scaled_dot_product_attention(qs[it[0] % 8], k, v, enable_gqa=True)

                med, mn, p90 = timed(call, 3, args.reps)
                nbytes = 2.0 * k.numel() * 2 + 2.0 * bsz * hq * d * 2
                emit({"bench": "torch", "method": "torch_sdpa", "n": n, "batch": bsz, "ms": med, "ms_min": mn,
                      "ms_p90": p90, "bytes": nbytes, "gbps": nbytes / (med * 1e-3) / 1e9, "flush": args.flush})
                del k, v, qs
            except Exception as e:  # OOM or an unsupported path: record and go on
                emit({"bench": "torch", "method": "torch_sdpa", "n": n, "batch": bsz, "error": str(e)[:200]})
            torch.cuda.empty_cache()
    for n in args.prefill_lengths:
        try:
            g = torch.Generator(device=dev).manual_seed(n)
            q = torch.randn(1, hq, n, d, device=dev, dtype=torch.bfloat16, generator=g)
            k = torch.randn(1, hkv, n, d, device=dev, dtype=torch.bfloat16, generator=g)
            v = torch.randn(1, hkv, n, d, device=dev, dtype=torch.bfloat16, generator=g)
            med, mn, p90 = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), 1,
                                 args.prefill_reps)
            flops = 4.0 * n * n / 2 * d * hq  # QK and PV, causal half
            emit({"bench": "torch", "method": "torch_prefill_causal", "n": n, "batch": 1, "ms": med, "ms_min": mn,
                  "ms_p90": p90, "tflops": flops / (med * 1e-3) / 1e12})
            del q, k, v
        except Exception as e:
            emit({"bench": "torch", "method": "torch_prefill_causal", "n": n, "batch": 1, "error": str(e)[:200]})
        torch.cuda.empty_cache()


def summarize(kernel_path, torch_path):
    rows = {}
    for path in (kernel_path, torch_path):
        try:
            for line in open(path):
                line = line.strip()
                if line.startswith("{"):
                    r = json.loads(line)
                    rows[(r["method"], r["n"], r["batch"])] = r
        except FileNotFoundError:
            print(f"(missing {path})")
    keys = sorted({(n, b) for (_, n, b) in rows})

    def get(m, n, b, f="ms"):
        r = rows.get((m, n, b))
        return r.get(f) if r else None

    def fmt(x, spec):
        return format(x, spec) if x is not None else "-"

    print("| n | batch | full ms | full TB/s | torch ms | torch TB/s | full/torch | retro ms | retro graph ms |"
          " full/retro graph | retro moved/required | quest ms | k-means ms/seq | prefill ms | k-means / prefill |"
          " k-means / torch prefill |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n, b in keys:
        if n is None:
            continue
        full, tor, ret, qu = get("full", n, b), get("torch_sdpa", n, b), get("retro", n, b), get("quest", n, b)
        rg = get("retro_graph", n, b)
        fg, tg = get("full", n, b, "gbps"), get("torch_sdpa", n, b, "gbps")
        km = get("kmeans", n, b, "per_sequence_ms")
        pre = get("prefill", n, 1)  # our PrefillAttention, same kernel_bench run
        tpre = get("torch_prefill_causal", n, 1)
        mor = get("retro", n, b, "moved_over_required")
        print(f"| {n} | {b} | {fmt(full, '.4f')} | {fmt(fg and fg / 1000, '.2f')} | {fmt(tor, '.4f')} | "
              f"{fmt(tg and tg / 1000, '.2f')} | {fmt(full and tor and full / tor, '.3f')} | {fmt(ret, '.4f')} | "
              f"{fmt(rg, '.4f')} | {fmt(full and rg and full / rg, '.1f')} | {fmt(mor, '.2f')} | {fmt(qu, '.4f')} | {fmt(km, '.2f')} | "
              f"{fmt(pre, '.2f')} | {fmt(km and pre and km / pre, '.4f')} | {fmt(km and tpre and km / tpre, '.4f')} |")


def summarize_stages(kernel_path):
    """Retro decode stage breakdown (eager, one stream, events between stages) and prefill figures."""
    rows = [json.loads(l) for l in open(kernel_path) if l.startswith("{")]
    st = [r for r in rows if r["method"] == "retro_stages"]
    if st:
        names = list(st[0]["stages_ms"].keys())
        print("| n | batch | " + " | ".join(f"{n} us" for n in names) + " | sum us |")
        print("|---|---|" + "---|" * (len(names) + 1))
        for r in st:
            v = [r["stages_ms"][n] * 1000 for n in names]
            print(f"| {r['n']} | {r['batch']} | " + " | ".join(f"{x:.1f}" for x in v) + f" | {sum(v):.1f} |")


def compare(path_a, path_b):
    """Same-run A/B of two kernel_bench files: full / k-means / retro graph times and the select stage."""
    def load(path):
        out = {}
        for line in open(path):
            if line.startswith("{"):
                r = json.loads(line)
                out[(r["method"], r["n"], r["batch"])] = r
        return out

    a, b = load(path_a), load(path_b)
    fields = [("full", "ms", 1000.0, "full us"), ("kmeans", "per_sequence_ms", 1.0, "k-means ms/seq"),
              ("retro_graph", "ms", 1000.0, "retro graph us"), ("retro_stages", "select", 1000.0, "select us")]
    print("| n | batch | " + " | ".join(f"{t} A | {t} B | B/A" for _, _, _, t in fields) + " |")
    print("|---|---|" + "---|---|---|" * len(fields))
    for n, bt in sorted({(k[1], k[2]) for k in a} & {(k[1], k[2]) for k in b}):
        cells = []
        for m, f, scale, _ in fields:
            ra, rb = a.get((m, n, bt)), b.get((m, n, bt))
            if m == "retro_stages":
                va = ra["stages_ms"].get(f) if ra else None
                vb = rb["stages_ms"].get(f) if rb else None
            else:
                va, vb = (ra or {}).get(f), (rb or {}).get(f)
            if va is None or vb is None:
                cells += ["-", "-", "-"]
            else:
                cells += [f"{va * scale:.1f}", f"{vb * scale:.1f}", f"{vb / va:.3f}"]
        print(f"| {n} | {bt} | " + " | ".join(cells) + " |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--lengths", type=ints, default=[32768, 131072, 524288, 1048576])
    ap.add_argument("--batches", type=ints, default=[1, 4, 16])
    ap.add_argument("--prefill-lengths", type=ints, default=[32768, 131072])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--flush", choices=["write", "read"], default="write",
                    help="L2 eviction before each timed call: memset (write, default) or a read of 2x L2 (read)")
    ap.add_argument("--prefill-reps", type=int, default=3)
    ap.add_argument("--summarize", nargs=2, metavar=("KERNEL_JSONL", "TORCH_JSONL"))
    ap.add_argument("--stages", metavar="KERNEL_JSONL", help="print the retro stage table of a kernel_bench run")
    ap.add_argument("--compare", nargs=2, metavar=("KERNEL_JSONL_A", "KERNEL_JSONL_B"),
                    help="same-run A/B table of two kernel_bench files")
    args = ap.parse_args()
    if args.compare:
        compare(*args.compare)
    elif args.stages:
        summarize_stages(args.stages)
    elif args.summarize:
        summarize(*args.summarize)
    else:
        if not args.out:
            ap.error("--out is required")
        bench(args)


if __name__ == "__main__":
    main()
