#!/usr/bin/env python3
"""The architecture check: every #include "..." of the library, the CLI and the Python bindings must point
down the layer order of docs/architecture.md (or stay inside its own layer). Exits 1 and lists each edge
that goes the wrong way; exits 0 otherwise.

    scripts/check_layers.py [ROOT]        ROOT: the repository (default: this script's parent's parent)
    scripts/check_layers.py --self-test   plants back edges in a copy of the tree and checks that each fails

Layers, lowest first (a file may include its own layer and any lower one):
    core      src/core, the public headers of errors, dtypes, the KV cache, the softmax state, the attention
              parameters (attention_config.h, attention_params.h) and the wave index's counts (wave_counts.h)
    kernels   src/kernels (bare CUDA kernels and launchers), include/retroinfer/cuda_device.h
    io        src/io, src/tokenizer, the public model-file, config and tokenizer headers
    index     src/index (+ cuda/)
    buffer    src/buffer (+ cuda/), include/retroinfer/wave_buffer.h, memory_planner.h
    attention src/attention (+ cuda/), include/retroinfer/attention.h, cuda_backend.h, cuda_synthetic.h
    model     src/model (+ cuda/), include/retroinfer/model.h, cuda_model.h, session_planner.h, ...
    engine    src/engine, include/retroinfer/engine_model.h, generate.h, batch_scheduler.h, ...
    app       src/eval, src/server
    face      tools/, python/: the public headers and src/engine, src/eval, src/server only
Index and buffer are peers (neither includes the other), as are io and kernels; eval and server are peers.
Tests, benchmarks and fuzz targets may include anything.
"""
import os
import re
import sys

RANK = {"core": 0, "kernels": 1, "io": 1, "index": 2, "buffer": 2, "attention": 3, "model": 4, "engine": 5,
        "app": 6, "face": 7}
# Layers of equal rank that must not include each other.
PEERS = {frozenset(("kernels", "io")), frozenset(("index", "buffer")), frozenset(("eval", "server"))}

PUBLIC = {
    "error.h": "core", "attention_config.h": "core", "dtype.h": "core", "kv_cache.h": "core", "softmax_state.h": "core",
    "wave_counts.h": "core", "attention_params.h": "core", "cluster_trace.h": "core", "fault_injection.h": "core",
    "cuda_device.h": "kernels",
    "model_config.h": "io", "model_file.h": "io", "tokenizer.h": "io",
    "wave_buffer.h": "buffer", "memory_planner.h": "buffer", "cache_replay.h": "buffer",
    "attention.h": "attention", "cuda_backend.h": "attention", "cuda_synthetic.h": "kernels",
    "model.h": "model", "model_shapes.h": "model", "cuda_model.h": "model", "sequence_session.h": "model",
    "session_planner.h": "model",
    "engine_model.h": "engine", "generate.h": "engine", "sampler.h": "engine", "batch_scheduler.h": "engine",
    "text_generate.h": "engine", "prefix_cache.h": "engine", "snapshot.h": "engine", "key_calibration_store.h": "engine",
}
SRC_DIRS = {"core": "core", "kernels": "kernels", "io": "io", "tokenizer": "io", "index": "index",
            "buffer": "buffer", "attention": "attention", "model": "model", "engine": "engine", "eval": "app",
            "server": "app"}
# What the faces (tools/, python/) may include besides the public headers.
FACE_MAY_INCLUDE = ("engine", "eval", "server")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCE = re.compile(r"\.(h|hpp|cpp|cu|cuh)$")


def sub_layer(layer, top):
    """eval and server are both 'app'; keep their names for the peer rule."""
    return top if layer == "app" else layer


def layer_of_src(rel):
    """(layer, name for the peer rule) of a path relative to src/ (or include/retroinfer/...)."""
    parts = rel.split("/")
    if parts[0] == "retroinfer":
        name = PUBLIC.get(parts[-1])
        return (name, name) if name else (None, None)
    layer = SRC_DIRS.get(parts[0])
    return (layer, sub_layer(layer, parts[0])) if layer else (None, None)


def layer_of_file(root, path):
    rel = os.path.relpath(path, root)
    top = rel.split("/")[0]
    if top in ("tools", "python"):
        return "face", "face"
    if top == "include":
        return layer_of_src(os.path.relpath(path, os.path.join(root, "include")))
    if top == "src":
        return layer_of_src(os.path.relpath(path, os.path.join(root, "src")))
    return None, None


def violations(root):
    out = []
    for top in ("src", "include", "tools", "python"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not SOURCE.search(f):
                    continue
                path = os.path.join(dirpath, f)
                layer, name = layer_of_file(root, path)
                rel = os.path.relpath(path, root)
                if layer is None:
                    out.append(f"{rel}: the file belongs to no layer (add its directory or header to "
                               "scripts/check_layers.py and docs/architecture.md)")
                    continue
                with open(path, encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
                for lineno, inc in ((text.count("\n", 0, m.start()) + 1, m.group(1))
                                    for m in INCLUDE.finditer(text)):
                    if "/" not in inc:
                        continue  # a file of the same directory
                    to_layer, to_name = layer_of_src(inc)
                    if to_layer is None:
                        out.append(f"{rel}:{lineno}: includes \"{inc}\", which belongs to no layer")
                        continue
                    if layer == "face":
                        if not (inc.startswith("retroinfer/") or inc.split("/")[0] in FACE_MAY_INCLUDE):
                            out.append(f"{rel}:{lineno}: the {top} face includes the private header \"{inc}\" "
                                       f"(faces use include/retroinfer/ and {', '.join(FACE_MAY_INCLUDE)})")
                        continue
                    if RANK[to_layer] > RANK[layer]:
                        out.append(f"{rel}:{lineno}: {name} includes \"{inc}\" of the higher layer {to_name}")
                    elif name != to_name and frozenset((name, to_name)) in PEERS:
                        out.append(f"{rel}:{lineno}: {name} includes \"{inc}\" of its peer {to_name}")
    return out


def self_test(root):
    """The check's own test: the tree passes; a copy with one planted edge of each kind fails on that edge."""
    import shutil
    import tempfile
    if violations(root):
        print("self-test: the tree itself fails the check; run scripts/check_layers.py")
        return 1
    plants = [  # (file to create, include it plants, text the report must contain)
        ("src/core/planted_edge.h", "model/weights.h", "core includes \"model/weights.h\" of the higher layer model"),
        ("src/kernels/planted_edge.h", "attention/cuda/layer_common.h", "of the higher layer attention"),
        ("src/index/planted_edge.h", "buffer/page_lru.h", "index includes \"buffer/page_lru.h\" of its peer buffer"),
        ("include/retroinfer/error.h", "retroinfer/engine_model.h", "of the higher layer engine"),
        ("python/planted_edge.cpp", "io/gguf_reader.h", "includes the private header \"io/gguf_reader.h\""),
    ]
    failed = 0
    for path, inc, expect in plants:
        with tempfile.TemporaryDirectory() as tmp:
            for top in ("src", "include", "tools", "python"):
                shutil.copytree(os.path.join(root, top), os.path.join(tmp, top))
            target = os.path.join(tmp, path)
            with open(target, "a", encoding="utf-8") as fh:
                fh.write(f'\n#include "{inc}"\n')
            bad = violations(tmp)
            if not any(expect in line for line in bad):
                print(f"self-test: planting {inc} in {path} was not reported (got {bad})")
                failed += 1
            else:
                print(f"self-test: planted {inc} in {path}: reported")
    return 1 if failed else 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--self-test":
        return self_test(os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    bad = violations(root)
    for line in bad:
        print(line)
    if bad:
        print(f"check_layers: {len(bad)} include(s) against the layer order (docs/architecture.md)")
        return 1
    print("check_layers: every include follows the layer order")
    return 0


if __name__ == "__main__":
    sys.exit(main())
