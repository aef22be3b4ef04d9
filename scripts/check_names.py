#!/usr/bin/env python3
"""The naming check: nothing in the code is named after when it was tried. Fails (exit 1) on
  - a benchmark run number in a file name, an identifier or a comment ("run 9", "run9", kRun25..., "Run 17");
  - a version suffix in an identifier or a file name (kExactV1, v1 kernels, *_v1.cpp);
  - an adjective standing in for a name in an identifier or a file name (kUpdateFast, finalize_fast_kernel,
    test_cuda_kmeans_fast.cpp).
Reads src/, include/, tools/, python/, tests/ (fixtures in tests/data excepted) and bench/*.cpp|h|sh.
History belongs in commit messages and docs/changelog.md; a variant that lost its A/B leaves the tree.

    scripts/check_names.py [ROOT]
    scripts/check_names.py --self-test     checks that planted names are caught and plain English is not
"""
import os
import re
import sys

DIRS = ("src", "include", "tools", "python", "tests", "bench")
SKIP_DIRS = {os.path.join("tests", "data"), os.path.join("bench", "results")}
SOURCE = re.compile(r"\.(h|hpp|cpp|cu|cuh|py|sh|txt|cmake)$")
RULES = [
    ("a run number", re.compile(r"(?<![A-Za-z])[Rr]un[ _-]?\d+|[a-z_]Run\d+")),
    ("a version suffix", re.compile(r"(?<![A-Za-z0-9])[A-Za-z_]*V1(?![0-9])|(?<![A-Za-z0-9])v1(?![0-9/])")),
    ("an adjective for a name", re.compile(r"(?<=[a-z_])Fast|_fast(?![a-z])|(?<![A-Za-z])fast_")),
]
# Text that looks like a rule but is not a name: the OpenAI API's URL prefix ("/v1/..."), YaRN's beta_fast (its
# Hugging Face parameter name).
ALLOWED = [re.compile(r"/v1\b|\bv1/"), re.compile(r"beta_fast")]


# A numbered pair of values (v0 / v1, k1 / v1) is an index, not a version.
PAIR = re.compile(r"\b(v0|k1|v2)\b")


def findings_in_text(text):
    out = []
    pairs = PAIR.search(text) is not None  # a file that numbers its values (v0, v1, ...) names no version v1
    for lineno, line in enumerate(text.splitlines(), 1):
        scrubbed = line
        for a in ALLOWED:
            scrubbed = a.sub("", scrubbed)
        if pairs:
            scrubbed = re.sub(r"\bv1\b", "", scrubbed)
        for what, rx in RULES:
            m = rx.search(scrubbed)
            if m:
                out.append((lineno, what, m.group(0)))
    return out


def violations(root):
    out = []
    for top in DIRS:
        base = os.path.join(root, top)
        for dirpath, dirnames, files in os.walk(base):
            rel_dir = os.path.relpath(dirpath, root)
            dirnames[:] = [d for d in dirnames if os.path.join(rel_dir, d) not in SKIP_DIRS]
            if top == "bench" and rel_dir != "bench":
                continue
            for f in sorted(files):
                rel = os.path.join(rel_dir, f)
                for what, rx in RULES:
                    m = rx.search(os.path.splitext(f)[0])
                    if m:
                        out.append(f"{rel}: the file name has {what} ('{m.group(0)}')")
                if not SOURCE.search(f):
                    continue
                with open(os.path.join(dirpath, f), encoding="utf-8", errors="replace") as fh:
                    for lineno, what, hit in findings_in_text(fh.read()):
                        out.append(f"{rel}:{lineno}: {what} ('{hit}')")
    return out


def self_test():
    bad = ["inline constexpr bool kRun9IsDefault = true;", "// since run 25 the default", "// Run 17 measured",
           "enum { kExactV1 = 0 };", "launch_run17(p);", "cudaError_t finalize_fast_kernel();", "kUpdateFast,",
           "RETROINFER_DECODE=run10s", "// the v1 kernel"]
    good = ["// the server answers POST /v1/chat/completions", "// fast enough for one warp per row",
            "const float* k_new = nullptr;", "// runs 9 times per segment", "int run_case(int n);",
            "// the run of rows", "// the default run", "const float v0 = a[0], v1 = a[1];"]
    failed = 0
    for s in bad:
        if not findings_in_text(s):
            print(f"self-test: not caught: {s}")
            failed += 1
    for s in good:
        if findings_in_text(s):
            print(f"self-test: wrongly caught: {s} -> {findings_in_text(s)}")
            failed += 1
    print("self-test: " + ("failed" if failed else f"{len(bad)} planted names caught, {len(good)} plain lines passed"))
    return 1 if failed else 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--self-test":
        return self_test()
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    bad = violations(root)
    for line in bad:
        print(line)
    if bad:
        print(f"check_names: {len(bad)} name(s) after a run, a version or an adjective")
        return 1
    print("check_names: no name says when it was tried")
    return 0


if __name__ == "__main__":
    sys.exit(main())
