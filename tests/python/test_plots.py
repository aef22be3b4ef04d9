"""The charts of --plot: retroinfer.plots on small inputs, the CLI's eval report / bench decode --plot on the
committed results (bench/results), and the CLI's error when matplotlib is missing."""

import lzma
import os
import stat
import subprocess
import sys

import pytest

from conftest import ROOT

plots = pytest.importorskip("retroinfer.plots")
pytest.importorskip("matplotlib")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
RESULTS = os.path.join(ROOT, "bench", "results")
# The README's charts must stay small (< 100 KB each).
MAX_PNG_BYTES = 100_000


def assert_png(path):
    with open(path, "rb") as f:
        head = f.read(8)
    assert head == PNG_SIGNATURE, f"{path} is not a PNG"
    assert 1000 < os.path.getsize(path) < MAX_PNG_BYTES, f"{path}: {os.path.getsize(path)} bytes"


def test_eval_charts(tmp_path):
    summary = {"tasks": ["a", "b"], "averages": [
        {"context": c, "method": m, "score": s, "kv_placement": "gpu", "context_tokens_per_head": c,
         "exact_tokens_per_head": c if m == "full" else c * 0.03}
        for c, scores in ((4096, (90, 89)), (8192, (85, 80))) for m, s in zip(("full", "retro"), scores)]}
    ppl = [{"prefix_tokens": p, "methods": [{"method": "full", "ppl_rel_diff": 0.0},
                                            {"method": "retro", "ppl_rel_diff": d}]}
           for p, d in ((4032, 0.02), (8128, 0.03))]
    written = plots.eval_charts(summary, ppl, str(tmp_path))
    assert [os.path.basename(p) for p in written] == ["eval_score_vs_context.png", "eval_ppl_delta_vs_context.png"]
    for p in written:
        assert_png(p)


def test_decode_charts_skip_rows_without_a_measurement(tmp_path):
    rows = [{"bench": "decode_env", "model": "llama3-8b", "device": "test"}]
    for batch, tok_s in ((1, 100.0), (4, 300.0)):
        rows.append({"bench": "decode", "context": 131072, "method": "retro", "placement": "gpu", "batch": batch,
                     "tok_s": tok_s, "breakdown_ms": {"attention": 2.0, "other": 4.0}})
    rows.append({"bench": "decode", "context": 131072, "method": "full", "placement": "gpu", "batch": 9,
                 "status": "refused"})
    written = plots.decode_charts(rows, str(tmp_path))
    assert [os.path.basename(p) for p in written] == ["decode_tokens_per_s.png", "decode_step_breakdown.png"]
    for p in written:
        assert_png(p)
    with pytest.raises(ValueError, match="no measured rows"):
        plots.decode_charts(rows[-1:], str(tmp_path))


def test_cli_eval_report_plot_of_committed_results(cli, tmp_path):
    results = tmp_path / "results.jsonl"
    with lzma.open(os.path.join(RESULTS, "h200-qwen25-coder-accuracy", "results.jsonl.xz"), "rt") as f:
        results.write_text("".join(f.readlines()[:400]))
    ppl = [os.path.join(RESULTS, "h200-qwen25-coder-accuracy", f"ppl_{n}.json") for n in (4032, 8128)]
    out = tmp_path / "charts"
    # TMPDIR: where the CLI keeps the summary for the chart script, removed afterwards.
    r = subprocess.run([cli, "eval", "report", "--results", str(results), "--ppl", *ppl, "--plot", str(out)],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(out)) == ["eval_ppl_delta_vs_context.png", "eval_score_vs_context.png"]
    for name in os.listdir(out):
        assert_png(out / name)
    assert not [n for n in os.listdir(tmp_path) if n.startswith("retroinfer-eval-summary")]


def test_cli_bench_decode_plot_from_committed_results(cli, tmp_path):
    runs = ",".join(os.path.join(RESULTS, d) for d in ("h200-e2e/128k_batches.jsonl", "h200-host-tier/host_128k_int8.jsonl"))
    r = subprocess.run([cli, "bench", "decode", "--plot", str(tmp_path), "--plot-from", runs],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["decode_step_breakdown.png", "decode_tokens_per_s.png"]


def test_cli_plot_without_matplotlib_says_what_to_install(cli, tmp_path):
    # A python3 first on PATH in which `import matplotlib` fails.
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexec " + sys.executable + " -c \"import runpy, sys; sys.modules['matplotlib'] = None; "
                    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')\" \"$@\"\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ, PATH=f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    runs = os.path.join(RESULTS, "h200-e2e", "128k_batches.jsonl")
    r = subprocess.run([cli, "bench", "decode", "--plot", str(tmp_path / "charts"), "--plot-from", runs],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 1
    assert "matplotlib is missing" in r.stderr and "pip install matplotlib==" in r.stderr, r.stderr
    assert not (tmp_path / "charts").exists()
