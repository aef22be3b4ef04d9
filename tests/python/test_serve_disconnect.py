"""A client that goes away at every point of a request, against the `retroinfer serve` binary over loopback
(plain sockets, so the test holds for any HTTP transport): before sending anything, inside the request line,
inside the headers, inside the body, after the whole request (plain and streaming, before the reply), after the
first streamed event, with a half-close, and with a reset (SO_LINGER 0) instead of a close. After each, the
server must answer /health and a completion equal to the one it gave before, and at the end its thread count
must be back near where it started (a connection's thread or a request's generation is not left behind).

The tiny model (tests/data/models/tiny-llama3) with the byte tokenizer; about 10 s on 2 cores.
"""

import json
import os
import re
import threading
import socket
import struct
import subprocess
import time

import pytest

PROMPT_BODY = json.dumps({"prompt": "Disconnect test prompt.", "max_tokens": 24, "temperature": 0})
STREAM_BODY = json.dumps({"prompt": "Disconnect test prompt.", "max_tokens": 400, "temperature": 0, "stream": True})


def request_bytes(body, path="/v1/completions"):
    b = body.encode()
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(b)}\r\nConnection: close\r\n\r\n").encode() + b


def threads_of(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"^Threads:\s+(\d+)", f.read(), re.M).group(1))


def http(port, method, path, body=None, timeout=60):
    """One request on its own connection; returns (status, body bytes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        data = body.encode() if body is not None else b""
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        s.sendall(head.encode() + b"\r\n" + data)
        chunks = []
        while True:
            c = s.recv(65536)
            if not c:
                break
            chunks.append(c)
    raw = b"".join(chunks)
    head, _, rest = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        out, pos = b"", 0
        while True:
            eol = rest.index(b"\r\n", pos)
            n = int(rest[pos:eol].split(b";")[0], 16)
            if n == 0:
                break
            out += rest[eol + 2:eol + 2 + n]
            pos = eol + 2 + n + 2
        rest = out
    return status, rest


@pytest.fixture(scope="module")
def server(cli, tiny_text_model_dir):
    p = subprocess.Popen([cli, "serve", "--model", tiny_text_model_dir, "--port", "0", "--host", "127.0.0.1",
                          "--max-batch", "4"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    port = None
    lines = []
    deadline = time.time() + 60
    while time.time() < deadline:
        line = p.stderr.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    if port is None:
        p.kill()
        pytest.fail("serve did not start: " + "".join(lines))
    # The server's stderr from here on (its request log), read on a thread so that the pipe never fills.
    p.log_lines = []
    reader = threading.Thread(target=lambda: p.log_lines.extend(iter(p.stderr.readline, "")), daemon=True)
    reader.start()
    # The port is bound before the model loads (/health is 503 until then).
    while time.time() < deadline and http(port, "GET", "/health")[0] != 200:
        time.sleep(0.1)
    yield p, port
    p.terminate()
    try:
        p.wait(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail("serve did not stop on SIGTERM within 20 s")
    reader.join(timeout=5)


def connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def close(s, reset):
    if reset:  # RST instead of FIN
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def cut_points():
    """(name, bytes to send before going away, what to wait for first)."""
    plain = request_bytes(PROMPT_BODY)
    stream = request_bytes(STREAM_BODY)
    head_end = plain.index(b"\r\n\r\n") + 4
    return [
        ("nothing sent", b"", None),
        ("inside the request line", plain[:7], None),
        ("inside the headers", plain[:head_end - 20], None),
        ("after the headers, no body", plain[:head_end], None),
        ("inside the body", plain[:head_end + 10], None),
        ("whole request, reply not read", plain, None),
        ("whole request, a moment into the generation", plain, 0.05),
        ("whole stream request, reply not read", stream, None),
        ("whole stream request, after the first event", stream, "event"),
        ("whole stream request, half-closed", stream, "halfclose"),
    ]


@pytest.mark.parametrize("reset", [False, True], ids=["close", "reset"])
def test_client_gone_at_every_point(server, reset):
    p, port = server
    status, ref = http(port, "POST", "/v1/completions", PROMPT_BODY)
    assert status == 200, ref
    ref_text = json.loads(ref)["choices"][0]["text"]
    time.sleep(0.5)
    threads_before = threads_of(p.pid)
    for name, data, wait in cut_points():
        s = connect(port)
        if data:
            s.sendall(data)
        if wait == "event":
            got = b""
            while b"data: " not in got:
                c = s.recv(4096)
                assert c, f"{name}: the connection closed before the first event"
                got += c
        elif wait == "halfclose":
            s.shutdown(socket.SHUT_WR)
            time.sleep(0.05)
        elif wait:
            time.sleep(wait)
        close(s, reset)
        assert p.poll() is None, f"serve exited after the client went away ({name})"
        status, body = http(port, "GET", "/health")
        assert status == 200, f"{name}: /health gave {status} {body!r}"
        status, body = http(port, "POST", "/v1/completions", PROMPT_BODY)
        assert status == 200, f"{name}: {status} {body!r}"
        assert json.loads(body)["choices"][0]["text"] == ref_text, name
    # Each request the client left before its reply was out has its log line: status 499 and what ended the
    # connection (a close reads as the client closing; a reset as a read or write error).
    def cut_requests():
        logged = [json.loads(l) for l in list(p.log_lines) if l.startswith("{")]
        return [l for l in logged if l.get("status") == 499 and l.get("path") == "/v1/completions"], logged

    deadline = time.time() + 10
    while time.time() < deadline and not cut_requests()[0]:
        time.sleep(0.1)
    cut, logged = cut_requests()
    assert cut, [(l.get("path"), l.get("status"), l.get("cancelled"), l.get("closed")) for l in logged if l.get("path") != "/health"]
    if not reset:
        assert any(l["closed"] == "client_closed" for l in cut), cut
    else:
        assert all(l["closed"] for l in cut), cut
    # The abandoned streams' generations stop (their writes fail) and connection threads end: the thread
    # count comes back to where it was (a transport may keep a pool: +2 leaves room for one in flight).
    deadline = time.time() + 20
    while threads_of(p.pid) > threads_before + 2 and time.time() < deadline:
        time.sleep(0.2)
    assert threads_of(p.pid) <= threads_before + 2, (threads_before, threads_of(p.pid))
