"""Drives runcell's E2B door with the official E2B SDKs (e2b, e2b-code-interpreter) and reports
what it saw as one JSON object on stdout; the assertions are in crates/runcell/tests/e2b.rs.

Environment: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY (set by the test), OTHER_KEY (another
runcell key), WRONG_KEY (no key of the server's).
"""
import json
import os
import sys
import time
import traceback
from importlib import metadata

from e2b_code_interpreter import Sandbox

report = {"versions": {p: metadata.version(p) for p in ("e2b", "e2b-code-interpreter")}}


def step(name, fn):
    try:
        report[name] = fn()
    except Exception as e:  # reported, judged by the Rust test
        report[name] = {"raised": type(e).__name__, "message": str(e)[:300]}
        if os.environ.get("E2B_TEST_DEBUG"):
            traceback.print_exc(file=sys.stderr)


def execution(e):
    return {
        "text": e.text,
        "stdout": "".join(e.logs.stdout),
        "stderr": "".join(e.logs.stderr),
        "results": [
            {"text": r.text, "html": r.html, "png": bool(r.png), "main": r.is_main_result}
            for r in e.results
        ],
        "error": None
        if e.error is None
        else {"name": e.error.name, "value": e.error.value, "traceback": e.error.traceback},
        "execution_count": e.execution_count,
    }


other_key = os.environ["OTHER_KEY"]
a = Sandbox.create(envs={"FOO": "bar"}, metadata={"suite": "e2b"})
b = Sandbox.create()
report["ids"] = [a.sandbox_id, b.sandbox_id]

step("state_set", lambda: execution(a.run_code("x = 41")))
step("state_kept", lambda: execution(a.run_code("print(x + 1)")))
step("isolated", lambda: execution(b.run_code("x")))
step("last_value", lambda: execution(a.run_code("x + 1")))
step("exception", lambda: execution(a.run_code("def f():\n    return 1/0\nf()")))
step(
    "logs",
    lambda: execution(
        a.run_code("import sys\nprint('to out')\nprint('to err', file=sys.stderr)")
    ),
)
step("env_at_create", lambda: execution(a.run_code("import os\nprint(os.environ['FOO'])")))
step(
    "env_per_run",
    lambda: execution(
        a.run_code("import os\nprint(os.environ.get('PER'), os.environ['FOO'])", envs={"PER": "run"})
    ),
)
step("env_after_run", lambda: execution(a.run_code("print(os.environ.get('PER'))")))
step(
    "dataframe",
    lambda: execution(
        a.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
    ),
)
step(
    "figure",
    lambda: execution(
        a.run_code(
            "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()"
        )
    ),
)

# Files: the SDK writes, code reads; code writes, the SDK reads; text and bytes.
def files():
    out = {}
    out["write"] = a.files.write("/home/user/a.txt", "hello file").path
    a.files.write("/home/user/d/b.bin", b"\x00\x01\xfe\xff")
    out["code_reads"] = execution(
        a.run_code(
            "print(open('/home/user/a.txt').read())\nprint(list(open('d/b.bin', 'rb').read()))"
        )
    )["stdout"]
    a.run_code(
        "open('from_code.txt', 'w').write('written by code')\n"
        "open('from_code.bin', 'wb').write(bytes([0, 128, 255]))"
    )
    out["sdk_reads_text"] = a.files.read("/home/user/from_code.txt")
    out["sdk_reads_bytes"] = list(a.files.read("from_code.bin", format="bytes"))
    out["list"] = sorted((e.name, e.type.value) for e in a.files.list("/home/user"))
    out["exists"] = [a.files.exists("/home/user/a.txt"), a.files.exists("/home/user/nope")]
    try:
        a.files.read("/home/user/nope.txt")
        out["missing"] = "read"
    except Exception as e:
        out["missing"] = type(e).__name__
    out["make_dir"] = [a.files.make_dir("/home/user/newdir"), a.files.make_dir("/home/user/newdir")]
    a.files.write("/home/user/mv/src.txt", "moving")
    out["rename"] = a.files.rename("/home/user/mv/src.txt", "/home/user/moved/dst.txt").path
    out["renamed_reads"] = a.files.read("/home/user/moved/dst.txt")
    a.files.remove("/home/user/moved")
    out["removed"] = a.files.exists("/home/user/moved/dst.txt")
    try:
        a.files.write("/etc/passwd", "x")
        out["outside"] = "written"
    except Exception as e:
        out["outside"] = type(e).__name__
    return out


step("files", files)


def commands():
    from e2b import CommandExitException

    out = {}
    r = a.commands.run("echo hi $FOO $PER; cat /home/user/a.txt; echo oops >&2", envs={"PER": "cmd"})
    out["run"] = {"stdout": r.stdout, "stderr": r.stderr, "exit_code": r.exit_code}
    try:
        a.commands.run("echo before; exit 3")
        out["exit"] = "no exception"
    except CommandExitException as e:
        out["exit"] = {"exit_code": e.exit_code, "stdout": e.stdout}
    out["cwd"] = a.commands.run("pwd", cwd="/home/user/d").stdout
    out["pwd"] = a.commands.run("pwd").stdout
    a.commands.run("echo from-command > made.txt")
    out["code_sees"] = execution(a.run_code("print(open('made.txt').read().strip(), x)"))["stdout"]
    try:
        a.commands.run("echo started; sleep 600", timeout=2)
        out["timed_out"] = "finished"
    except Exception as e:
        out["timed_out"] = type(e).__name__
    out["after_timeout"] = execution(a.run_code("print(x)"))["stdout"]
    h = a.commands.run("sleep 600", background=True)
    out["background_pid"] = h.pid
    out["killed"] = h.kill()
    after = execution(a.run_code("print(x)"))
    out["after_kill"] = after["stdout"]
    out["after_kill_error"] = after["error"]
    # A command's script (with its own envs) is not left behind in the sandbox's /tmp.
    out["left_in_tmp"] = execution(
        a.run_code("import glob\nprint(glob.glob('/tmp/.runcell-cell-*.sh'))")
    )["stdout"]
    return out


step("commands", commands)


def info():
    i = a.get_info()
    return {
        "id": i.sandbox_id,
        "template": i.template_id,
        "metadata": i.metadata,
        "state": str(i.state.value if hasattr(i.state, "value") else i.state),
    }


step("info", info)


def timeout():
    a.set_timeout(120)
    end = a.get_info().end_at
    return {"seconds_left": end.timestamp() - time.time()}


step("timeout", timeout)


def listing():
    p = Sandbox.list()
    items = p.next_items()
    return sorted(s.sandbox_id for s in items)


step("list", listing)


def connect():
    c = Sandbox.connect(a.sandbox_id)
    return {"id": c.sandbox_id, "x": execution(c.run_code("print(x)"))["stdout"]}


step("connect", connect)


def other():
    out = {}
    try:
        Sandbox.connect(a.sandbox_id, api_key=other_key)
        out["connect"] = "connected"
    except Exception as e:
        out["connect"] = type(e).__name__
    out["kill"] = Sandbox.kill(a.sandbox_id, api_key=other_key)
    out["list"] = [s.sandbox_id for s in Sandbox.list(api_key=other_key).next_items()]
    return out


step("other_key", other)


def wrong_key():
    try:
        Sandbox.create(api_key=os.environ["WRONG_KEY"])
        return "created"
    except Exception as e:
        return type(e).__name__


step("wrong_key", wrong_key)


def kill():
    out = {"a": a.kill(), "b": Sandbox.kill(b.sandbox_id), "again": Sandbox.kill(a.sandbox_id)}
    try:
        a.get_info()
        out["info_after"] = "found"
    except Exception as e:
        out["info_after"] = type(e).__name__
    return out


step("kill", kill)


def expiry():
    c = Sandbox.create(timeout=1)
    deadline = time.time() + 60
    while time.time() < deadline and c.is_running():
        time.sleep(0.5)
    return {"running": c.is_running()}


step("expiry", expiry)
print(json.dumps(report))
