//! Rootless mode: runcell run by an unprivileged user (nobody, via `setpriv`). No cgroups,
//! so the verdict says so, `--strict` refuses, and the other layers still isolate the program.

mod common;
use common::*;

use std::fs;
use std::process::Command;

const NOBODY: u32 = 65534;

/// `runcell run --json ARGS...` as nobody.
fn rootless_with(args: &[&str], adjust: impl FnOnce(&mut Command)) -> Run {
    let mut argv: Vec<String> = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    argv.push(runcell_bin().display().to_string());
    argv.extend(["run", "--json"].iter().map(|s| s.to_string()));
    argv.extend(args.iter().map(|s| s.to_string()));
    run_argv(&argv, adjust)
}

fn rootless(args: &[&str]) -> Run {
    rootless_with(args, |_| {})
}

#[test]
#[cfg_attr(
    not(all(host_root, host_setpriv)),
    ignore = "needs root and setpriv (util-linux) to become nobody"
)]
fn rootless_run_works_and_says_cgroups_are_missing() {
    let r = rootless(&["-c", "import os; print(os.getuid())"]);
    r.assert_ok();
    assert_eq!(r.stdout(), "1000\n");
    let e = &r.verdict["enforcement"];
    assert_eq!(e["rootless"], true, "{e:#}");
    assert_eq!(e["cgroup"], "none", "{e:#}");
    let missing = e["missing"].as_array().expect("missing is a list");
    assert!(!missing.is_empty(), "{e:#}");
    assert!(
        missing
            .iter()
            .any(|m| m.as_str().unwrap_or("").contains("cgroup")),
        "{e:#}"
    );
    // The other layers are all there.
    assert_eq!(
        e["namespaces"],
        serde_json::json!(["user", "pid", "mount", "net", "ipc", "uts", "cgroup"])
    );
    assert_eq!(e["seccomp"], true);
    assert_eq!(e["landlock"], "full");
}

#[test]
#[cfg_attr(
    not(all(host_root, host_setpriv)),
    ignore = "needs root and setpriv (util-linux) to become nobody"
)]
fn rootless_strict_refuses_naming_cgroups() {
    let r = rootless(&["--strict", "-c", "open('/tmp/strict-ran', 'w')"]);
    r.assert_category("sandbox_failure");
    assert_eq!(r.code, Some(125));
    assert_eq!(r.exit_code(), None, "nothing ran: {:#}", r.verdict);
    assert!(r.message().contains("cgroup"), "{}", r.message());
    assert_eq!(r.verdict["error"]["retryable"], false);
}

#[test]
#[cfg_attr(
    not(all(host_root, host_setpriv)),
    ignore = "needs root and setpriv (util-linux) to become nobody"
)]
fn rootless_program_is_isolated_like_the_privileged_one() {
    let id = unique_digits();
    let host = HostFile::create(format!("/tmp/runcell-rootless-{id}"), b"host only");
    let secret = format!("rootless-secret-{id}");
    let code = py(&format!(
        r#"
print("uid_map=" + " ".join(open("/proc/self/uid_map").read().split()))
read("shadow", "/etc/shadow")
read("host_tmp_file", "{host}")
print("tmp_listing=" + json.dumps(os.listdir("/tmp")))
write("usr", "/usr/pwned-{id}")
write("workspace", "/workspace/ok")
print("secret=" + ("present" if "RUNCELL_TEST_SECRET" in os.environ else "absent"))
for k in ["CapEff", "CapBnd", "NoNewPrivs", "Seccomp"]:
    print(k + "=" + [l.split()[1] for l in open("/proc/self/status") if l.startswith(k + ":")][0])
sc("mount", 165, 0, 0, 0, 0, 0)
sc("unshare", 272, 0x10000000)
attempt("tcp_out", lambda: socket.create_connection(("1.1.1.1", 443), timeout=2))
print("pids=" + json.dumps(sorted(int(p) for p in os.listdir("/proc") if p.isdigit())))
print("hostname=" + socket.gethostname())
"#,
        host = host.path_str()
    ));
    let r = rootless_with(&["-c", &code], |c| {
        c.env("RUNCELL_TEST_SECRET", &secret);
    });
    r.assert_ok();
    r.expect(&[
        // Without privilege the only uid runcell can map is its own.
        ("uid_map", &format!("1000 {NOBODY} 1")),
        ("shadow", "ENOENT"),
        ("host_tmp_file", "ENOENT"),
        ("tmp_listing", "[]"),
        ("usr", "EROFS"),
        ("workspace", "OK"),
        ("secret", "absent"),
        ("CapEff", "0000000000000000"),
        ("CapBnd", "0000000000000000"),
        ("NoNewPrivs", "1"),
        ("Seccomp", "2"),
        ("mount", "EPERM"),
        ("unshare", "EPERM"),
        ("tcp_out", "ENETUNREACH"),
        ("pids", "[1, 2]"),
        ("hostname", "runcell"),
    ]);
    assert_not_on_host(&format!("/usr/pwned-{id}"));
    assert_eq!(fs::read(&host.path).unwrap(), b"host only");
}

#[test]
#[cfg_attr(
    not(all(host_root, host_setpriv)),
    ignore = "needs root and setpriv (util-linux) to become nobody"
)]
fn rootless_timeout_kills_everything_including_daemons() {
    let tag = unique_digits();
    let code = format!(
        r#"
import os
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp("sleep", ["sleep", "1000.{tag}"])
    os._exit(0)
while True:
    pass
"#
    );
    const TIMEOUT_SECS: f64 = 1.5;
    let r = rootless(&["--timeout", &TIMEOUT_SECS.to_string(), "-c", &code]);
    r.assert_category("timeout");
    assert_eq!(r.exit_code(), Some(124));
    assert!(
        r.execution_time() < TIMEOUT_SECS + LOADED_MARGIN.as_secs_f64(),
        "{:#}",
        r.verdict
    );
    assert_marker_gone(&tag, LOADED_MARGIN);
}

#[test]
#[cfg_attr(
    not(all(host_root, host_setpriv)),
    ignore = "needs root and setpriv (util-linux) to become nobody"
)]
fn rootless_kill_minus_one_does_not_reach_host_processes_of_the_same_user() {
    // A host process running as nobody: the very uid the rootless sandbox runs as.
    let tag = unique_digits();
    let mut host_proc = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sleep",
            &format!("30.{tag}"),
        ])
        .spawn()
        .unwrap();
    assert!(wait_for_marker(&tag, START_WITHIN));
    let host_pid = host_proc.id();
    let code = py(&format!(
        r#"
attempt("kill_all", lambda: os.kill(-1, signal.SIGKILL))
attempt("kill_host_pid", lambda: os.kill({host_pid}, signal.SIGKILL))
print("survived=yes")
"#
    ));
    let r = rootless(&["-c", &code]);
    let alive = host_proc.try_wait().unwrap().is_none();
    let _ = host_proc.kill();
    let _ = host_proc.wait();
    r.assert_ok();
    // The host pid does not exist in the sandbox's pid namespace (or is pid 1/2 at most).
    let kill_host = r.out("kill_host_pid");
    assert!(
        kill_host == "ESRCH" || host_pid <= 2,
        "kill({host_pid}) from the sandbox: {kill_host}"
    );
    // kill(-1) skips pid 1 and the caller; nothing else is in the sandbox's pid namespace.
    r.expect(&[("kill_all", "ESRCH"), ("survived", "yes")]);
    assert!(alive, "the sandbox killed a host process of its own uid");
}

#[test]
#[cfg_attr(
    not(all(host_root, host_setpriv)),
    ignore = "needs root and setpriv (util-linux) to become nobody"
)]
fn rootless_memory_limit_still_bounds_allocations() {
    let r = rootless(&[
        "--memory",
        "64M",
        "-c",
        "b = bytearray(1 << 30)\nprint('allocated', len(b))",
    ]);
    assert_eq!(
        r.stdout(),
        "",
        "1 GiB allocated under a 64 MiB limit: {:#}",
        r.verdict
    );
    match r.category() {
        // Without cgroups the limit is RLIMIT_AS: Python gets a MemoryError.
        "runtime_error" => assert!(r.stderr_out().contains("MemoryError"), "{:#}", r.verdict),
        "memory_limit" => assert_eq!(r.exit_code(), Some(137)),
        other => panic!("unexpected category {other}: {:#}", r.verdict),
    }
}

#[test]
#[cfg_attr(
    not(all(host_root, host_setpriv)),
    ignore = "needs root and setpriv (util-linux) to become nobody"
)]
fn rootless_process_count_is_still_capped() {
    let code = r#"
import os, time, errno
n = 0
err = "none"
while n < 100:
    try:
        pid = os.fork()
    except OSError as e:
        err = errno.errorcode[e.errno]
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    n += 1
print("forked=%d" % n)
print("error=" + err)
"#;
    let r = rootless(&["--pids", "16", "--timeout", "10", "-c", code]);
    r.assert_ok();
    let forked: u32 = r.out("forked").parse().unwrap();
    assert!(forked <= 16, "forked {forked} with --pids 16 and no cgroup");
    assert_eq!(r.out("error"), "EAGAIN");
}
