"""Every bad input raises retroinfer.Error (a RuntimeError) with the engine's message; nothing crashes."""

import os

import pytest

import retroinfer
from conftest import model_dir


def test_error_is_a_runtime_error():
    assert issubclass(retroinfer.Error, RuntimeError)


def test_bad_paths(tmp_path):
    with pytest.raises(retroinfer.Error, match="does-not-exist"):
        retroinfer.load(str(tmp_path / "does-not-exist.gguf"))
    with pytest.raises(retroinfer.Error):
        retroinfer.load(str(tmp_path))  # a folder without config.json
    with pytest.raises(retroinfer.Error):
        retroinfer.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))


def test_malformed_model_files(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 40)
    with pytest.raises(retroinfer.Error):
        retroinfer.load(str(bad))
    bad.write_bytes(b"not a model at all")
    with pytest.raises(retroinfer.Error):
        retroinfer.load(str(bad))
    # A HF folder whose safetensors header is cut short, and one whose config.json is not JSON.
    d = tmp_path / "hf"
    d.mkdir()
    with open(os.path.join(model_dir("tiny-llama3"), "config.json")) as f:
        (d / "config.json").write_text(f.read())
    with open(os.path.join(model_dir("tiny-llama3"), "model.safetensors"), "rb") as f:
        (d / "model.safetensors").write_bytes(f.read(200))
    with pytest.raises(retroinfer.Error):
        retroinfer.load(str(d), tokenizer="")
    (d / "config.json").write_text("{ not json")
    with pytest.raises(retroinfer.Error):
        retroinfer.load(str(d), tokenizer="")


def test_model_without_its_tokenizer_file():
    with pytest.raises(retroinfer.Error, match="tokenizer.json"):
        retroinfer.load(model_dir("tiny-llama3"))  # the fixture has no tokenizer.json


def test_bad_device_and_weights():
    with pytest.raises(retroinfer.Error, match="unknown device"):
        retroinfer.load(model_dir("tiny-llama3"), device="gpu", tokenizer="")
    with pytest.raises(retroinfer.Error, match="weight type"):
        retroinfer.load(model_dir("tiny-llama3"), weights="fp16", tokenizer="")
    if not retroinfer.cuda_built():
        with pytest.raises(retroinfer.Error, match="no CUDA backend"):
            retroinfer.load(model_dir("tiny-llama3"), device="cuda", tokenizer="")


def test_invalid_utf8_input(tiny_text_model):
    tok = tiny_text_model.tokenizer
    with pytest.raises(retroinfer.Error, match="not valid UTF-8"):
        tok.encode(b"ok \xff\xfe")
    with pytest.raises(retroinfer.Error, match="not valid UTF-8"):
        tiny_text_model.generate(b"\xc3(", max_tokens=2)
    with pytest.raises(retroinfer.Error, match="surrogate"):
        tok.encode("a\udc80b")
    with pytest.raises(retroinfer.Error, match="surrogate"):
        tiny_text_model.generate("a\ud800", max_tokens=2)
    with pytest.raises(TypeError):
        tok.encode(12)


def test_prompts_longer_than_the_context(tiny_text_model):
    ctx = tiny_text_model.config["max_context"]
    assert ctx == 512
    with pytest.raises(retroinfer.Error, match="maximum context"):
        tiny_text_model.generate([5] * (ctx - 3), max_tokens=8)
    s = tiny_text_model.session(max_context=16)
    with pytest.raises(retroinfer.Error, match="at most 16"):
        s.prefill([5] * 17)
    with pytest.raises(retroinfer.Error):
        tiny_text_model.session(max_context=ctx + 1)
    s = tiny_text_model.session(max_context=4)
    s.prefill([1, 2, 3])
    s.decode(4)
    with pytest.raises(retroinfer.Error, match="context is full"):
        s.decode(5)


def test_bad_tokens(tiny_text_model):
    s = tiny_text_model.session(max_context=8)
    with pytest.raises(retroinfer.Error, match="token id 512"):
        s.prefill([1, 512])
    with pytest.raises(retroinfer.Error, match="out of range"):
        s.prefill([1, 2**40])
    with pytest.raises(retroinfer.Error, match="empty"):
        s.prefill([])
    with pytest.raises(TypeError):
        s.prefill("text")
    with pytest.raises(retroinfer.Error):
        tiny_text_model.tokenizer.decode([100000])
    with pytest.raises(retroinfer.Error, match="empty prompt|no tokens"):
        tiny_text_model.generate([], max_tokens=2)


def test_bad_attention_parameters(tiny_text_model):
    with pytest.raises(retroinfer.Error, match="attention"):
        tiny_text_model.generate("x", attention="sparse")
    with pytest.raises(retroinfer.Error, match="retrieval_fraction"):
        tiny_text_model.session(attention="retro", retrieval_fraction=2.0)
    with pytest.raises(retroinfer.Error, match="sink_tokens"):
        tiny_text_model.generate("x", attention="retro", sink_tokens=-1)
    with pytest.raises(retroinfer.Error, match="out of range"):
        tiny_text_model.session(window_tokens=2**40)
    with pytest.raises(TypeError, match="unknown attention parameter 'window'"):
        tiny_text_model.session(window=3)
    with pytest.raises(TypeError):
        tiny_text_model.session(tokens_per_cluster=8.5)
    with pytest.raises(retroinfer.Error):
        tiny_text_model.session(kv_dtype="f8")
    with pytest.raises(retroinfer.Error):
        tiny_text_model.generate("x", temperature=-1.0)
    with pytest.raises(retroinfer.Error):
        tiny_text_model.generate("x", top_p=0.0)
    with pytest.raises(retroinfer.Error, match="max_new_tokens"):
        tiny_text_model.generate("x", max_tokens=0)
    cfg = retroinfer.attention_config("retro", head_dim=64, window_tokens=32)  # head_dim < 128: 2 tokens per cluster
    assert cfg["tokens_per_cluster"] == 2 and cfg["window_tokens"] == 32 and cfg["attention"] == "retro"
    with pytest.raises(retroinfer.Error):
        retroinfer.attention_config("retro", estimation_fraction=0.9, retrieval_fraction=0.5)


def test_kv_placement_on_the_cpu():
    m = retroinfer.load(model_dir("tiny-llama3"), device="cpu", tokenizer="")
    assert m.session(attention="retro", max_context=64, kv_placement="auto").kv_placement is None
    for p in ("gpu", "split", "host"):
        with pytest.raises(retroinfer.Error, match=f"--kv-placement {p} \\(kv_placement='{p}'\\)"):
            m.session(attention="retro", max_context=64, kv_placement=p)
    with pytest.raises(retroinfer.Error, match="unknown|placement"):
        m.session(attention="retro", max_context=64, kv_placement="disk")
    with pytest.raises(TypeError, match="kv_placement takes a str"):
        m.session(attention="retro", max_context=64, kv_placement=1)
    with pytest.raises(retroinfer.Error, match="--cache-fraction"):
        m.session(attention="retro", max_context=64, cache_fraction=0.0)
    with pytest.raises(retroinfer.Error, match="fp4"):
        m.session(attention="retro", max_context=64, host_store="fp4")
    with pytest.raises(TypeError, match="host_store takes a str"):
        m.session(attention="retro", max_context=64, host_store=8)
    with pytest.raises(retroinfer.Error, match="--kv-placement host"):
        m.generate([1, 2, 3], max_tokens=2, attention="retro", kv_placement="host")
