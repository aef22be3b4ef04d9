"""Model.generate against `retroinfer generate` (the same library functions: text_generate.h), and its
options: determinism, token-id prompts, streaming, stop strings, callbacks, sampling seeds."""

import json
import subprocess

import pytest

import retroinfer

PROMPT = "The quick brown fox jumps over the lazy dog. " * 3
# Retro with a steady zone smaller than the prompt, so that the index is used: the CLI flags and the
# keywords that mean the same.
RETRO_CLI = ["--attention", "retro", "--sink", "4", "--window", "16", "--tokens-per-cluster", "8"]
RETRO_KW = dict(attention="retro", sink_tokens=4, window_tokens=16, tokens_per_cluster=8)


def run_cli(cli, model_dir, tmp_path, *args):
    out = tmp_path / "summary.json"
    r = subprocess.run([cli, "generate", "--model", model_dir, "--device", "cpu", "--json", str(out), *args],
                       capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    with open(out) as f:
        return json.load(f), r.stdout


@pytest.mark.parametrize("mode", ["full", "retro", "chat"])
def test_greedy_generate_equals_cli(cli, tiny_text_model_dir, tiny_text_model, tmp_path, mode):
    cli_args = ["--prompt", PROMPT, "--max-new-tokens", "24"]
    kw = dict(max_tokens=24)
    if mode == "retro":
        cli_args += RETRO_CLI
        kw.update(RETRO_KW)
    else:  # both default to retro: full attention is asked for
        cli_args += ["--attention", "full"]
        kw.update(attention="full")
    if mode == "chat":
        cli_args += ["--chat", "--system", "Be brief."]
        kw.update(chat=True, system="Be brief.")
    want, stdout = run_cli(cli, tiny_text_model_dir, tmp_path, *cli_args)
    got = tiny_text_model.generate(PROMPT, **kw)
    assert got.tokens == want["tokens"]
    assert got.text == want["text"]
    assert stdout.decode() == got.text + "\n"  # the CLI streams the same text
    assert got.stop_reason == want["stop_reason"]
    assert got.attention == want["attention"]
    assert got.prompt_tokens == want["prompt_tokens"] and got.generated_tokens == want["generated_tokens"]
    if mode == "retro":
        assert 0 < got.kv_read_share < 1 and got.kv_read_share == pytest.approx(want["kv_read_share"], rel=1e-12)
    else:
        assert got.kv_read_share == 1.0


def test_greedy_generate_is_deterministic_and_text_equals_ids(tiny_text_model):
    a = tiny_text_model.generate(PROMPT, max_tokens=20, ignore_eos=True)
    b = tiny_text_model.generate(PROMPT, max_tokens=20, ignore_eos=True)
    assert a.tokens == b.tokens and a.text == b.text
    assert len(a.tokens) == 20 and a.stop_reason == "max_tokens"
    # A prompt given as ids: the text's encoding (add_special, as generate does) gives the same tokens.
    ids = tiny_text_model.tokenizer.encode(PROMPT, add_special=True)
    c = tiny_text_model.generate(ids, max_tokens=20, ignore_eos=True)
    assert c.tokens == a.tokens and c.prompt_tokens == len(ids)
    st = a.stats
    assert st["prompt_tokens"] == len(ids) and st["generated_tokens"] == 20 and st["decode_steps"] == 19
    assert st["prefill_s"] > 0 and st["decode_s"] > 0 and st["ttft_s"] >= st["prefill_s"]


def test_sampling_is_seeded(tiny_text_model):
    kw = dict(max_tokens=16, temperature=1.5, top_p=0.95, ignore_eos=True)
    a = tiny_text_model.generate(PROMPT, seed=7, **kw)
    b = tiny_text_model.generate(PROMPT, seed=7, **kw)
    c = tiny_text_model.generate(PROMPT, seed=8, **kw)
    assert a.tokens == b.tokens
    assert a.tokens != c.tokens  # 16 draws at temperature 1.5 over a random model's flat distribution


def test_on_token_streams_the_text(tiny_text_model):
    seen = []
    r = tiny_text_model.generate(PROMPT, max_tokens=24, ignore_eos=True, on_token=lambda t, s: seen.append((t, s)))
    assert [t for t, _ in seen[: len(r.tokens)]] == r.tokens
    assert "".join(s for _, s in seen) == r.text


def test_on_token_false_stops_and_exceptions_propagate(tiny_text_model):
    calls = []

    def stop_after_three(t, s):
        calls.append(t)
        return len(calls) < 3

    r = tiny_text_model.generate(PROMPT, max_tokens=24, ignore_eos=True, on_token=stop_after_three)
    assert r.stop_reason == "callback" and len(r.tokens) == 3

    def boom(t, s):
        raise ValueError("from the callback")

    with pytest.raises(ValueError, match="from the callback"):
        tiny_text_model.generate(PROMPT, max_tokens=24, on_token=boom)


def test_stop_string_cuts_the_text(tiny_text_model):
    full = tiny_text_model.generate(PROMPT, max_tokens=32, ignore_eos=True)
    text = full.text
    # A stop string taken from the middle of the unconstrained output (first occurrence defines the cut).
    stop = next(text[i:i + 2] for i in range(4, len(text) - 2) if "\ufffd" not in text[i:i + 2])
    r = tiny_text_model.generate(PROMPT, max_tokens=32, ignore_eos=True, stop=[stop, "never-there"])
    assert r.stop_reason == "stop_string"
    assert r.text == text[: text.index(stop)]
    assert r.tokens == full.tokens[: len(r.tokens)]


def test_token_prompt_without_tokenizer():
    from conftest import model_dir
    m = retroinfer.load(model_dir("tiny-llama3"), device="cpu", tokenizer="")
    assert m.tokenizer is None
    r = m.generate([1, 5, 9, 200], max_tokens=5, ignore_eos=True)
    assert len(r.tokens) == 5 and r.text == ""
    with pytest.raises(retroinfer.Error, match="without a tokenizer"):
        m.generate("text", max_tokens=2)


@pytest.mark.parametrize("flag,value", [("--kmeans-iters", "-1"), ("--segment-tokens", "0")])
def test_cli_rejects_bad_kmeans_options(cli, tiny_text_model_dir, flag, value):
    r = subprocess.run([cli, "generate", "--model", tiny_text_model_dir, "--device", "cpu", "--prompt", "x",
                        *RETRO_CLI, flag, value], capture_output=True, timeout=60)
    assert r.returncode != 0
    assert flag in r.stderr.decode(errors="replace")


def test_cli_kmeans_options_reach_the_index(cli, tiny_text_model_dir, tmp_path):
    # Zero k-means iterations is a valid (initialisation-only) index; the run must still generate.
    summary, _ = run_cli(cli, tiny_text_model_dir, tmp_path, "--prompt", PROMPT, "--max-new-tokens", "4",
                         *RETRO_CLI, "--kmeans-iters", "0", "--segment-tokens", "16")
    assert summary["generated_tokens"] >= 1


def test_generate_defaults_to_retro_in_python_and_the_cli(cli, tiny_text_model_dir, tiny_text_model, tmp_path):
    assert tiny_text_model.generate(PROMPT, max_tokens=2).attention == "retro"
    want, _ = run_cli(cli, tiny_text_model_dir, tmp_path, "--prompt", PROMPT, "--max-new-tokens", "2")
    assert want["attention"] == "retro"
