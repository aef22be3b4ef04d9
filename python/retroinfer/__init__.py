"""retroinfer: long-context LLM inference with the KV cache as a vector store (RetroInfer).

    import retroinfer
    model = retroinfer.load("model.gguf")              # or a Hugging Face folder; device="auto"
    out = model.generate("The capital of France is", max_tokens=16, attention="retro")
    print(out.text, out.stats)

    s = model.session(attention="retro", tokens_per_cluster=8)
    logits = s.prefill(model.tokenizer.encode("Hello"))  # numpy float32 [vocab]
    logits = s.decode(int(logits.argmax()))

Every error of the engine raises retroinfer.Error (a RuntimeError) with the C++ message.
retroinfer.plots draws the charts of the JSON results (matplotlib). `pip install .` also installs the
`retroinfer` command. See docs/python.md and docs/install.md.
"""

from ._retroinfer import (  # noqa: F401  (the compiled module, python/bindings.cpp)
    Error,
    GenerateResult,
    Model,
    Session,
    Tokenizer,
    __version__,
    attention_config,
    cuda_built,
    load,
    num_threads,
    set_num_threads,
)

__all__ = [
    "Error",
    "GenerateResult",
    "Model",
    "Session",
    "Tokenizer",
    "attention_config",
    "cuda_built",
    "load",
    "num_threads",
    "set_num_threads",
]
