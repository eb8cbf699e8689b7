"""Drives runcell's E2B door's pause, resume, connect and fork with the official E2B SDK and
reports what it saw as one JSON object on stdout; the assertions are in
crates/runcell/tests/e2b.rs (`the_python_sdk_pauses_resumes_and_forks`).

Environment: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY (set by the test), OTHER_KEY.
"""
import json
import os
import sys
import traceback

import httpx
from e2b import SandboxQuery, SandboxState
from e2b_code_interpreter import Sandbox

report = {}


def step(name, fn):
    try:
        report[name] = fn()
    except Exception as e:  # reported, judged by the Rust test
        report[name] = {"raised": type(e).__name__, "message": str(e)[:300]}
        if os.environ.get("E2B_TEST_DEBUG"):
            traceback.print_exc(file=sys.stderr)


def text(e):
    return "".join(e.logs.stdout) if e.error is None else f"{e.error.name}: {e.error.value}"


def connect_status(sandbox_id):
    """The status of a raw v2 connect, as the SDK sends it."""
    r = httpx.post(
        f"{os.environ['E2B_API_URL']}/v2/sandboxes/{sandbox_id}/connect",
        headers={"X-API-Key": os.environ["E2B_API_KEY"]},
        json={},
    )
    return r.status_code


a = Sandbox.create()
report["id"] = a.sandbox_id
step("set", lambda: text(a.run_code("x = 41\nprint('set')")))
step("pause", lambda: a.pause())
step("pause_again", lambda: a.pause())
step("info_paused", lambda: a.get_info().state.value)
step(
    "listed_paused",
    lambda: [
        s.sandbox_id
        for s in Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
    ],
)
step(
    "listed_running_while_paused",
    lambda: [
        s.sandbox_id
        for s in Sandbox.list(query=SandboxQuery(state=[SandboxState.RUNNING])).next_items()
    ],
)
step(
    "other_key_pause",
    lambda: Sandbox.pause(a.sandbox_id, api_key=os.environ["OTHER_KEY"]),
)


def connect():
    c = Sandbox.connect(a.sandbox_id)
    return {"state": c.get_info().state.value, "x": text(c.run_code("print(x + 1)"))}


step("connect", connect)


def statuses():
    a.pause()
    return {"resumed": connect_status(a.sandbox_id), "running": connect_status(a.sandbox_id)}


step("connect_status", statuses)


def call_resumes():
    a.pause()
    out = text(a.run_code("print(x + 2)"))
    return {"x": out, "state": a.get_info().state.value}


step("call_resumes", call_resumes)


def fork():
    if not hasattr(a, "fork"):
        return "no fork in this SDK"
    a.run_code("y = [1, 2]\nopen('/home/user/f.txt', 'w').write('forked')")
    forks = a.fork(count=1)
    out = []
    for f in forks:
        if isinstance(f, Exception):
            out.append({"raised": type(f).__name__, "message": str(f)[:300]})
            continue
        f.run_code("y.append(3)")
        out.append(
            {
                "id": f.sandbox_id,
                "child": text(f.run_code("print(x, y, open('/home/user/f.txt').read())")),
            }
        )
        f.kill()
    out_parent = text(a.run_code("print(y)"))
    return {"forks": out, "parent": out_parent}


step("fork", fork)
step("kill", lambda: a.kill())
print(json.dumps(report))
