#!/usr/bin/env python3
"""Reference logits from llama.cpp (llama-cpp-python) on an f32 copy of a GGUF, for the peer test
tests/unit/test_model_llamacpp.cpp.

llama.cpp's own quantized matmuls (activations quantized to q8 blocks) sit ~2% of the logit range away from
exact arithmetic, so the reference runs on a copy of the model whose every tensor is dequantized to f32 by the
`gguf` package (llama.cpp's gguf-py, independent of src/io/ggml_quants.cpp). Our loader dequantizes every GGUF
type to f32 at load, so both sides then compute with the same f32 weights; the KV cache of llama.cpp is f32
(type_k = type_v = f32), flash attention off.

Token ids come from our own tokenizer (the `retroinfer` module of build/<preset>/python); llama.cpp is fed
those ids, so tokenization is no confound. llama.cpp's tokenizer is run on the same text too and its agreement
is recorded (`tokenizer_check`).

For each prompt the fixture holds the ids, a greedy continuation (argmax of llama.cpp's logits, fed back one
token at a time through llama.cpp's decode path) and, for every row of prompt + continuation (the logits that
predict the next token), the reference's top-8 ids and logits and the row's minimum logit (so top-1, the
top-2 gap and the logit range max - min are known). Logits are rounded to 1e-5 (far below the compared
differences).

  PYTHONPATH=build/cpu-release/python python3 scripts/make_llamacpp_reference.py smollm2
  PYTHONPATH=build/cpu-release/python python3 scripts/make_llamacpp_reference.py qwen2.5-coder-0.5b --lengths 512,1024

Needs llama-cpp-python==0.3.36, gguf==0.19.0, numpy and the `bible` command (Debian bible-kjv).
"""
import argparse
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TOP_K = 8
GREEDY_TOKENS = 16
CHAT_QUESTION = "Write two sentences about why the sky is blue."
# Public-domain text for the long prompts (King James Bible): one passage per length, cut to that many tokens.
PASSAGES = ["Ru1:1-4:22", "Mt5:1-7:29", "Ge1:1-11:32"]


def bible_text(ref):
    out = subprocess.run(["bible", ref], check=True, capture_output=True, text=True).stdout
    lines = [re.sub(r"^ *[0-9]+ ", "", ln) for ln in out.splitlines() if ln.strip()]
    # Drop the chapter headings ("Ruth 1") that the command prints before each chapter.
    lines = [ln for ln in lines if not re.fullmatch(r"[0-9A-Za-z ]+ [0-9]+", ln.strip())]
    return re.sub(r"\s+", " ", " ".join(lines)).strip()


def dequantize_to_f32(src, dst):
    """Writes dst: src with every tensor dequantized to f32 by the gguf package, all metadata copied."""
    import gguf

    reader = gguf.GGUFReader(src)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(dst, arch)
    for field in reader.fields.values():
        # GGUF.* are the reader's virtual fields; the writer writes the architecture and alignment itself.
        if field.name.startswith("GGUF.") or field.name in (gguf.Keys.General.ARCHITECTURE, gguf.Keys.General.ALIGNMENT):
            continue
        if field.name == gguf.Keys.General.FILE_TYPE:
            writer.add_file_type(gguf.LlamaFileType.ALL_F32)
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    tensors = []
    for t in reader.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        # numpy order is ggml's dims reversed.
        data = data.reshape([int(d) for d in reversed(t.shape)])
        tensors.append((t.name, data))
        writer.add_tensor_info(t.name, data.shape, data.dtype, data.nbytes, gguf.GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, data in tensors:
        writer.write_tensor_data(data)
    writer.close()


def row_record(logits):
    top = np.argsort(-logits, kind="stable")[:TOP_K]
    return [int(i) for i in top], [round(float(logits[i]), 5) for i in top], round(float(logits.min()), 5)


def run_prompt(llm, ids):
    """Rows of prompt + greedy continuation: top-8 ids/logits and min of each row's logits."""
    llm.reset()
    llm.eval(ids)
    rows = [row_record(np.asarray(llm.scores[i], dtype=np.float32)) for i in range(len(ids))]
    greedy = []
    for _ in range(GREEDY_TOKENS):
        t = rows[-1][0][0]
        greedy.append(t)
        llm.eval([t])
        rows.append(row_record(np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float32)))
    return greedy, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="smollm2 | qwen2.5-coder-0.5b | a .gguf path (found as `retroinfer --model` finds it)")
    ap.add_argument("--lengths", default="512,2048", help="token counts of the text prompts (besides the chat prompt)")
    ap.add_argument("--out", help="fixture path (default tests/data/reference/<name>_llamacpp.json)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()

    import llama_cpp
    import retroinfer

    ours = retroinfer.load(args.model, device="cpu")
    src = ours.path
    tok = ours.tokenizer
    name = args.model if not args.model.endswith(".gguf") else Path(args.model).stem
    out = Path(args.out) if args.out else ROOT / "tests" / "data" / "reference" / f"{name}_llamacpp.json"
    del ours  # frees its f32 weights before llama.cpp loads its own

    lengths = [int(x) for x in args.lengths.split(",") if x]
    prompts = []
    chat = tok.apply_chat_template([{"role": "user", "content": CHAT_QUESTION}], add_generation_prompt=True)
    prompts.append({"name": "chat", "text": chat, "ids": tok.encode(chat, add_special=False, parse_special=True)})
    for n, passage in zip(lengths, PASSAGES):
        text = bible_text(passage)
        ids = tok.encode(text, add_special=True)
        if len(ids) < n:
            sys.exit(f"{passage}: {len(ids)} tokens, fewer than {n}")
        prompts.append({"name": f"kjv {passage}, first {n} tokens", "text": text, "ids": ids[:n]})

    with tempfile.TemporaryDirectory() as tmp:
        f32 = os.path.join(tmp, "model-f32.gguf")
        t0 = time.time()
        dequantize_to_f32(src, f32)
        print(f"dequantized {src} -> f32 in {time.time() - t0:.0f} s", file=sys.stderr)
        n_ctx = max(len(p["ids"]) for p in prompts) + GREEDY_TOKENS + 16
        llm = llama_cpp.Llama(model_path=f32, n_ctx=n_ctx, n_batch=512, n_ubatch=512, logits_all=True,
                              n_threads=args.threads, n_threads_batch=args.threads, flash_attn=False,
                              type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, verbose=False)
        records = []
        for p in prompts:
            t0 = time.time()
            greedy, rows = run_prompt(llm, p["ids"])
            # llama.cpp's own tokenization of the same text (special tokens parsed, BOS as its vocabulary says).
            theirs = llm.tokenize(p["text"].encode(), add_bos=p["name"] != "chat", special=True)[: len(p["ids"])]
            agree = sum(a == b for a, b in zip(theirs, p["ids"])) if len(theirs) == len(p["ids"]) else None
            print(f"{p['name']}: {len(p['ids'])} tokens, {time.time() - t0:.0f} s; llama.cpp tokenizer "
                  f"{'agrees' if theirs == p['ids'] else 'differs'}", file=sys.stderr)
            records.append({
                "name": p["name"],
                "ids": p["ids"],
                "greedy": greedy,
                "tokenizer_check": {"llama_cpp_equal": theirs == p["ids"], "equal_prefix_ids": agree},
                # One row per position of ids + greedy: the logits predicting the next token.
                "top_ids": [r[0] for r in rows],
                "top_logits": [r[1] for r in rows],
                "min_logit": [r[2] for r in rows],
            })
        del llm

    fixture = {
        "model": os.path.basename(src),
        "made_by": "scripts/make_llamacpp_reference.py",
        "llama_cpp_python": llama_cpp.__version__,
        "gguf": importlib.metadata.version("gguf"),
        "llama_cpp_settings": {"weights": "f32 (dequantized by gguf.quants.dequantize)", "type_k": "f32",
                               "type_v": "f32", "flash_attn": False, "n_batch": 512, "n_ubatch": 512},
        "ids_from": "retroinfer tokenizer",
        "top_k": TOP_K,
        "prompts": records,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(fixture, separators=(",", ":")) + "\n")
    print(f"wrote {out} ({out.stat().st_size / 1e3:.0f} KB)", file=sys.stderr)


if __name__ == "__main__":
    main()
