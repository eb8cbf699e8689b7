#!/usr/bin/env python3
"""Run the documentation's examples against a live `runcell serve`, and fail when one fails.

Which blocks run (README.md, SECURITY.md and docs/**/*.md, except docs/reference/):
- A fenced block whose info string is `sh`, `bash` or `shell` runs with `bash -euo pipefail`;
  one tagged `python` runs with a Python interpreter chosen by its imports (`e2b` or
  `e2b_code_interpreter`: target/e2b-venv; `mcp`: target/mcp-venv; `openai` or `anthropic`:
  target/agent-venv; `k8s_agent_sandbox`: target/agent-sandbox-venv; else /usr/bin/python3;
  the venvs are scripts/test.sh's). Each block is its own process, killed with its process
  group after 120 s (a failure). The blocks of one file share a fresh working directory, in
  order, so that one may use a file an earlier one wrote; variables do not carry over.
- `json` blocks must parse as JSON, unless they contain `...`. No other block runs.
- `<!-- not-run: REASON -->` on the line before a runnable block (blank lines between are
  allowed) skips it; the reason is printed and must not be empty.
  `<!-- expect-fail -->` there says the block shows a failure on purpose: it must exit non-zero
  or get an HTTP error (>= 400) from curl, and fails if it does neither. A marker anywhere else
  (before a block that would not run, or before no block) is an error; `not-run` may also
  spare a `json` block its check.

Links: every relative link of those pages (and of CHANGELOG.md and docs/reference/README.md)
must lead to a file that exists and, with `#anchor` into a Markdown page, to one of its
headings (GitHub's anchors); links with a scheme (https:, mailto:) are not followed.

What a block sees: `runcell serve` (this script starts it, with an API key, an admin key and an
agent upstream that is a scripted OpenAI-compatible model in this process) reachable at
`localhost:8080`: `localhost:8080` and `127.0.0.1:8080` in the block's text are rewritten to
the server's own port. `PATH` starts with a `curl` that fails (exit 22, the status on stderr)
on an HTTP status >= 400 unless the block is expect-fail, and (exit 26) on a file to upload
(`-d @FILE`, `--data-binary @FILE`, `-F name=@FILE`, `-T FILE`) that is not there, where curl
itself would send an empty body; then the runcell binary's directory. Environment: RUNCELL_API_KEY (`e2b_` + 40 hex, so E2B SDKs take it), ADMIN_KEY,
RUNCELL_URL, E2B_API_URL and E2B_SANDBOX_URL (RUNCELL_URL/e2b), E2B_API_KEY and
OPENAI_API_KEY (the API key), and RUNCELL_AGENT_UPSTREAM, _BASE_URL, _API_KEY and _MODEL
(the scripted model, for `runcell agent`); LANG=C.UTF-8, TMPDIR (the runner's), and of the
caller's environment only PATH (after the two directories above), HOME, USER and LOGNAME.

Usage: scripts/docs-examples.py [--runcell PATH] [--file PATH]... [--list] [--self-test]
Python 3.11 standard library only.
"""

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHELL_LANGS = {"sh", "bash", "shell"}
BLOCK_TIMEOUT = 120.0
# The venv a Python block runs in, by the top-level modules it imports (first match wins).
VENVS = [
    ({"e2b", "e2b_code_interpreter"}, "target/e2b-venv"),
    ({"mcp"}, "target/mcp-venv"),
    ({"openai", "anthropic"}, "target/agent-venv"),
    ({"k8s_agent_sandbox"}, "target/agent-sandbox-venv"),
]
MARKER = re.compile(r"^\s*<!--\s*(not-run|expect-fail)\b(.*?)-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^`\s]*)[^`]*$")
PORT_8080 = re.compile(r"\b(localhost|127\.0\.0\.1):8080\b")


@dataclass
class Block:
    file: str  # relative to the documentation's root
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    marker: str | None = None  # "not-run" or "expect-fail"
    reason: str = ""

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def runnable(self) -> bool:
        return self.lang in SHELL_LANGS or self.lang == "python"

    def decision(self) -> str:
        if self.marker == "not-run":
            return f"not run: {self.reason}"
        if self.runnable:
            return "run, expecting a failure" if self.marker == "expect-fail" else "run"
        if self.lang == "json":
            return "skipped (contains ...)" if "..." in self.text else "checked as JSON"
        return "not runnable"


@dataclass
class Outcome:
    block: Block
    status: str  # "ok", "fail", "not-run", "checked", "skipped"
    seconds: float = 0.0
    detail: str = ""
    output: str = ""


def parse(path: Path, rel: str) -> tuple[list[Block], list[str]]:
    """The fenced blocks of a Markdown file, with their markers, and the markers' errors."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, errors = [], []
    pending: list[tuple[int, str, str]] = []  # markers waiting for their block
    i = 0
    while i < len(lines):
        line = lines[i]
        m = MARKER.match(line)
        if m:
            kind, rest = m.group(1), m.group(2).strip()
            if kind == "not-run":
                reason = rest[1:].strip() if rest.startswith(":") else ""
                if not reason:
                    errors.append(f"{rel}:{i + 1}: not-run needs a reason: <!-- not-run: REASON -->")
                pending.append((i + 1, kind, reason))
            elif rest:
                errors.append(f"{rel}:{i + 1}: expect-fail takes nothing after it: {line.strip()}")
                pending.append((i + 1, kind, ""))
            else:
                pending.append((i + 1, kind, ""))
            i += 1
            continue
        f = FENCE.match(line)
        if not f:
            if line.strip() and pending:
                for n, kind, _ in pending:
                    errors.append(f"{rel}:{n}: {kind} is not directly before a code block")
                pending = []
            i += 1
            continue
        indent, fence, lang = len(f.group(1)), f.group(2), f.group(3).lower()
        body, j = [], i + 1
        while j < len(lines):
            close = lines[j].strip()
            if close.startswith(fence[0]) and set(close) == {fence[0]} and len(close) >= len(fence):
                break
            # Content of a fence indented in a list loses that indentation (CommonMark).
            body.append(re.sub(rf"^ {{0,{indent}}}", "", lines[j]))
            j += 1
        block = Block(rel, i + 1, lang, "\n".join(body) + "\n")
        if len(pending) > 1:
            errors.append(f"{block.where}: more than one marker before this block")
        if pending:
            _, block.marker, block.reason = pending[-1]
            if not block.runnable and not (block.lang == "json" and block.marker == "not-run"):
                errors.append(
                    f"{block.where}: {block.marker} before a `{lang or '(no info string)'}` block, "
                    "which does not run"
                )
        pending = []
        blocks.append(block)
        i = j + 1
    for n, kind, _ in pending:
        errors.append(f"{rel}:{n}: {kind} is not directly before a code block")
    return blocks, errors


def doc_files(root: Path) -> list[Path]:
    files = [root / "README.md", root / "SECURITY.md"]
    docs = root / "docs"
    if docs.is_dir():
        files += sorted(
            p for p in docs.rglob("*.md") if (docs / "reference") not in p.parents
        )
    return [p for p in files if p.is_file()]


# --- links ----------------------------------------------------------------------------------

LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, links and code marks dropped, punctuation
    removed, spaces made hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    text = text.lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
            continue
        m = None if fence else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def link_errors(root: Path, files: list[Path]) -> list[str]:
    """Every relative link of the pages leads to a file that exists and, with `#anchor`, to a
    heading of it (GitHub's anchors); links to the web are not followed."""
    errors = []
    cache: dict[Path, set[str]] = {}
    for path in files:
        rel = path.relative_to(root) if path.is_relative_to(root) else path
        fence = False
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.startswith("```"):
                fence = not fence
                continue
            if fence:
                continue
            for m in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
                target = m.group(1) or m.group(2)
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                    continue
                file_part, _, anchor = target.partition("#")
                dest = (path.parent / file_part).resolve() if file_part else path
                if not dest.exists():
                    errors.append(f"{rel}:{n}: the link {target!r} leads to no file")
                    continue
                if anchor and dest.suffix == ".md":
                    known = cache.setdefault(dest, anchors(dest))
                    if anchor not in known:
                        errors.append(f"{rel}:{n}: the link {target!r} names no heading of {dest.name}")
    return errors


# --- the scripted model -------------------------------------------------------------------

# What the model computes of numbers in a question, by the words it uses (first match wins).
STATISTICS = [
    (("standard deviation", "stdev"), "statistics.stdev"),
    (("median",), "statistics.median"),
    (("variance",), "statistics.variance"),
    (("mean", "average"), "statistics.mean"),
]
OTHER_TOOLS = {
    "code_exec_bash": "echo 42",
    "code_exec_node": "console.log(42)",
    "code_exec_ruby": "puts 42",
    "code_exec_go": 'package main\n\nimport "fmt"\n\nfunc main() { fmt.Println(42) }\n',
}


def model_program(question: str, tool: str) -> str:
    """A program for the tool that computes something of the question: a statistic (the sum
    unless it names one) of the numbers in its first [...] list, or of all its numbers when
    it has several, else 6 * 7."""
    if tool != "code_exec_python":
        return OTHER_TOOLS.get(tool, "print(42)")
    m = re.search(r"\[([^\]]*)\]", question)
    numbers = re.findall(r"-?\d+(?:\.\d+)?", m.group(1) if m else question)
    data = numbers if m or len(numbers) > 1 else []
    if not data:
        return "print(6 * 7)"
    q = question.lower()
    fn = next((f for words, f in STATISTICS if any(w in q for w in words)), "math.fsum")
    return f"import math, statistics\ndata = [{', '.join(data)}]\nprint(round({fn}(data), 2))\n"


def tool_stdout(text: str) -> str:
    m = re.search(r"--- stdout ---\n(.*?)(?:\n--- |\Z)", text, re.S)
    return (m.group(1) if m else text).strip()


class FakeModel(ThreadingHTTPServer):
    """An OpenAI Chat Completions (POST .../chat/completions) and Anthropic Messages
    (POST .../v1/messages) model that calls the first code tool it is offered once, with a
    program computed from the user's question, and then answers with what that printed."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), FakeModelHandler)
        self.calls = 0
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class FakeModelHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        self.server.calls += 1
        n = self.server.calls
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
            if self.path.endswith("/chat/completions"):
                return self.reply(200, self.openai(body, n))
            if self.path.endswith("/v1/messages"):
                return self.reply(200, self.anthropic(body, n))
            return self.reply(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
        except (ValueError, KeyError, TypeError, IndexError) as e:
            return self.reply(400, {"error": {"message": f"{type(e).__name__}: {e}", "type": "invalid_request_error"}})

    @staticmethod
    def pick_tool(names):
        code = [t for t in names if t.startswith("code_exec_")]
        return "code_exec_python" if "code_exec_python" in code else (code[0] if code else None)

    @staticmethod
    def text_of(content) -> str:
        if isinstance(content, str):
            return content
        return " ".join(b.get("text", "") for b in content or [] if isinstance(b, dict))

    def openai(self, body, n):
        msgs = body["messages"]
        last = msgs[-1]
        tool = self.pick_tool([t["function"]["name"] for t in body.get("tools") or []])
        message = {"role": "assistant", "content": None}
        if last["role"] == "tool":
            message["content"] = f"The result is {tool_stdout(self.text_of(last['content']))}."
        elif tool:
            question = next((self.text_of(m["content"]) for m in reversed(msgs) if m["role"] == "user"), "")
            message["tool_calls"] = [{"id": f"call_{n}", "type": "function", "function": {
                "name": tool, "arguments": json.dumps({"code": model_program(question, tool)})}}]
        else:
            message["content"] = "There is no tool to compute this with."
        return {"id": f"chatcmpl-{n}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", "fake-model"),
                "choices": [{"index": 0, "message": message, "logprobs": None,
                             "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}

    def anthropic(self, body, n):
        msgs = body["messages"]
        last = msgs[-1]
        tool = self.pick_tool([t["name"] for t in body.get("tools") or []])
        results = [b for b in last["content"] if isinstance(b, dict) and b.get("type") == "tool_result"] \
            if isinstance(last["content"], list) else []
        if results:
            content = [{"type": "text", "text": f"The result is {tool_stdout(self.text_of(results[0]['content']))}."}]
        elif tool:
            question = self.text_of(last["content"])
            content = [{"type": "tool_use", "id": f"toolu_{n}", "name": tool,
                        "input": {"code": model_program(question, tool)}}]
        else:
            content = [{"type": "text", "text": "There is no tool to compute this with."}]
        return {"id": f"msg_{n}", "type": "message", "role": "assistant",
                "model": body.get("model", "fake-model"), "content": content,
                "stop_reason": "tool_use" if content[0]["type"] == "tool_use" else "end_turn",
                "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 5}}


# --- the environment the blocks run in ------------------------------------------------------

CURL_WRAPPER = r"""#!/bin/bash
# curl for the documentation's examples (scripts/docs-examples.py): the real curl with every
# argument as given, plus -D to a file of our own; an HTTP status >= 400 makes it exit 22
# (unless the block expects a failure), with the status on stderr. The body passes through.
# curl sends an empty body, with only a warning, for a file to upload that is not there.
prev=
for a in "$@"; do
  f=
  case "$prev" in
    -d|--data|--data-binary|--data-urlencode|--json) [[ $a == @* ]] && f=${a#@} ;;
    -F|--form) [[ $a == *=@* ]] && { f=${a#*=@}; f=${f%%;*}; } ;;
    -T|--upload-file) f=$a ;;
  esac
  if [ -n "$f" ] && [ "$f" != - ] && [ ! -r "$f" ]; then
    echo "curl: $f: no such file to upload (the example must create it first)" >&2
    exit 26
  fi
  prev=$a
done
hdr=$(mktemp "${TMPDIR:-/tmp}/docs-curl.XXXXXX")
trap 'rm -f "$hdr"' EXIT
rc=0
REAL_CURL -D "$hdr" "$@" || rc=$?
status=$(grep -aoE '^HTTP/[0-9.]+ [0-9]{3}' "$hdr" | awk '$2 >= 400 { print $2 }' | tail -1)
if [ -n "$status" ]; then
  echo "$status $*" >> "$RUNCELL_DOCS_HTTP_ERRORS"
  if [ "${RUNCELL_DOCS_EXPECT_FAIL:-}" != 1 ]; then
    printf '\ncurl: HTTP %s (an HTTP error fails a documentation example; mark it <!-- expect-fail -->)\n' "$status" >&2
    [ "$rc" -ne 0 ] || rc=22
  fi
fi
exit "$rc"
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_group(proc: subprocess.Popen):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Harness:
    """The server, the scripted model, the curl wrapper and the environment of the blocks."""

    def __init__(self, runcell: Path, root: Path, timeout: float):
        self.runcell, self.root, self.timeout = runcell, root, timeout
        self.tmp = Path(tempfile.mkdtemp(prefix="docs-examples."))
        self.server: subprocess.Popen | None = None
        self.running: subprocess.Popen | None = None
        self.model: FakeModel | None = None
        self.log_path = self.tmp / "serve.log"

    def start(self):
        real_curl = shutil.which("curl")
        if not real_curl:
            raise SystemExit("docs-examples: curl is not installed")
        bin_dir = self.tmp / "bin"
        bin_dir.mkdir()
        wrapper = bin_dir / "curl"
        wrapper.write_text(CURL_WRAPPER.replace("REAL_CURL", real_curl))
        wrapper.chmod(0o755)
        self.model = FakeModel()
        self.port = free_port()
        url = f"http://127.0.0.1:{self.port}"
        key, admin = "e2b_" + secrets.token_hex(20), "admin_" + secrets.token_hex(20)
        base = {k: v for k, v in os.environ.items() if k in ("HOME", "USER", "LOGNAME")}
        base["PATH"] = os.pathsep.join([str(bin_dir), str(self.runcell.parent), os.environ.get("PATH", "/usr/bin:/bin")])
        base["LANG"] = "C.UTF-8"
        agent = {"RUNCELL_AGENT_UPSTREAM": "openai", "RUNCELL_AGENT_BASE_URL": self.model.base_url,
                 "RUNCELL_AGENT_API_KEY": "sk-docs-examples-" + secrets.token_hex(8),
                 "RUNCELL_AGENT_MODEL": "docs-examples-model"}
        self.env = base | agent | {
            "RUNCELL_API_KEY": key, "ADMIN_KEY": admin, "RUNCELL_URL": url,
            "E2B_API_URL": f"{url}/e2b", "E2B_SANDBOX_URL": f"{url}/e2b", "E2B_API_KEY": key,
            "OPENAI_API_KEY": key,
        }
        server_env = base | agent
        with open(self.log_path, "wb") as log:
            self.server = subprocess.Popen(
                [str(self.runcell), "serve", "--listen", f"127.0.0.1:{self.port}",
                 "--api-key", key, "--admin-key", admin],
                env=server_env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while True:
            if self.server.poll() is not None:
                raise SystemExit(f"docs-examples: runcell serve exited ({self.server.returncode}):\n{self.server_log()}")
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"docs-examples: runcell serve did not answer /healthz in 60 s:\n{self.server_log()}")
            time.sleep(0.1)

    def server_log(self, start: int = 0) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(start)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self):
        if self.running:
            kill_group(self.running)
        if self.server and self.server.poll() is None:
            self.server.send_signal(signal.SIGTERM)
            try:
                self.server.wait(15)
            except subprocess.TimeoutExpired:
                kill_group(self.server)
                self.server.wait()
        if self.model:
            self.model.shutdown()
            self.model.server_close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def interpreter(self, block: Block) -> Path | str:
        modules = set(re.findall(r"^\s*(?:from|import)\s+([A-Za-z_]\w*)", block.text, re.M))
        for names, venv in VENVS:
            if modules & names:
                return self.root / venv / "bin" / "python"
        return "/usr/bin/python3"

    def run(self, block: Block, cwd: Path) -> Outcome:
        if block.marker == "not-run":
            return Outcome(block, "not-run", detail=block.reason)
        if block.lang == "json":
            if "..." in block.text:
                return Outcome(block, "skipped")
            try:
                json.loads(block.text)
                return Outcome(block, "checked")
            except ValueError as e:
                return Outcome(block, "fail", detail=f"not JSON: {e}", output=block.text)
        if not block.runnable:
            return Outcome(block, "skipped")
        text = PORT_8080.sub(lambda m: f"{m.group(1)}:{self.port}", block.text)
        script = self.tmp / "blocks" / f"{block.file.replace('/', '_')}-{block.line}"
        script.parent.mkdir(exist_ok=True)
        script.write_text(text)
        if block.lang == "python":
            interp = self.interpreter(block)
            if not Path(interp).exists():
                return Outcome(block, "fail", detail=f"{interp} is missing (scripts/test.sh installs it)")
            argv = [str(interp), "-u", str(script)]
        else:
            argv = ["bash", "-euo", "pipefail", str(script)]
        http_errors = self.tmp / "http-errors"
        http_errors.write_text("")
        env = self.env | {"TMPDIR": str(self.tmp), "RUNCELL_DOCS_HTTP_ERRORS": str(http_errors)}
        if block.marker == "expect-fail":
            env["RUNCELL_DOCS_EXPECT_FAIL"] = "1"
        log_start = self.log_path.stat().st_size
        start = time.monotonic()
        self.running = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
        timed_out = False
        try:
            out, _ = self.running.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_group(self.running)
            out, _ = self.running.communicate()
        # Whatever the block left running in its group (a server, a sleep) ends with it.
        kill_group(self.running)
        rc, self.running = self.running.returncode, None
        seconds = time.monotonic() - start
        output = out.decode("utf-8", "replace")
        errors = http_errors.read_text().split("\n")
        errors = [e for e in errors if e]
        if timed_out:
            status, detail = "fail", f"killed after {self.timeout:.0f} s"
        elif block.marker == "expect-fail":
            failed = rc != 0 or errors
            status = "ok" if failed else "fail"
            detail = "" if failed else "expected a failure (a non-zero exit or an HTTP error), but it succeeded"
        else:
            status = "ok" if rc == 0 else "fail"
            detail = "" if rc == 0 else f"exit code {rc}"
        o = Outcome(block, status, seconds, detail, output)
        if status == "fail":
            log = self.server_log(log_start).strip().splitlines()
            if log:
                o.output += "\n--- runcell serve's log meanwhile (last 20 lines) ---\n" + "\n".join(log[-20:]) + "\n"
        return o


def report(o: Outcome, verbose_ok: bool = True) -> str:
    b = o.block
    if o.status == "ok":
        return f"ok {b.where} ({b.lang}{', expect-fail' if b.marker else ''}, {o.seconds:.1f}s)"
    if o.status == "checked":
        return f"ok {b.where} (json, parsed)"
    if o.status == "not-run":
        return f"not run {b.where}: {o.detail}"
    if o.status == "skipped":
        return ""
    out = o.output if len(o.output) <= 8000 else o.output[:3000] + "\n[...]\n" + o.output[-4000:]
    return (
        f"FAIL {b.where} ({b.lang}, {o.seconds:.1f}s): {o.detail}\n"
        f"--- block ---\n{textwrap.indent(b.text.rstrip(), '  ')}\n"
        f"--- output ---\n{textwrap.indent(out.rstrip(), '  ') or '  (none)'}\n"
    )


def run_files(harness: Harness, root: Path, files: list[Path], quiet: bool = False) -> tuple[list[Outcome], list[str]]:
    outcomes, errors = [], []
    for path in files:
        rel = str(path.resolve().relative_to(root)) if path.resolve().is_relative_to(root) else str(path)
        blocks, errs = parse(path, rel)
        errors += errs
        cwd = Path(tempfile.mkdtemp(prefix="file.", dir=harness.tmp))
        for block in blocks:
            o = harness.run(block, cwd)
            outcomes.append(o)
            line = report(o)
            if line and not quiet:
                print(line, flush=True)
    return outcomes, errors


def summary(outcomes: list[Outcome], errors: list[str]) -> tuple[str, bool]:
    count = lambda *s: sum(o.status in s for o in outcomes)  # noqa: E731
    ran, failed = count("ok", "fail"), count("fail")
    line = (f"docs-examples: {ran} run, {count('not-run')} not run, {failed} failed"
            f" ({count('checked')} json blocks parsed"
            f"{f', {len(errors)} marker errors' if errors else ''})")
    return line, failed == 0 and not errors


# --- the self-test --------------------------------------------------------------------------

SELF_TEST_DOC = """\
# A synthetic page

```sh
echo passes > shared.txt
```

```bash
test -f shared.txt   # the same file's blocks share a directory
false
```

<!-- not-run: it needs the internet -->

```sh
exit 1
```

<!-- expect-fail -->
```sh
echo failing on purpose; exit 3
```

```sh
curl -s localhost:8080/no-such-route -H "X-API-Key: $RUNCELL_API_KEY"
```

<!-- expect-fail -->
```sh
curl -s localhost:8080/no-such-route -H "X-API-Key: $RUNCELL_API_KEY"
```

<!-- expect-fail -->
```sh
true
```

```sh
curl -s localhost:8080/healthz | grep -q '"status":"ok"'
curl -s 127.0.0.1:8080/v1/execute -H "X-API-Key: $RUNCELL_API_KEY" \\
  -d '{"language": "python", "code": "print(6*7)"}' | jq -e '.stdout == "42\\n"'
```

```python
import json, os, urllib.request
req = urllib.request.Request("http://localhost:8080/v1/agents", headers={"X-API-Key": os.environ["RUNCELL_API_KEY"]},
    data=json.dumps({"messages": [{"role": "user", "content": "the median of [1, 5, 9]"}],
                     "tools": [{"type": "runcell_tool", "name": "code_exec_python"}]}).encode())
answer = json.load(urllib.request.urlopen(req))["choices"][0]["message"]["content"]
assert "5" in answer, answer
```

```sh
curl -s -o health.json localhost:8080/healthz && jq -e '.status == "ok"' health.json
! curl -s localhost:8080/v1/execute --data-binary @missing.json 2>err.txt
grep -q 'no such file to upload' err.txt
curl -s localhost:8080/v1/execute -H "X-API-Key: $RUNCELL_API_KEY" \\
  -d '{"language": "bash", "code": "echo a@b"}' | jq -e '.stdout == "a@b\\n"'
printf 'print(1)' > one.py
jq -Rs '{language: "python", code: .}' one.py > body.json
curl -sN localhost:8080/v1/execute -H "X-API-Key: $RUNCELL_API_KEY" -H 'Accept: text/event-stream' \\
  --data-binary @body.json | grep -qx 'event: result'
```

```sh
sleep 300 &
echo "$!" > sleeper.pid
sleep 300
```

```sh
# the timed-out block's group was killed (gone, or a zombie where pid 1 does not reap)
! ps -o stat= -p "$(cat sleeper.pid)" | grep -qv Z
```

```json
{"a": 1}
```

```json
{"a": 1,}
```

```json
{"a": ...}
```

```text
not run
```
"""
# The outcome of each block of SELF_TEST_DOC, in order.
SELF_TEST_EXPECT = [
    "ok", "fail", "not-run", "ok", "fail", "ok", "fail", "ok",
    "ok", "ok", "fail", "ok", "checked", "fail", "skipped", "skipped",
]
CURL_404, HANGS = 4, 10  # indices in it
SELF_TEST_BAD_MARKERS = """\
<!-- not-run: -->
```sh
true
```

<!-- expect-fail -->
```text
x
```

<!-- not-run: a marker without its block -->
Some prose.
"""


def fake_model_problems() -> list[str]:
    """The scripted model's two turns in both wire formats (the server uses the OpenAI one)."""
    model, problems = FakeModel(), []

    def post(path, body):
        req = urllib.request.Request(model.base_url.removesuffix("/v1") + path, json.dumps(body).encode(),
                                     {"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.load(r)

    question = "the median of [1, 5, 9]"
    result = "exit code 0, 0.010 s\n--- stdout ---\n5\n"
    try:
        tools = [{"type": "function", "function": {"name": "code_exec_python", "parameters": {}}}]
        first = post("/v1/chat/completions", {"model": "m", "tools": tools,
                                              "messages": [{"role": "user", "content": question}]})
        call = first["choices"][0]["message"]["tool_calls"][0]
        if "statistics.median(data)" not in json.loads(call["function"]["arguments"])["code"]:
            problems.append(f"openai tool call: {call}")
        second = post("/v1/chat/completions", {"model": "m", "tools": tools, "messages": [
            {"role": "user", "content": question}, first["choices"][0]["message"],
            {"role": "tool", "tool_call_id": call["id"], "content": result}]})
        if second["choices"][0]["message"]["content"] != "The result is 5.":
            problems.append(f"openai answer: {second}")
        tools = [{"name": "code_exec_python", "input_schema": {"type": "object"}}]
        first = post("/v1/messages", {"model": "m", "max_tokens": 100, "tools": tools,
                                      "messages": [{"role": "user", "content": question}]})
        use = first["content"][0]
        if first["stop_reason"] != "tool_use" or "statistics.median" not in use["input"]["code"]:
            problems.append(f"anthropic tool use: {first}")
        second = post("/v1/messages", {"model": "m", "max_tokens": 100, "tools": tools, "messages": [
            {"role": "user", "content": question}, {"role": "assistant", "content": first["content"]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": result}]}]})
        if second["content"] != [{"type": "text", "text": "The result is 5."}]:
            problems.append(f"anthropic answer: {second}")
    except (OSError, KeyError, IndexError, ValueError) as e:
        problems.append(f"the scripted model: {type(e).__name__}: {e}")
    finally:
        model.shutdown()
        model.server_close()
    return problems


def self_test(runcell: Path) -> int:
    with tempfile.TemporaryDirectory(prefix="docs-examples-self-test.") as d:
        root = Path(d)
        (root / "docs").mkdir()
        (root / "docs" / "page.md").write_text(SELF_TEST_DOC)
        (root / "docs" / "markers.md").write_text(SELF_TEST_BAD_MARKERS)
        (root / "docs" / "reference").mkdir()
        (root / "docs" / "reference" / "skip.md").write_text("```sh\nfalse\n```\n")
        problems = []
        found = [str(p.relative_to(root)) for p in doc_files(root)]
        if found != ["docs/markers.md", "docs/page.md"]:
            problems.append(f"files found: {found}")
        _, errors = parse(root / "docs" / "markers.md", "docs/markers.md")
        want = ["docs/markers.md:1: not-run needs a reason", "docs/markers.md:7: expect-fail before a `text` block",
                "docs/markers.md:11: not-run is not directly before"]
        if len(errors) != len(want) or not all(e.startswith(w) for e, w in zip(errors, want)):
            problems.append(f"marker errors: {errors}")
        (root / "docs" / "links.md").write_text(
            "# Links: here\n\n## Twice\n\n## Twice\n\n"
            "[ok](#links-here) [ok](page.md) [ok](#twice-1) [web](https://example.com/x#y)\n"
            "[no file](missing.md) [no heading](links.md#nowhere) `[in code](nothing.md)`\n"
            "![image](gone.png)\n```text\n[in a fence](nothing.md)\n```\n")
        got_links = link_errors(root, [root / "docs" / "links.md"])
        want_links = ["docs/links.md:8: the link 'missing.md' leads to no file",
                      "docs/links.md:8: the link 'links.md#nowhere' names no heading of links.md",
                      "docs/links.md:9: the link 'gone.png' leads to no file"]
        if got_links != want_links:
            problems.append(f"link errors: {got_links}, expected {want_links}")
        (root / "docs" / "links.md").unlink()
        problems += fake_model_problems()
        harness = Harness(runcell, root, timeout=5)
        try:
            harness.start()
            outcomes, _ = run_files(harness, root, [root / "docs" / "page.md"], quiet=True)
        finally:
            harness.stop()
        got = [o.status for o in outcomes]
        if got != SELF_TEST_EXPECT:
            wrong = [f"line {o.block.line}: {o.status}, expected {w}\n{report(o)}"
                     for o, w in zip(outcomes, SELF_TEST_EXPECT) if o.status != w]
            problems.append(f"decisions: {got}, expected {SELF_TEST_EXPECT}\n" + "\n".join(wrong))
        elif "curl: HTTP 404" not in outcomes[CURL_404].output:
            problems.append(f"the curl 404 failed without saying so: {outcomes[CURL_404].output!r}")
        elif "killed after 5 s" not in outcomes[HANGS].detail:
            problems.append(f"the hanging block: {outcomes[HANGS].detail!r}")
    if problems:
        print("docs-examples self-test FAILED:\n  " + "\n  ".join(problems))
        return 1
    print(f"docs-examples self-test: ok ({len(SELF_TEST_EXPECT)} blocks, 3 marker errors and 3 broken "
          "links as expected, the scripted model in both wire formats)")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runcell", type=Path, default=ROOT / "target/debug/runcell",
                   help="the binary to serve and put on PATH (default target/debug/runcell, built if missing)")
    p.add_argument("--file", type=Path, action="append", help="check only this Markdown file (repeatable)")
    p.add_argument("--list", action="store_true", help="list the blocks and what would be done with each")
    p.add_argument("--self-test", action="store_true", help="check the runner on synthetic pages")
    p.add_argument("--timeout", type=float, default=BLOCK_TIMEOUT, help="seconds per block (default 120)")
    a = p.parse_args()
    files = a.file or doc_files(ROOT)
    if a.list:
        errors = []
        for path in files:
            rel = str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path)
            blocks, errs = parse(path, rel)
            errors += errs
            for b in blocks:
                print(f"{b.where} {b.lang or '(none)'}: {b.decision()}")
        for e in errors:
            print(f"error: {e}")
        return 1 if errors else 0
    runcell = a.runcell.resolve()
    if not runcell.exists():
        if runcell != (ROOT / "target/debug/runcell").resolve():
            raise SystemExit(f"docs-examples: {runcell} does not exist")
        print("docs-examples: building target/debug/runcell", flush=True)
        subprocess.run(["cargo", "build", "-q", "-p", "runcell"], cwd=ROOT, check=True)
    # Ctrl-C and SIGTERM unwind through the `finally`s below: the block's group and the
    # server are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if a.self_test:
        return self_test(runcell)
    started = time.monotonic()
    link_files = files + [f for f in (ROOT / "CHANGELOG.md", ROOT / "docs/reference/README.md")
                          if not a.file and f.is_file()]
    broken = link_errors(ROOT, link_files)
    for e in broken:
        print(f"FAIL {e}")
    print(f"docs-examples: {len(link_files)} pages' links checked, {len(broken)} broken", flush=True)
    harness = Harness(runcell, ROOT, a.timeout)
    try:
        harness.start()
        outcomes, errors = run_files(harness, ROOT, files)
    finally:
        harness.stop()
    for e in errors:
        print(f"FAIL {e}")
    line, ok = summary(outcomes, errors)
    print(f"{line} in {time.monotonic() - started:.0f}s")
    failed = [o.block.where for o in outcomes if o.status == "fail"]
    if failed:
        print("failed: " + " ".join(failed))
    return 0 if ok and not broken else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("docs-examples: interrupted", file=sys.stderr)
        sys.exit(130)
