"""Session logits against the Hugging Face reference fixtures (tests/data/models/<name>/reference.json), at the
tolerance of the C++ test (tests/unit/test_model_hf.cpp): both sides compute in f32 on the same bf16-exact
weights and differ only in summation order and libm, a few 1e-6 of the logit scale; the bound is 1e-4 of the
largest |logit| of the row with a floor of 1e-5, loose for any summation order, tight for a wrong RoPE angle,
a missing bias or norm weight (changes of order 1e-2..1 here)."""

import json
import os

import numpy as np
import pytest

import retroinfer
from conftest import model_dir

REL_TOL = 1e-4
FIXTURES = ["tiny-llama3", "tiny-qwen2", "tiny-llama-yarn", "tiny-llama-dynamic"]


def reference(name):
    p = os.path.join(model_dir(name), "reference.json")
    if not os.path.exists(p) or not os.path.exists(os.path.join(model_dir(name), "model.safetensors")):
        pytest.skip(f"fixture {name} absent (scripts/make_tiny_models.py)")
    with open(p) as f:
        return json.load(f)


def assert_logits_near(got, want, what):
    want = np.asarray(want, dtype=np.float64)
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape, what
    err = np.abs(got - want)
    scale = np.abs(want).max()
    tol = max(REL_TOL * scale, 1e-5)
    i = int(err.argmax())
    assert err[i] <= tol, f"{what}: worst |ours - HF| = {err[i]:.3g} at id {i} (ours {got[i]}, HF {want[i]}), scale {scale}"


@pytest.mark.parametrize("name", FIXTURES)
def test_prefill_logits_match_reference(name):
    ref = reference(name)
    model = retroinfer.load(model_dir(name), device="cpu", tokenizer="")
    vocab = model.config["vocab_size"]
    # Chunk 64 over 300 tokens: four full chunks and a tail of 44, so chunk boundaries are crossed.
    s = model.session(attention="full", prefill_chunk=64)
    logits = s.prefill(ref["tokens"], all_logits=True)
    assert logits.dtype == np.float32 and logits.shape == (len(ref["tokens"]), vocab)
    assert s.num_tokens == len(ref["tokens"])
    for pos, want in zip(ref["positions"], ref["logits"]):
        assert_logits_near(logits[pos], want, f"{name} position {pos}")


@pytest.mark.parametrize("name", FIXTURES)
def test_greedy_decode_matches_reference(name):
    ref = reference(name)
    model = retroinfer.load(model_dir(name), device="cpu", tokenizer="")
    s = model.session(attention="full", max_context=len(ref["tokens"]) + len(ref["greedy"]))
    logits = s.prefill(ref["tokens"])
    assert logits.shape == (model.config["vocab_size"],)
    steps = {int(k): v for k, v in ref["greedy_logits"].items()}
    for step, want_tok in enumerate(ref["greedy"]):
        if step in steps:
            assert_logits_near(logits, steps[step], f"{name} decode step {step}")
        tok = int(np.argmax(logits))
        if tok != want_tok:
            # Only a near tie may flip the choice: HF's top-2 margin must be within the logit tolerance.
            assert ref["greedy_margin"][step] < 1e-3, f"{name}: greedy token {step} is {tok}, HF chose {want_tok}"
            return
        logits = s.decode(tok)
    assert s.num_tokens == len(ref["tokens"]) + len(ref["greedy"])
    assert s.last_stats["exact_token_share"] == 1.0  # full attention reads every cached token


def test_retro_session_reads_a_share_and_forks():
    """A retro session over a prefilled prompt reads a subset exactly (exact-token share < 1); forks of it
    onto the same KV cache: full attention equals a fresh full session bit for bit, and retro retrieving
    every cluster exactly (retrieval_fraction 1, nothing estimated) equals full attention within the logit
    tolerance (only the log-sum-exp merge order differs)."""
    ref = reference("tiny-llama3")
    model = retroinfer.load(model_dir("tiny-llama3"), device="cpu", tokenizer="")
    kw = dict(sink_tokens=4, window_tokens=16, tokens_per_cluster=8)
    retro = model.session(attention="retro", max_context=400, **kw)
    assert retro.attention_config["tokens_per_cluster"] == 8 and retro.attention == "retro"
    first = retro.prefill(ref["tokens"])
    tok = int(np.argmax(first))
    full = retro.fork("full")
    every = retro.fork(retrieval_fraction=1.0, estimation_fraction=0.0, outlier_fraction=0.0)
    assert every.attention == "retro" and every.attention_config["window_tokens"] == 16
    a = retro.decode(tok)
    st = retro.last_stats
    assert 0 < st["exact_tokens"] < st["context_tokens"], st
    assert st["retrieved_clusters"] > 0 and st["estimated_clusters"] > 0, st
    b = full.decode(tok)
    assert full.last_stats["exact_token_share"] == 1.0
    assert not np.array_equal(a, b)
    c = every.decode(tok)
    assert every.last_stats["exact_token_share"] == 1.0, every.last_stats
    assert_logits_near(c, b, "retro retrieving every cluster vs full")
    fresh = model.session(attention="full", max_context=400)
    fresh.prefill(ref["tokens"])
    np.testing.assert_array_equal(fresh.decode(tok), b)
