#!/usr/bin/env python3
"""Makes tests/data/quant/ggml_blocks.json: for each GGUF block type the loader dequantizes (Q5_0, Q5_1, Q4_K,
Q5_K, Q6_K), two blocks of random bytes (the f16 scale fields set to finite values of a realistic size) and their
dequantized values as computed by the `gguf` package (gguf-py, llama.cpp's own Python implementation, numpy), an
implementation independent of ours. tests/unit/test_gguf_quants.cpp checks src/io's dequantize against them.

    pip install gguf==0.19.0 numpy && python3 scripts/make_quant_fixtures.py
"""
import json
import os

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf import quants

# (type, byte offsets of its f16 scale fields within a block)
TYPES = [(T.Q5_0, [0]), (T.Q5_1, [0, 2]), (T.Q4_K, [0, 2]), (T.Q5_K, [0, 2]), (T.Q6_K, [208])]
BLOCKS = 2


def main():
    rng = np.random.default_rng(20261201)
    out = {"generator": "scripts/make_quant_fixtures.py", "gguf_version": "0.19.0", "types": []}
    for t, scale_offsets in TYPES:
        block_elems, block_bytes = GGML_QUANT_SIZES[t]
        raw = rng.integers(0, 256, size=(BLOCKS, block_bytes), dtype=np.uint8)
        for b in range(BLOCKS):
            for off in scale_offsets:
                scale = np.float16(rng.uniform(0.001, 0.05) * (1 if off == 0 or t == T.Q6_K else 0.5))
                raw[b, off:off + 2] = np.frombuffer(scale.tobytes(), dtype=np.uint8)
        values = quants.dequantize(raw.reshape(-1), t).astype(np.float32).reshape(-1)
        assert values.size == BLOCKS * block_elems and np.all(np.isfinite(values))
        out["types"].append({"type": t.name, "ggml_type": int(t), "block_elems": block_elems,
                             "block_bytes": block_bytes, "bytes_hex": raw.tobytes().hex(),
                             "values": [float(v) for v in values]})
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "quant", "ggml_blocks.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=0)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
