#!/usr/bin/env python3
"""Sustained throughput and idle memory, against bare processes and a baseline, in one run.

Reports, side by side (issue 24):
  * closed-loop throughput (runs/s) at 1, 2 and 4 clients, each cell for a fixed duration, of
    `print(1)` and a pandas one-liner, as
      - one-shot runs through `POST /v1/execute` of a `runcell serve` with the warm pool on and
        pandas preloaded,
      - calls of sessions (one session per client, created before the clock starts),
      - bare `python3 -c` processes with no sandbox (the ratio's denominator);
  * memory per idle preloaded session, counted as PSS (/proc/PID/smaps_rollup: private pages
    plus shared pages divided by their sharers) over every process of the session's sandbox
    and the server-side helper process that belongs to it, with N sessions open; template
    processes (cgroup ending in `-template` or `__template` in the command line) apart; and
    how many such sessions fit in 16 GiB and in this host's MemTotal;
  * from /metrics: pool hits and misses, mean refill time, and (when the server has them)
    template forks and their mean time ("n/a" otherwise).

Usage: benches/throughput.py [--runcell PATH] [--duration S] [--sessions N] [--clients 1,2,4]
Without --runcell, builds the tree it is in (release). BASELINE=REV (a commit, tag or branch)
also builds REV in a worktree under target/bench-baseline (as benches/startup.sh does) and
measures it in the same run, in a column of its own.
"""

import argparse
import http.client
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time

PRINT = "print(1)"
PANDAS = "import pandas as pd; print(pd.DataFrame({'a': range(1000)}).a.sum())"
PRELOAD = "python=numpy,pandas"
ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1 << 30

SERVERS = []  # every server started, stopped on exit whatever happens


def build_here():
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "runcell"], cwd=ROOT, check=True)
    return os.path.join(ROOT, "target/release/runcell")


def build_baseline(rev_name):
    wt = os.path.join(ROOT, "target/bench-baseline")
    rev = subprocess.run(
        ["git", "rev-parse", "--verify", f"{rev_name}^{{commit}}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    if not os.path.isdir(wt):
        subprocess.run(["git", "worktree", "add", "-q", "--detach", wt, rev], cwd=ROOT, check=True)
    subprocess.run(["git", "-C", wt, "checkout", "-q", "--detach", rev], check=True)
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "runcell"], cwd=wt, check=True)
    return os.path.join(wt, "target/release/runcell"), rev[:12]


class Server:
    def __init__(self, runcell, args):
        self.key = secrets.token_hex(16)
        self.sessions = []
        self.proc = subprocess.Popen(
            [runcell, "serve", "--listen", "127.0.0.1:0", "--audit-log", "off", *args],
            env={**ENV, "RUNCELL_API_KEY": self.key},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        SERVERS.append(self)
        self.port = None
        for line in self.proc.stderr:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        if self.port is None:
            raise SystemExit("throughput.py: the server did not start")
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()

    def conn(self):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)

    def call(self, conn, method, path, body=None):
        headers = {"Authorization": f"Bearer {self.key}"}
        if body is not None:
            headers["Content-Type"] = "application/json"
            body = json.dumps(body)
        conn.request(method, path, body, headers)
        res = conn.getresponse()
        data = res.read()
        return res.status, data

    def run(self, conn, path, code):
        status, data = self.call(conn, "POST", path, {"language": "python", "code": code} if "sessions" not in path else {"code": code})
        if status != 200:
            raise SystemExit(f"throughput.py: {path} answered {status}: {data[:300]!r}")
        v = json.loads(data)
        if v.get("exit_code") != 0:
            raise SystemExit(f"throughput.py: {path} run failed: {data[:300]!r}")

    def open_session(self):
        c = self.conn()
        status, data = self.call(c, "POST", "/v1/sessions", {"language": "python", "ttl": 3600})
        c.close()
        if status != 201:
            raise SystemExit(f"throughput.py: POST /v1/sessions answered {status}: {data[:300]!r}")
        sid = json.loads(data)["id"]
        self.sessions.append(sid)
        return sid

    def close_sessions(self):
        for sid in self.sessions:
            try:
                c = self.conn()
                self.call(c, "DELETE", f"/v1/sessions/{sid}")
                c.close()
            except OSError:
                pass
        self.sessions = []

    def metrics(self):
        c = self.conn()
        _, data = self.call(c, "GET", "/metrics")
        c.close()
        out = {}
        for line in data.decode().splitlines():
            m = re.match(r"(runcell_\w+)(\{[^}]*\})? (\S+)$", line)
            if m and 'language="python"' in (m.group(2) or 'language="python"'):
                labels = m.group(2) or ""
                key = m.group(1) + ("{ok}" if 'result="ok"' in labels else "{failed}" if 'result="failed"' in labels else "")
                out[key] = out.get(key, 0.0) + float(m.group(3))
        return out

    def wait_pool(self, n, within=300):
        deadline = time.time() + within
        while time.time() < deadline:
            if self.metrics().get("runcell_pool_ready", 0) >= n:
                return
            time.sleep(0.05)
        raise SystemExit("throughput.py: the pool did not fill")

    def stop(self):
        if self.proc.poll() is None:
            self.close_sessions()
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self in SERVERS:
            SERVERS.remove(self)


def closed_loop(clients, duration, one):
    """`clients` threads each calling one(i) back to back for `duration` s; runs/s."""
    counts = [0] * clients
    errors = []
    stop_at = [0.0]
    start = threading.Barrier(clients + 1)

    def worker(i):
        start.wait()
        try:
            while time.perf_counter() < stop_at[0]:
                one(i)
                counts[i] += 1
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(clients)]
    for t in ts:
        t.start()
    t0 = time.perf_counter()
    stop_at[0] = t0 + duration
    start.wait()
    for t in ts:
        t.join()
    took = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"throughput.py: {errors[0]}")
    return sum(counts) / took


def bare_rate(python, code, clients, duration):
    def one(_):
        subprocess.run([python, "-c", code], env=ENV, stdout=subprocess.DEVNULL, check=True)

    return closed_loop(clients, duration, one)


def oneshot_rate(server, code, clients, duration):
    conns = [server.conn() for _ in range(clients)]
    try:
        return closed_loop(clients, duration, lambda i: server.run(conns[i], "/v1/execute", code))
    finally:
        for c in conns:
            c.close()


def session_rate(server, code, clients, duration):
    sids = [server.open_session() for _ in range(clients)]
    conns = [server.conn() for _ in range(clients)]
    try:
        for i in range(clients):  # the first call imports; not what is measured
            server.run(conns[i], f"/v1/sessions/{sids[i]}/execute", code)
        return closed_loop(clients, duration, lambda i: server.run(conns[i], f"/v1/sessions/{sids[i]}/execute", code))
    finally:
        for c in conns:
            c.close()
        server.close_sessions()


# --- memory -------------------------------------------------------------------------------


def proc_table():
    """pid -> (ppid, cgroup path, cmdline) for every live process."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            with open(f"/proc/{name}/cgroup") as f:
                lines = f.read().splitlines()
            # v2's one line, else v1's memory hierarchy (the one runcell always creates).
            fields = [line.split(":", 2) for line in lines]
            cg = next((f[2] for f in fields if "memory" in f[1].split(",")), None)
            if cg is None:
                cg = next((f[2] for f in fields if f[1] == ""), "")
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            out[int(name)] = (ppid, cg, cmd)
        except (OSError, ValueError, IndexError):
            pass
    return out


def pss(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def descendants(table, root):
    kids = {}
    for pid, (ppid, _, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        for k in kids.get(p, []):
            out.append(k)
            todo.append(k)
    return out


def sandboxes(server_pid):
    """Groups the server's descendants: {sandbox cgroup: [pids]} (each sandbox's helper on the
    host side, a process outside the sandbox's cgroup whose descendants are all inside it, is
    counted with it), plus the template processes' pids."""
    table = proc_table()
    mine = descendants(table, server_pid)
    server_cg = table.get(server_pid, (0, "", ""))[1]
    templates, groups, outside = [], {}, []
    for p in mine:
        _, cg, cmd = table[p]
        if cg.endswith("-template") or "__template" in cmd or "-template/" in cg:
            templates.append(p)
        elif cg != server_cg:
            groups.setdefault(cg, []).append(p)
        else:
            outside.append(p)
    for p in outside:
        below = {table[d][1] for d in descendants(table, p)}
        if len(below) == 1 and next(iter(below)) in groups:
            groups[next(iter(below))].append(p)
    return groups, templates


def idle_memory(server, n):
    before, _ = sandboxes(server.proc.pid)
    conn = server.conn()
    for _ in range(n):
        sid = server.open_session()
        # A preloaded session: pandas imported, as a pool sandbox has it.
        server.run(conn, f"/v1/sessions/{sid}/execute", "import numpy, pandas")
    conn.close()
    time.sleep(1)
    after, templates = sandboxes(server.proc.pid)
    new = [pids for cg, pids in after.items() if cg not in before]
    per = [sum(pss(p) for p in pids) for pids in new]
    tmpl = sum(pss(p) for p in templates)
    server.close_sessions()
    if not per:
        return None
    return {"sessions": len(per), "per_session": sum(per) / len(per), "templates": tmpl, "template_procs": len(templates)}


# --- report -------------------------------------------------------------------------------


def mem_total():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def pool_figures(m):
    def mean(total, count):
        return f"{m[total] / m[count] * 1000:.1f} ms" if m.get(count) else "n/a"

    forks = m.get("runcell_template_forks_total{ok}")
    return {
        "pool hits": f"{m.get('runcell_pool_hits_total', 0):.0f}",
        "pool misses": f"{m.get('runcell_pool_misses_total', 0):.0f}",
        "pool refills": f"{m.get('runcell_pool_refills_total', 0):.0f}",
        "mean refill": mean("runcell_pool_refill_seconds_total", "runcell_pool_refills_total"),
        "template forks ok/failed": "n/a"
        if forks is None
        else f"{forks:.0f}/{m.get('runcell_template_forks_total{failed}', 0):.0f}",
        "mean fork": mean("runcell_template_fork_seconds_sum", "runcell_template_fork_seconds_count"),
    }


def measure(runcell, a, clients):
    """Every runcell measurement for one binary."""
    pool = max(clients)
    server = Server(
        runcell,
        [
            "--pool", f"python={pool}",
            "--preload", PRELOAD,
            "--max-concurrent", str(pool),
            "--max-sessions", str(a.sessions + pool),
            "--max-sessions-per-key", str(a.sessions + pool),
        ],
    )
    try:
        server.wait_pool(pool)
        rates = {}
        for name, code in (("print(1)", PRINT), ("pandas", PANDAS)):
            for c in clients:
                rates[("one-shot", name, c)] = oneshot_rate(server, code, c, a.duration)
                rates[("session", name, c)] = session_rate(server, code, c, a.duration)
        figures = pool_figures(server.metrics())
        server.wait_pool(pool)
        mem = idle_memory(server, a.sessions)
        return rates, figures, mem
    finally:
        server.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runcell", help="the binary to measure (default: build this tree, release)")
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per throughput cell")
    ap.add_argument("--sessions", type=int, default=20, help="idle sessions for the memory figure")
    ap.add_argument("--clients", default="1,2,4")
    a = ap.parse_args()
    clients = [int(c) for c in a.clients.split(",")]

    contenders = [("runcell", a.runcell or build_here())]
    if os.environ.get("BASELINE"):
        base, rev = build_baseline(os.environ["BASELINE"])
        print(f"baseline: runcell at {rev} ({os.environ['BASELINE']})")
        contenders.insert(0, ("baseline", base))
    doctor = json.loads(subprocess.run([contenders[-1][1], "doctor", "--json"], capture_output=True, text=True).stdout)
    python = [r for r in doctor["runtimes"] if r["language"] == "python"][0]["executable"]

    bare = {}
    for name, code in (("print(1)", PRINT), ("pandas", PANDAS)):
        for c in clients:
            bare[(name, c)] = bare_rate(python, code, c, a.duration)
    results = {label: measure(path, a, clients) for label, path in contenders}
    labels = [label for label, _ in contenders]

    print(f"\nthroughput, closed loop, {a.duration:g} s per cell (runs/s, and ratio to bare python3 -c)")
    head = f"{'code':9} {'clients':>7} {'bare':>8}"
    for kind in ("one-shot", "session"):
        for label in labels:
            head += f" {kind + ' ' + label:>26}"
    print(head)
    for name in ("print(1)", "pandas"):
        for c in clients:
            b = bare[(name, c)]
            line = f"{name:9} {c:7} {b:8.1f}"
            for kind in ("one-shot", "session"):
                for label in labels:
                    r = results[label][0][(kind, name, c)]
                    line += f" {r:17.1f} ({r / b:5.2f}x)"
            print(line)

    print("\n/metrics after the throughput cells")
    print(f"{'':26}" + "".join(f" {label:>14}" for label in labels))
    for key in results[labels[0]][1]:
        print(f"{key:26}" + "".join(f" {results[label][1][key]:>14}" for label in labels))

    total = mem_total()
    print(f"\nidle preloaded sessions (numpy and pandas imported), {a.sessions} open, PSS")
    print(f"{'':26}" + "".join(f" {label:>14}" for label in labels))
    rows = {"sessions measured": [], "PSS per session": [], "templates PSS (procs)": [], "fit in 16 GiB": [], "fit in MemTotal": []}
    for label in labels:
        mem = results[label][2]
        if mem is None:
            for k in rows:
                rows[k].append("n/a")
            continue
        per = mem["per_session"]
        rows["sessions measured"].append(str(mem["sessions"]))
        rows["PSS per session"].append(f"{per / (1 << 20):.1f} MiB")
        rows["templates PSS (procs)"].append(f"{mem['templates'] / (1 << 20):.1f} MiB ({mem['template_procs']})")
        rows["fit in 16 GiB"].append(f"{int((16 * GIB - mem['templates']) // per)}")
        rows["fit in MemTotal"].append(f"{int((total - mem['templates']) // per)}")
    for k, vs in rows.items():
        print(f"{k:26}" + "".join(f" {v:>14}" for v in vs))
    print(f"(MemTotal here: {total / GIB:.1f} GiB; the fits subtract the templates, shared by all)")


def cleanup(*_):
    for s in list(SERVERS):
        try:
            s.stop()
        except Exception:  # noqa: BLE001 - best effort on the way out
            s.proc.kill()
    if _:
        sys.exit(130)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, cleanup)
    try:
        main()
    except KeyboardInterrupt:
        cleanup()
        sys.exit(130)
    finally:
        cleanup()
