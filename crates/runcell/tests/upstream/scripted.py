"""A scripted model API for the agent loop's tests: it speaks Anthropic Messages
(POST /v1/messages) or OpenAI Chat Completions (POST /chat/completions under any prefix),
replays scripted turns one request at a time, and checks both directions against the
official SDKs:

- each answer it builds is validated with the SDK's response type
  (anthropic.types.Message, openai.types.chat.ChatCompletion), so the tests talk to the
  real formats, not to what runcell's parser happens to accept;
- each request runcell sends is validated with the SDK's request parameter type
  (MessageCreateParamsNonStreaming, CompletionCreateParamsNonStreaming) and with the rules
  the APIs enforce that types cannot say (alternating roles, every tool result answering
  a tool call of the turn before it). A request that breaks them gets a 400 and is
  recorded as invalid, so the test sees it.

Usage: scripted.py --wire anthropic|openai --script steps.json --record requests.jsonl
It prints "listening on http://127.0.0.1:PORT" once ready, and serves until killed.

A step of the script is one of:
  {"text": "...", "code": "...", "tool": "code_exec_python", "usage": [in, out]}
      an answer: text, a tool call (when code is given), or both; "arguments": {...} gives
      the tool call's whole input instead of {"code": code}
  {"status": 429, "retry_after": 0, "times": 1}   an error answer in the vendor's shape
  {"raw": "not json"}                             a 200 whose body is this text
  {"json": {...}}                                 a 200 with this body, unchecked
  {"hang": true}                                  never answers
"times" repeats a step. When the script runs out, the answer is a 500 "script exhausted".
"""

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pydantic

import anthropic.types
import anthropic.types.message_create_params as anthropic_params
import openai.types.chat
import openai.types.chat.completion_create_params as openai_params

ANTHROPIC_REQUEST = pydantic.TypeAdapter(anthropic_params.MessageCreateParamsNonStreaming)
OPENAI_REQUEST = pydantic.TypeAdapter(openai_params.CompletionCreateParamsNonStreaming)


def validated(adapter, body):
    """Validate body with the SDK's parameter type, all the way down: the SDKs type lists as
    Iterable, which pydantic validates lazily, item by item as they are iterated."""

    def force(x):
        if isinstance(x, dict):
            for v in x.values():
                force(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                force(v)
        elif hasattr(x, "__next__"):
            for v in x:
                force(v)

    force(adapter.validate_python(body))


def anthropic_problems(body):
    """What the Messages API would refuse in this request."""
    validated(ANTHROPIC_REQUEST, body)
    problems = []
    if "max_tokens" not in body:
        problems.append("max_tokens is required")
    msgs = body["messages"]
    if not msgs or msgs[0]["role"] != "user":
        problems.append("the first message must be the user's")
    for a, b in zip(msgs, msgs[1:]):
        if a["role"] == b["role"]:
            problems.append("roles must alternate")
    for i, m in enumerate(msgs):
        blocks = m["content"] if isinstance(m["content"], list) else []
        results = [b for b in blocks if b.get("type") == "tool_result"]
        if not results:
            continue
        prev = msgs[i - 1]["content"] if i > 0 else []
        uses = {b["id"] for b in prev if isinstance(b, dict) and b.get("type") == "tool_use"}
        if {r["tool_use_id"] for r in results} != uses:
            problems.append(f"message {i}: tool results do not answer the tool uses before them")
        if blocks[: len(results)] != results:
            problems.append(f"message {i}: tool results must come first")
    for m in msgs:
        blocks = m["content"] if isinstance(m["content"], list) else []
        if m["role"] == "user" and any(b.get("type") == "tool_use" for b in blocks):
            problems.append("a tool_use block in a user message")
    for t in body.get("tools", []):
        if t.get("input_schema", {}).get("type") != "object":
            problems.append(f"tool {t['name']}: input_schema must be an object schema")
    return problems


def openai_problems(body):
    """What the Chat Completions API would refuse in this request."""
    validated(OPENAI_REQUEST, body)
    problems = []
    open_calls = set()
    for i, m in enumerate(body["messages"]):
        if m["role"] == "tool":
            if m["tool_call_id"] not in open_calls:
                problems.append(f"message {i}: a tool message answers no open tool call")
            open_calls.discard(m["tool_call_id"])
            continue
        if open_calls:
            problems.append(f"message {i}: tool calls left unanswered: {sorted(open_calls)}")
            open_calls = set()
        if m["role"] == "assistant":
            open_calls = {c["id"] for c in m.get("tool_calls") or []}
    for t in body.get("tools", []):
        if t["type"] != "function" or "parameters" not in t["function"]:
            problems.append("a tool that is not a function with parameters")
    return problems


class Script:
    def __init__(self, wire, steps, record):
        self.wire = wire
        self.steps = []
        for s in steps:
            self.steps.extend([s] * int(s.get("times", 1)))
        self.record = record
        self.lock = threading.Lock()
        self.n = 0

    def next_step(self):
        with self.lock:
            self.n += 1
            return self.steps.pop(0) if self.steps else {"status": 500, "message": "script exhausted"}

    def log(self, entry):
        with self.lock:
            with open(self.record, "a") as f:
                f.write(json.dumps(entry) + "\n")


def answer(wire, step, n):
    """The vendor's response for an answer step, validated with the SDK's type."""
    tool = step.get("tool", "code_exec_python")
    usage_in, usage_out = step.get("usage", [10, 3])
    text, code = step.get("text"), step.get("code")
    arguments = step.get("arguments", {"code": code})
    calls = code is not None or "arguments" in step
    if wire == "anthropic":
        content = []
        if text is not None:
            content.append({"type": "text", "text": text})
        if calls:
            content.append({"type": "tool_use", "id": f"toolu_{n:04d}", "name": tool,
                            "input": arguments})
        body = {"id": f"msg_{n:04d}", "type": "message", "role": "assistant",
                "model": "scripted-model", "content": content,
                "stop_reason": "tool_use" if calls else "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": usage_in, "output_tokens": usage_out}}
        anthropic.types.Message.model_validate(body, strict=False)
    else:
        message = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = [{"id": f"call_{n:04d}", "type": "function",
                                      "function": {"name": tool,
                                                   "arguments": json.dumps(arguments)}}]
        body = {"id": f"chatcmpl-{n:04d}", "object": "chat.completion", "created": int(time.time()),
                "model": "scripted-model",
                "choices": [{"index": 0, "message": message, "logprobs": None,
                             "finish_reason": "tool_calls" if calls else "stop"}],
                "usage": {"prompt_tokens": usage_in, "completion_tokens": usage_out,
                          "total_tokens": usage_in + usage_out}}
        openai.types.chat.ChatCompletion.model_validate(body)
    return body


def error_body(wire, status, message):
    if wire == "anthropic":
        kind = {429: "rate_limit_error", 529: "overloaded_error"}.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": "server_error", "code": None, "param": None}}


def handler_for(script):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def reply(self, status, body, headers=()):
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for k, v in headers:
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            raw = self.rfile.read(int(self.headers.get("content-length", 0)))
            entry = {"path": self.path,
                     "x_api_key": self.headers.get("x-api-key"),
                     "authorization": self.headers.get("authorization"),
                     "anthropic_version": self.headers.get("anthropic-version")}
            want = "/v1/messages" if script.wire == "anthropic" else "/chat/completions"
            try:
                body = json.loads(raw)
                entry["body"] = body
                if not self.path.endswith(want):
                    problems = [f"{self.path} is not {want}"]
                elif script.wire == "anthropic":
                    problems = anthropic_problems(body)
                else:
                    problems = openai_problems(body)
            except (ValueError, KeyError, TypeError, pydantic.ValidationError) as e:
                problems = [f"{type(e).__name__}: {e}"]
            if problems:
                entry["invalid"] = problems
                script.log(entry)
                return self.reply(400, error_body(script.wire, 400, "; ".join(problems)))
            step = script.next_step()
            entry["step"] = step
            script.log(entry)
            if step.get("hang"):
                time.sleep(3600)
                return
            if "raw" in step:
                return self.reply(200, step["raw"].encode())
            if "json" in step:
                return self.reply(200, step["json"])
            if "status" in step:
                headers = []
                if "retry_after" in step:
                    headers.append(("retry-after", str(step["retry_after"])))
                message = step.get("message", f"scripted {step['status']}")
                return self.reply(step["status"], error_body(script.wire, step["status"], message),
                                  headers)
            return self.reply(200, answer(script.wire, step, script.n))

    return Handler


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--wire", choices=["anthropic", "openai"], required=True)
    p.add_argument("--script", required=True)
    p.add_argument("--record", required=True)
    a = p.parse_args()
    with open(a.script) as f:
        steps = json.load(f)
    # Validate every answer step up front, so a bad script fails before any request.
    for i, s in enumerate(steps):
        if not any(k in s for k in ("status", "raw", "json", "hang")):
            answer(a.wire, s, i)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(Script(a.wire, steps, a.record)))
    server.daemon_threads = True
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
