#!/usr/bin/env python3
"""The container permission matrix (driven by scripts/image/container-matrix.sh).

Each row is one way a container runtime or a pod can start runcell's image: which user, which
user namespace, which seccomp profile, whether /proc is masked, which capabilities. runcell is
asked to run `print(1)` in it and must either do so, reporting the expected `enforcement`
(all seven namespaces, its own seccomp filter, full Landlock, and the cgroup the shape gives),
or refuse with a `sandbox_failure` whose message names what is missing. The rows follow
docs/container.md (and the research behind it, rows A-O and M').
"""
import argparse
import json
import subprocess
import sys
import time
import uuid

NAMESPACES = {"user", "mount", "pid", "net", "ipc", "uts", "cgroup"}
UNMASK = ["--security-opt", "unmask=/proc/*"]
USERNS = ["--uidmap", "0:200000:65536", "--gidmap", "0:200000:65536"]
LOCKED = ["--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--read-only"]


def rows(runtime_default, runcell_profile, host_cgroup):
    rd = ["--security-opt", f"seccomp={runtime_default}"]
    unconfined = ["--security-opt", "seccomp=unconfined"]
    ours = ["--security-opt", f"seccomp={runcell_profile}"]
    root = ["--user", "0:0"]
    user = ["--user", "1000:1000"]
    admin = ["--cap-add", "SYS_ADMIN"]
    ok = lambda cgroup: ("ok", cgroup)  # noqa: E731
    fail = lambda what: ("fail", what)  # noqa: E731
    # (id, shape, Kubernetes equivalent, podman flags, expectation)
    return [
        ("A", "root, default caps, podman's seccomp, masked /proc", "runAsUser: 0",
         root, fail("mount proc")),
        ("B", "root, RuntimeDefault seccomp", "runAsUser: 0, RuntimeDefault",
         root + rd, fail("clone")),
        ("C", "privileged", "privileged: true", root + ["--privileged"], ok(host_cgroup)),
        ("D", "root + SYS_ADMIN, RuntimeDefault", "add SYS_ADMIN",
         root + admin + rd, fail("mount proc")),
        ("E", "root + SYS_ADMIN, Unconfined", "add SYS_ADMIN, Unconfined",
         root + admin + unconfined, fail("mount proc")),
        ("F", "root + SYS_ADMIN, Unconfined, unmasked /proc", "… + procMount: Unmasked",
         root + admin + unconfined + UNMASK, ok("none")),
        ("G", "uid 1000, podman's seccomp, masked /proc", "runAsUser: 1000",
         user, fail("mount proc")),
        ("H", "uid 1000, Unconfined, unmasked /proc (no userns)", "not legal without hostUsers: false",
         user + unconfined + UNMASK, ok("none")),
        ("I", "uid 1000, RuntimeDefault, unmasked /proc", "RuntimeDefault",
         user + rd + UNMASK, fail("clone")),
        ("J", "uid 1000 + SYS_ADMIN, RuntimeDefault, unmasked /proc", "add SYS_ADMIN, RuntimeDefault",
         user + admin + rd + UNMASK, fail("pivot_root")),
        ("K", "userns, uid 0, runcell.json, unmasked /proc", "hostUsers: false, runAsUser: 0",
         USERNS + root + ours + UNMASK, ok("none")),
        ("L", "userns, uid 0 + SYS_ADMIN, runcell.json, unmasked /proc", "… + add SYS_ADMIN",
         USERNS + root + admin + ours + UNMASK, ok("none")),
        ("M", "userns, uid 1000, Unconfined, unmasked, caps dropped, no-new-privs, read-only",
         "P1 with seccomp Unconfined", USERNS + user + unconfined + UNMASK + LOCKED, ok("none")),
        ("N", "userns, uid 1000, Unconfined, masked /proc", "procMount: Default",
         USERNS + user + unconfined, fail("mount proc")),
        ("O", "userns, uid 1000, RuntimeDefault, unmasked /proc", "P1 with RuntimeDefault",
         USERNS + user + rd + UNMASK, fail("clone")),
        ("M'", "userns, uid 1000, runcell.json, unmasked, caps dropped, no-new-privs, read-only",
         "P1 (the unprivileged profile)", USERNS + user + ours + UNMASK + LOCKED, ok("none")),
    ]


def podman_run(image, flags, args, env=(), timeout=300):
    cmd = ["podman", "run", "--rm", "--network=none", "--pull=never"]
    for e in env:
        cmd += ["-e", e]
    cmd += flags + [image] + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def check_run(image, row):
    rid, _, _, flags, (kind, want) = row
    code, out, err = podman_run(image, flags, ["run", "--json", "-c", "print(1)"])
    try:
        v = json.loads(out)
    except json.JSONDecodeError:
        return False, f"no verdict (exit {code}): {(err or out).strip()[-300:]}"
    e = v.get("enforcement", {})
    if v.get("error"):
        got = f"{v['error']['category']}: {v['error']['message']}"
    else:
        got = (f"stdout {v['stdout'].strip()!r}, {len(e.get('namespaces', []))} ns, "
               f"seccomp {e.get('seccomp')}, landlock {e.get('landlock')}, cgroup {e.get('cgroup')}")
    if kind == "ok":
        good = (v.get("exit_code") == 0 and v["stdout"] == "1\n"
                and set(e.get("namespaces", [])) == NAMESPACES and e.get("seccomp") is True
                and e.get("landlock") == "full" and e.get("cgroup") == want)
    else:
        err_ = v.get("error") or {}
        good = (err_.get("category") == "sandbox_failure"
                and want.lower() in err_.get("message", "").lower())
    return good, got


def check_doctor(image, row, env, want):
    """`runcell doctor` in a failing shape names the fix for where it runs."""
    code, out, err = podman_run(image, row[3], ["doctor"], env=env)
    text = out + err
    return want in text, f"doctor (exit {code}) {'mentions' if want in text else 'lacks'} {want!r}"


LANGUAGES = [
    ("python", "import pandas, numpy, matplotlib.pyplot\nprint(int(numpy.arange(10).sum()))", "45"),
    ("node", "console.log(6 * 7)", "42"),
    ("ruby", "puts 6 * 7", "42"),
    ("go", 'package main\nimport "fmt"\nfunc main() { fmt.Println(6 * 7) }', "42"),
    ("bash", "echo $((6 * 7))", "42"),
]


def check_languages(image, row):
    """Every runtime in the image runs in this shape (the data stack for Python): the image
    carries what each needs, and the seccomp profile allows what each does."""
    out = []
    for lang, code, want in LANGUAGES:
        _, stdout, err = podman_run(image, row[3], ["run", "--json", "-l", lang, "-c", code])
        try:
            v = json.loads(stdout)
            got = v["stdout"].strip() if not v.get("error") else v["error"]["message"][:160]
        except (json.JSONDecodeError, KeyError):
            got = (err or stdout).strip()[-160:]
        out.append((f"{lang} in {row[0]}", got == want, f"{got!r}"))
    return out


def http_status(name, path):
    code = ("import urllib.request, urllib.error, sys\n"
            "try:\n"
            f"    r = urllib.request.urlopen('http://127.0.0.1:8080{path}', timeout=10); print(r.status)\n"
            "except urllib.error.HTTPError as e: print(e.code)\n"
            "except Exception: print(0)\n")
    p = subprocess.run(["podman", "exec", name, "/usr/bin/python3", "-c", code],
                       capture_output=True, text=True, timeout=60)
    try:
        return int(p.stdout.strip())
    except ValueError:
        return 0


def check_readyz(image, row, want_ready):
    """The server's /readyz: 200 once its probe sandbox ran (a working shape), 503 where the
    shape cannot build a sandbox. None when this build has no /readyz (404)."""
    name = f"runcell-matrix-{uuid.uuid4().hex[:8]}"
    subprocess.run(["podman", "run", "-d", "--name", name, "--network=none", "--pull=never"]
                   + row[3] + [image, "serve", "--listen", "127.0.0.1:8080"],
                   check=True, capture_output=True, timeout=120)
    try:
        # Up once /healthz answers (no deadline of its own: podman's timeout bounds each call).
        for _ in range(120):
            if http_status(name, "/healthz") == 200:
                break
            time.sleep(1)
        else:
            return False, "the server never answered /healthz"
        seen = []
        for _ in range(120 if want_ready else 5):
            s = http_status(name, "/readyz")
            seen.append(s)
            if s == 404:
                return None, "no /readyz in this build"
            if want_ready and s == 200:
                return True, "/readyz 200"
            time.sleep(1)
        if want_ready:
            return False, f"/readyz never 200 ({sorted(set(seen))})"
        return all(s == 503 for s in seen), f"/readyz {sorted(set(seen))}"
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", required=True)
    ap.add_argument("--runtime-default", required=True)
    ap.add_argument("--runcell-profile", required=True)
    ap.add_argument("only", nargs="*", help="row ids (default: all)")
    a = ap.parse_args()
    host_cgroup = "v2" if open("/proc/self/mountinfo").read().count(" - cgroup2 ") and \
        not open("/proc/self/mountinfo").read().count(" - cgroup ") else "v1"
    table = rows(a.runtime_default, a.runcell_profile, host_cgroup)
    by_id = {r[0]: r for r in table}
    if unknown := [i for i in a.only if i not in by_id]:
        sys.exit(f"unknown rows {unknown}; rows are {' '.join(by_id)}")
    results = []
    for row in table:
        if a.only and row[0] not in a.only:
            continue
        t = time.monotonic()
        good, got = check_run(a.image, row)
        want = ("print(1), cgroup " + row[4][1]) if row[4][0] == "ok" else f"fails naming {row[4][1]!r}"
        results.append((row[0], row[1], want, got, good, time.monotonic() - t))
        print(f"{row[0]:<3} {'ok  ' if good else 'FAIL'} {row[1]}: {got}", flush=True)
    extra = []
    if not a.only or "G" in a.only:
        g = by_id["G"]
        extra.append(("doctor G (podman)",) + check_doctor(a.image, g, [], "unmask=/proc"))
        extra.append(("doctor G (pod)",) + check_doctor(
            a.image, g, ["KUBERNETES_SERVICE_HOST=10.0.0.1"], "procMount: Unmasked"))
        extra.append(("readyz G",) + check_readyz(a.image, g, False))
    if not a.only or "M'" in a.only:
        extra += check_languages(a.image, by_id["M'"])
        extra.append(("readyz M'",) + check_readyz(a.image, by_id["M'"], True))
    for name, good, got in extra:
        print(f"{name:<18} {'skip' if good is None else 'ok  ' if good else 'FAIL'} {got}", flush=True)

    print()
    print(f"{'row':<4}{'shape':<80}{'expected':<32}result")
    for rid, shape, want, got, good, secs in results:
        print(f"{rid:<4}{shape[:79]:<80}{want[:31]:<32}{'ok' if good else 'MISMATCH'} ({secs:.1f}s)")
        if not good:
            print(f"    got: {got}")
    for name, good, got in extra:
        print(f"{name:<84}{'':<32}{'SKIP' if good is None else 'ok' if good else 'MISMATCH'}: {got}")
    bad = [r[0] for r in results if not r[4]] + [x[0] for x in extra if x[1] is False]
    print(f"\ncontainer-matrix: {len(results)} rows, {len(extra)} checks, "
          f"{len(bad)} mismatches{': ' + ', '.join(bad) if bad else ''}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
