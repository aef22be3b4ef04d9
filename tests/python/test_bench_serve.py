"""`retroinfer bench serve` against a local `retroinfer serve` (the tiny model fixture): a short run whose
JSON report counts every request and whose latencies are consistent."""

import json
import math
import os
import subprocess

from conftest import Server


def test_bench_serve_reports(cli, tiny_text_model_dir, tmp_path):
    s = Server(cli, tiny_text_model_dir, "--served-model-name", "tiny", "--max-batch", "4")
    try:
        text = tmp_path / "text.txt"
        text.write_text(" ".join(f"word{i % 997} stone{i % 13}" for i in range(3000)))
        out = tmp_path / "report.json"
        r = subprocess.run([cli, "bench", "serve", "--base-url", s.base_url, "--concurrency", "4",
                            "--num-requests", "8", "--prompt-tokens", "64", "--max-tokens", "6", "--ignore-eos",
                            "--shared-prefix-share", "0.5", "--request-rate", "50", "--text-file", str(text),
                            "--json", str(out)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        rep = json.loads(out.read_text())
    finally:
        s.close()
    assert rep["model"] == "tiny"
    assert rep["sent"] == 8 and rep["completed"] == 8 and rep["errors"] == {}
    assert rep["output_tokens"] == 8 * 6
    # The byte tokenizer: one token per character, measured by the calibration request.
    assert abs(rep["config"]["chars_per_token"] - 1.0) < 0.01
    assert 0.9 * 64 <= rep["mean_prompt_tokens"] <= 1.1 * 64
    for k in ("ttft_ms", "itl_ms", "latency_ms"):
        assert rep[k]["p50"] <= rep[k]["p90"] <= rep[k]["p99"]
    assert rep["ttft_ms"]["p50"] <= rep["latency_ms"]["p50"]
    assert rep["requests_per_s"] > 0 and math.isclose(rep["output_tokens_per_s"] * rep["duration_s"], 48, rel_tol=0.01)


def test_bench_serve_clear_errors(cli, tmp_path):
    r = subprocess.run([cli, "bench", "serve", "--base-url", "http://127.0.0.1:9/v1", "--num-requests", "1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "cannot reach" in r.stderr
    r = subprocess.run([cli, "bench", "serve", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--shared-prefix-share" in r.stdout
    # --plot without matplotlib is refused before any request (simulated by hiding the module).
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    (tmp_path / "matplotlib.py").write_text("raise ImportError('hidden for the test')\n")
    r = subprocess.run([cli, "bench", "serve", "--plot", str(tmp_path / "x.png")], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 2 and "matplotlib" in r.stderr
