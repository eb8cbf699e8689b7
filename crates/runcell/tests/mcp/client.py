"""Drive runcell's MCP server with the official Python SDK (`mcp` 2.x) and print one JSON
report on stdout; crates/runcell/tests/mcp.rs makes the assertions.

    client.py stdio RUNCELL_BINARY [--mode auto|legacy] [--scenarios a,b,...]
    client.py http URL [--mode auto|legacy] [--scenarios a,b,...]   (API key in RUNCELL_TEST_KEY)

Scenarios: tools, languages, errors, plot, files, progress, cancel, sessions, and approval
(only when asked for: it needs a server that requires network approval). The marker for the
cancellation scenario comes in RUNCELL_TEST_MARKER. Whatever fails inside a scenario is
reported as {"exception": ...} under its name, so one broken scenario does not hide others.
"""

import argparse
import base64
import json
import os
import sys
import time
import traceback

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

HELLO = {
    "python": 'print("hello from python")',
    "node": 'console.log("hello from node")',
    "ruby": 'puts "hello from ruby"',
    "go": 'package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("hello from go") }\n',
    "bash": 'echo "hello from bash"',
}

PLOT = """
import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [1, 4, 9])
plt.title("squares")
print("plotted")
"""

FILES = """
import json
text = open("data/in.txt").read()
blob = open("blob.bin", "rb").read()
open("out.txt", "w").write(text.upper())
open("out.bin", "wb").write(bytes(reversed(blob)))
print(json.dumps({"text": text, "blob": list(blob)}))
"""


def dump(result):
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


def marker_pids(marker):
    """Host processes whose command line contains the marker (not this one)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd:
            found.append(int(name))
    return found


def children_named(name):
    """Child processes of this one running `name` (the stdio server)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                status = dict(
                    line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line
                )
        except OSError:
            continue
        if status.get("PPid") == str(os.getpid()) and status.get("Name") == name:
            pids.append(int(entry))
    return pids


async def scenario_tools(c, report):
    listed = await c.list_tools()
    report["tools"] = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in listed.tools]


async def scenario_languages(c, report):
    listed = await c.list_tools()
    out = {}
    for tool in listed.tools:
        lang = tool.name.removeprefix("code_exec_")
        out[lang] = dump(await c.call_tool(tool.name, {"code": HELLO[lang]}))
    report["languages"] = out


async def scenario_errors(c, report):
    out = {}
    out["runtime_error"] = dump(
        await c.call_tool("code_exec_python", {"code": 'raise ValueError("boom")'})
    )
    out["timeout"] = dump(
        await c.call_tool(
            "code_exec_python", {"code": "import time\ntime.sleep(30)", "timeout": 0.5}
        )
    )
    out["bad_argument"] = dump(
        await c.call_tool("code_exec_python", {"code": "print(1)", "language": "go"})
    )
    out["missing_code"] = dump(await c.call_tool("code_exec_bash", {}))
    out["timeout_over_max"] = dump(
        await c.call_tool("code_exec_bash", {"code": "true", "timeout": 10**9})
    )
    try:
        await c.call_tool("code_exec_cobol", {"code": "x"})
        out["unknown_tool"] = {"raised": None}
    except MCPError as e:
        out["unknown_tool"] = {"raised": "MCPError", "code": e.code, "message": str(e)}
    report["errors"] = out


async def scenario_plot(c, report):
    report["plot"] = dump(await c.call_tool("code_exec_python", {"code": PLOT}))


async def scenario_files(c, report):
    blob = bytes([0, 1, 2, 250, 255])
    report["files"] = dump(
        await c.call_tool(
            "code_exec_python",
            {
                "code": FILES,
                "files": [
                    {"path": "data/in.txt", "content": "héllo files\n"},
                    {"path": "blob.bin", "content_base64": base64.b64encode(blob).decode()},
                ],
            },
        )
    )


async def scenario_progress(c, report):
    events = []

    async def on_progress(progress, total, message):
        events.append({"progress": progress, "total": total, "message": message})

    code = "for i in 1 2 3; do echo line$i; sleep 0.2; done; echo oops >&2; echo last"
    result = await c.call_tool("code_exec_bash", {"code": code}, progress_callback=on_progress)
    report["progress"] = {"events": events, "result": dump(result)}


async def scenario_cancel(c, report):
    marker = os.environ["RUNCELL_TEST_MARKER"]
    started = anyio.Event()
    out = {"finished": False}

    async def on_progress(progress, total, message):
        if message and "started" in message:
            started.set()

    code = f"(exec -a {marker} sleep 1000) & echo started; wait"
    scope = anyio.CancelScope()

    async def call():
        with scope:
            await c.call_tool(
                "code_exec_bash", {"code": code, "timeout": 600}, progress_callback=on_progress
            )
            out["finished"] = True

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        with anyio.fail_after(60):
            await started.wait()
        # The program runs: its marker process shows up on the host (the background job may
        # not have exec'd yet when "started" is printed).
        deadline = time.monotonic() + 15
        while not marker_pids(marker) and time.monotonic() < deadline:
            await anyio.sleep(0.02)
        out["alive_before_cancel"] = bool(marker_pids(marker))
        scope.cancel()
    # The session stays open: the sandbox must die because of the cancellation alone.
    deadline = time.monotonic() + 15
    while marker_pids(marker) and time.monotonic() < deadline:
        await anyio.sleep(0.05)
    out["left_after_cancel"] = marker_pids(marker)
    # The server is still usable afterwards.
    after = await c.call_tool("code_exec_bash", {"code": "echo still here"})
    out["after"] = dump(after)
    report["cancel"] = out


async def scenario_sessions(c, report):
    first = dump(
        await c.call_tool(
            "code_exec_python",
            {"code": "x = 41\nopen('kept.txt', 'w').write('k')", "session_id": "new"},
        )
    )
    sid = first["structuredContent"]["session_id"]
    out = {"first": first}
    out["second"] = dump(
        await c.call_tool(
            "code_exec_python",
            {"code": "print(x + 1, open('kept.txt').read())", "session_id": sid},
        )
    )
    out["other"] = dump(
        await c.call_tool(
            "code_exec_python",
            {"code": "import os\nprint('x' in globals(), os.listdir('.'))", "session_id": "new"},
        )
    )
    out["fresh"] = dump(
        await c.call_tool("code_exec_python", {"code": "print('x' in globals())"})
    )
    out["wrong_language"] = dump(
        await c.call_tool("code_exec_node", {"code": "console.log(1)", "session_id": sid})
    )
    # A shell command runs in any session's sandbox, beside its interpreter: it sees the
    # session's files.
    out["shell_in_session"] = dump(
        await c.call_tool("code_exec_bash", {"code": "echo hi; ls", "session_id": sid})
    )
    out["unknown"] = dump(
        await c.call_tool("code_exec_python", {"code": "1", "session_id": "ses_unknown"})
    )
    out["bad"] = dump(
        await c.call_tool("code_exec_python", {"code": "1", "session_id": 7})
    )
    report["sessions"] = out


# The user's answer to the next elicitation ("accept", "decline", or "refuse" to answer an
# approval question with approve=false), and the messages the user was shown.
ELICIT = {"answer": "accept", "asked": []}


async def elicitation_callback(context, params):
    import mcp.types as types

    ELICIT["asked"].append(params.message)
    if ELICIT["answer"] == "decline":
        return types.ElicitResult(action="decline")
    return types.ElicitResult(action="accept", content={"approve": ELICIT["answer"] == "accept"})


async def scenario_approval(c, report):
    """Network approval (the server runs with approval required and RUNCELL_TEST_NET_URL's
    host allowed): the user accepts, then declines, then answers no."""
    url = os.environ["RUNCELL_TEST_NET_URL"]
    entry = os.environ["RUNCELL_TEST_NET_ENTRY"]
    code = f"import urllib.request\nprint(urllib.request.urlopen({url!r}, timeout=10).read().decode().strip())"
    out = {}
    for answer in ["accept", "decline", "refuse"]:
        ELICIT["answer"] = answer
        out[answer] = dump(
            await c.call_tool("code_exec_python", {"code": code, "network": {"allow": [entry]}})
        )
    out["asked"] = list(ELICIT["asked"])
    report["approval"] = out


SCENARIOS = {
    "tools": scenario_tools,
    "languages": scenario_languages,
    "errors": scenario_errors,
    "plot": scenario_plot,
    "files": scenario_files,
    "progress": scenario_progress,
    "cancel": scenario_cancel,
    "sessions": scenario_sessions,
    "approval": scenario_approval,
}


async def run(args):
    if args.transport == "stdio":
        target = StdioServerParameters(command=args.target, args=["mcp"])
    else:
        key = os.environ.get("RUNCELL_TEST_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(120, read=600))
        target = streamable_http_client(args.target, http_client=http)
    report = {"scenarios": {}}
    async with Client(
        target, mode=args.mode, read_timeout_seconds=600, elicitation_callback=elicitation_callback
    ) as c:
        report["protocol_version"] = c.protocol_version
        if args.transport == "stdio":
            report["server_pids"] = children_named("runcell")
        for name in args.scenarios.split(","):
            try:
                await SCENARIOS[name](c, report)
                report["scenarios"][name] = "ok"
            except Exception as e:  # reported, asserted on by the Rust test
                report["scenarios"][name] = {
                    "exception": repr(e),
                    "traceback": traceback.format_exc(),
                }
    return report


def main():
    p = argparse.ArgumentParser()
    p.add_argument("transport", choices=["stdio", "http"])
    p.add_argument("target")
    p.add_argument("--mode", default="auto")
    p.add_argument("--scenarios", default=",".join(n for n in SCENARIOS if n != "approval"))
    args = p.parse_args()
    report = anyio.run(run, args)
    json.dump(report, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
