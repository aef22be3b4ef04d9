#!/usr/bin/env python3
"""Merges the output of scripts/run_accuracy.sh runs (a work folder) into the files scripts/gpu-accuracy.sh
returns: results.jsonl (every result line once), tasks_summary.json + the task table (`retroinfer eval
report` over results.jsonl), ppl_*.json, run.json (how much ran: samples complete per context, budget spent)
and report.md (status + tables). Standard library only (the GPU machine installs nothing)."""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys

# The task generator's tasks, in its order (task_names() in src/eval/tasks.cpp).
ALL_TASKS = ["niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey", "niah_multivalue",
             "niah_multiquery", "vt", "cwe", "fwe", "passkey"]


def key(j):
    return (j["task"], int(j["context"]), int(j["index"]), j["method"])


def read_lines(path):
    """Complete JSON lines of a results file (a line cut off by a kill is skipped)."""
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.endswith("\n"):
                break
            try:
                j = json.loads(line)
            except json.JSONDecodeError:
                continue
            if all(k in j for k in ("task", "context", "index", "method")):
                out.append(j)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--samples", type=int, required=True)
    ap.add_argument("--contexts", required=True)
    ap.add_argument("--methods", required=True)
    ap.add_argument("--tasks", default="all")
    ap.add_argument("--budget", type=float, default=0)
    ap.add_argument("--elapsed", type=float, default=0)
    ap.add_argument("--bin", required=True, help="the retroinfer binary (for eval report)")
    a = ap.parse_args()
    contexts = [int(c) for c in a.contexts.split(",") if c]
    methods = [m for m in a.methods.split(",") if m]
    tasks = ALL_TASKS if a.tasks == "all" else [t for t in a.tasks.split(",") if t]

    # Earlier call's lines first, then each part (which start with a copy of them: deduplicated).
    seen, lines = set(), []
    for path in [os.path.join(a.work, "previous.jsonl")] + sorted(glob.glob(os.path.join(a.work, "tasks.part*.jsonl"))):
        if not os.path.exists(path):
            continue
        for j in read_lines(path):
            if key(j) not in seen:
                seen.add(key(j))
                lines.append(j)
    results = os.path.join(a.out, "results.jsonl")
    with open(results, "w", encoding="utf-8") as f:
        for j in lines:
            f.write(json.dumps(j, ensure_ascii=False) + "\n")

    table = ""
    if lines:
        r = subprocess.run([a.bin, "eval", "report", "--results", results, "--summary",
                            os.path.join(a.out, "tasks_summary.json")], capture_output=True, text=True)
        table = r.stdout if r.returncode == 0 else "eval report failed: " + r.stderr
    for p in glob.glob(os.path.join(a.work, "ppl_*.json")):
        shutil.copy(p, a.out)

    # A sample is complete when every method has its line.
    complete = {}
    for c in contexts:
        n = 0
        for t in tasks:
            for i in range(a.samples):
                n += all((t, c, i, m) in seen for m in methods)
        complete[str(c)] = n
    jobs = []
    for p in sorted(glob.glob(os.path.join(a.work, "tasks.part*.stats.json"))):
        with open(p) as f:
            jobs.append(json.load(f))
    ppl = {}
    for p in sorted(glob.glob(os.path.join(a.work, "ppl_*.json"))):
        with open(p) as f:
            j = json.load(f)
        ppl[str(j.get("prefix_tokens"))] = {"windows": j.get("windows"), "windows_run": j.get("windows_run"),
                                            "attention_error_measured": j.get("attention_error_measured")}
    devices = sorted({j.get("device", "cpu") for j in lines})
    expected = len(tasks) * a.samples
    status = {
        "devices": devices,
        "device_description": jobs[0].get("device_description") if jobs else None,
        "tasks": tasks,
        "methods": methods,
        "samples_per_task_and_context": a.samples,
        "samples_expected_per_context": expected,
        "samples_complete_per_context": complete,
        "finished": all(complete[str(c)] == expected for c in contexts),
        "budget_spent": any(j.get("budget_spent") for j in jobs),
        "samples_run_this_call": sum(j.get("samples_run", 0) for j in jobs),
        "result_lines": len(lines),
        "budget_s": a.budget,
        "elapsed_s": a.elapsed,
        "jobs": jobs,
        "ppl": ppl,
    }
    with open(os.path.join(a.out, "run.json"), "w") as f:
        json.dump(status, f, indent=2)

    md = ["# Accuracy run: %s" % (status["device_description"] or ", ".join(devices)), ""]
    md.append("- samples complete (every method) per context: " + ", ".join(
        "%s: %d of %d" % (c, complete[str(c)], expected) for c in contexts) +
        ("" if status["finished"] else " (**partial**: rerun with RESUME_DIR to continue)"))
    md.append("- this call: %d samples run in %.0f s (budget %.0f s%s)" % (
        status["samples_run_this_call"], a.elapsed, a.budget, ", spent" if status["budget_spent"] else ""))
    md.append("- result lines: %d; methods: %s" % (len(lines), ", ".join(methods)))
    md += ["", "## Tasks (score: string_match_all, %)", "", table or "(no result lines)", ""]
    for p in sorted(glob.glob(os.path.join(a.work, "ppl_*.md"))):
        prefix = os.path.basename(p)[4:-3]
        info = ppl.get(prefix, {})
        md.append("## Teacher-forced fidelity, prefix %s (%s of %s windows)" % (
            prefix, info.get("windows_run"), info.get("windows")))
        if info.get("attention_error_measured") is False:
            md.append("")
            md.append("Per-layer attention error: not measured on this device (CPU runner only).")
        md += ["", open(p).read(), ""]
    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
