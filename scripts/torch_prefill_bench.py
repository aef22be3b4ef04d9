#!/usr/bin/env python3
"""Peer baseline for bench/prefill_bench.cpp: torch scaled_dot_product_attention, bf16, causal prefill of one
layer on the same shapes (default Llama-3-8B: 32 query / 8 KV heads, head_dim 128).

Two variants per prompt length n, both timed like prefill_bench (CUDA events around the whole prefill, one
warm-up, L2 evicted before each repetition, median):
  whole    one call, q [1, Hq, n, D], k/v [1, Hkv, n, D], is_causal=True, enable_gqa=True (flash / cuDNN);
  chunked  the runner's order: chunks of --chunk queries, chunk c attends to keys [0, pos0 + m) with the
           causal diagonal at the bottom right (torch.nn.attention.bias.causal_lower_right); K/V heads
           repeated to Hq beforehand (outside the timing) because that mask path does not take enable_gqa.
TFLOP/s counts the causal work only: 4 * D * Hq * n (n + 1) / 2. One JSON object per line (--out, appended).

  torch_prefill_bench.py --out FILE [--lengths 4096,32768,131072] [--chunk 8192] [--reps 5]
  torch_prefill_bench.py --summarize OURS_JSONL TORCH_JSONL   # markdown table of both runs
"""
import argparse
import json
import sys


def ints(s):
    return [int(x) for x in s.split(",") if x]


def causal_flops(n, hq, d):
    return 4.0 * d * hq * (n * (n + 1) / 2.0)


def bench(args):
    import torch
    import torch.nn.functional as F

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    l2 = getattr(props, "L2_cache_size", 50 * 2**20)
    flush = torch.empty(2 * l2, dtype=torch.uint8, device=dev)
    out = open(args.out, "a")
    hq, hkv, d = args.heads_q, args.heads_kv, args.head_dim

    def emit(rec):
        out.write(json.dumps(rec) + "\n")
        out.flush()

    def timed(fn, reps):
        fn()  # warm-up
        torch.cuda.synchronize()
        ts = []
        for _ in range(reps):
            flush.zero_()
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        ts.sort()
        return ts[len(ts) // 2], ts[0], ts[-1]

    for n in args.lengths:
        g = torch.Generator(device=dev).manual_seed(n)
        k = torch.randn(1, hkv, n, d, device=dev, dtype=torch.bfloat16, generator=g)
        v = torch.randn(1, hkv, n, d, device=dev, dtype=torch.bfloat16, generator=g)
        flops = causal_flops(n, hq, d)
        base = {"bench": "prefill", "impl": "torch_sdpa", "n": n, "hq": hq, "hkv": hkv, "d": d,
                "torch": torch.__version__}
        try:
            q = torch.randn(1, hq, n, d, device=dev, dtype=torch.bfloat16, generator=g)
            med, mn, mx = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                                args.reps)
            emit(dict(base, variant="whole", chunk=n, chunks=1, ms=med, ms_min=mn, ms_max=mx, reps=args.reps,
                      flops=flops, tflops=flops / (med * 1e-3) / 1e12))
            del q
        except Exception as e:  # OOM or an unsupported path: record and go on
            emit(dict(base, variant="whole", chunk=n, error=str(e)[:200]))
        torch.cuda.empty_cache()
        if args.chunk < n:
            try:
                from torch.nn.attention.bias import causal_lower_right

                chunk = args.chunk
                rep = hq // hkv
                kr = k.repeat_interleave(rep, dim=1)  # [1, Hq, n, D]
                vr = v.repeat_interleave(rep, dim=1)
                qc = torch.randn(1, hq, chunk, d, device=dev, dtype=torch.bfloat16, generator=g)
                calls = []
                for pos0 in range(0, n, chunk):
                    m = min(chunk, n - pos0)
                    calls.append((qc[:, :, :m], kr[:, :, :pos0 + m], vr[:, :, :pos0 + m],
                                  causal_lower_right(m, pos0 + m)))

                def whole():
                    for qq, kk, vv, mask in calls:
                        F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask)

                med, mn, mx = timed(whole, args.reps)
                emit(dict(base, variant="chunked", chunk=chunk, chunks=len(calls), ms=med, ms_min=mn, ms_max=mx,
                          reps=args.reps, flops=flops, tflops=flops / (med * 1e-3) / 1e12))
                del kr, vr, qc, calls
            except Exception as e:
                emit(dict(base, variant="chunked", chunk=args.chunk, error=str(e)[:200]))
            torch.cuda.empty_cache()
        del k, v
        torch.cuda.empty_cache()


def summarize(ours_path, torch_path):
    rows = []
    for path in (ours_path, torch_path):
        try:
            for line in open(path):
                if line.startswith("{"):
                    r = json.loads(line)
                    if r.get("bench") == "prefill":
                        rows.append(r)
        except FileNotFoundError:
            print(f"(missing {path})")

    def pick(impl, n, whole):
        for r in rows:
            if r.get("impl") != impl or r["n"] != n or "ms" not in r:
                continue
            is_whole = r.get("chunk") == n if impl == "retroinfer" else r.get("variant") == "whole"
            if is_whole == whole:
                return r
        return None

    def cell(r):
        return (f"{r['ms']:.2f}", f"{r['tflops']:.0f}") if r else ("-", "-")

    print("| n | ours chunked ms | TFLOP/s | torch chunked ms | TFLOP/s | ours one call ms | TFLOP/s |"
          " torch one call ms | TFLOP/s | ours / torch (one call) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in sorted({r["n"] for r in rows}):
        oc, tc, ow, tw = pick("retroinfer", n, False), pick("torch_sdpa", n, False), pick("retroinfer", n, True), \
            pick("torch_sdpa", n, True)
        ratio = f"{ow['ms'] / tw['ms']:.2f}" if ow and tw else "-"
        print(f"| {n} | " + " | ".join(" | ".join(cell(r)) for r in (oc, tc, ow, tw)) + f" | {ratio} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--lengths", type=ints, default=[4096, 32768, 131072])
    ap.add_argument("--chunk", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--heads-q", type=int, default=32)
    ap.add_argument("--heads-kv", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--summarize", nargs=2, metavar=("OURS_JSONL", "TORCH_JSONL"))
    args = ap.parse_args()
    if args.summarize:
        summarize(*args.summarize)
        return
    if not args.out:
        ap.error("--out is required")
    if args.heads_q % args.heads_kv:
        ap.error("--heads-q must be a multiple of --heads-kv")
    bench(args)


if __name__ == "__main__":
    sys.exit(main())
