#!/usr/bin/env python3
"""`retroinfer bench serve`: a load generator for any OpenAI-compatible server (retroinfer serve, vLLM,
llama.cpp's server, ...). Streams every request and reports throughput, time to first token (TTFT, at the
first chunk with content) and inter-token latency (ITL, the gaps between content chunks) percentiles, and
the errors by kind, as JSON (--json) and a PNG plot (--plot, with matplotlib).

Prompts are cut from a real text (--text-file, default the King James Bible of Debian's bible-kjv): each
prompt is about --prompt-tokens tokens (uniform within +-spread), of which a share (--shared-prefix-share)
is one prefix common to every request and the rest starts at a random place of the text. Characters per
token are measured first with one request (usage.prompt_tokens of a prompt of up to 12,000 characters) unless
--chars-per-token is given. Arrivals are Poisson at --request-rate requests/s (inf: all at once), at most
--concurrency in flight; the run ends after --num-requests requests or when --duration seconds have passed
(no new request starts after it). Standard library only, except matplotlib for --plot.

    scripts/bench_serve.py --base-url http://127.0.0.1:8080/v1 --concurrency 8 --num-requests 32 \
        --prompt-tokens 4096 --max-tokens 32 --json out.json --plot out.png
"""
import argparse
import http.client
import json
import math
import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

BIBLE_COMMAND = ["bible", "Ge1:1-Re22:21"]


def parse_args(argv):
    p = argparse.ArgumentParser(prog="retroinfer bench serve", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8080/v1", help="the API root (default %(default)s)")
    p.add_argument("--model", default="", help="model name (default: the first of GET /models)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", ""),
                   help="sent as 'Authorization: Bearer KEY' (default: $OPENAI_API_KEY, else none)")
    p.add_argument("--endpoint", choices=["completions", "chat"], default="completions",
                   help="/completions with the raw prompt, or /chat/completions with it as one user message")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight at most (default %(default)s)")
    p.add_argument("--request-rate", type=float, default=math.inf,
                   help="Poisson arrivals per second; inf: all at once (default)")
    p.add_argument("--num-requests", type=int, default=64, help="requests to send (default %(default)s)")
    p.add_argument("--duration", type=float, default=0.0, help="seconds after which no request starts (0: no limit)")
    p.add_argument("--prompt-tokens", type=int, default=4096, help="mean prompt length in tokens (default %(default)s)")
    p.add_argument("--prompt-tokens-spread", type=float, default=0.1,
                   help="prompt lengths are uniform in mean * (1 +- spread) (default %(default)s)")
    p.add_argument("--shared-prefix-share", type=float, default=0.0,
                   help="share of each prompt that is a prefix common to all requests, in [0, 1] (default 0)")
    p.add_argument("--max-tokens", type=int, default=64, help="max_tokens of each request (default %(default)s)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="send ignore_eos: true (a vLLM/retroinfer extension) so every request generates max_tokens")
    p.add_argument("--temperature", type=float, default=0.0, help="(default %(default)s)")
    p.add_argument("--text-file", default="", help="the text prompts are cut from (default: bible-kjv's Bible)")
    p.add_argument("--chars-per-token", type=float, default=0.0,
                   help="characters per token of the server's tokenizer (0: measure with one request)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="prompt and arrival seed (default %(default)s)")
    p.add_argument("--label", default="", help="a name for this run in the JSON and the plot")
    p.add_argument("--json", default="", help="write the report here")
    p.add_argument("--plot", default="", help="write a PNG plot here (needs matplotlib)")
    a = p.parse_args(argv)
    if a.concurrency < 1 or a.num_requests < 1 or a.max_tokens < 1 or a.prompt_tokens < 1:
        p.error("--concurrency, --num-requests, --max-tokens and --prompt-tokens must be >= 1")
    if not 0.0 <= a.shared_prefix_share <= 1.0:
        p.error("--shared-prefix-share must be in [0, 1]")
    if not 0.0 <= a.prompt_tokens_spread < 1.0:
        p.error("--prompt-tokens-spread must be in [0, 1)")
    if not a.request_rate > 0:
        p.error("--request-rate must be > 0 (inf: all at once)")
    return a


def fail(message):
    print("bench serve: " + message, file=sys.stderr)
    sys.exit(2)


def load_text(path):
    if path:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError as e:
            fail(f"cannot read --text-file '{path}': {e}")
    else:
        try:
            text = subprocess.run(BIBLE_COMMAND, capture_output=True, text=True, check=False).stdout
        except OSError:
            text = ""
        if len(text) < 100000:
            fail("no prompt text: install bible-kjv (scripts/setup.sh) or pass --text-file FILE "
                 "(e.g. the haystack.txt of `retroinfer eval inputs`)")
    text = " ".join(text.split())  # one space between words: prompt lengths follow character counts
    if len(text) < 10000:
        fail(f"the prompt text has {len(text)} characters; give a longer --text-file (>= 10,000)")
    return text


class Api:
    """One HTTP connection per call (keep-alive is the server's business, not the benchmark's)."""

    def __init__(self, base_url, api_key, timeout):
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https"):
            fail(f"--base-url '{base_url}' must start with http:// or https://")
        self.https = u.scheme == "https"
        self.host = u.hostname
        self.port = u.port or (443 if self.https else 80)
        self.root = u.path.rstrip("/")
        self.timeout = timeout
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream, application/json"}
        if api_key:
            self.headers["Authorization"] = "Bearer " + api_key

    def connect(self):
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout)

    def get_json(self, path):
        c = self.connect()
        try:
            c.request("GET", self.root + path, headers=self.headers)
            r = c.getresponse()
            body = r.read()
            if r.status != 200:
                raise RuntimeError(f"GET {path}: HTTP {r.status}: {body[:300]!r}")
            return json.loads(body)
        finally:
            c.close()

    def post_json(self, path, payload):
        c = self.connect()
        try:
            c.request("POST", self.root + path, body=json.dumps(payload), headers=self.headers)
            r = c.getresponse()
            body = r.read()
            if r.status != 200:
                raise RuntimeError(f"POST {path}: HTTP {r.status}: {body[:300]!r}")
            return json.loads(body)
        finally:
            c.close()


def payload_for(a, model, prompt):
    body = {"model": model, "max_tokens": a.max_tokens, "temperature": a.temperature, "stream": True,
            "stream_options": {"include_usage": True}}
    if a.ignore_eos:
        body["ignore_eos"] = True
    if a.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def chunk_text(chunk):
    """The content a stream chunk carries (completions: text; chat: delta.content)."""
    out = ""
    for c in chunk.get("choices") or []:
        if "text" in c and c["text"]:
            out += c["text"]
        d = c.get("delta") or {}
        if d.get("content"):
            out += d["content"]
    return out


def run_one(api, path, body):
    """Sends one streamed request; returns its record (times relative to its send)."""
    rec = {"ok": False, "error": None, "ttft_s": None, "latency_s": None, "chunk_times_s": [],
           "output_tokens": 0, "prompt_tokens": None}
    t0 = time.perf_counter()
    conn = None
    try:
        conn = api.connect()
        conn.request("POST", path, body=json.dumps(body), headers=api.headers)
        r = conn.getresponse()
        if r.status != 200:
            r.read()
            rec["error"] = f"http_{r.status}"
            return rec
        done = False
        usage = None
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                rec["error"] = "error_event"
                return rec
            if chunk.get("usage"):
                usage = chunk["usage"]
            if chunk_text(chunk):
                t = time.perf_counter() - t0
                if rec["ttft_s"] is None:
                    rec["ttft_s"] = t
                rec["chunk_times_s"].append(t)
        if not done:
            rec["error"] = "incomplete_stream"
            return rec
        rec["latency_s"] = time.perf_counter() - t0
        rec["output_tokens"] = usage["completion_tokens"] if usage else len(rec["chunk_times_s"])
        rec["prompt_tokens"] = usage["prompt_tokens"] if usage else None
        rec["ok"] = rec["ttft_s"] is not None or rec["output_tokens"] == 0
        if not rec["ok"]:
            rec["error"] = "no_content"
    except ConnectionResetError:
        rec["error"] = "connection_reset"
    except ConnectionRefusedError:
        rec["error"] = "connection_refused"
    except (socket.timeout, TimeoutError):
        rec["error"] = "timeout"
    except (http.client.HTTPException, ConnectionError, OSError) as e:
        rec["error"] = type(e).__name__
    except (ValueError, KeyError):
        rec["error"] = "bad_response"
    finally:
        if conn is not None:
            conn.close()
    return rec


def percentiles(xs):
    if not xs:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    s = sorted(xs)

    def q(p):  # linear interpolation between closest ranks
        k = (len(s) - 1) * p
        lo, hi = math.floor(k), math.ceil(k)
        return s[lo] + (s[hi] - s[lo]) * (k - lo)

    return {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "mean": sum(s) / len(s)}


def ms(d):
    return {k: (None if v is None else round(v * 1000.0, 2)) for k, v in d.items()}


def make_prompts(a, text, chars_per_token, rng):
    shared_start = rng.randrange(0, len(text) // 2)
    prompts = []
    for _ in range(a.num_requests):
        tokens = a.prompt_tokens * (1.0 + rng.uniform(-a.prompt_tokens_spread, a.prompt_tokens_spread))
        chars = max(1, int(tokens * chars_per_token))
        shared = int(chars * a.shared_prefix_share)
        own = chars - shared
        start = rng.randrange(0, max(1, len(text) - own))
        # Texts shorter than a prompt wrap around.
        body = (text * (own // len(text) + 2))[start:start + own]
        prefix = (text * (shared // len(text) + 2))[shared_start:shared_start + shared]
        prompts.append(prefix + body)
    return prompts


def check_plot_support(path):
    if not path:
        return
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        fail("--plot needs matplotlib: pip install matplotlib==3.10.7 (scripts/setup.sh installs it)")


def plot(report, records, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(2, 2, figsize=(11, 8))
    title = f"{report['label'] or report['model']}: concurrency {report['config']['concurrency']}, " \
            f"~{report['config']['prompt_tokens']} prompt tokens, max_tokens {report['config']['max_tokens']}"
    fig.suptitle(title)
    ok = [r for r in records if r["ok"]]
    ttft = sorted(r["ttft_s"] * 1000 for r in ok if r["ttft_s"] is not None)
    itl = sorted(g * 1000 for r in ok for g in r["itl_s"])
    for axis, xs, name in ((ax[0][0], ttft, "TTFT (ms)"), (ax[0][1], itl, "inter-token latency (ms)")):
        if xs:
            axis.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))])
        axis.set_xlabel(name)
        axis.set_ylabel("share of " + ("requests" if "TTFT" in name else "gaps"))
        axis.grid(True, alpha=0.3)
    starts = [r["start_s"] for r in ok]
    ax[1][0].scatter(starts, [r["ttft_s"] * 1000 for r in ok], s=8, label="TTFT")
    ax[1][0].scatter(starts, [r["latency_s"] * 1000 for r in ok], s=8, label="end to end")
    ax[1][0].set_xlabel("request start (s)")
    ax[1][0].set_ylabel("ms")
    ax[1][0].legend()
    ax[1][0].grid(True, alpha=0.3)
    # Content chunks per second over the run (1 s bins).
    times = [r["start_s"] + t for r in ok for t in r["chunk_times_s"]]
    if times:
        bins = max(1, int(math.ceil(max(times))))
        ax[1][1].hist(times, bins=bins, range=(0, bins))
    ax[1][1].set_xlabel("time (s)")
    ax[1][1].set_ylabel("content chunks per second")
    ax[1][1].grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    check_plot_support(a.plot)
    api = Api(a.base_url, a.api_key, a.timeout)
    model = a.model
    try:
        if not model:
            models = api.get_json("/models").get("data") or []
            if not models:
                fail(f"{a.base_url}/models lists no model; pass --model")
            model = models[0]["id"]
    except (OSError, RuntimeError, ValueError) as e:
        fail(f"cannot reach {a.base_url}: {e}")
    text = load_text(a.text_file)
    rng = random.Random(a.seed)
    cpt = a.chars_per_token
    if cpt <= 0:
        # About half a prompt's tokens (at >= 2 characters per token), so that it fits where the prompts fit.
        sample = text[:max(200, min(12000, 2 * a.prompt_tokens))]
        body = {"model": model, "max_tokens": 1, "temperature": 0}
        path = "/chat/completions" if a.endpoint == "chat" else "/completions"
        if a.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": sample}]
        else:
            body["prompt"] = sample
        try:
            n = api.post_json(path, body)["usage"]["prompt_tokens"]
        except (OSError, RuntimeError, ValueError, KeyError) as e:
            fail(f"cannot measure the characters per token (pass --chars-per-token): {e}")
        cpt = len(sample) / max(1, n)
    prompts = make_prompts(a, text, cpt, rng)
    arrivals = [0.0] * a.num_requests
    if math.isfinite(a.request_rate):
        t = 0.0
        for i in range(a.num_requests):
            t += rng.expovariate(a.request_rate)
            arrivals[i] = t
    path = api.root + ("/chat/completions" if a.endpoint == "chat" else "/completions")
    records = [None] * a.num_requests
    next_index = [0]
    lock = threading.Lock()
    t_start = time.perf_counter()

    def worker():
        while True:
            with lock:
                i = next_index[0]
                if i >= a.num_requests:
                    return
                next_index[0] += 1
            wait = arrivals[i] - (time.perf_counter() - t_start)
            if wait > 0:
                time.sleep(wait)
            start = time.perf_counter() - t_start
            if a.duration > 0 and start > a.duration:
                return
            rec = run_one(api, path, payload_for(a, model, prompts[i]))
            rec["start_s"] = start
            rec["itl_s"] = [b - c for b, c in zip(rec["chunk_times_s"][1:], rec["chunk_times_s"][:-1])]
            records[i] = rec

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(a.concurrency, a.num_requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t_start
    sent = [r for r in records if r is not None]
    ok = [r for r in sent if r["ok"]]
    errors = {}
    for r in sent:
        if not r["ok"]:
            errors[r["error"]] = errors.get(r["error"], 0) + 1
    out_tokens = sum(r["output_tokens"] for r in ok)
    prompt_tokens = [r["prompt_tokens"] for r in ok if r["prompt_tokens"] is not None]
    report = {
        "label": a.label,
        "base_url": a.base_url,
        "model": model,
        "endpoint": a.endpoint,
        "config": {"concurrency": a.concurrency, "request_rate": None if math.isinf(a.request_rate) else a.request_rate,
                   "num_requests": a.num_requests, "duration_limit_s": a.duration or None,
                   "prompt_tokens": a.prompt_tokens, "prompt_tokens_spread": a.prompt_tokens_spread,
                   "shared_prefix_share": a.shared_prefix_share, "max_tokens": a.max_tokens,
                   "ignore_eos": a.ignore_eos, "temperature": a.temperature, "seed": a.seed,
                   "chars_per_token": round(cpt, 4), "text_file": a.text_file or "bible-kjv"},
        "sent": len(sent),
        "completed": len(ok),
        "failed": len(sent) - len(ok),
        "errors": errors,
        "duration_s": round(elapsed, 3),
        "requests_per_s": round(len(ok) / elapsed, 4) if elapsed > 0 else None,
        "output_tokens": out_tokens,
        "output_tokens_per_s": round(out_tokens / elapsed, 3) if elapsed > 0 else None,
        "mean_prompt_tokens": round(sum(prompt_tokens) / len(prompt_tokens), 1) if prompt_tokens else None,
        "ttft_ms": ms(percentiles([r["ttft_s"] for r in ok if r["ttft_s"] is not None])),
        "itl_ms": ms(percentiles([g for r in ok for g in r["itl_s"]])),
        "latency_ms": ms(percentiles([r["latency_s"] for r in ok])),
    }
    print(json.dumps(report, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    if a.plot:
        plot(report, ok, a.plot)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
