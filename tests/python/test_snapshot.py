"""Model.save_snapshot and generate(snapshot=): the saved context's continuation gives the tokens of a cold
prompt (docs/prefix-cache.md); the CLI's `snapshot save` / `generate --snapshot` read the same files; a file
from another attention configuration or a corrupt one raises retroinfer.Error saying which."""

import json
import subprocess

import pytest

import retroinfer

DOC = "In the beginning God created the heaven and the earth. And the earth was without form, and void. " * 4
QUESTION = " And God said, Let there be light:"
RETRO_KW = dict(attention="retro", sink_tokens=4, window_tokens=16, tokens_per_cluster=8)


@pytest.mark.parametrize("attention", ["full", "retro", "quest"])
def test_snapshot_continuation_equals_cold(tiny_text_model, tmp_path, attention):
    kw = dict(RETRO_KW, attention=attention)
    path = str(tmp_path / "doc.snapshot")
    n = tiny_text_model.save_snapshot(DOC, path, **kw)
    doc_ids = tiny_text_model.tokenizer.encode(DOC, add_special=True)
    assert n == len(doc_ids)
    q_ids = tiny_text_model.tokenizer.encode(QUESTION)
    cold = tiny_text_model.generate(doc_ids + q_ids, max_tokens=12, ignore_eos=True, **kw)
    warm = tiny_text_model.generate(QUESTION, max_tokens=12, ignore_eos=True, snapshot=path, **kw)
    assert warm.tokens == cold.tokens
    assert warm.reused_tokens == n
    assert warm.prompt_tokens == n + len(q_ids)
    # No prompt: the context itself, all but its last token reused.
    alone = tiny_text_model.generate("", max_tokens=6, ignore_eos=True, snapshot=path, **kw)
    assert alone.reused_tokens == n - 1
    assert alone.tokens == tiny_text_model.generate(doc_ids, max_tokens=6, ignore_eos=True, **kw).tokens


def test_snapshot_refusals(tiny_text_model, tmp_path):
    path = str(tmp_path / "doc.snapshot")
    tiny_text_model.save_snapshot(DOC, path, **RETRO_KW)
    with pytest.raises(retroinfer.Error, match="another attention configuration: attention=retro"):
        tiny_text_model.generate(QUESTION, max_tokens=2, snapshot=path, attention="full")
    with pytest.raises(retroinfer.Error, match="holds f32 K/V but this session's KV cache is bf16"):
        tiny_text_model.generate(QUESTION, max_tokens=2, snapshot=path, kv_dtype="bf16", **RETRO_KW)
    data = bytearray(open(path, "rb").read())
    data[-5] ^= 0xFF
    bad = tmp_path / "bad.snapshot"
    bad.write_bytes(bytes(data))
    with pytest.raises(retroinfer.Error, match="section KVDT is corrupt"):
        tiny_text_model.generate(QUESTION, max_tokens=2, snapshot=str(bad), **RETRO_KW)
    bad.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(retroinfer.Error, match="truncated"):
        tiny_text_model.generate(QUESTION, max_tokens=2, snapshot=str(bad), **RETRO_KW)


def test_cli_reads_the_same_snapshot(cli, tiny_text_model_dir, tiny_text_model, tmp_path):
    path = str(tmp_path / "cli.snapshot")
    args = ["--attention", "retro", "--sink", "4", "--window", "16", "--tokens-per-cluster", "8"]
    r = subprocess.run([cli, "snapshot", "save", "--model", tiny_text_model_dir, "--device", "cpu", "--prompt", DOC,
                        "--out", path, *args], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    out = tmp_path / "summary.json"
    r = subprocess.run([cli, "generate", "--model", tiny_text_model_dir, "--device", "cpu", "--snapshot", path,
                        "--prompt", QUESTION, "--max-new-tokens", "12", "--ignore-eos", "--json", str(out), *args],
                       capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    summary = json.loads(out.read_text())
    py = tiny_text_model.generate(QUESTION, max_tokens=12, ignore_eos=True, snapshot=path, **RETRO_KW)
    assert summary["tokens"] == py.tokens
    assert summary["reused_tokens"] == py.reused_tokens > 0
    r = subprocess.run([cli, "generate", "--model", tiny_text_model_dir, "--device", "cpu", "--snapshot", path,
                        "--prompt", QUESTION, "--attention", "full"], capture_output=True, timeout=60)
    assert r.returncode != 0
    assert b"another attention configuration" in r.stderr


def test_serve_preload_puts_the_snapshot_in_the_prefix_cache(cli, tiny_text_model_dir, tiny_text_model, tmp_path):
    import urllib.request

    from conftest import Server

    path = str(tmp_path / "doc.snapshot")
    n = tiny_text_model.save_snapshot(DOC, path, attention="full")
    args = ["--device", "cpu", "--attention", "full", "--no-request-log", "--prefix-cache-mb", "64",
            "--prefix-cache-block", "32"]
    with pytest.raises(RuntimeError, match="another attention configuration: attention=full"):
        Server(cli, tiny_text_model_dir, *args[:2], "--attention", "retro", *args[4:], "--preload", path).close()
    s = Server(cli, tiny_text_model_dir, *args, "--preload", path)
    try:
        body = json.dumps({"prompt": DOC + QUESTION, "max_tokens": 4, "temperature": 0}).encode()
        req = urllib.request.Request(s.base_url + "/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            usage = json.load(r)["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == n // 32 * 32
        with urllib.request.urlopen(s.base_url[: -len("/v1")] + "/metrics", timeout=60) as r:
            metrics = r.read().decode()
        assert f"retroinfer_prefix_cache_pinned_blocks {n // 32}\n" in metrics
        assert "retroinfer_prefix_cache_hits_total 1\n" in metrics
    finally:
        s.close()
