#!/usr/bin/env python3
"""Soak test of `retroinfer serve` on the CPU: a bounded mixed workload (plain and streamed completions and
chats, streams the client abandons, bad requests, long prompts) from several client threads, with the server's
RSS and thread count sampled once a second. Python standard library only.

    scripts/soak.py --cli build/cpu-release/bin/retroinfer                  # 600 s on smollm2
    scripts/soak.py --cli ... --duration 90 --json soak.json                 # the CI run
    scripts/soak.py --url http://127.0.0.1:8080 --pid 1234 --duration 60     # a server already running

Prints one JSON object (also written to --json): requests by kind, responses by status, errors by kind,
latency percentiles, RSS (MiB) and threads at start (after a warm-up), end and peak. Exits 1 when the server
died, a request got an unexpected answer, or (with --max-rss-growth) RSS grew more than allowed.
"""

import argparse
import http.client
import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time

LONG_TEXT = ("The history of computing is a story of machines that remember. Early calculators kept a single "
             "number; later designs stored programs beside their data, and caches grew between the processor "
             "and its memory. ")


def proc_status(pid):
    """(RSS MiB, threads) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            s = f.read()
    except OSError:
        return None
    rss = int(re.search(r"^VmRSS:\s+(\d+) kB", s, re.M).group(1)) / 1024.0
    threads = int(re.search(r"^Threads:\s+(\d+)", s, re.M).group(1))
    return rss, threads


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests = {}  # kind -> count
        self.statuses = {}  # "kind:status" -> count
        self.errors = {}  # "kind: what" -> count (unexpected outcomes)
        self.latency = {}  # kind -> [seconds]
        self.tokens = 0

    def record(self, kind, status, seconds, error=None, tokens=0):
        with self.lock:
            self.requests[kind] = self.requests.get(kind, 0) + 1
            key = f"{kind}:{status}"
            self.statuses[key] = self.statuses.get(key, 0) + 1
            self.latency.setdefault(kind, []).append(seconds)
            self.tokens += tokens
            if error:
                k = f"{kind}: {error}"
                self.errors[k] = self.errors.get(k, 0) + 1


def percentile(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 3)


class Client:
    def __init__(self, host, port, model, stats, rng, timeout):
        self.host, self.port, self.model, self.stats, self.rng, self.timeout = host, port, model, stats, rng, timeout

    def conn(self):
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    def post(self, kind, path, body, expect, raw=None):
        t0 = time.time()
        c = self.conn()
        try:
            data = raw if raw is not None else json.dumps(body)
            c.request("POST", path, body=data, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            payload = r.read()
            err = None
            tokens = 0
            if r.status != expect:
                err = f"status {r.status} (expected {expect}): {payload[:200]!r}"
            elif expect == 200:
                j = json.loads(payload)
                tokens = j.get("usage", {}).get("completion_tokens", 0)
                if not j.get("choices"):
                    err = "no choices"
            elif "error" not in json.loads(payload):
                err = "error reply without an error object"
            self.stats.record(kind, r.status, time.time() - t0, err, tokens)
        except (OSError, http.client.HTTPException, ValueError) as e:
            self.stats.record(kind, "exception", time.time() - t0, f"{type(e).__name__}: {e}")
        finally:
            c.close()

    def stream(self, kind, body, abandon_after=None):
        """A streamed request read to [DONE], or abandoned (socket closed) after `abandon_after` events."""
        t0 = time.time()
        body = dict(body, stream=True)
        data = json.dumps(body).encode()
        try:
            s = socket.create_connection((self.host, self.port), timeout=self.timeout)
            s.sendall((f"POST {'/v1/chat/completions' if 'messages' in body else '/v1/completions'} HTTP/1.1\r\n"
                       f"Host: {self.host}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                       "Connection: close\r\n\r\n").encode() + data)
            buf = b""
            events = 0
            err = None
            status = None
            while True:
                c = s.recv(65536)
                if not c:
                    break
                buf += c
                if status is None and b"\r\n" in buf:
                    status = int(buf.split(b" ", 2)[1])
                events = buf.count(b"data: ")
                if abandon_after is not None and events >= abandon_after:
                    break
            s.close()
            if status != 200:
                err = f"status {status}: {buf[:200]!r}"
            elif abandon_after is None and b"data: [DONE]" not in buf:
                err = "stream ended without [DONE]"
            elif abandon_after is None and b'"error"' in buf:
                err = "error event in the stream"
            self.stats.record(kind, status, time.time() - t0, err, max(0, events - 1) if abandon_after is None else 0)
        except (OSError, ValueError, IndexError) as e:
            self.stats.record(kind, "exception", time.time() - t0, f"{type(e).__name__}: {e}")

    def one(self):
        r = self.rng.random()
        prompt = self.rng.choice(["Once upon a time", "The capital of France is", "def fib(n):", "List three colors:",
                                  "Explain caching in one sentence."])
        mt = self.rng.randint(4, 24)
        if r < 0.24:
            self.post("completion", "/v1/completions", {"model": self.model, "prompt": prompt, "max_tokens": mt,
                                                        "temperature": self.rng.choice([0, 0.7])}, 200)
        elif r < 0.43:
            self.post("chat", "/v1/chat/completions",
                      {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": prompt}],
                       "max_tokens": mt, "seed": self.rng.randint(0, 1 << 30), "temperature": 0.8, "top_p": 0.9}, 200)
        elif r < 0.62:
            self.stream("stream", {"prompt": prompt, "max_tokens": mt, "stop": ["\n\n"]})
        elif r < 0.74:
            self.stream("stream_cancelled", {"messages": [{"role": "user", "content": prompt}], "max_tokens": 200},
                        abandon_after=self.rng.randint(1, 4))
        elif r < 0.90:
            bad = self.rng.choice([
                ("invalid_json", None, "{\"prompt\": "),
                ("bad_field", {"prompt": "x", "max_tokens": -3}, None),
                ("bad_type", {"prompt": 12}, None),
                ("bad_role", {"messages": [{"role": "robot", "content": "x"}]}, None),
                ("too_many_stops", {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, None),
                ("invalid_utf8", None, b"{\"prompt\": \"\xc3\x28\"}"),
                ("context_overflow", {"prompt": LONG_TEXT * 400, "max_tokens": 8}, None),
            ])
            path = "/v1/chat/completions" if bad[1] and "messages" in bad[1] else "/v1/completions"
            self.post("bad_request:" + bad[0], path, bad[1], 400, raw=bad[2])
        elif r < 0.94:
            t0 = time.time()
            c = self.conn()
            try:
                c.request("GET", "/v1/nowhere")
                resp = c.getresponse()
                resp.read()
                self.stats.record("not_found", resp.status, time.time() - t0,
                                  None if resp.status == 404 else f"status {resp.status}")
            except (OSError, http.client.HTTPException) as e:
                self.stats.record("not_found", "exception", time.time() - t0, f"{type(e).__name__}: {e}")
            finally:
                c.close()
        else:
            n = self.rng.randint(5, 15)  # ~40 tokens a repetition: 200-600 token prompts
            self.post("long_prompt", "/v1/completions", {"prompt": LONG_TEXT * n + "\nSummary:", "max_tokens": 8,
                                                         "temperature": 0}, 200)


def start_server(cli, model, extra):
    cmd = [cli, "serve", "--model", model, "--port", "0", "--host", "127.0.0.1"] + extra
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines = []
    while True:
        line = p.stderr.readline()
        if not line:
            raise SystemExit("soak: serve exited before listening:\n" + "".join(lines))
        lines.append(line)
        m = re.search(r"listening on http://([^:]+):(\d+)", line)
        if m:
            break
    # The port may be bound before the model is loaded (/health answers 503 until then).
    port = int(m.group(2))
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection(m.group(1), port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                break
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(0.2)
    # Keep draining stderr (a full pipe would block the server); keep the tail for the report.
    tail = []

    def drain():
        for line in p.stderr:
            tail.append(line)
            del tail[:-50]

    threading.Thread(target=drain, daemon=True).start()
    return p, m.group(1), int(m.group(2)), tail


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=600, help="seconds of workload (default 600)")
    ap.add_argument("--clients", type=int, default=4, help="client threads (default 4)")
    ap.add_argument("--cli", default=None, help="the retroinfer binary (default build/cpu-release/bin/retroinfer)")
    ap.add_argument("--model", default="smollm2", help="--model of serve (default smollm2)")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra argument for serve (repeatable)")
    ap.add_argument("--url", default=None, help="use a running server instead of starting one (needs --pid)")
    ap.add_argument("--pid", type=int, default=None, help="the running server's pid (RSS / threads)")
    ap.add_argument("--warmup", type=float, default=10, help="seconds before the start figures are taken")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=300, help="per-request socket timeout (s)")
    ap.add_argument("--max-rss-growth", type=float, default=None,
                    help="fail when end RSS exceeds start RSS by more than this many MiB")
    ap.add_argument("--json", default=None, help="also write the report here")
    a = ap.parse_args()

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc, tail = None, []
    if a.url:
        m = re.match(r"http://([^:/]+):(\d+)", a.url)
        host, port, pid = m.group(1), int(m.group(2)), a.pid
    else:
        cli = a.cli or os.path.join(root, "build", "cpu-release", "bin", "retroinfer")
        proc, host, port, tail = start_server(cli, a.model, a.serve_arg)
        pid = proc.pid

    stats = Stats()
    samples = []  # (t, rss MiB, threads)
    stop = threading.Event()
    t_start = time.time()

    def sampler():
        while not stop.is_set():
            st = proc_status(pid) if pid else None
            if st:
                samples.append((round(time.time() - t_start, 1), round(st[0], 1), st[1]))
            stop.wait(1.0)

    def worker(i):
        c = Client(host, port, a.model, stats, random.Random(a.seed * 1000 + i), a.timeout)
        while time.time() - t_start < a.duration and not stop.is_set():
            if proc and proc.poll() is not None:
                return
            c.one()

    threads = [threading.Thread(target=sampler, daemon=True)]
    threads += [threading.Thread(target=worker, args=(i,)) for i in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads[1:]:
        t.join()
    # Let abandoned streams finish their cancellation, then a last sample.
    time.sleep(2)
    stop.set()
    threads[0].join()
    alive = proc.poll() is None if proc else (pid is None or proc_status(pid) is not None)
    final = proc_status(pid) if pid else None
    if final:
        samples.append((round(time.time() - t_start, 1), round(final[0], 1), final[1]))

    after_warmup = [s for s in samples if s[0] >= a.warmup] or samples
    report = {
        "duration_s": round(time.time() - t_start, 1),
        "clients": a.clients,
        "model": a.model,
        "server_alive": alive,
        "requests": sum(stats.requests.values()),
        "requests_by_kind": dict(sorted(stats.requests.items())),
        "responses_by_status": dict(sorted(stats.statuses.items())),
        "unexpected": sum(stats.errors.values()),
        "errors_by_kind": dict(sorted(stats.errors.items())),
        "completion_tokens": stats.tokens,
        "latency_s": {k: {"p50": percentile(v, 0.5), "p95": percentile(v, 0.95), "max": round(max(v), 3)}
                      for k, v in sorted(stats.latency.items())},
        "rss_mib": {"start": after_warmup[0][1] if after_warmup else None,
                    "end": samples[-1][1] if samples else None,
                    "peak": max(s[1] for s in samples) if samples else None},
        "threads": {"start": after_warmup[0][2] if after_warmup else None,
                    "end": samples[-1][2] if samples else None,
                    "peak": max(s[2] for s in samples) if samples else None},
        "samples": len(samples),
    }
    ok = alive and report["unexpected"] == 0
    if a.max_rss_growth is not None and samples and after_warmup:
        growth = report["rss_mib"]["end"] - report["rss_mib"]["start"]
        report["rss_growth_mib"] = round(growth, 1)
        if growth > a.max_rss_growth:
            ok = False
            report["rss_growth_exceeded"] = True
    if proc:
        proc.terminate()
        try:
            report["server_exit"] = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            report["server_exit"] = "killed (no exit within 30 s of SIGTERM)"
            ok = False
        if not alive or report["server_exit"] not in (0, -15):
            report["server_stderr_tail"] = "".join(tail[-20:])
    report["ok"] = ok
    text = json.dumps(report, indent=1)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
