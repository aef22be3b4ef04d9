"""Tokenizer bindings: the Hugging Face goldens of tests/data/tokenizer, round trips, chat templates."""

import json
import os

import pytest

import retroinfer
from conftest import DATA


def tok_path(name):
    return os.path.join(DATA, "tokenizer", name)


@pytest.fixture(scope="module")
def tiny_bpe():
    return retroinfer.Tokenizer.from_file(tok_path("tiny_bpe.tokenizer.json"))


def test_encode_matches_hf_goldens_and_round_trips(tiny_bpe):
    with open(tok_path("goldens_tiny_bpe.json")) as f:
        g = json.load(f)
    assert len(g["cases"]) > 200
    for i, case in enumerate(g["cases"]):
        ids = tiny_bpe.encode(case["text"])
        assert ids == case["ids"], f"case {i}: {case['text']!r}"
        assert tiny_bpe.decode(ids) == case["text"], f"case {i}: {case['text']!r}"
        # bytes in, exact bytes out
        assert tiny_bpe.decode_bytes(tiny_bpe.encode(case["text"].encode())) == case["text"].encode()
    for case in g["with_special"]:
        assert tiny_bpe.encode(case["text"], add_special=True) == case["ids"]


def test_special_tokens_and_properties(tiny_bpe):
    assert tiny_bpe.vocab_size == len(tiny_bpe) == 701
    assert tiny_bpe.bos_id == 0
    assert tiny_bpe.token_to_id("<|eot_id|>") == 2 and tiny_bpe.token_to_id("no such token") is None
    assert tiny_bpe.encode("<|eot_id|>") == [2]
    assert tiny_bpe.encode("<|eot_id|>", parse_special=False) != [2]
    assert tiny_bpe.decode([0, 42], skip_special=True) == tiny_bpe.decode([42])
    assert tiny_bpe.token_to_piece(42) == tiny_bpe.decode_bytes([42])
    # Half a UTF-8 sequence: decode replaces it, decode_bytes keeps it.
    ids = tiny_bpe.encode("é")
    first_byte = tiny_bpe.decode_bytes(ids)[:1]
    part = [i for i in range(tiny_bpe.vocab_size) if tiny_bpe.token_to_piece(i) == first_byte]
    if part:
        assert tiny_bpe.decode(part) == "\ufffd" and tiny_bpe.decode_bytes(part) == first_byte


def test_model_tokenizer_and_chat_template(tiny_text_model):
    tok = tiny_text_model.tokenizer
    assert tok.vocab_size == 259 and tok.chat_format == "chatml"
    assert 256 in tok.eog_ids
    s = "Grüße, 世界! 🦊"
    assert tok.decode(tok.encode(s)) == s
    msgs = [{"role": "system", "content": "S"}, ("user", "Hi")]
    text = tok.apply_chat_template(msgs)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.apply_chat_template(msgs, add_generation_prompt=False).endswith("Hi<|im_end|>\n")
    assert tok.encode(text)[0] == 257  # <|im_start|> as one special id
