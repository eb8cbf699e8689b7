#!/usr/bin/env python3
"""Soak test of `runcell serve` (issue 10, "Under load and faults").

Starts the server on a free loopback port with an API key, sends N mixed requests (default
10,000) at concurrency C (default 8): every language; successes, errors, timeouts, memory and
fork bombs, output floods, disk floods, files in and out, stdin, background daemons, event
streams, clients that hang up mid-run, refused requests, and sessions (state across calls,
interruptions that keep it, a memory kill that loses it, deletion). Every answer is checked precisely
(status, exit code, category, stdout/stderr, files, truncation flags, the audit line of its
request id), the server's memory is sampled every second, and after a clean shutdown the host
is checked for leftovers: no sandbox process, no cgroup of this server, no new mount, no
temporary file, the data directory unchanged. Bounded in time (--deadline). Exits non-zero on
any wrong answer, leftover, or memory growth. Python 3 standard library only.

See docs/soak.md.
"""

import argparse
import base64
import collections
import glob
import hashlib
import http.client
import json
import os
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SANDBOX_UIDS = range(2000000000, 2001000000)
MIB = 1 << 20


# ---------------------------------------------------------------------------------------------
# The mix: every kind of request, its weight, and what its answer must be
# ---------------------------------------------------------------------------------------------


class Req:
    """One request to send: the body, and a check of the answer returning a list of problems."""

    def __init__(self, body, check, *, key=None, events=False, hangup=None, marker=None, session=None):
        self.session = session  # a session's calls: steps of (body, check), see Mix.session
        self.body = body
        self.check = check
        self.key = key  # None: the right key; otherwise the key to send
        self.events = events  # Accept: text/event-stream
        self.hangup = hangup  # disconnect once this marker's process runs
        self.marker = marker  # a process argv marker that must be gone at the end


def expect(problems, cond, what):
    if not cond:
        problems.append(what)


def delivered(text):
    """The size of output as a verdict counts it: its JSON string, escapes included."""
    return len(json.dumps(text, ensure_ascii=False)) - 2


def verdict_problems(v, *, exit_code, category, stdout=None, stderr=None, language=None):
    """The fields every kind checks; returns problems."""
    p = []
    err = v.get("error")
    got_cat = err["category"] if err else None
    expect(p, got_cat == category, f"category {got_cat!r}, want {category!r}")
    expect(p, v.get("exit_code") == exit_code, f"exit_code {v.get('exit_code')!r}, want {exit_code!r}")
    if err:
        expect(p, isinstance(err.get("message"), str) and err["message"], "empty error message")
        want_retry = category not in ("runtime_unavailable", "sandbox_failure")
        expect(p, err.get("retryable") == want_retry, f"retryable {err.get('retryable')!r}")
    if stdout is not None:
        expect(p, v.get("stdout") == stdout, f"stdout {v.get('stdout', '')[:200]!r}, want {stdout[:200]!r}")
    if stderr is not None:
        expect(p, v.get("stderr") == stderr, f"stderr {v.get('stderr', '')[:300]!r}, want {stderr[:300]!r}")
    if language:
        expect(p, v.get("language") == language, f"language {v.get('language')!r}")
    # A session's call that lost its state says so in a warning (checked by state_lost()).
    warnings = [w for w in v.get("warnings") or [] if not (v.get("state_lost") and w.startswith("The session's state was lost"))]
    expect(p, not warnings, f"warnings {v.get('warnings')!r}")
    return p


def state_kept():
    def extra(v):
        return [] if v.get("state_lost") is False else [f"state_lost is {v.get('state_lost')!r}, not false"]
    return extra


def state_lost():
    def extra(v):
        return [] if v.get("state_lost") is True else [f"state_lost is {v.get('state_lost')!r}, not true"]
    return extra


def ok(stdout, stderr="", language=None, extra=None):
    def check(status, v):
        if status != 200:
            return [f"status {status}"]
        p = verdict_problems(v, exit_code=0, category=None, stdout=stdout, stderr=stderr, language=language)
        expect(p, v.get("stdout_truncated") is False and v.get("stderr_truncated") is False, "truncated flags")
        if extra:
            p += extra(v)
        return p

    return check


def failed(category, exit_code, *, stdout=None, stderr=None, stderr_has=None, message_has=None, extra=None):
    def check(status, v):
        if status != 200:
            return [f"status {status}"]
        p = verdict_problems(v, exit_code=exit_code, category=category, stdout=stdout, stderr=stderr)
        if stderr_has is not None:
            expect(p, stderr_has in v.get("stderr", ""), f"stderr lacks {stderr_has!r}: {v.get('stderr', '')[-300:]!r}")
        if message_has is not None:
            msg = (v.get("error") or {}).get("message", "")
            expect(p, message_has in msg, f"message lacks {message_has!r}: {msg!r}")
        if extra:
            p += extra(v)
        return p

    return check


# What a check returns for a run that never reached what it tests: the host was too loaded for
# the program to even start within its (short) timeout. The answer, a timeout with no output
# and next to no CPU time, is right for what happened; the soak counts these apart.
STARVED = "starved"


def or_starved(check):
    """Accept, as STARVED, a timeout before the program printed its first line."""

    def wrapped(status, v):
        p = check(status, v)
        if p and status == 200 and (v.get("error") or {}).get("category") == "timeout" and v.get("exit_code") == 124 \
                and v.get("stdout") == "" and (v.get("usage") or {}).get("cpu_time", 1) < 0.25 and not v.get("warnings"):
            return [STARVED]
        return p

    return wrapped


def refused(status_want, category, limit=None):
    def check(status, v):
        p = []
        expect(p, status == status_want, f"status {status}, want {status_want}")
        err = v.get("error") if isinstance(v, dict) else None
        expect(p, isinstance(err, dict) and err.get("category") == category, f"body {str(v)[:300]}")
        if limit:
            expect(p, isinstance(err, dict) and err.get("limit") == limit, f"limit {err and err.get('limit')!r}")
        return p

    return check


def timed(lo, hi):
    """execution_time within [lo, hi]."""

    def extra(v):
        t = v.get("execution_time", -1)
        return [] if lo <= t <= hi else [f"execution_time {t} not in [{lo}, {hi}]"]

    return extra


def files_are(want):
    """The verdict's files are exactly `want` ({path: bytes}), content, size and sha256."""

    def extra(v):
        p = []
        got = {f["path"]: f for f in v.get("files", [])}
        expect(p, sorted(got) == sorted(want), f"files {sorted(got)}, want {sorted(want)}")
        for path, content in want.items():
            f = got.get(path)
            if not f:
                continue
            data = base64.b64decode(f.get("content_base64") or "")
            expect(p, data == content, f"{path}: content {data[:80]!r}, want {content[:80]!r}")
            expect(p, f.get("size") == len(content), f"{path}: size {f.get('size')}")
            expect(p, f.get("sha256") == hashlib.sha256(content).hexdigest(), f"{path}: sha256")
            expect(p, not f.get("truncated"), f"{path}: truncated")
        expect(p, not v.get("files_omitted"), f"files_omitted {v.get('files_omitted')}")
        return p

    return extra


def flood(stream, cap, pattern):
    """An output flood cut at `cap` delivered bytes of `stream`, the other stream empty."""

    def extra(v):
        p = []
        other = "stderr" if stream == "stdout" else "stdout"
        text = v.get(stream, "")
        expect(p, v.get(f"{stream}_truncated") is True, f"{stream}_truncated not set")
        expect(p, v.get(f"{other}_truncated") is False, f"{other}_truncated set")
        expect(p, v.get(other) == "", f"{other} {v.get(other, '')[:100]!r}")
        n = delivered(text)
        expect(p, cap - 1 <= n <= cap, f"{stream} delivered {n} bytes for a cap of {cap}")
        reps = pattern * (len(text) // len(pattern) + 1)
        expect(p, reps.startswith(text), f"{stream} is not the program's output: {text[:100]!r}")
        expect(p, stream in (v.get("error") or {}).get("message", ""), "message does not name the stream")
        return p

    return extra


def peak_below(limit):
    def extra(v):
        peak = (v.get("usage") or {}).get("peak_memory_bytes") or 0
        return [] if peak <= limit + MIB else [f"peak memory {peak} above the {limit} limit"]

    return extra


def hexstr(r, n):
    """n random bytes in hex, from the request's own (seeded) generator."""
    return r.randbytes(n).hex()


def go_src(body, imports=("fmt",)):
    imps = "\n".join(f'\t"{i}"' for i in imports)
    return f"package main\n\nimport (\n{imps}\n)\n\nfunc main() {{\n{body}\n}}\n"


# Timeouts: short, so that the kinds that wait for them do not dominate the soak's time.
T = 1  # seconds
# How far past its limit a run may end under a loaded host (the verdict's own time).
LATE = 3.0
# A run that must end promptly (a daemon left behind must not keep it alive).
PROMPT = 8.0


class Mix:
    """Builds request n of a kind; `tag` is unique to this soak, for process markers."""

    def __init__(self, tag):
        self.tag = tag

    def marker(self, n):
        # digits only: it is an argument of `sleep` (1000.<marker> seconds)
        return f"{self.tag}{n:07d}"

    # --- successes -------------------------------------------------------------------------
    def python_ok(self, n, r):
        a, b = r.randrange(10**6), r.randrange(10**6)
        return Req({"language": "python", "code": f"print({a} * {b})"}, ok(f"{a * b}\n", language="python"))

    def node_ok(self, n, r):
        a, b = r.randrange(10**6), r.randrange(10**6)
        return Req({"language": "node", "code": f"console.log({a} * {b})"}, ok(f"{a * b}\n", language="node"))

    def ruby_ok(self, n, r):
        a, b = r.randrange(10**6), r.randrange(10**6)
        return Req({"language": "ruby", "code": f"puts {a} * {b}"}, ok(f"{a * b}\n", language="ruby"))

    def bash_ok(self, n, r):
        a, b = r.randrange(10**6), r.randrange(10**6)
        code = f"x=$(( {a} * {b} )); echo \"$x\" | cat"
        return Req({"language": "bash", "code": code}, ok(f"{a * b}\n", language="bash"))

    def go_ok(self, n, r):
        a, b = r.randrange(10**6), r.randrange(10**6)
        code = go_src(f"\tfmt.Println({a} * {b})")

        def extra(v):
            return [] if (v.get("compile_time") or 0) > 0 else ["no compile_time"]

        return Req({"language": "go", "code": code, "timeout": 20}, ok(f"{a * b}\n", language="go", extra=extra))

    def python_pandas(self, n, r):
        rows = [(i, r.randrange(1000)) for i in range(r.randrange(5, 50))]
        csv = "id,v\n" + "".join(f"{i},{v}\n" for i, v in rows)
        total = sum(v for _, v in rows)
        code = (
            "import pandas as pd\n"
            "df = pd.read_csv('data.csv')\n"
            "df['w'] = df.v * 2\n"
            "df.to_csv('out/doubled.csv', index=False)\n"
            "print(int(df.v.sum()), len(df))\n"
        )
        out = "id,v,w\n" + "".join(f"{i},{v},{2 * v}\n" for i, v in rows)
        return Req(
            {"language": "python", "code": "import os\nos.makedirs('out')\n" + code, "files": [{"path": "data.csv", "content": csv}], "timeout": 30},
            ok(f"{total} {len(rows)}\n", extra=files_are({"out/doubled.csv": out.encode()})),
        )

    # --- stdin -----------------------------------------------------------------------------
    def _numbers(self, r):
        nums = [r.randrange(-1000, 1000) for _ in range(r.randrange(1, 200))]
        return nums, "".join(f"{x}\n" for x in nums)

    def python_stdin(self, n, r):
        nums, text = self._numbers(r)
        code = "import sys\nnums = [int(x) for x in sys.stdin.read().split()]\nprint(sum(nums), len(nums))"
        return Req({"language": "python", "code": code, "stdin": text}, ok(f"{sum(nums)} {len(nums)}\n"))

    def node_stdin(self, n, r):
        nums, text = self._numbers(r)
        code = (
            "const n = require('fs').readFileSync(0, 'utf8').split(/\\s+/).filter(Boolean).map(Number);\n"
            "console.log(n.reduce((a, b) => a + b, 0), n.length);"
        )
        return Req({"language": "node", "code": code, "stdin": text}, ok(f"{sum(nums)} {len(nums)}\n"))

    def ruby_stdin(self, n, r):
        nums, text = self._numbers(r)
        code = 'n = STDIN.read.split.map(&:to_i)\nputs "#{n.sum} #{n.size}"'
        return Req({"language": "ruby", "code": code, "stdin": text}, ok(f"{sum(nums)} {len(nums)}\n"))

    def bash_stdin(self, n, r):
        words = " ".join(hexstr(r, 4) for _ in range(r.randrange(1, 20)))
        return Req({"language": "bash", "code": "tr a-f A-F", "stdin": words}, ok(words.upper()))

    def go_stdin(self, n, r):
        nums, text = self._numbers(r)
        body = (
            "\ts := bufio.NewScanner(os.Stdin)\n\tsum, count := 0, 0\n"
            "\tfor s.Scan() {\n\t\tx, _ := strconv.Atoi(s.Text())\n\t\tsum += x\n\t\tcount++\n\t}\n"
            "\tfmt.Println(sum, count)"
        )
        code = go_src(body, ("bufio", "fmt", "os", "strconv"))
        return Req({"language": "go", "code": code, "stdin": text, "timeout": 20}, ok(f"{sum(nums)} {len(nums)}\n"))

    # --- errors ----------------------------------------------------------------------------
    def python_error(self, n, r):
        code = f"print('before {n}')\nraise ValueError('boom {n}')"
        return Req({"language": "python", "code": code}, failed("runtime_error", 1, stdout=f"before {n}\n", stderr_has=f"ValueError: boom {n}\n"))

    def node_error(self, n, r):
        return Req({"language": "node", "code": f"throw new TypeError('boom {n}')"}, failed("runtime_error", 1, stdout="", stderr_has=f"TypeError: boom {n}"))

    def ruby_error(self, n, r):
        return Req({"language": "ruby", "code": f"raise ArgumentError, 'boom {n}'"}, failed("runtime_error", 1, stdout="", stderr_has=f"boom {n}", message_has=f"boom {n}"))

    def bash_error(self, n, r):
        code = 3 + n % 100
        return Req(
            {"language": "bash", "code": f"echo out{n}; echo err{n} >&2; exit {code}"},
            failed("runtime_error", code, stdout=f"out{n}\n", stderr=f"err{n}\n"),
        )

    def python_signal(self, n, r):
        return Req({"language": "python", "code": "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)"}, failed("runtime_error", 143, stdout="", message_has="SIGTERM"))

    def go_compile_error(self, n, r):
        code = go_src(f'\tfmt.Printn("x{n}")')

        def check(status, v):
            if status != 200:
                return [f"status {status}"]
            p = []
            err = v.get("error") or {}
            expect(p, err.get("category") == "compile_error", f"category {err.get('category')!r}")
            expect(p, "undefined" in err.get("message", ""), f"message {err.get('message')!r}")
            expect(p, "main.go:" in err.get("message", ""), f"message {err.get('message')!r}")
            expect(p, v.get("exit_code") != 0, "exit code 0")
            expect(p, v.get("stdout") == "", f"stdout {v.get('stdout')!r}")
            expect(p, not v.get("warnings"), f"warnings {v.get('warnings')}")
            return p

        return Req({"language": "go", "code": code, "timeout": 20}, check)

    def go_panic(self, n, r):
        return Req({"language": "go", "code": go_src(f'\tpanic("boom {n}")', ()), "timeout": 20}, failed("runtime_error", 2, stdout="", stderr_has=f"panic: boom {n}"))

    # --- refused requests ------------------------------------------------------------------
    def bad_language(self, n, r):
        return Req({"language": f"cobol{n}", "code": "DISPLAY 1"}, refused(400, "invalid_request"))

    def over_limit(self, n, r):
        return Req({"language": "python", "code": "print(1)", "memory": "1T"}, refused(400, "invalid_request", limit="memory"))

    def wrong_key(self, n, r):
        return Req({"language": "python", "code": "print(1)"}, refused(401, "unauthorized"), key="wrong-" + hexstr(r, 16))

    # --- timeouts --------------------------------------------------------------------------
    def _timeout(self, lang, code, start, timeout=T):
        return Req(
            {"language": lang, "code": code, "timeout": timeout, "compile_timeout": 30},
            or_starved(failed("timeout", 124, stdout=start, extra=timed(timeout * 0.95, timeout + LATE))),
        )

    def python_timeout(self, n, r):  # a busy loop
        return self._timeout("python", f"print('start {n}', flush=True)\nwhile True: pass", f"start {n}\n")

    def node_timeout(self, n, r):
        return self._timeout("node", f"console.log('start {n}'); setInterval(() => {{}}, 1000)", f"start {n}\n")

    def ruby_timeout(self, n, r):
        return self._timeout("ruby", f"puts 'start {n}'\n$stdout.flush\nsleep", f"start {n}\n")

    def bash_timeout(self, n, r):
        return self._timeout("bash", f"echo start {n}\nwhile :; do sleep 100; done", f"start {n}\n")

    def go_timeout(self, n, r):
        code = go_src(f'\tfmt.Println("start {n}")\n\tfor {{\n\t\ttime.Sleep(time.Hour)\n\t}}', ("fmt", "time"))
        return self._timeout("go", code, f"start {n}\n")

    # --- memory bombs ----------------------------------------------------------------------
    def _membomb(self, lang, code, start, mem=64):
        return Req(
            {"language": lang, "code": code, "memory": f"{mem}M", "timeout": 20},
            failed("memory_limit", 137, stdout=start, message_has=f"{mem} MiB", extra=peak_below(mem * MIB)),
        )

    def python_membomb(self, n, r):
        return self._membomb("python", f"print('alloc {n}', flush=True)\nb = bytearray(1 << 30)\nprint(len(b))", f"alloc {n}\n")

    def python_membomb_gradual(self, n, r):
        return self._membomb("python", "x = []\nwhile True:\n    x.append(bytearray(1 << 20))", "")

    def node_membomb(self, n, r):
        return self._membomb("node", "const a = []; while (true) { a.push(Buffer.alloc(1 << 20, 1)); }", "")

    def ruby_membomb(self, n, r):
        return self._membomb("ruby", "s = 'x' * 1024\nloop { s << s }", "")

    def go_membomb(self, n, r):
        body = f'\tfmt.Println("alloc {n}")\n\tb := make([]byte, 1<<30)\n\tfor i := 0; i < len(b); i += 4096 {{\n\t\tb[i] = 1\n\t}}\n\tfmt.Println(len(b))'
        return self._membomb("go", go_src(body), f"alloc {n}\n")

    # --- fork bombs ------------------------------------------------------------------------
    def _forkbomb(self, lang, code, start):
        check = failed("process_limit", 124, stdout=start, message_has="16 processes", extra=timed(T * 0.95, T + LATE))
        return Req({"language": lang, "code": code, "timeout": T, "pids": 16}, or_starved(check))

    def python_forkbomb(self, n, r):
        code = f"import os\nprint('bomb {n}', flush=True)\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
        return self._forkbomb("python", code, f"bomb {n}\n")

    def bash_forkbomb(self, n, r):
        return self._forkbomb("bash", f"echo bomb {n}\n:(){{ :|:& }};:\nsleep 10", f"bomb {n}\n")

    # --- output floods ---------------------------------------------------------------------
    def python_flood(self, n, r):  # the default 1 MiB cap
        line = f"{n}:" + "x" * 1000
        return Req({"language": "python", "code": f"while True:\n    print({line!r})"}, failed("output_limit", 137, extra=flood("stdout", MIB, line + "\n")))

    def python_stderr_flood(self, n, r):
        chunk = f"e{n}." * 100
        return Req(
            {"language": "python", "code": f"import sys\nwhile True:\n    sys.stderr.write({chunk!r})", "output": "64K"},
            failed("output_limit", 137, extra=flood("stderr", 64 << 10, chunk)),
        )

    def node_flood(self, n, r):
        # Each write waits for the previous one: a loop that never yields would queue its
        # writes in memory (libuv) and end at the memory limit instead.
        chunk = f"n{n}." * 512
        code = f"const c = {json.dumps(chunk)}; function f() {{ process.stdout.write(c, f); }} f();"
        return Req({"language": "node", "code": code, "output": "64K"}, failed("output_limit", 137, extra=flood("stdout", 64 << 10, chunk)))

    def ruby_flood(self, n, r):
        chunk = f"r{n}." * 1000
        return Req({"language": "ruby", "code": f"loop {{ $stdout.write({json.dumps(chunk)}) }}", "output": "64K"}, failed("output_limit", 137, extra=flood("stdout", 64 << 10, chunk)))

    def bash_flood(self, n, r):
        return Req({"language": "bash", "code": f"yes flood{n}", "output": "64K"}, failed("output_limit", 137, extra=flood("stdout", 64 << 10, f"flood{n}\n")))

    # --- disk ------------------------------------------------------------------------------
    def python_disk(self, n, r):
        code = "f = open('/workspace/big', 'wb')\nfor i in range(200):\n    f.write(b'x' * (1 << 20))\n    f.flush()"
        return Req({"language": "python", "code": code, "disk": "4M"}, failed("disk_limit", 1, stdout="", stderr_has="No space left on device", message_has="4 MiB"))

    def bash_disk(self, n, r):
        code = "head -c 100M /dev/zero > /tmp/big"
        return Req({"language": "bash", "code": code, "disk": "2M"}, failed("disk_limit", 1, stdout="", stderr_has="No space left on device"))

    # --- files in and out ------------------------------------------------------------------
    def python_files(self, n, r):
        blob = r.randbytes(r.randrange(1, 4096))
        lines = [hexstr(r, 8) for _ in range(r.randrange(1, 30))]
        code = (
            "import os\n"
            "data = open('in/lines.txt').read().split()\n"
            "os.makedirs('out/deep', exist_ok=True)\n"
            "open('out/deep/sorted.txt', 'w').write('\\n'.join(sorted(data)) + '\\n')\n"
            "open('rev.bin', 'wb').write(open('blob.bin', 'rb').read()[::-1])\n"
            f"print('files {n}', len(data))\n"
        )
        body = {
            "language": "python",
            "code": code,
            "files": [
                {"path": "in/lines.txt", "content": "\n".join(lines) + "\n"},
                {"path": "blob.bin", "content_base64": base64.b64encode(blob).decode()},
            ],
        }
        want = {"out/deep/sorted.txt": ("\n".join(sorted(lines)) + "\n").encode(), "rev.bin": blob[::-1]}
        return Req(body, ok(f"files {n} {len(lines)}\n", extra=files_are(want)))

    def node_files(self, n, r):
        values = [r.randrange(10**6) for _ in range(r.randrange(1, 50))]
        code = (
            "const fs = require('fs');\n"
            "const v = JSON.parse(fs.readFileSync('input.json', 'utf8'));\n"
            "fs.writeFileSync('result.json', JSON.stringify({sum: v.reduce((a, b) => a + b, 0), n: v.length}));\n"
            f"console.log('node files {n}');\n"
        )
        body = {"language": "node", "code": code, "files": [{"path": "input.json", "content": json.dumps(values)}]}
        want = {"result.json": json.dumps({"sum": sum(values), "n": len(values)}, separators=(",", ":")).encode()}
        return Req(body, ok(f"node files {n}\n", extra=files_are(want)))

    def ruby_files(self, n, r):
        words = [hexstr(r, 3) for _ in range(r.randrange(1, 30))]
        code = "w = File.read('words.txt').split\nFile.write('report/count.txt', \"#{w.size} #{w.uniq.size}\\n\")\nputs w.size\n"
        body = {"language": "ruby", "code": "Dir.mkdir('report')\n" + code, "files": [{"path": "words.txt", "content": " ".join(words)}]}
        want = {"report/count.txt": f"{len(words)} {len(set(words))}\n".encode()}
        return Req(body, ok(f"{len(words)}\n", extra=files_are(want)))

    def bash_files(self, n, r):
        lines = [hexstr(r, 5) for _ in range(r.randrange(1, 40))]
        body = {
            "language": "bash",
            "code": "sort data.txt > sorted.txt\nmkdir -p a/b && cp data.txt a/b/copy.txt && chmod 600 a/b/copy.txt\nwc -l < data.txt",
            "files": [{"path": "data.txt", "content": "\n".join(lines) + "\n"}],
        }
        want = {"sorted.txt": ("\n".join(sorted(lines)) + "\n").encode(), "a/b/copy.txt": ("\n".join(lines) + "\n").encode()}
        return Req(body, ok(f"{len(lines)}\n", extra=files_are(want)))

    # --- background daemons ----------------------------------------------------------------
    def python_daemon(self, n, r):
        m = self.marker(n)
        code = (
            "import os, signal, time\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            "        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):\n"
            "            signal.signal(s, signal.SIG_IGN)\n"
            f"        os.execvp('sleep', ['sleep', '1000.{m}'])\n"
            "    os._exit(0)\n"
            "def up():\n"
            "    for p in os.listdir('/proc'):\n"
            "        try:\n"
            "            argv = open(f'/proc/{p}/cmdline', 'rb').read().split(b'\\0')\n"
            "        except (OSError, ValueError):\n"
            "            continue\n"
            f"        if argv[0] == b'sleep' and len(argv) > 1 and b'{m}' in argv[1]:\n"
            "            return True\n"
            "    return False\n"
            "while not up():\n"
            "    time.sleep(0.01)\n"
            f"print('daemon up {n}')\n"
        )
        return Req({"language": "python", "code": code, "timeout": 20}, ok(f"daemon up {n}\n", extra=timed(0, PROMPT)), marker=m)

    def bash_daemon(self, n, r):
        m = self.marker(n)
        code = (
            f"nohup sleep 1000.{m} >/dev/null 2>&1 &\nsetsid sleep 1001.{m} &\n"
            "until [ \"$(pgrep -c -x sleep)\" = 2 ]; do sleep 0.01; done\n"
            f"echo done {n}\n"
        )
        return Req({"language": "bash", "code": code, "timeout": 20}, ok(f"done {n}\n", extra=timed(0, PROMPT)), marker=m)

    def node_daemon(self, n, r):
        m = self.marker(n)
        code = (
            "const cp = require('child_process');\n"
            f"const c = cp.spawn('sleep', ['1000.{m}'], {{detached: true, stdio: 'ignore'}});\n"
            f"c.unref();\nconsole.log('spawned {n}', c.pid > 1);\n"
        )
        return Req({"language": "node", "code": code, "timeout": 20}, ok(f"spawned {n} true\n", extra=timed(0, PROMPT)), marker=m)

    def ruby_daemon(self, n, r):
        m = self.marker(n)
        code = f"pid = Process.spawn('sleep', '1000.{m}', pgroup: true)\nProcess.detach(pid)\nputs \"spawned {n}\"\n"
        return Req({"language": "ruby", "code": code, "timeout": 20}, ok(f"spawned {n}\n", extra=timed(0, PROMPT)), marker=m)

    # --- sessions: state across calls, an interruption that keeps it, a memory kill -------
    def session(self, language, create, steps):
        """A session's life: created, called step by step (each call checked and audited),
        then deleted."""
        return Req({"language": language, **create}, None, session=steps)

    def python_session(self, n, r):
        a = r.randrange(10**6)
        return self.session("python", {"ttl": 60}, [
            ({"code": f"x = {a}\n_ = open('s.txt', 'w').write('{n}')"}, ok("")),
            ({"code": "print(x + 1, open('s.txt').read())"}, ok(f"{a + 1} {n}\n", extra=state_kept())),
            ({"code": "import time\ntime.sleep(30)", "timeout": 1},
             failed("timeout", 124, stderr_has="KeyboardInterrupt", extra=state_kept())),
            ({"code": "x * 2"}, ok(f"{a * 2}\n", extra=state_kept())),
        ])

    def python_session_membomb(self, n, r):
        return self.session("python", {"memory": "96M"}, [
            ({"code": f"y = {n}"}, ok("")),
            ({"code": "b = bytearray(300 << 20)"}, failed("memory_limit", 137, extra=state_lost())),
            ({"code": "print('y' in globals())"}, ok("False\n", extra=state_kept())),
        ])

    def node_session(self, n, r):
        return self.session("node", {}, [
            ({"code": f"let v = {n}"}, ok("")),
            ({"code": "while (true) {}", "timeout": 1}, failed("timeout", 124, extra=state_kept())),
            ({"code": "console.log(v)"}, ok(f"{n}\n", extra=state_kept())),
        ])

    def bash_session(self, n, r):
        return self.session("bash", {}, [
            ({"code": f"mkdir -p d{n} && cd d{n} && export V={n}"}, ok("")),
            ({"code": "echo $V $(basename $PWD)"}, ok(f"{n} d{n}\n", extra=state_kept())),
        ])

    # --- event streams and clients that hang up --------------------------------------------
    def bash_events(self, n, r):
        k = r.randrange(1, 6)
        code = f"for i in $(seq {k}); do echo {n}-$i; echo e$i >&2; done"
        want = "".join(f"{n}-{i}\n" for i in range(1, k + 1))
        return Req({"language": "bash", "code": code}, ok(want, stderr="".join(f"e{i}\n" for i in range(1, k + 1))), events=True)

    def python_hangup(self, n, r):
        # The client disconnects once the program runs: its sandbox must be killed at once
        # (the marker process gone) and the run audited as cancelled.
        m = self.marker(n)
        code = f"import os\nos.execvp('sleep', ['sleep', '1000.{m}'])"
        return Req({"language": "python", "code": code, "timeout": 60}, None, hangup=m, marker=m)


# name: (weight, language). Weights are relative; every kind is present in every soak of at
# least len(KINDS) requests. Tuned so that 10,000 requests take about 20 minutes on 2 cores:
# the kinds that hold a sandbox for their timeout, or compile Go, weigh less.
KINDS = {
    "python_ok": (10, "python"),
    "node_ok": (6, "node"),
    "ruby_ok": (6, "ruby"),
    "bash_ok": (8, "bash"),
    "go_ok": (2, "go"),
    "python_pandas": (2, "python"),
    "python_stdin": (4, "python"),
    "node_stdin": (3, "node"),
    "ruby_stdin": (3, "ruby"),
    "bash_stdin": (4, "bash"),
    "go_stdin": (1, "go"),
    "python_error": (4, "python"),
    "node_error": (3, "node"),
    "ruby_error": (3, "ruby"),
    "bash_error": (4, "bash"),
    "python_signal": (1, "python"),
    "go_compile_error": (1, "go"),
    "go_panic": (1, "go"),
    "bad_language": (2, "-"),
    "over_limit": (2, "-"),
    "wrong_key": (2, "-"),
    "python_timeout": (1, "python"),
    "node_timeout": (1, "node"),
    "ruby_timeout": (1, "ruby"),
    "bash_timeout": (1, "bash"),
    "go_timeout": (0.5, "go"),
    "python_membomb": (1.5, "python"),
    "python_membomb_gradual": (1, "python"),
    "node_membomb": (1, "node"),
    "ruby_membomb": (1, "ruby"),
    "go_membomb": (0.5, "go"),
    "python_forkbomb": (1, "python"),
    "bash_forkbomb": (1, "bash"),
    "python_flood": (1.5, "python"),
    "python_stderr_flood": (1, "python"),
    "node_flood": (1, "node"),
    "ruby_flood": (1, "ruby"),
    "bash_flood": (1.5, "bash"),
    "python_disk": (1, "python"),
    "bash_disk": (1, "bash"),
    "python_files": (4, "python"),
    "node_files": (3, "node"),
    "ruby_files": (2, "ruby"),
    "bash_files": (3, "bash"),
    "python_daemon": (2, "python"),
    "bash_daemon": (2, "bash"),
    "node_daemon": (1.5, "node"),
    "ruby_daemon": (1.5, "ruby"),
    "bash_events": (3, "bash"),
    "python_hangup": (0.5, "python"),
    "python_session": (2, "python"),
    "python_session_membomb": (0.5, "python"),
    "node_session": (1, "node"),
    "bash_session": (1, "bash"),
}


def schedule(n, seed, only=None):
    """A deterministic sequence of n kind names in proportion to the weights, every kind at
    least once, shuffled with `seed`."""
    names = [k for k in KINDS if not only or k in only]
    total = sum(KINDS[k][0] for k in names)
    counts = {k: max(1, int(n * KINDS[k][0] / total)) for k in names}
    # Fill (or trim) to exactly n by the largest remainders.
    while sum(counts.values()) < n:
        k = max(names, key=lambda k: n * KINDS[k][0] / total - counts[k])
        counts[k] += 1
    while sum(counts.values()) > n:
        k = max((k for k in names if counts[k] > 1), key=lambda k: counts[k] - n * KINDS[k][0] / total)
        counts[k] -= 1
    seq = [k for k in names for _ in range(counts[k])]
    random.Random(seed).shuffle(seq)
    return seq


# ---------------------------------------------------------------------------------------------
# The host: processes, cgroups, mounts, files
# ---------------------------------------------------------------------------------------------


def read(path, mode="r"):
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError:
        return None


def proc_status(pid):
    s = read(f"/proc/{pid}/status")
    if s is None:
        return None
    out = {}
    for line in s.splitlines():
        k, _, v = line.partition(":")
        out[k] = v.strip()
    return out


def kib(field):
    return int(field.split()[0]) * 1024 if field else 0


def processes():
    """pid -> (uid, cgroup text, cmdline, exe) of every host process."""
    out = {}
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        st = proc_status(e)
        if not st:
            continue
        try:
            uid = int(st.get("Uid", "0").split()[0])
        except ValueError:
            uid = 0
        cmd = (read(f"/proc/{e}/cmdline", "rb") or b"").replace(b"\0", b" ").decode("utf-8", "replace").strip()
        try:
            exe = os.readlink(f"/proc/{e}/exe")
        except OSError:
            exe = ""
        out[int(e)] = (uid, read(f"/proc/{e}/cgroup") or "", cmd, exe)
    return out


def leftover_processes(server_pid, binary, tag, before):
    """Processes of this soak still alive: in a cgroup of the server, running the soak's
    runcell binary (helpers, sandboxes' pid 1), carrying one of its markers, or a sandbox uid
    outside any live supervisor's group (an escape). Other runcells may run on this host at the
    same time (other worktrees' tests): a sandbox of theirs being set up has a sandbox uid and
    no group for a moment, so a suspect counts only if it is still there a few seconds later."""
    ours = f"/runcell/{server_pid}-"

    def suspects():
        found = {}
        for pid, (uid, cg, cmd, exe) in processes().items():
            if pid == os.getpid():
                continue
            exe = exe.replace(" (deleted)", "")
            why = None
            if ours in cg:
                why = "in the server's cgroup"
            elif exe == binary:
                why = "runs the soaked binary"
            elif tag in cmd:
                why = "carries the soak's marker"
            elif pid not in before and uid in SANDBOX_UIDS:
                m = re.search(r"/runcell/(\d+)-", cg)
                if not (m and os.path.exists(f"/proc/{m.group(1)}")):
                    why = "a sandbox uid outside any live supervisor's group"
            if why:
                start = (read(f"/proc/{pid}/stat") or ")").rpartition(")")[2].split()[19:20]
                found[(pid, tuple(start))] = (pid, uid, why, exe, cg.strip().replace("\n", " ")[:200], cmd[:120])
        return found

    first = suspects()
    if not first:
        return []
    time.sleep(3)
    again = suspects()
    return [again[k] for k in first if k in again]


def cgroup_dirs():
    """Directories under which runcell makes its runs' groups (v1 hierarchies, v2)."""
    dirs = [d for d in glob.glob("/sys/fs/cgroup/*/runcell") if os.path.isdir(d)]
    if os.path.exists("/sys/fs/cgroup/runcell/cgroup.procs"):
        dirs.append("/sys/fs/cgroup/runcell")
    return sorted(set(os.path.realpath(d) for d in dirs))


def groups_of(pid):
    prefix = f"{pid}-"
    found = []
    for d in cgroup_dirs():
        try:
            found += [os.path.join(d, e) for e in os.listdir(d) if e.startswith(prefix)]
        except OSError:
            pass
    return found


def mounts():
    out = set()
    for line in (read("/proc/self/mountinfo") or "").splitlines():
        f = line.split()
        sep = f.index("-") if "-" in f else len(f)
        out.add(" ".join([f[4]] + f[sep + 1 : sep + 3]))
    return out


def listing(root, max_entries=200000):
    """path -> (size, mtime_ns, mode) of everything under root (not following symlinks)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            out[p] = (st.st_size if not os.path.isdir(p) else 0, st.st_mtime_ns, st.st_mode, st.st_uid)
            if len(out) > max_entries:
                return out
    return out


def top_entries(d):
    out = {}
    try:
        for e in os.listdir(d):
            try:
                st = os.lstat(os.path.join(d, e))
                out[e] = st.st_uid
            except OSError:
                pass
    except OSError:
        pass
    return out


# ---------------------------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------------------------


class Server:
    def __init__(self, binary, workdir, key, concurrency, max_queue):
        self.key = key
        self.audit_path = os.path.join(workdir, "audit.jsonl")
        self.log_path = os.path.join(workdir, "server.log")
        self.tmpdir = os.path.join(workdir, "tmp")
        os.makedirs(self.tmpdir)
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNCELL_")}
        env.update(RUNCELL_API_KEY=key, TMPDIR=self.tmpdir, RUNCELL_LOG="info")
        args = [binary, "serve", "--listen", "127.0.0.1:0", "--max-concurrent", str(concurrency), "--max-queue", str(max_queue), "--audit-log", self.audit_path]
        self.proc = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.pid = self.proc.pid
        self.log = open(self.log_path, "w")
        self.lines = []
        addr = []
        ready = threading.Event()

        def pump():
            for raw in self.proc.stderr:
                line = raw.decode("utf-8", "replace")
                self.log.write(line)
                self.log.flush()
                self.lines.append(line)
                m = re.search(r"listening on http://(\S+)", line)
                if m and not addr:
                    addr.append(m.group(1))
                    ready.set()
            ready.set()

        self.pump = threading.Thread(target=pump, daemon=True)
        self.pump.start()
        if not ready.wait(30) or not addr:
            self.proc.kill()
            raise SystemExit(f"soak: the server did not start:\n{''.join(self.lines)}")
        host, _, port = addr[0].rpartition(":")
        self.host, self.port = host, int(port)

    def connection(self):
        return http.client.HTTPConnection(self.host, self.port, timeout=120)

    def get(self, path, auth=True):
        c = self.connection()
        try:
            c.request("GET", path, headers={"Authorization": f"Bearer {self.key}"} if auth else {})
            r = c.getresponse()
            return r.status, r.read().decode()
        finally:
            c.close()

    def sample(self):
        st = proc_status(self.pid) or {}
        try:
            fds = len(os.listdir(f"/proc/{self.pid}/fd"))
        except OSError:
            fds = -1
        return {"rss": kib(st.get("VmRSS")), "hwm": kib(st.get("VmHWM")), "fds": fds, "threads": int(st.get("Threads", "0") or 0)}

    def stop(self, within):
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(within)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            code = None
        self.pump.join(5)
        self.log.close()
        return code


# ---------------------------------------------------------------------------------------------
# Sending
# ---------------------------------------------------------------------------------------------


class Client:
    """One keep-alive connection per worker; reconnects when the server closed an idle one."""

    def __init__(self, server):
        self.server = server
        self.conn = None
        self.reconnects = 0

    def post(self, body, key, events):
        return self.request("POST", "/v1/execute", body, key, events)

    def request(self, method, path, body, key, events=False):
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
        if events:
            headers["Accept"] = "text/event-stream"
        for attempt in range(2):
            fresh = self.conn is None
            if fresh:
                self.conn = self.server.connection()
            try:
                self.conn.request(method, path, body=data, headers=headers)
                r = self.conn.getresponse()
                raw = r.read()
                rid = r.getheader("X-Request-Id")
                # A 401 is answered before the body is read: the server may then close the
                # connection (hyper does when the body was not all received), without saying so.
                if r.status == 401 or r.getheader("Connection", "").lower() == "close":
                    self.conn.close()
                    self.conn = None
                return r.status, raw, rid
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                self.conn.close()
                self.conn = None
                # A kept-alive connection the server closed in between: retry once, fresh.
                if fresh or attempt:
                    raise
                self.reconnects += 1
        raise RuntimeError("unreachable")


def parse_events(raw):
    """Server-sent events -> (stdout, stderr, result verdict or None, order problems)."""
    out, err, result, problems = [], [], None, []
    for block in raw.decode("utf-8", "replace").split("\n\n"):
        if not block.strip():
            continue
        event, data = "message", []
        for line in block.split("\n"):
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" ") if line[5:6] == " " else line[5:])
        if not data:
            continue  # keep-alive comment
        payload = json.loads("\n".join(data))
        if result is not None:
            problems.append(f"event {event} after the result")
        if event == "stdout":
            out.append(payload["text"])
        elif event == "stderr":
            err.append(payload["text"])
        elif event == "result":
            result = payload
        else:
            problems.append(f"unexpected event {event}: {payload}")
    return "".join(out), "".join(err), result, problems


def find_marker(marker):
    pat = marker.encode()
    found = []
    for e in os.listdir("/proc"):
        if e.isdigit() and int(e) != os.getpid():
            cmd = read(f"/proc/{e}/cmdline", "rb")
            if cmd and pat in cmd:
                found.append((int(e), cmd.replace(b"\0", b" ").decode("utf-8", "replace")))
    return found


def hangup(server, req):
    """Send the request, wait until its program runs, disconnect; the program must be gone
    within a few seconds. Returns (problems, request id or None)."""
    body = json.dumps(req.body).encode()
    s = socket.create_connection((server.host, server.port), timeout=30)
    try:
        s.sendall(
            b"POST /v1/execute HTTP/1.1\r\nHost: %s:%d\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % (server.host.encode(), server.port, server.key.encode(), len(body))
            + body
        )
        deadline = time.monotonic() + 60
        while not find_marker(req.hangup):
            if time.monotonic() > deadline:
                return ["the program never ran"], None
            time.sleep(0.05)
    finally:
        s.close()
    gone_by = time.monotonic() + PROMPT
    while find_marker(req.hangup):
        if time.monotonic() > gone_by:
            return [f"the program outlived its client by {PROMPT} s: {find_marker(req.hangup)}"], None
        time.sleep(0.05)
    return [], None


# ---------------------------------------------------------------------------------------------
# The soak
# ---------------------------------------------------------------------------------------------


def percentile(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    i = min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))
    return xs[i]


def median(xs):
    return percentile(xs, 0.5)


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.sent = collections.Counter()
        self.correct = collections.Counter()
        self.wrong = collections.Counter()
        self.starved = collections.Counter()
        self.latency = collections.defaultdict(list)
        self.wrong_examples = []
        self.audit_expect = {}  # request id -> expected audit category
        self.cancelled_expected = 0
        self.statuses = collections.Counter()
        self.done = 0
        self.reconnects = 0

    def record(self, kind, latency, problems, status, detail):
        with self.lock:
            if problems == [STARVED]:
                self.starved[kind] += 1
                problems = []
            self.sent[kind] += 1
            self.done += 1
            self.statuses[status] += 1
            self.latency[kind].append(latency)
            if problems:
                self.wrong[kind] += 1
                if len(self.wrong_examples) < 12:
                    self.wrong_examples.append((kind, problems, detail))
            else:
                self.correct[kind] += 1


def run_session(client, key, req, stats):
    """Create a session, run its steps (each answer checked, each call audited), delete it."""
    problems = []
    status, raw, _ = client.request("POST", "/v1/sessions", req.body, key)
    if status != 201:
        return [f"creating the session answered {status}: {raw[:300]!r}"], status, raw[:2000].decode("utf-8", "replace")
    sid = json.loads(raw)["id"]
    detail = ""
    try:
        detail = session_steps(client, key, req, stats, sid, problems)
    finally:
        # Always ended, also after a wrong answer: a session left behind would count against
        # the key's cap for every later one.
        status, raw, _ = client.request("DELETE", f"/v1/sessions/{sid}", None, key)
        expect(problems, status == 204, f"deleting the session answered {status}")
    return problems, status, detail


def session_steps(client, key, req, stats, sid, problems):
    detail = ""
    for i, (body, check) in enumerate(req.session, start=1):
        status, raw, rid = client.request("POST", f"/v1/sessions/{sid}/execute", body, key)
        detail = raw[:2000].decode("utf-8", "replace")
        try:
            v = json.loads(raw)
        except ValueError:
            v = {}
        step = check(status, v)
        expect(step, v.get("session_id") == sid, f"session_id {v.get('session_id')!r}")
        expect(step, v.get("execution_count") == i, f"execution_count {v.get('execution_count')!r}, not {i}")
        problems += [f"call {i}: {p}" for p in step]
        if rid and status == 200:
            err = v.get("error")
            with stats.lock:
                stats.audit_expect[rid] = "ok" if not err else err.get("category")
    return detail


def run_requests(server, mix, kinds, first, stats, concurrency, deadline, seed):
    """Send requests first..first+len(kinds)-1 from `concurrency` threads."""
    lock = threading.Lock()
    it = iter(enumerate(kinds, start=first))
    expired = threading.Event()

    def worker():
        client = Client(server)
        while True:
            with lock:
                nxt = next(it, None)
            if nxt is None:
                break
            if time.monotonic() > deadline:
                expired.set()
                break
            n, kind = nxt
            r = random.Random(seed * 1000003 + n)
            req = getattr(mix, kind)(n, r)
            t0 = time.monotonic()
            rid, status, detail = None, None, ""
            try:
                if req.session is not None:
                    problems, status, detail = run_session(client, server.key, req, stats)
                elif req.hangup:
                    problems, rid = hangup(server, req)
                    status = "hangup"
                    with stats.lock:
                        stats.cancelled_expected += 1
                else:
                    status, raw, rid = client.post(req.body, req.key or server.key, req.events)
                    detail = raw[:2000].decode("utf-8", "replace")
                    problems = []
                    if req.events and status == 200:
                        out, err, v, problems = parse_events(raw)
                        if v is None:
                            problems.append("no result event")
                            v = {}
                        else:
                            expect(problems, out == v.get("stdout"), f"stdout events {out!r} differ from the verdict's {v.get('stdout')!r}")
                            expect(problems, err == v.get("stderr"), f"stderr events {err!r} differ from the verdict's {v.get('stderr')!r}")
                    else:
                        try:
                            v = json.loads(raw)
                        except ValueError:
                            v = {}
                            problems.append("the body is not JSON")
                    problems += req.check(status, v)
                    if rid and isinstance(v, dict) and status in (200, 400):
                        err = v.get("error")
                        cat = "ok" if status == 200 and not err else (err or {}).get("category")
                        with stats.lock:
                            stats.audit_expect[rid] = cat
            except Exception as e:  # a transport failure is a wrong answer too
                problems = [f"{type(e).__name__}: {e}"]
                status = "exception"
            stats.record(kind, time.monotonic() - t0, problems, status, f"request {n}: {json.dumps(req.body)[:600]}\nanswer: {detail}")
        with stats.lock:
            stats.reconnects += client.reconnects

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(1)
            if time.monotonic() > deadline + 180:
                raise SystemExit("soak: requests still running 180 s past the deadline")
    return not expired.is_set()


def wait_idle(server, within=30):
    """Until the server runs no sandbox and queues nothing (per /metrics)."""
    deadline = time.monotonic() + within
    while True:
        status, text = server.get("/metrics")
        m = metric_values(text)
        if status == 200 and m.get("runcell_sandboxes_running", 1) == 0 and m.get("runcell_queue_depth", 1) == 0:
            return m
        if time.monotonic() > deadline:
            return m
        time.sleep(0.2)


def metric_values(text):
    """Metric name -> value, summed over its labels."""
    out = collections.Counter()
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name.split("{")[0]] += float(value)
        except ValueError:
            pass
    return out


def executions_by_category(text):
    out = collections.Counter()
    for line in text.splitlines():
        m = re.match(r'runcell_executions_total\{([^}]*)\} (\S+)', line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            out[labels.get("category")] += int(float(m.group(2)))
    return out


def git_describe():
    try:
        rev = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except OSError:
        return "?"


def build(profile):
    args = ["cargo", "build", "-q", "-p", "runcell"] + (["--release"] if profile == "release" else [])
    print(f"soak: {' '.join(args)}", flush=True)
    subprocess.run(args, cwd=REPO, check=True)
    return os.path.join(REPO, "target", profile, "runcell")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-concurrent", type=int, default=None, help="the server's --max-concurrent (default: --concurrency)")
    ap.add_argument("--profile", choices=["release", "debug"], default="release", help="which build of runcell to soak (built first)")
    ap.add_argument("--binary", help="use this runcell binary, do not build")
    ap.add_argument("--deadline", type=float, default=None, help="seconds for the whole soak (default: 120 + 0.2 s per request)")
    ap.add_argument("--warmup", type=float, default=0.1, help="the fraction of requests that warms the server up")
    ap.add_argument("--rss-growth-mib", type=float, default=8, help="how much the idle RSS may grow after warm-up")
    ap.add_argument("--seed", type=int, default=10)
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--only", help="comma-separated kinds to send (to chase a problem); default all")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("soak: needs root (runcell's cgroups and sandbox uids)")
    only = set(args.only.split(",")) if args.only else None
    if only and only - set(KINDS):
        raise SystemExit(f"soak: unknown kinds {sorted(only - set(KINDS))}; kinds: {', '.join(KINDS)}")
    if args.requests < len(only or KINDS):
        raise SystemExit(f"soak: --requests must be at least {len(only or KINDS)} (one of each kind)")
    deadline_s = args.deadline or 120 + 0.2 * args.requests
    t_start = time.monotonic()
    deadline = t_start + deadline_s

    binary = args.binary or build(args.profile)
    binary = os.path.realpath(binary)
    workdir = f"/tmp/runcell-soak-{os.getpid()}"
    os.makedirs(workdir)
    tag = f"9{random.Random(os.getpid()).randrange(10**5, 10**6)}"
    mix = Mix(tag)

    # What the host looks like before.
    before_procs = processes()
    before_mounts = mounts()
    data_dir = "/var/lib/runcell"
    before_data = listing(data_dir)
    before_tmp = {d: top_entries(d) for d in ("/tmp", "/var/tmp", "/dev/shm")}

    key = secrets.token_hex(24)
    server = Server(binary, workdir, key, args.max_concurrent or args.concurrency, 4 * (args.max_concurrent or args.concurrency))
    SERVERS.append(server)
    print(f"soak: {args.requests} requests at concurrency {args.concurrency} to {binary} (pid {server.pid}) on port {server.port}, deadline {deadline_s:.0f} s, work dir {workdir}", flush=True)

    stats = Stats()
    samples = []  # (t, done, rss, hwm, fds, threads)
    stop_sampling = threading.Event()

    def sampler():
        while not stop_sampling.is_set():
            s = server.sample()
            if s["rss"]:
                samples.append((time.monotonic() - t_start, stats.done, s["rss"], s["hwm"], s["fds"], s["threads"]))
            stop_sampling.wait(1.0)

    threading.Thread(target=sampler, daemon=True).start()

    def progress():
        last = 0
        while not stop_sampling.wait(15):
            with stats.lock:
                done, wrong = stats.done, sum(stats.wrong.values())
            rss = samples[-1][2] / MIB if samples else 0
            rate = (done - last) / 15
            last = done
            print(f"soak: {done}/{args.requests} done, {wrong} wrong, {rate:.1f}/s, server RSS {rss:.1f} MiB", flush=True)

    threading.Thread(target=progress, daemon=True).start()

    kinds = schedule(args.requests, args.seed, only)
    n_warm = max(1, int(args.requests * args.warmup))
    t0 = time.monotonic()
    in_time = run_requests(server, mix, kinds[:n_warm], 0, stats, args.concurrency, deadline, args.seed)
    wait_idle(server)
    time.sleep(1)
    warm = server.sample()
    t_warm = time.monotonic() - t_start
    if in_time:
        in_time = run_requests(server, mix, kinds[n_warm:], n_warm, stats, args.concurrency, deadline, args.seed)
    wall = time.monotonic() - t0
    final_metrics = wait_idle(server)
    time.sleep(1)
    end = server.sample()
    _, metrics_text = server.get("/metrics")
    stop_sampling.set()

    failures = []
    if not in_time:
        failures.append(f"the deadline of {deadline_s:.0f} s passed with {args.requests - stats.done} requests unsent")
    total_wrong = sum(stats.wrong.values())
    if total_wrong:
        failures.append(f"{total_wrong} wrong answers")

    # --- the server's memory and descriptors ---------------------------------------------
    post = [s for s in samples if s[0] >= t_warm]
    q = max(1, len(post) // 4)
    first_q, last_q = [s[2] for s in post[:q]], [s[2] for s in post[-q:]]
    growth_idle = (end["rss"] - warm["rss"]) / MIB
    growth_trend = (median(last_q) - median(first_q)) / MIB if post else 0.0
    bound = args.rss_growth_mib
    if growth_idle > bound:
        failures.append(f"idle RSS grew by {growth_idle:.1f} MiB after warm-up (bound {bound} MiB)")
    if growth_trend > bound:
        failures.append(f"RSS under load grew by {growth_trend:.1f} MiB from the first to the last quarter after warm-up (bound {bound} MiB)")
    if end["fds"] > warm["fds"] + 4:
        failures.append(f"the server's open descriptors went from {warm['fds']} to {end['fds']} when idle")
    if final_metrics.get("runcell_sandboxes_running", 0) != 0:
        failures.append(f"sandboxes_running is {final_metrics.get('runcell_sandboxes_running')} when idle")

    # --- the server's own count of executions --------------------------------------------
    by_cat = executions_by_category(metrics_text)

    # --- clean stop ------------------------------------------------------------------------
    code = server.stop(60)
    if code != 0:
        failures.append(f"the server exited with {code} on SIGTERM")
    log = "".join(server.lines)
    for bad in ("panicked", "RUST_BACKTRACE"):
        if bad in log:
            failures.append(f"the server's log says {bad!r} (see {server.log_path})")
    log_warnings = [l for l in server.lines if " WARN " in l or " ERROR " in l]
    if log_warnings:
        failures.append(f"{len(log_warnings)} warnings or errors in the server's log, first: {log_warnings[0].strip()[:300]}")

    # --- the audit log: one line per execution, the category of the verdict ---------------
    audit = {}
    audit_lines = 0
    for line in open(server.audit_path):
        audit_lines += 1
        rec = json.loads(line)
        audit[rec.get("request_id")] = rec.get("category")
    audit_wrong = [(rid, want, audit.get(rid)) for rid, want in stats.audit_expect.items() if audit.get(rid) != want]
    if audit_wrong:
        failures.append(f"{len(audit_wrong)} audit lines missing or with another category, first: {audit_wrong[:3]}")
    # Exactly one line per execution: none lost, none run twice (a retried request).
    if audit_lines != len(stats.audit_expect) + stats.cancelled_expected:
        failures.append(f"{audit_lines} audit lines for {len(stats.audit_expect)} answered requests and {stats.cancelled_expected} hang-ups")
    cancelled = sum(1 for c in audit.values() if c == "cancelled")
    if cancelled != stats.cancelled_expected:
        failures.append(f"{cancelled} runs audited as cancelled, {stats.cancelled_expected} clients hung up")

    # --- leftovers -------------------------------------------------------------------------
    time.sleep(0.5)
    left = {}
    groups = groups_of(server.pid)
    if groups:
        left["cgroups"] = groups
    procs = leftover_processes(server.pid, binary, tag, before_procs)
    if procs:
        left["processes"] = procs
    new_mounts = sorted(mounts() - before_mounts)
    if new_mounts:
        left["mounts"] = new_mounts
    tmp_left = os.listdir(server.tmpdir)
    if tmp_left:
        left["server TMPDIR"] = tmp_left
    foreign_tmp = {}
    for d, before in before_tmp.items():
        for name, uid in top_entries(d).items():
            if name not in before and (uid in SANDBOX_UIDS or "runcell" in name) and not os.path.join(d, name).startswith(workdir):
                left.setdefault("temporary files", []).append(os.path.join(d, name))
            elif name not in before and os.path.join(d, name) != workdir:
                foreign_tmp.setdefault(d, []).append(name)
    after_data = listing(data_dir)
    if after_data != before_data:
        changed = sorted(set(after_data) ^ set(before_data)) + sorted(p for p in set(after_data) & set(before_data) if after_data[p] != before_data[p])
        left["data dir changes"] = changed[:10]
    for what, items in left.items():
        failures.append(f"left behind: {what}: {items[:10]}")

    # --- report ----------------------------------------------------------------------------
    all_lat = [x for xs in stats.latency.values() for x in xs]
    figures = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "commit": git_describe(),
        "binary": os.path.relpath(binary, REPO),
        "requests": stats.done,
        "concurrency": args.concurrency,
        "wall_seconds": round(wall, 1),
        "throughput_per_second": round(stats.done / wall, 2) if wall else 0,
        "correct": sum(stats.correct.values()),
        "starved": sum(stats.starved.values()),
        "wrong": total_wrong,
        "p50_seconds": round(median(all_lat), 3),
        "p99_seconds": round(percentile(all_lat, 0.99), 3),
        "rss_mib": {
            "start": round(samples[0][2] / MIB, 1) if samples else None,
            "after_warmup_idle": round(warm["rss"] / MIB, 1),
            "end_idle": round(end["rss"] / MIB, 1),
            "peak_hwm": round(max(s[3] for s in samples) / MIB, 1) if samples else None,
            "median_first_quarter": round(median(first_q) / MIB, 1) if post else None,
            "median_last_quarter": round(median(last_q) / MIB, 1) if post else None,
            "growth_idle": round(growth_idle, 1),
            "growth_trend": round(growth_trend, 1),
            # the RSS when each tenth of the requests had been answered
            "by_tenth": [round(next((s[2] for s in samples if s[1] >= stats.done * i // 10), samples[-1][2]) / MIB, 1) for i in range(1, 11)] if samples else [],
        },
        "fds": {"after_warmup_idle": warm["fds"], "end_idle": end["fds"]},
        "threads": {"after_warmup_idle": warm["threads"], "end_idle": end["threads"]},
        "audit_lines": audit_lines,
        "executions_by_category": dict(by_cat),
        "client_reconnects": stats.reconnects,
        "leftovers": left or "none",
        "kinds": {
            k: {
                "sent": stats.sent[k],
                "correct": stats.correct[k],
                "wrong": stats.wrong[k],
                "starved": stats.starved[k],
                "p50": round(median(stats.latency[k]), 3),
                "p99": round(percentile(stats.latency[k], 0.99), 3),
            }
            for k in KINDS
        },
    }
    print()
    print(f"{'kind':<24}{'lang':<8}{'sent':>6}{'correct':>9}{'wrong':>7}{'p50 s':>9}{'p99 s':>9}")
    for k in KINDS:
        f = figures["kinds"][k]
        if not f["sent"]:
            continue
        print(f"{k:<24}{KINDS[k][1]:<8}{f['sent']:>6}{f['correct']:>9}{f['wrong']:>7}{f['p50']:>9.3f}{f['p99']:>9.3f}")
    print(f"{'all':<32}{stats.done:>6}{figures['correct']:>9}{total_wrong:>7}{figures['p50_seconds']:>9.3f}{figures['p99_seconds']:>9.3f}")
    if stats.starved:
        print(f"correct but starved (a timeout before the program printed its first line, the host too loaded to start it): {dict(stats.starved)}")
    print()
    r = figures["rss_mib"]
    print(f"requests {stats.done} in {wall:.1f} s at concurrency {args.concurrency}: {figures['throughput_per_second']} requests/s ({figures['binary']}, {figures['commit']})")
    print(f"server RSS: start {r['start']} MiB, after warm-up {r['after_warmup_idle']} MiB (idle), end {r['end_idle']} MiB (idle), peak {r['peak_hwm']} MiB; "
          f"median under load {r['median_first_quarter']} -> {r['median_last_quarter']} MiB (first -> last quarter after warm-up); "
          f"at each tenth of the requests: {r['by_tenth']} MiB")
    print(f"server fds {warm['fds']} -> {end['fds']}, threads {warm['threads']} -> {end['threads']} (idle, after warm-up -> end); client reconnects {stats.reconnects}; audit lines {audit_lines}; executions by category {dict(sorted(by_cat.items()))}")
    print(f"leftovers: {left or 'none'} (processes, cgroups of pid {server.pid}, mounts, temporary files, data dir)")
    if foreign_tmp:
        print(f"note: new entries in shared temporary directories, not the soak's (other users of this host): { {d: v[:5] for d, v in foreign_tmp.items()} }")
    for kind, problems, detail in stats.wrong_examples:
        print(f"\nWRONG {kind}: {'; '.join(problems)}\n{detail}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    total = time.monotonic() - t_start
    if failures:
        print(f"\nsoak: FAILED after {total:.0f} s:")
        for f in failures:
            print(f"  - {f}")
        print(f"(server log and audit log kept in {workdir})")
        return 1
    print(f"\nsoak: OK in {total:.0f} s")
    subprocess.run(["rm", "-rf", workdir])
    return 0


# The server of a soak that ends early (past its deadline, interrupted, a bug of the soak's
# own): stopped on the way out, so that it does not outlive the soak.
SERVERS = []


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        for s in SERVERS:
            if s.proc.poll() is None:
                print(f"soak: stopping the server (pid {s.pid})", file=sys.stderr)
                s.stop(30)
