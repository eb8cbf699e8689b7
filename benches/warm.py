#!/usr/bin/env python3
"""Warm one-shot runs against cold ones and against bare Python, in one run (issue 11).

Measures, through `runcell serve`'s /v1/execute over a kept-alive HTTP connection:
  * `print(1)` from a warm pool (the sandbox and its interpreter ready before the request),
    p50/p99 at concurrency 1 and 2;
  * the same with the pool off (a cold sandbox per request);
  * `import pandas as pd; print(pd.DataFrame({"x": [1, 2]}).x.sum())` warm, with pandas
    preloaded, and cold;
and, as the baseline, bare Python started as a process for each (the same interpreter the
sandbox runs). Between warm requests it waits until the pool is full again, so each warm
figure is a request that found its sandbox ready (the pool's refill time is reported apart).
Also reports the memory one idle warm sandbox holds (its cgroup's usage).

Usage: benches/warm.py [--runcell PATH] [--requests N]
"""

import argparse
import glob
import http.client
import json
import os
import re
import secrets
import statistics
import subprocess
import sys
import threading
import time

PRINT = "print(1)"
PANDAS = 'import pandas as pd; print(pd.DataFrame({"x": [1, 2]}).x.sum())'


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class Server:
    def __init__(self, runcell, args):
        self.key = secrets.token_hex(16)
        env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "RUNCELL_API_KEY": self.key}
        self.proc = subprocess.Popen(
            [runcell, "serve", "--listen", "127.0.0.1:0", "--audit-log", "off", *args],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        self.port = None
        deadline = time.time() + 30
        for line in self.proc.stderr:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
            if time.time() > deadline:
                break
        if self.port is None:
            raise SystemExit("warm.py: the server did not start")
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()

    def conn(self):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)

    def execute(self, conn, code):
        body = json.dumps({"language": "python", "code": code})
        t = time.perf_counter()
        conn.request("POST", "/v1/execute", body, {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"})
        res = conn.getresponse()
        data = res.read()
        took = time.perf_counter() - t
        v = json.loads(data)
        if res.status != 200 or v.get("exit_code") != 0:
            raise SystemExit(f"warm.py: unexpected answer {res.status}: {data[:300]!r}")
        return took, v

    def metrics(self):
        c = self.conn()
        c.request("GET", "/metrics", headers={"Authorization": f"Bearer {self.key}"})
        text = c.getresponse().read().decode()
        c.close()
        out = {}
        for line in text.splitlines():
            m = re.match(r'runcell_pool_(\w+)\{language="python"\} (\S+)', line)
            if m:
                out[m.group(1)] = float(m.group(2))
        return out

    def wait_full(self, n, within=120):
        deadline = time.time() + within
        while time.time() < deadline:
            if self.metrics().get("ready", 0) >= n:
                return
            time.sleep(0.005)
        raise SystemExit("warm.py: the pool did not refill")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def serial(server, code, n, pool):
    conn = server.conn()
    times = []
    for _ in range(n):
        if pool:
            server.wait_full(pool)
        t, _ = server.execute(conn, code)
        times.append(t)
    conn.close()
    return times


def pairs(server, code, n, pool):
    """Two requests at once, n times; with a pool, each pair starts when the pool is full."""
    times = []
    conns = [server.conn(), server.conn()]
    for _ in range(n):
        if pool:
            server.wait_full(pool)
        out = [None, None]
        ts = [threading.Thread(target=lambda i=i: out.__setitem__(i, server.execute(conns[i], code)[0])) for i in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        times.extend(out)
    for c in conns:
        c.close()
    return times


def bare(python, code, n):
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
    times = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run([python, "-c", code], env=env, stdout=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - t)
    return times


def idle_memory(pid):
    """Bytes each idle warm sandbox holds: the usage of the server's run cgroups."""
    usages = []
    for f in glob.glob(f"/sys/fs/cgroup/memory/runcell/{pid}-*/memory.usage_in_bytes") + glob.glob(
        f"/sys/fs/cgroup/runcell/{pid}-*/memory.current"
    ):
        try:
            usages.append(int(open(f).read()))
        except OSError:
            pass
    return usages


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runcell", default="target/release/runcell")
    ap.add_argument("--requests", type=int, default=100)
    a = ap.parse_args()
    n = a.requests
    doctor = json.loads(subprocess.run([a.runcell, "doctor", "--json"], capture_output=True, text=True).stdout)
    python = [r for r in doctor["runtimes"] if r["language"] == "python"][0]["executable"]

    rows = []
    b_print = bare(python, PRINT, n)
    b_pandas = bare(python, PANDAS, max(5, n // 10))
    rows.append(("bare python3 -c print(1)", b_print))
    rows.append(("bare python3 pandas", b_pandas))

    warm = Server(a.runcell, ["--pool", "python=2", "--preload", "python=numpy,pandas,matplotlib.pyplot", "--max-concurrent", "2"])
    try:
        warm.wait_full(2)
        time.sleep(0.5)
        mem = idle_memory(warm.proc.pid)
        w1 = serial(warm, PRINT, n, 2)
        w2 = pairs(warm, PRINT, n // 2, 2)
        wp = serial(warm, PANDAS, max(5, n // 10), 2)
        m = warm.metrics()
    finally:
        warm.stop()
    cold = Server(a.runcell, ["--pool", "python=0", "--max-concurrent", "2"])
    try:
        c1 = serial(cold, PRINT, n, 0)
        cp = serial(cold, PANDAS, max(5, n // 10), 0)
    finally:
        cold.stop()
    rows += [
        ("warm print(1), c=1", w1),
        ("warm print(1), c=2", w2),
        ("cold print(1), c=1", c1),
        ("warm pandas (preloaded)", wp),
        ("cold pandas", cp),
    ]
    base = statistics.median(b_print)
    base_pd = statistics.median(b_pandas)
    print(f"{'':28} {'n':>4} {'p50 ms':>8} {'p99 ms':>8} {'p50/bare':>9}")
    for name, xs in rows:
        ref = base_pd if "pandas" in name else base
        print(f"{name:28} {len(xs):4d} {pct(xs, 50) * 1e3:8.2f} {pct(xs, 99) * 1e3:8.2f} {pct(xs, 50) / ref:8.3f}x")
    refills = m.get("refills_total", 0)
    print(
        f"pool: hits {m.get('hits_total', 0):.0f}, misses {m.get('misses_total', 0):.0f}, "
        f"mean refill {m.get('refill_seconds_total', 0) / max(refills, 1) * 1e3:.0f} ms "
        f"(with numpy, pandas, matplotlib.pyplot preloaded)"
    )
    if mem:
        print(f"memory of one idle warm sandbox (cgroup usage, preloaded): {statistics.median(mem) / 2**20:.1f} MiB")
    print(f"load average at the end: {open('/proc/loadavg').read().split()[0]} (other work on the host skews every figure)")


if __name__ == "__main__":
    sys.exit(main())
