#!/usr/bin/env python3
"""Tiny random-weight Llama-family models and Hugging Face transformers reference outputs for the model
runner tests (tests/unit/test_model_hf.cpp).

For each variant it writes tests/data/models/<name>/config.json + model.safetensors (bf16 weights, which
f32 represents exactly, so both sides compute on identical numbers) and reference.json:
  tokens           the fixed input sequence (SEQ_LEN random ids, seeded)
  positions        positions whose next-token logits are stored (every 32nd, and the last)
  logits           [len(positions)][vocab] from one full-sequence forward pass (f32, eager attention)
  greedy           32 greedy tokens continuing `tokens`, one cached decode step at a time
  greedy_margin    top-1 minus top-2 logit at each greedy step (a near tie explains a divergence)
  greedy_logits    {step: [vocab]} raw logits of the decode steps listed in GREEDY_LOGIT_STEPS
The model runs in float32 on the CPU (or CUDA with --device cuda).

Needs: torch, transformers (>= 4.45), safetensors. Usage: python3 scripts/make_tiny_models.py [--out DIR]
"""
import argparse
import json
import os

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

SEQ_LEN = 300
NEW_TOKENS = 32
LOGIT_STRIDE = 32
GREEDY_LOGIT_STEPS = [0, 15, 31]

COMMON = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
              bos_token_id=1, eos_token_id=2, max_position_embeddings=512)

VARIANTS = {
    # Llama 3.1-style frequency rule; original length 64 so the scaling matters within 300 tokens.
    "tiny-llama3": (LlamaConfig, LlamaForCausalLM, dict(
        rope_theta=10000.0, tie_word_embeddings=False,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=64))),
    # Qwen2: QKV bias, tied embeddings, default RoPE with a large theta.
    "tiny-qwen2": (Qwen2Config, Qwen2ForCausalLM, dict(
        rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False)),
    # YaRN: ramp between beta_fast and beta_slow, mscale 0.1 ln(4) + 1 on cos/sin.
    "tiny-llama-yarn": (LlamaConfig, LlamaForCausalLM, dict(
        rope_theta=10000.0, tie_word_embeddings=False,
        rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=128))),
    # Dynamic NTK: max_position_embeddings 128 < 300 tokens, so the base is recomputed for the length.
    "tiny-llama-dynamic": (LlamaConfig, LlamaForCausalLM, dict(
        rope_theta=10000.0, tie_word_embeddings=False, max_position_embeddings=128,
        rope_scaling=dict(rope_type="dynamic", factor=4.0))),
}


def randomize(model, seed):
    """Weights of std 0.15 (logits of a few units, so greedy choices are not near ties), norm weights
    1 + 0.1 N(0,1) and biases 0.1 N(0,1) so that each is visibly applied; rounded to bf16."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if name.endswith("norm.weight"):
                v = 1.0 + 0.1 * r
            elif name.endswith(".bias"):
                v = 0.1 * r
            else:
                v = 0.15 * r
            p.copy_(v.to(torch.bfloat16).to(torch.float32))


def legacy_config(path):
    """Rewrites transformers 5's `rope_parameters` into the `rope_theta` + `rope_scaling` form that the
    published checkpoints (Llama 3.1, Qwen2.5, SmolLM2) use; the reference is computed after reloading from
    this file, so both sides read the same config."""
    with open(path) as f:
        c = json.load(f)
    rp = c.pop("rope_parameters", None)
    if rp is not None:
        rp = dict(rp)
        c["rope_theta"] = rp.pop("rope_theta")
        if rp.get("rope_type", "default") != "default":
            c["rope_scaling"] = rp
    c["torch_dtype"] = c.get("dtype", "bfloat16")
    with open(path, "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
        f.write("\n")


def fmt(xs):
    return [float("%.8g" % x) for x in xs]


def make(name, out_dir, device):
    cfg_cls, model_cls, extra = VARIANTS[name]
    kw = dict(COMMON)
    kw.update(extra)
    cfg = cfg_cls(**kw)
    torch.manual_seed(0)
    model = model_cls(cfg).to(torch.float32)
    randomize(model, seed=1234 + sum(map(ord, name)))
    model.eval()
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
    for extra_file in ("generation_config.json",):
        p = os.path.join(d, extra_file)
        if os.path.exists(p):
            os.remove(p)
    legacy_config(os.path.join(d, "config.json"))
    model = model_cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").to(device)
    model.eval()

    g = torch.Generator().manual_seed(42)
    tokens = torch.randint(0, cfg.vocab_size, (SEQ_LEN,), generator=g)
    positions = list(range(0, SEQ_LEN, LOGIT_STRIDE)) + [SEQ_LEN - 1]
    with torch.no_grad():
        full = model(tokens[None].to(device)).logits[0].float().cpu()
        ref_logits = [fmt(full[p].tolist()) for p in positions]
        # Greedy continuation through the KV-cache decode path, one token per step.
        out = model(tokens[None].to(device), use_cache=True)
        pkv = out.past_key_values
        step_logits = out.logits[0, -1].float().cpu()
        greedy, margins, greedy_logits = [], [], {}
        for step in range(NEW_TOKENS):
            if step in GREEDY_LOGIT_STEPS:
                greedy_logits[str(step)] = fmt(step_logits.tolist())
            top2 = torch.topk(step_logits, 2)
            tok = int(top2.indices[0])
            greedy.append(tok)
            margins.append(float(top2.values[0] - top2.values[1]))
            out = model(torch.tensor([[tok]], device=device), past_key_values=pkv, use_cache=True)
            pkv = out.past_key_values
            step_logits = out.logits[0, -1].float().cpu()
    ref = dict(model=name, transformers=transformers.__version__, torch=torch.__version__, device=device,
               tokens=tokens.tolist(), positions=positions, logits=ref_logits, greedy=greedy,
               greedy_margin=fmt(margins), greedy_logits=greedy_logits)
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(ref, f, separators=(",", ":"))
    sizes = {fn: os.path.getsize(os.path.join(d, fn)) for fn in sorted(os.listdir(d))}
    print(name, sizes, "min greedy margin %.4f" % min(margins))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "models"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--only", nargs="*", default=list(VARIANTS))
    a = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    for name in a.only:
        make(name, a.out, a.device)


if __name__ == "__main__":
    main()
