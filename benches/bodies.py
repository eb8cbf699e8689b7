#!/usr/bin/env python3
"""What large request bodies cost the server's memory, route by route, in one run.

Each HTTP route that takes a body now takes a place in line before it reads one, and reads it
within the server's body budget ((max_concurrent + max_queue) x max_body, shared between API
keys). Before that, POST /v1/sessions, POST /v1/agents and PUT /v1/sessions/{id}/files/...
read whole bodies first: 50 bodies of 100 MiB took the server to about 5 GiB. This sends,
to each route in turn, N requests at once (default 50), each with a large body (default
100 MiB), streamed as fast as the client can, and reports the server's peak RSS during them
(VmHWM of /proc/<pid>/status, reset before the flood), the answers by status, and the ratio
to the peak of POST /v1/execute, the baseline: the route that always read within the budget.

The routes and their bodies (valid JSON where the route parses JSON; one field carries the
bulk, so the server reads the whole body and then refuses it for a cap: 400, or 413/429
before or while reading):
  execute         POST /v1/execute                       {"language":"python","code":"aaa..."}
  sessions        POST /v1/sessions                      {"language":"python","files":[{"path":"big.txt","content":"aaa..."}]}
  agents          POST /v1/agents                        {"model":"m","messages":[{"role":"user","content":"aaa..."}],"tools":[...]}
  agents_chat     POST /v1/agents/chat/completions       the same
  put_missing     PUT /v1/sessions/<no such id>/files/x  raw bytes
  put_session     PUT /v1/sessions/<a session>/files/x   raw bytes
  session_execute POST /v1/sessions/<a session>/execute  {"code":"aaa..."}
  mcp             POST /mcp                              a 2026-07-28 (stateless) tools/call of code_exec_python
  e2b_create      POST /e2b/v2/sandboxes                 {"templateID":"base","envVars":{"BIG":"aaa..."}}
  e2b_execute     POST /e2b/execute (a sandbox's token)  {"code":"aaa..."}
  e2b_files       POST /e2b/files?path=x (its token)     multipart/form-data, one file part
A PUT's cap (and an E2B upload's) is the input-file cap (32 MiB by default), not the body cap:
larger bodies get a 413 from their Content-Length before any byte is read, so PUTs and
e2b_files send --put-mib (default 32) instead, the most the route accepts.

The server: the release build (built first, unless --runcell), an API key, `--max-concurrent
2 --max-queue 8 --max-body 101M`, no warm pool, no audit log, and an agent upstream (openai)
at a local listener that accepts connections and never answers, so that /v1/agents is
configured and reads its bodies. A fresh server for each route (so each peak is that route's
own); the sessions the routes need are created before the peak is reset. The client is this
script: one thread per request, each streaming its body from one shared 1 MiB buffer (the
client holds no body), and stopping as soon as the server answers (`sent` in the table: the
body bytes the server let in before its answers). A request unanswered after --answer-within
seconds counts as `no answer`. Python standard library only; runs where runcell runs (root
or user namespaces: the session routes build a sandbox). About
3 minutes on 2 cores once built: the agent routes wait for the silent model API's timeout
(30 s). See docs/soak.md for the figures of a run.

Usage: benches/bodies.py [--runcell PATH] [--requests 50] [--mib 100] [--put-mib 32]
                         [--max-concurrent 2] [--max-queue 8] [--max-body 101M]
                         [--answer-within 60] [--routes execute,sessions,...] [--json]
"""

import argparse
import json
import os
import re
import secrets
import select
import signal
import socket
import subprocess
import sys
import threading
import time

CHUNK = 1 << 20
MIB = 1 << 20
FILL = b"a" * CHUNK  # the bulk of every body: one buffer, shared by every sender
ROUTES = ["execute", "sessions", "agents", "agents_chat", "put_missing", "put_session",
          "session_execute", "mcp", "e2b_create", "e2b_execute", "e2b_files"]
MISSING = "ses_" + "0" * 32  # an id no session has


def die(msg):
    print(f"bodies.py: {msg}", file=sys.stderr)
    sys.exit(1)


class Server:
    """`runcell serve` on a free loopback port, its stderr kept in memory."""

    def __init__(self, runcell, args, upstream_port):
        self.key = secrets.token_hex(16)
        env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8",
               "RUNCELL_API_KEY": self.key, "RUNCELL_AGENT_API_KEY": "unused"}
        self.proc = subprocess.Popen(
            [runcell, "serve", "--listen", "127.0.0.1:0", "--audit-log", "off", "--pool", "python=0",
             "--agent-upstream", "openai", "--agent-base-url", f"http://127.0.0.1:{upstream_port}/v1",
             "--agent-model", "m", *args],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True)
        self.log = []
        self.port = None
        deadline = time.time() + 30
        for line in self.proc.stderr:
            self.log.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
            if time.time() > deadline:
                break
        if self.port is None:
            self.stop()
            die("the server did not start:\n" + "".join(self.log[-20:]))
        threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True).start()

    def request(self, method, path, body=None):
        """A small request: (status, parsed JSON or text)."""
        s = socket.create_connection(("127.0.0.1", self.port), timeout=120)
        data = b"" if body is None else json.dumps(body).encode()
        s.sendall(head(method, path, self.key, len(data), "application/json") + data)
        status, text = response(s)
        s.close()
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def status(self):
        """VmRSS and VmHWM, bytes."""
        out = {}
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    k, v = line.split(":")
                    out[k] = int(v.split()[0]) * 1024
        return out["VmRSS"], out["VmHWM"]

    def reset_peak(self):
        # proc(5): writing 5 to clear_refs resets the peak RSS (VmHWM) to the current RSS.
        with open(f"/proc/{self.proc.pid}/clear_refs", "w") as f:
            f.write("5")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def head(method, path, key, length, ctype, extra=()):
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Authorization: Bearer {key}",
             f"Content-Type: {ctype}", f"Content-Length: {length}", "Connection: close", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def response(s):
    """Read an HTTP/1.1 response to the end (the server closes: Connection: close)."""
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
        if len(data) > 1 << 20:
            break
    m = re.match(rb"HTTP/1\.1 (\d{3})", data)
    if not m:
        raise ConnectionError("no response")
    text = data.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in data else b""
    if b"transfer-encoding: chunked" in data.split(b"\r\n\r\n", 1)[0].lower():
        text = unchunk(text)
    return int(m.group(1)), text.decode(errors="replace")


def unchunk(b):
    out = b""
    while b:
        size, _, rest = b.partition(b"\r\n")
        n = int(size.split(b";")[0] or b"0", 16)
        if n == 0:
            break
        out += rest[:n]
        b = rest[n + 2:]
    return out


def body_of(route, size):
    """(method, path suffix, content type, prefix, bulk bytes, suffix, extra headers)."""
    def around(doc, marker="@BULK@"):
        pre, post = json.dumps(doc).encode().split(marker.encode())
        return pre, size - len(pre) - len(post), post

    tools = [{"type": "runcell_tool", "name": "code_exec_python"}]
    js = "application/json"
    if route == "execute":
        pre, n, post = around({"language": "python", "code": "@BULK@"})
        return "POST", "/v1/execute", js, pre, n, post, ()
    if route == "sessions":
        pre, n, post = around({"language": "python", "files": [{"path": "big.txt", "content": "@BULK@"}]})
        return "POST", "/v1/sessions", js, pre, n, post, ()
    if route in ("agents", "agents_chat"):
        pre, n, post = around({"model": "m", "messages": [{"role": "user", "content": "@BULK@"}],
                               "tools": tools})
        path = "/v1/agents" if route == "agents" else "/v1/agents/chat/completions"
        return "POST", path, js, pre, n, post, ()
    if route in ("put_missing", "put_session"):
        return "PUT", "/v1/sessions/{id}/files/x", "application/octet-stream", b"", size, b"", ()
    if route == "session_execute":
        pre, n, post = around({"code": "@BULK@"})
        return "POST", "/v1/sessions/{id}/execute", js, pre, n, post, ()
    if route == "mcp":
        v = "2026-07-28"
        pre, n, post = around({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "code_exec_python", "arguments": {"code": "@BULK@"},
            "_meta": {"io.modelcontextprotocol/protocolVersion": v,
                      "io.modelcontextprotocol/clientCapabilities": {}}}})
        return "POST", "/mcp", js, pre, n, post, (
            "Accept: application/json, text/event-stream", f"MCP-Protocol-Version: {v}",
            "Mcp-Method: tools/call", "Mcp-Name: code_exec_python")
    if route == "e2b_create":
        pre, n, post = around({"templateID": "base", "envVars": {"BIG": "@BULK@"}})
        return "POST", "/e2b/v2/sandboxes", js, pre, n, post, ()
    sandbox = ("E2b-Sandbox-Id: {id}", "X-Access-Token: {token}")
    if route == "e2b_execute":
        pre, n, post = around({"code": "@BULK@"})
        return "POST", "/e2b/execute", js, pre, n, post, sandbox
    if route == "e2b_files":
        b = "runcellbench"
        pre = (f"--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x\"\r\n"
               "Content-Type: application/octet-stream\r\n\r\n").encode()
        post = f"\r\n--{b}--\r\n".encode()
        return ("POST", "/e2b/files?path=x", f"multipart/form-data; boundary={b}", pre,
                size - len(pre) - len(post), post, sandbox)
    raise ValueError(route)


def send_one(port, request, start, out, i, answer_within):
    """Stream one request's body, stopping as soon as the server answers: out[i] = (status or
    what went wrong on the way, bytes of the body sent)."""
    head_bytes, bulk, suffix = request
    sent = 0
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
    except OSError as e:
        out[i] = (f"connect: {e.__class__.__name__}", 0)
        return
    try:
        s.setblocking(False)
        start.wait()
        pending = memoryview(head_bytes)
        left = bulk
        tail = memoryview(suffix)
        view = memoryview(FILL)
        try:
            while pending or left or tail:
                r, w, _ = select.select([s], [s], [], answer_within)
                if r:
                    break  # an answer (or a close) before the whole body was sent
                if not w:
                    out[i] = ("stalled", sent)  # the server neither read nor answered
                    return
                try:
                    if pending:
                        n = s.send(pending)
                        pending = pending[n:]
                    elif left:
                        n = s.send(view[:min(left, CHUNK)])
                        left -= n
                        sent += n
                    else:
                        n = s.send(tail)
                        tail = tail[n:]
                except BlockingIOError:
                    continue
        except OSError:
            pass  # the server answered and closed while this was sending: its answer is read below
        s.setblocking(True)
        s.settimeout(answer_within)
        out[i] = (response(s)[0], sent)
    except socket.timeout:
        out[i] = ("no answer", sent)
    except OSError:
        out[i] = ("reset", sent)  # closed without an answer
    finally:
        s.close()


def flood(server, route, size, requests, answer_within, session):
    method, path, ctype, pre, bulk, post, extra = body_of(route, size)
    if isinstance(session, dict):  # an E2B sandbox: its id and token go in headers
        extra = tuple(e.format(id=session["sandboxID"], token=session["envdAccessToken"])
                      for e in extra)
        session = None
    path = path.format(id=session or MISSING)
    total = len(pre) + bulk + len(post)
    h = head(method, path, server.key, total, ctype, extra)
    out = [None] * requests
    start = threading.Event()
    threads = [threading.Thread(target=send_one, args=(server.port, (h + pre, bulk, post), start, out, i,
                                                       answer_within), daemon=True)
               for i in range(requests)]
    for t in threads:
        t.start()
    rss0, _ = server.status()
    server.reset_peak()
    samples = []
    done = threading.Event()

    def sample():
        while not done.is_set():
            try:
                samples.append(server.status()[0])
            except OSError:
                return
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.monotonic()
    start.set()
    for t in threads:
        t.join()
    took = time.monotonic() - t0
    done.set()
    sampler.join()
    if server.proc.poll() is not None:
        die(f"{route}: the server exited ({server.proc.returncode}) during the flood:\n"
            + "".join(server.log[-20:]))
    rss1, hwm = server.status()
    return {"route": route, "method": method, "path": path, "body_bytes": total, "requests": requests,
            "seconds": took, "rss_before": rss0, "peak": max([hwm, *samples]), "rss_after": rss1,
            "answers": out}


def upstream_that_never_answers():
    """A listener that takes connections (the kernel accepts them into its backlog) and never
    answers: the agent's model API, configured but silent."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(128)
    return s


def run_route(a, route, upstream):
    server = Server(a.runcell, ["--max-concurrent", str(a.max_concurrent), "--max-queue", str(a.max_queue),
                               "--max-body", a.max_body], upstream.getsockname()[1])
    try:
        st, v = server.request("GET", "/healthz")
        if st != 200:
            die(f"/healthz answered {st}")
        session = None
        if route in ("put_session", "session_execute"):
            st, v = server.request("POST", "/v1/sessions", {"language": "python"})
            if st != 201:
                die(f"{route}: creating the session answered {st}: {v}")
            session = v["id"]
        if route in ("e2b_execute", "e2b_files"):
            st, v = server.request("POST", "/e2b/v2/sandboxes", {"templateID": "base"})
            if st != 201:
                die(f"{route}: creating the sandbox answered {st}: {v}")
            session = v
        size = (a.put_mib if route.startswith("put_") or route == "e2b_files" else a.mib) * MIB
        r = flood(server, route, size, a.requests, a.answer_within, session)
        st, _ = server.request("GET", "/healthz")
        if st != 200:
            die(f"{route}: /healthz answered {st} after the flood")
        if isinstance(session, dict):
            st, v = server.request("DELETE", f"/e2b/sandboxes/{session['sandboxID']}")
            if st != 204:
                die(f"{route}: killing the sandbox answered {st}: {v}")
        elif session:
            st, v = server.request("DELETE", f"/v1/sessions/{session}")
            if st != 204:
                die(f"{route}: deleting the session answered {st}: {v}")
        return r
    finally:
        server.stop()
        if server.proc.returncode not in (0, None):
            print(f"bodies.py: {route}: the server exited with {server.proc.returncode} after SIGTERM",
                  file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runcell", help="the binary to measure (default: build target/release/runcell)")
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--mib", type=int, default=100, help="body size of the POST routes, MiB")
    ap.add_argument("--put-mib", type=int, default=32, help="body size of the PUT routes, MiB")
    ap.add_argument("--max-concurrent", type=int, default=2)
    ap.add_argument("--max-queue", type=int, default=8)
    ap.add_argument("--max-body", default="101M")
    ap.add_argument("--answer-within", type=float, default=60.0,
                    help="seconds a request may wait for its answer (or its body for the server)")
    ap.add_argument("--routes", default=",".join(ROUTES))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    routes = a.routes.split(",")
    for r in routes:
        if r not in ROUTES:
            die(f"unknown route {r} (routes: {', '.join(ROUTES)})")
    if "execute" not in routes:
        routes.insert(0, "execute")  # the baseline
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    if not a.runcell:
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "runcell"], check=True)
        a.runcell = "target/release/runcell"
    loadavg = open("/proc/loadavg").read().split()[0]
    upstream = upstream_that_never_answers()
    t0 = time.monotonic()
    rows = [run_route(a, r, upstream) for r in routes]
    upstream.close()
    took = time.monotonic() - t0
    base = next(r for r in rows if r["route"] == "execute")
    for r in rows:
        codes = {}
        for status, _ in r["answers"]:
            codes[str(status)] = codes.get(str(status), 0) + 1
        r["codes"] = dict(sorted(codes.items()))
        r["2xx"] = sum(v for k, v in codes.items() if k.isdigit() and k.startswith("2"))
        r["4xx"] = sum(v for k, v in codes.items() if k.isdigit() and k.startswith("4"))
        r["other"] = a.requests - r["2xx"] - r["4xx"]
        r["client_sent_bytes"] = sum(n for _, n in r["answers"])
        r["peak_over_execute"] = r["peak"] / base["peak"]
        del r["answers"]
    if a.json:
        print(json.dumps({"server": {"max_concurrent": a.max_concurrent, "max_queue": a.max_queue,
                                     "max_body": a.max_body}, "requests": a.requests,
                          "post_body_mib": a.mib, "put_body_mib": a.put_mib,
                          "load_average_at_start": float(loadavg), "seconds": took, "rows": rows}, indent=2))
        return
    m = lambda b: f"{b / MIB:.0f}"
    print(f"{a.requests} requests at once per route, each with a {a.mib} MiB body ({a.put_mib} MiB for PUT);"
          f" runcell serve --max-concurrent {a.max_concurrent} --max-queue {a.max_queue} --max-body {a.max_body}"
          f" (body budget: {a.max_concurrent + a.max_queue} x max-body); a fresh server per route;"
          f" load average at start {loadavg}")
    print(f"{'route':16} {'request':40} {'body':>4} {'RSS':>4} {'peak':>5} {'after':>5} {'peak /':>8}"
          f" {'sent':>5} {'2xx':>3} {'4xx':>3} {'other':>5} {'secs':>5}  answers")
    print(f"{'':16} {'':40} {'MiB':>4} {'MiB':>4} {'MiB':>5} {'MiB':>5} {'execute':>8} {'MiB':>5}")
    for r in rows:
        req = f"{r['method']} {r['path']}".replace(MISSING, "<missing>")
        req = re.sub(r"/v1/sessions/ses[a-z0-9]+", "/v1/sessions/<id>", req)
        print(f"{r['route']:16} {req:40} {m(r['body_bytes']):>4} {m(r['rss_before']):>4} {m(r['peak']):>5}"
              f" {m(r['rss_after']):>5} {r['peak_over_execute']:7.2f}x {m(r['client_sent_bytes']):>5}"
              f" {r['2xx']:3} {r['4xx']:3} {r['other']:5} {r['seconds']:5.1f}  "
              + ", ".join(f"{k}: {v}" for k, v in r["codes"].items()))
    print("RSS: the server's VmRSS before the flood; peak: its VmHWM (reset just before) or VmRSS sampled"
          " every 10 ms, whichever is higher; after: VmRSS once every request was answered; sent: body"
          f" bytes the client got to send before each answer. {took:.0f} s in all.")


if __name__ == "__main__":
    main()
