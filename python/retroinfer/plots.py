"""Charts of retroinfer's JSON results (PNG, matplotlib).

The CLI runs this file for `retroinfer eval report --plot DIR` and `retroinfer bench decode --plot DIR`; it
needs only the standard library and matplotlib, so it also runs on its own:

    python3 plots.py eval --summary tasks_summary.json --ppl ppl_4032.json ppl_8128.json --out DIR
    python3 plots.py decode --jsonl 128k_batches.jsonl host_128k_int8.jsonl --out DIR

From Python (after `pip install .`):

    from retroinfer import plots
    plots.eval_charts(summary, ppl_reports, "charts/")   # dicts as read with json.load
    plots.decode_charts(rows, "charts/")                 # the JSON lines of bench decode as dicts

The inputs: `eval report --summary` / `eval tasks --summary` (averages per context and method),
`eval ppl --json` (one report per prefix length), `bench decode --out` (JSON lines). docs/install.md#charts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Iterable

# Exit status when matplotlib is missing (the CLI turns it into an error that says what to install).
EXIT_NO_MATPLOTLIB = 3
MATPLOTLIB_PIN = "matplotlib==3.10.7"  # the version scripts/setup.sh installs

# One colour and marker per attention method across every chart.
_STYLE = {
    "full": ("#222222", "o"),
    "retro": ("#d62728", "s"),
    "retro-noest": ("#ff9896", "s"),
    "quest": ("#1f77b4", "^"),
    "streaming": ("#7f7f7f", "v"),
    "oracle": ("#2ca02c", "D"),
}
# Placements after the method's colour: dashes tell the KV placement apart.
_DASHES = {"gpu": "-", "split": "--", "host": ":", "auto": "-."}


def _pyplot():
    """matplotlib.pyplot on the file-only Agg backend, or SystemExit with what to install."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.stderr.write(
            f"plots: matplotlib is not installed for {sys.executable}: run scripts/setup.sh, or "
            f"{sys.executable} -m pip install {MATPLOTLIB_PIN}\n"
        )
        raise SystemExit(EXIT_NO_MATPLOTLIB)
    plt.rcParams.update({"figure.dpi": 100, "font.size": 9, "axes.grid": True, "grid.alpha": 0.3})
    return plt


def _style(method: str) -> tuple[str, str]:
    return _STYLE.get(method, ("#9467bd", "x"))


def _tokens_label(n: float) -> str:
    """4096 -> '4K', 1048576 -> '1M'."""
    n = int(round(n))
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    if n >= 1024:
        return f"{n / 1024:.0f}K" if n % 1024 == 0 else f"{n / 1024:.1f}K"
    return str(n)


def _save(plt, fig, out_dir: str, name: str, tight_layout: bool = True) -> str:
    """Writes fig as out_dir/name; tight_layout=False when a legend outside the axes would shrink them (the
    saved area still grows to hold it)."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    if tight_layout:
        fig.tight_layout()
    fig.savefig(path, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def _context_axis(ax, contexts: Iterable[float]) -> None:
    ticks = sorted(set(contexts))
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks)
    ax.set_xticklabels([_tokens_label(t) for t in ticks])
    ax.minorticks_off()


def eval_charts(summary: dict | None, ppl_reports: list[dict], out_dir: str, title: str = "") -> list[str]:
    """Writes eval_score_vs_context.png (task score per method; `summary`: the JSON of `eval report
    --summary`) and eval_ppl_delta_vs_context.png (perplexity change against full per method; `ppl_reports`:
    JSONs of `eval ppl --json`, one per prefix length). Returns the paths written."""
    plt = _pyplot()
    written = []
    if summary is not None:
        rows = summary.get("averages", [])
        if not rows:
            raise ValueError("eval summary: no 'averages' (expected the JSON of `retroinfer eval report --summary`)")
        placements = {r.get("kv_placement", "") for r in rows}
        lines: dict[tuple[str, str], list[tuple[int, float, float]]] = {}
        for r in rows:
            share = r["exact_tokens_per_head"] / r["context_tokens_per_head"] if r.get("context_tokens_per_head") else 1.0
            key = (r["method"], r.get("kv_placement", "") if len(placements) > 1 else "")
            lines.setdefault(key, []).append((r["context"], r["score"], share))
        fig, ax = plt.subplots(figsize=(6.4, 3.8))
        for (method, placement), pts in lines.items():
            pts.sort()
            colour, marker = _style(method)
            mean_share = sum(p[2] for p in pts) / len(pts)
            label = method + (f" ({placement})" if placement else "")
            if method != "full":
                label += f", {100 * mean_share:.1f}% of the KV read exactly"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colour, marker=marker,
                    linestyle=_DASHES.get(placement, "-"), label=label)
        _context_axis(ax, [r["context"] for r in rows])
        ax.set_ylim(0, 100)
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel(f"task score (mean of {len(summary.get('tasks', [])) or '?'} tasks)")
        ax.set_title(title or "Accuracy against context length")
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)
        written.append(_save(plt, fig, out_dir, "eval_score_vs_context.png", tight_layout=False))
    if ppl_reports:
        lines = {}
        for rep in ppl_reports:
            if "methods" not in rep or "prefix_tokens" not in rep:
                raise ValueError("ppl report: no 'methods' / 'prefix_tokens' (expected the JSON of `retroinfer eval ppl --json`)")
            for m in rep["methods"]:
                if m["method"] == "full":
                    continue
                lines.setdefault(m["method"], []).append((rep["prefix_tokens"], 100.0 * m["ppl_rel_diff"]))
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        for method, pts in lines.items():
            pts.sort()
            colour, marker = _style(method)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colour, marker=marker, label=method)
        _context_axis(ax, [rep["prefix_tokens"] for rep in ppl_reports])
        ax.axhline(0.0, color=_style("full")[0], linewidth=0.8)
        ax.set_xlabel("prefix length (tokens)")
        ax.set_ylabel("perplexity vs full (% change)")
        ax.set_title(title or "Perplexity against full attention (teacher-forced)")
        ax.legend(fontsize=8)
        written.append(_save(plt, fig, out_dir, "eval_ppl_delta_vs_context.png"))
    return written


def _decode_key(r: dict) -> tuple[str, str]:
    """(method, placement label) of a bench decode row: the host store is named when it is not bf16."""
    placement = r.get("placement", "")
    if placement != "gpu" and r.get("host_store", "bf16") != "bf16":
        placement += f", {r['host_store']} host store"
    if r.get("mode") == "joined":
        placement += ", joined"
    return r["method"], placement


def decode_charts(rows: list[dict], out_dir: str, title: str = "") -> list[str]:
    """Writes decode_tokens_per_s.png (tokens/s against batch per method and KV placement, one panel per
    context) and decode_step_breakdown.png (ms per decode step: attention and the rest) from the JSON lines of
    `retroinfer bench decode`. Rows without a measurement (refused, error, --plan-only) are left out; a
    configuration measured twice keeps its last row. Returns the paths written."""
    plt = _pyplot()
    env = next((r for r in rows if r.get("bench") == "decode_env"), {})
    measured: dict[tuple, dict] = {}
    for r in rows:
        if r.get("bench") == "decode" and r.get("tok_s") is not None:
            measured[(r["context"],) + _decode_key(r) + (r["batch"],)] = r
    if not measured:
        raise ValueError("bench decode: no measured rows (bench: decode with tok_s) in the input")
    weights = f", {env['weights']} weights" if env.get("weights") else ""
    subtitle = title or f"bench decode, {env.get('model', 'model')} shape{weights}, {env.get('device', '')}".rstrip(", ")
    written = []

    contexts = sorted({k[0] for k in measured})
    fig, axes = plt.subplots(1, len(contexts), figsize=(4.2 * len(contexts) + 1.2, 3.8), squeeze=False)
    for ax, ctx in zip(axes[0], contexts):
        lines: dict[tuple[str, str], list[tuple[int, float]]] = {}
        for (c, method, placement, batch), r in measured.items():
            if c == ctx:
                lines.setdefault((method, placement), []).append((batch, r["tok_s"]))
        for (method, placement), pts in sorted(lines.items()):
            pts.sort()
            colour, marker = _style(method)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colour, marker=marker,
                    linestyle=_DASHES.get(placement.split(",")[0], "-"), label=f"{method}, {placement}")
        batches = sorted({p[0] for pts in lines.values() for p in pts})
        ax.set_xticks(batches)
        ax.set_xlabel("batch (sequences)")
        ax.set_ylabel("decode tokens/s (whole batch)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"context {_tokens_label(ctx)}")
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(subtitle, fontsize=9)
    written.append(_save(plt, fig, out_dir, "decode_tokens_per_s.png"))

    bars = [(k, r) for k, r in sorted(measured.items()) if isinstance(r.get("breakdown_ms"), dict)]
    if bars:
        fig, ax = plt.subplots(figsize=(6.4, 0.9 + 0.28 * len(bars)))
        labels = [f"{_tokens_label(k[0])} {k[1]}, {k[2]}, batch {k[3]}" for k, _ in bars]
        attention = [r["breakdown_ms"].get("attention", 0.0) for _, r in bars]
        other = [r["breakdown_ms"].get("other", 0.0) for _, r in bars]
        ys = range(len(bars))
        ax.barh(ys, attention, color="#d62728", label="attention")
        ax.barh(ys, other, left=attention, color="#aaaaaa", label="rest (products, norms, LM head)")
        ax.set_yticks(list(ys))
        ax.set_yticklabels(labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("ms per decode step")
        ax.set_title(subtitle, fontsize=8)
        ax.legend(fontsize=7, loc="lower right")
        written.append(_save(plt, fig, out_dir, "decode_step_breakdown.png"))
    return written


def _read_json(path: str) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _read_json_lines(path: str) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not a JSON line ({e.msg})") from None
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="plots.py", description="PNG charts of retroinfer's JSON results")
    sub = parser.add_subparsers(dest="kind", required=True)
    e = sub.add_parser("eval", help="task score and perplexity change against context length")
    e.add_argument("--summary", help="JSON of `retroinfer eval report --summary`")
    e.add_argument("--ppl", nargs="*", default=[], help="JSONs of `retroinfer eval ppl --json`")
    e.add_argument("--out", required=True, help="folder for the PNG files")
    e.add_argument("--title", default="")
    d = sub.add_parser("decode", help="tokens/s against batch and the per-step time of `bench decode`")
    d.add_argument("--jsonl", nargs="+", required=True, help="JSON lines of `retroinfer bench decode --out`")
    d.add_argument("--out", required=True, help="folder for the PNG files")
    d.add_argument("--title", default="")
    a = parser.parse_args(argv)
    try:
        if a.kind == "eval":
            if a.summary is None and not a.ppl:
                parser.error("eval: give --summary and/or --ppl")
            summary = _read_json(a.summary) if a.summary else None
            written = eval_charts(summary, [_read_json(p) for p in a.ppl], a.out, a.title)
        else:
            rows = [r for p in a.jsonl for r in _read_json_lines(p)]
            written = decode_charts(rows, a.out, a.title)
    except (OSError, ValueError, KeyError) as err:
        sys.stderr.write(f"plots: {err.__class__.__name__}: {err}\n")
        return 1
    for p in written:
        print(f"plots: wrote {p} ({os.path.getsize(p) // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
