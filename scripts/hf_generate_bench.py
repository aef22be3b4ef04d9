#!/usr/bin/env python3
"""Peer baseline for `retroinfer bench decode`: Hugging Face transformers `generate` on the same model
shape (Llama-3.1-8B: 32 layers, hidden 4096, 32 q / 8 KV heads of 128, FFN 14336, vocab 128256, RoPE
theta 500000 with llama3 scaling), random bf16 weights initialised on the GPU, SDPA attention, a prompt of
N random tokens per sequence, greedy decoding.

Timing: one generate() call per (context, batch) with max_new_tokens = 1 + steps; a logits processor
records the time (after torch.cuda.synchronize) each time generate asks it for the next token's scores:
the first call comes right after the prefill forward, so prefill_s = first - start and each decode step
is the interval between consecutive calls (decode tokens/s = batch * steps / (last - first)). This is the
"generate(max_new_tokens=1 + steps) minus generate(max_new_tokens=1)" difference measured inside one call,
which halves the prefill work; `--timing diff` runs the two calls instead. OOM is caught and reported.
One JSON object per line (stdout, and appended to --out).

  hf_generate_bench.py --out FILE [--contexts 32768,131072] [--batches 1,4] [--steps 32] [--cache dynamic]
"""
import argparse
import json
import sys
import time


def ints(s):
    return [int(x) for x in s.split(",") if x]


def llama3_8b_config(max_positions):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192),
        # Random-weight shape: positions beyond 131072 only if a longer context is asked for (the llama3
        # frequencies do not depend on it).
        max_position_embeddings=max(131072, max_positions), tie_word_embeddings=False,
        attention_bias=False, bos_token_id=128000, eos_token_id=128001, pad_token_id=0)


def emit(out, obj):
    obj["unix_time"] = int(time.time())
    line = json.dumps(obj)
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--contexts", type=ints, default=[32768, 131072])
    ap.add_argument("--batches", type=ints, default=[1, 4])
    ap.add_argument("--steps", type=int, default=32, help="decode steps timed after the first token")
    ap.add_argument("--cache", choices=["dynamic", "static"], default="dynamic")
    ap.add_argument("--timing", choices=["processor", "diff"], default="processor")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    import torch
    import transformers
    from transformers import LlamaForCausalLM, LogitsProcessor, LogitsProcessorList

    dev = torch.device("cuda")
    torch.manual_seed(args.seed)
    cfg = llama3_8b_config(max(args.contexts) + args.steps + 8)
    t0 = time.perf_counter()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(dev):  # parameters are created (and initialised, normal 0.02) on the GPU in bf16
        try:
            model = LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=torch.bfloat16)
        except TypeError:  # transformers < 5 names it torch_dtype
            model = LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa", torch_dtype=torch.bfloat16)
    torch.set_default_dtype(torch.float32)
    model.eval()
    torch.cuda.synchronize()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    emit(args.out, {"bench": "hf_generate_env", "device": torch.cuda.get_device_name(dev),
                    "torch": torch.__version__, "transformers": transformers.__version__,
                    "model": "llama3-8b", "weights": "random bf16", "weight_bytes": weight_bytes,
                    "attn": "sdpa", "cache": args.cache, "timing": args.timing,
                    "model_init_s": time.perf_counter() - t0})

    class StepClock(LogitsProcessor):
        """Records the time of every next-token selection (synchronised)."""

        def __init__(self):
            self.times = []

        def __call__(self, input_ids, scores):
            torch.cuda.synchronize()
            self.times.append(time.perf_counter())
            return scores

    def generate(ids, new_tokens, clock=None):
        kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, use_cache=True,
                  attention_mask=torch.ones_like(ids), pad_token_id=0)
        if args.cache == "static":
            kw["cache_implementation"] = "static"
        if clock is not None:
            kw["logits_processor"] = LogitsProcessorList([clock])
        with torch.no_grad():
            torch.cuda.synchronize()
            start = time.perf_counter()
            out = model.generate(ids, **kw)
            torch.cuda.synchronize()
            return out, start, time.perf_counter()

    gen = torch.Generator(device=dev).manual_seed(args.seed)
    warm = torch.randint(0, cfg.vocab_size, (1, 256), device=dev, generator=gen)
    generate(warm, 4)  # kernels, cuBLAS handles, the generation config

    for ctx in args.contexts:
        for batch in args.batches:
            rec = {"bench": "hf_generate", "model": "llama3-8b", "context": ctx, "batch": batch,
                   "steps": args.steps, "cache": args.cache, "timing": args.timing}
            print(f"hf generate: context {ctx}, batch {batch}", file=sys.stderr, flush=True)
            try:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(dev)
                ids = torch.randint(0, cfg.vocab_size, (batch, ctx), device=dev, generator=gen)
                if args.timing == "processor":
                    clock = StepClock()
                    out, start, end = generate(ids, 1 + args.steps, clock)
                    assert out.shape[1] == ctx + 1 + args.steps, out.shape
                    assert len(clock.times) == 1 + args.steps, len(clock.times)
                    prefill_s = clock.times[0] - start
                    decode_s = clock.times[-1] - clock.times[0]
                    rec["total_s"] = end - start
                else:
                    _, s1, e1 = generate(ids, 1)
                    _, s2, e2 = generate(ids, 1 + args.steps)
                    prefill_s = e1 - s1
                    decode_s = (e2 - s2) - prefill_s
                rec.update({"status": "ok", "prefill_s": prefill_s, "prefill_tok_s": batch * ctx / prefill_s,
                            "decode_s": decode_s, "ms_per_step": 1e3 * decode_s / args.steps,
                            "tok_s": batch * args.steps / decode_s,
                            "peak_gpu_bytes": torch.cuda.max_memory_allocated(dev)})
            except torch.cuda.OutOfMemoryError as e:
                rec.update({"status": "oom", "message": str(e).splitlines()[0][:300],
                            "peak_gpu_bytes": torch.cuda.max_memory_allocated(dev)})
            finally:
                ids = None
                out = None
                torch.cuda.empty_cache()
            emit(args.out, rec)


if __name__ == "__main__":
    main()
