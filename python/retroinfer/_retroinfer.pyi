# Type stubs of the compiled module (python/bindings.cpp, bindings_session.cpp). The docstrings that help()
# shows live in the module itself; docs/python.md is the reference.
from typing import Any, Callable, Iterable, Literal, Sequence

import numpy as np
import numpy.typing as npt

__version__: str

Device = Literal["cpu", "cuda", "auto"]
Attention = Literal["full", "retro", "quest", "streaming", "oracle", "retro-noest"]
KvPlacement = Literal["auto", "gpu", "split", "host"]
Prompt = str | bytes | Sequence[int]

class Error(RuntimeError):
    """An engine error: what was wrong, where, and what to do (the C++ retroinfer::Error message)."""

class Tokenizer:
    @staticmethod
    def from_file(path: str) -> Tokenizer: ...
    def encode(self, text: str | bytes, add_special: bool = False, parse_special: bool = True) -> list[int]: ...
    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str: ...
    def decode_bytes(self, ids: Iterable[int], skip_special: bool = False) -> bytes: ...
    def token_to_piece(self, id: int) -> bytes: ...
    def token_to_id(self, token_text: str) -> int | None: ...
    def apply_chat_template(
        self, messages: Sequence[dict[str, str] | tuple[str, str]], add_generation_prompt: bool = True
    ) -> str: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def bos_id(self) -> int: ...
    @property
    def eos_id(self) -> int: ...
    @property
    def eog_ids(self) -> list[int]: ...
    @property
    def chat_format(self) -> str: ...
    def __len__(self) -> int: ...

class GenerateResult:
    text: str
    tokens: list[int]
    attention: str
    prompt_tokens: int
    reused_tokens: int
    generated_tokens: int
    decode_steps: int
    prefill_seconds: float
    decode_seconds: float
    time_to_first_token: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    exact_tokens: int
    context_tokens: int
    kv_read_share: float
    mean_exact_tokens_per_head: float
    @property
    def stop_reason(self) -> Literal["max_tokens", "eos", "stop_string", "callback", "context_full"]: ...
    @property
    def kv_placement(self) -> dict[str, Any] | None: ...
    @property
    def stats(self) -> dict[str, Any]: ...

class Session:
    def prefill(self, tokens: Sequence[int], all_logits: bool = False) -> npt.NDArray[np.float32]: ...
    def decode(self, token: int) -> npt.NDArray[np.float32]: ...
    def fork(self, attention: Attention | None = None, **attention_parameters: Any) -> Session: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def max_context(self) -> int: ...
    @property
    def device(self) -> str: ...
    @property
    def attention(self) -> str: ...
    @property
    def attention_config(self) -> dict[str, Any]: ...
    @property
    def kv_placement(self) -> dict[str, Any] | None: ...
    @property
    def last_stats(self) -> dict[str, Any]: ...

class Model:
    @property
    def config(self) -> dict[str, Any]: ...
    @property
    def tokenizer(self) -> Tokenizer | None: ...
    @property
    def device(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def load_seconds(self) -> float: ...
    def generate(
        self,
        prompt: Prompt,
        *,
        max_tokens: int = 128,
        attention: Attention = "full",
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int = 0,
        stop: str | Sequence[str] | None = None,
        chat: bool = False,
        system: str = "",
        ignore_eos: bool = False,
        on_token: Callable[[int, str], bool | None] | None = None,
        kv_dtype: Literal["f32", "bf16"] | None = None,
        prefill_chunk: int | None = None,
        snapshot: str | None = None,
        kv_placement: KvPlacement = "auto",
        **attention_parameters: Any,
    ) -> GenerateResult: ...
    def save_snapshot(
        self,
        prompt: Prompt,
        path: str,
        *,
        attention: Attention = "retro",
        chat: bool = False,
        system: str = "",
        kv_dtype: Literal["f32", "bf16"] | None = None,
        prefill_chunk: int | None = None,
        **attention_parameters: Any,
    ) -> int: ...
    def session(
        self,
        *,
        attention: Attention = "full",
        max_context: int = 0,
        kv_dtype: Literal["f32", "bf16"] | None = None,
        prefill_chunk: int | None = None,
        kv_placement: KvPlacement = "auto",
        **attention_parameters: Any,
    ) -> Session: ...

def load(
    path: str,
    *,
    device: Device = "auto",
    weights: Literal["bf16", "f32"] = "bf16",
    tokenizer: str | None = None,
    threads: int | None = None,
) -> Model: ...
def attention_config(attention: Attention = "retro", head_dim: int = 0, **attention_parameters: Any) -> dict[str, Any]: ...
def cuda_built() -> bool: ...
def set_num_threads(n: int) -> None: ...
def num_threads() -> int: ...
