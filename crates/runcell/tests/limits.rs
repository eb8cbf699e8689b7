//! Resource limits: wall clock, leftover processes, memory, processes and threads, disk,
//! output, open files, CPU bandwidth, signals, and a crashing supervisor. Each test checks the
//! category and exit code *and* that nothing of the run is left on the host.

mod common;
use common::*;

use std::time::Duration;

/// How far past its limit the program's own measured time may go: the supervisor's check of
/// the deadline, then SIGKILL and reaping (the sandbox's teardown comes after, in
/// `LOADED_MARGIN`).
const KILL_LATENCY_SECS: f64 = 0.6;

fn assert_timed_out_after(r: &Run, secs: f64) {
    r.assert_category("timeout");
    assert_eq!(r.exit_code(), Some(124), "{:#}", r.verdict);
    assert_eq!(r.code, Some(124));
    let t = r.execution_time();
    assert!(
        t >= secs * 0.95 && t <= secs + KILL_LATENCY_SECS,
        "execution_time {t} for a {secs} s limit"
    );
    assert!(
        r.elapsed < Duration::from_secs_f64(secs) + LOADED_MARGIN,
        "runcell took {:?} for a {secs} s limit",
        r.elapsed
    );
    assert_eq!(r.verdict["error"]["retryable"], true);
}

/// Run `code` with `--timeout secs` and `extra`, and again with the timeout doubled (up to
/// 64 s) for as long as the program had not done what the test is about when the timeout
/// stopped it (`reached` says whether it had). A timeout is what ends these programs, and it
/// is short to keep the tests short; but on a slow machine (the qemu TCG guest of
/// `scripts/cgroup-v2-guest.sh`, where Python takes about a second to start) a short timeout
/// can stop a program before it gets there, which would test nothing and fail. Returns the
/// run that got there (or the last one) and its timeout.
fn run_until_reached(
    lang: &str,
    code: &str,
    mut secs: f64,
    extra: &[&str],
    reached: impl Fn(&Run) -> bool,
) -> (Run, f64) {
    loop {
        let timeout = secs.to_string();
        let mut args = vec!["--timeout", timeout.as_str()];
        args.extend_from_slice(extra);
        let r = run(lang, code, &args);
        if reached(&r) || secs >= 64.0 {
            return (r, secs);
        }
        secs *= 2.0;
    }
}

// ---------------------------------------------------------------------------------------------
// Wall clock
// ---------------------------------------------------------------------------------------------

#[test]
fn a_busy_loop_is_stopped_at_the_timeout() {
    let r = run("python", "while True: pass", &["--timeout", "1"]);
    assert_timed_out_after(&r, 1.0);
    assert!(r.message().contains("1 s"), "{}", r.message());
}

/// (The program must have started ignoring the signals before its timeout: it says so, and
/// runs again with a longer timeout when it had not.)
#[test]
fn a_program_ignoring_sigterm_and_sigint_is_still_stopped() {
    let (r, secs) = run_until_reached(
        "python",
        r#"
import signal
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGXCPU, signal.SIGUSR1):
    signal.signal(s, signal.SIG_IGN)
print("ignoring", flush=True)
while True:
    pass
"#,
        1.0,
        &[],
        |r| !r.stdout().is_empty(),
    );
    assert_timed_out_after(&r, secs);
    assert_eq!(
        r.stdout(),
        "ignoring\n",
        "output before the timeout is kept"
    );
}

#[test]
fn a_sleeping_program_is_stopped_at_the_timeout() {
    let r = run(
        "python",
        "import time\nprint('start', flush=True)\ntime.sleep(100)",
        &["--timeout", "1.5"],
    );
    assert_timed_out_after(&r, 1.5);
    assert_eq!(r.stdout(), "start\n");
}

/// A daemon: double fork, setsid, signals ignored (inherited through exec), then `sleep` with
/// the marker in its argv.
fn daemon_code(tag: &str) -> String {
    format!(
        r#"
import os, signal, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(s, signal.SIG_IGN)
        os.execvp("sleep", ["sleep", "1000.{tag}"])
    os._exit(0)
"#
    )
}

/// Python that waits (until the run's timeout) for a process whose argv is `sleep *<tag>*`.
fn wait_for_sleeper(tag: &str) -> String {
    format!(
        r#"
def _sleeper_up():
    for p in os.listdir("/proc"):
        try:
            argv = open(f"/proc/{{p}}/cmdline", "rb").read().split(b"\0")
        except (OSError, ValueError):
            continue
        if argv[0] == b"sleep" and len(argv) > 1 and b"{tag}" in argv[1]:
            return True
    return False
while not _sleeper_up():
    time.sleep(0.01)
"#
    )
}

#[test]
fn a_daemon_left_running_is_killed_when_the_program_exits() {
    let tag = unique_digits();
    // The program exits as soon as it sees its daemon running (from inside the sandbox: the
    // host could not look before the exit without a race).
    let code = format!(
        "{}{}print('daemon up')\n",
        daemon_code(&tag),
        wait_for_sleeper(&tag)
    );
    let r = run("python", &code, &[]);
    r.assert_ok();
    assert_eq!(
        r.stdout(),
        "daemon up\n",
        "the daemon never ran (test is void)"
    );
    assert!(
        r.execution_time() < LOADED_MARGIN.as_secs_f64(),
        "runcell waited for the daemon: {:#}",
        r.verdict
    );
    assert_marker_gone(&tag, LOADED_MARGIN);
}

#[test]
fn a_daemon_left_running_is_killed_on_timeout() {
    let tag = unique_digits();
    let code = format!("{}\nwhile True: pass\n", daemon_code(&tag));
    let p = spawn("python", &code, &["--timeout", "1.5"]);
    assert!(
        wait_for_marker(&tag, START_WITHIN),
        "the daemon never ran (test is void)"
    );
    let r = p.finish();
    assert_timed_out_after(&r, 1.5);
    assert_marker_gone(&tag, LOADED_MARGIN);
}

#[test]
fn a_bash_background_job_is_killed_when_the_script_exits() {
    let tag = unique_digits();
    // The script ends once both jobs run (seen from inside: `pgrep -x sleep`).
    let code = format!(
        "nohup sleep 1000.{tag} >/dev/null 2>&1 &\nsetsid sleep 1001.{tag} &\n\
         until [ \"$(pgrep -c -x sleep)\" = 2 ]; do sleep 0.01; done\necho done\n"
    );
    let r = run("bash", &code, &["--timeout", "10"]);
    r.assert_ok();
    assert_eq!(r.stdout(), "done\n", "the background jobs never ran");
    assert_marker_gone(&tag, LOADED_MARGIN);
}

/// `kill -9` of `runcell run` mid-run: no process of the sandbox survives it, and the next
/// run sweeps the cgroups it left.
#[test]
fn killing_the_supervisor_tears_the_sandbox_down() {
    let tag = unique_digits();
    let code = format!("{}\nwhile True: pass\n", daemon_code(&tag));
    let p = spawn("python", &code, &["--timeout", "60"]);
    let pid = p.pid;
    assert!(
        wait_for_marker(&tag, START_WITHIN),
        "the daemon never ran (test is void)"
    );
    assert!(
        !cgroups_of(pid).is_empty(),
        "the run has cgroups while it runs"
    );
    // The helper, the sandbox's pid 1, the program and its daemon.
    let procs = sandbox_processes_of(pid);
    assert!(procs.len() >= 4, "the run's processes: {procs:?}");
    p.kill_supervisor();
    // Every process of the sandbox dies with the supervisor (the helper's lifeline), the
    // helper itself too.
    assert_marker_gone(&tag, LOADED_MARGIN);
    assert_processes_gone(&procs, LOADED_MARGIN);
    // Empty cgroups of a dead supervisor are swept by the next run.
    run("python", "print(1)", &[]).assert_ok();
    let deadline = std::time::Instant::now() + LOADED_MARGIN;
    while !cgroups_of(pid).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        cgroups_of(pid),
        Vec::<std::path::PathBuf>::new(),
        "stale cgroups of the killed supervisor"
    );
}

// ---------------------------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------------------------

fn assert_memory_limit(r: &Run, limit: u64) {
    r.assert_category("memory_limit");
    assert_eq!(r.exit_code(), Some(137), "{:#}", r.verdict);
    assert_eq!(r.code, Some(137));
    assert!(r.message().contains("64 MiB"), "{}", r.message());
    let peak = r.verdict["usage"]["peak_memory_bytes"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        peak <= limit + (1 << 20),
        "peak {peak} above the {limit} limit"
    );
}

#[test]
fn python_memory_bomb_hits_the_memory_limit() {
    let r = run(
        "python",
        "b = bytearray(1 << 30)\nprint(len(b))",
        &["--memory", "64M"],
    );
    assert_memory_limit(&r, 64 << 20);
    assert_eq!(r.stdout(), "");
}

#[test]
fn python_gradual_allocation_hits_the_memory_limit() {
    let r = run(
        "python",
        "x = []\nwhile True:\n    x.append(bytearray(1 << 20))",
        &["--memory", "64M", "--timeout", "20"],
    );
    assert_memory_limit(&r, 64 << 20);
}

#[test]
fn memory_of_child_processes_counts_too() {
    let r = run(
        "python",
        r#"
import os
ready_r, ready_w = os.pipe()
hold_r, hold_w = os.pipe()
for i in range(4):
    if os.fork() == 0:
        os.close(ready_r)
        os.close(hold_w)
        b = bytearray(30 << 20)
        for j in range(0, len(b), 4096):
            b[j] = 1
        os.write(ready_w, b"x")
        os.close(ready_w)
        os.read(hold_r, 1)  # until the parent lets go
        os._exit(0)
os.close(ready_w)
# Until every child holds its memory or is dead: all of it is held at once.
while os.read(ready_r, 1):
    pass
os.close(hold_w)
bad = 0
for i in range(4):
    _, status = os.wait()
    bad += status != 0
raise SystemExit(1 if bad else 0)
"#,
        &["--memory", "64M", "--timeout", "20"],
    );
    // 4 x 30 MiB do not fit in 64 MiB: the cgroup OOM-kills a child, the program reports the
    // failure with exit 1, and the verdict names the memory limit. (Each child holds its
    // memory until all have theirs, not for a while: on a slow machine the first ones could
    // otherwise let go before the last ones allocate.)
    assert_memory_limit(&r, 64 << 20);
}

#[test]
fn peak_memory_is_reported() {
    let r = run(
        "python",
        "b = bytearray(100 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('ok')",
        &["--memory", "256M"],
    );
    r.assert_ok();
    let peak = r.verdict["usage"]["peak_memory_bytes"].as_u64().unwrap();
    assert!((100 << 20..=256 << 20).contains(&peak), "peak {peak}");
}

// ---------------------------------------------------------------------------------------------
// Processes and threads
// ---------------------------------------------------------------------------------------------

/// (The bomb must reach the limit before the timeout stops it: each process says so when one
/// of its forks fails, and the run is made again with a longer timeout when none did.)
#[test]
fn python_fork_bomb_is_reported_as_process_limit() {
    let (r, secs) = run_until_reached(
        "python",
        "import os\ncapped = False\nwhile True:\n    try:\n        os.fork()\n    \
         except OSError:\n        if not capped:\n            capped = True\n            \
         print('capped', flush=True)",
        2.0,
        &["--pids", "32"],
        |r| r.stdout().contains("capped"),
    );
    r.assert_category("process_limit");
    assert_eq!(r.exit_code(), Some(124), "{:#}", r.verdict);
    assert!(r.message().contains("32 processes"), "{}", r.message());
    assert!(
        r.elapsed < Duration::from_secs_f64(secs) + LOADED_MARGIN,
        "{:?}",
        r.elapsed
    );
}

/// (As above: bash says `fork: retry: Resource temporarily unavailable` when the limit
/// refuses a fork.)
#[test]
fn bash_fork_bomb_is_reported_as_process_limit() {
    // The script keeps running (sleep) while the bomb spreads; otherwise its exit ends it all.
    let (r, secs) = run_until_reached("bash", ":(){ :|:& };:\nsleep 1000", 3.0, &[], |r| {
        r.stderr_out().contains("fork")
    });
    r.assert_category("process_limit");
    assert!(r.message().contains("64 processes"), "{}", r.message());
    assert!(
        r.elapsed < Duration::from_secs_f64(secs) + LOADED_MARGIN,
        "{:?}",
        r.elapsed
    );
}

#[test]
fn the_process_count_is_capped_at_pids() {
    let r = run(
        "python",
        r#"
import os, time, errno
n = 0
err = "none"
while n < 200:
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
"#,
        &["--pids", "16", "--timeout", "10"],
    );
    // The program handled the failure and exited 0: a success, not a limit verdict.
    r.assert_ok();
    let forked: u32 = r.out("forked").parse().unwrap();
    // 16 processes and threads in all: the program itself is one of them.
    assert!(
        (8..=15).contains(&forked),
        "forked {forked} children with --pids 16"
    );
    assert_eq!(r.out("error"), "EAGAIN");
    // The sleeping children were killed when the program exited.
    assert!(r.execution_time() < LOADED_MARGIN.as_secs_f64());
}

#[test]
fn a_thread_bomb_cannot_exceed_pids() {
    let r = run(
        "python",
        r#"
import threading
started = 0
hold = threading.Event()  # never set: every thread lives until the program ends
def idle():
    hold.wait()
try:
    for i in range(500):
        t = threading.Thread(target=idle, daemon=True)
        t.start()
        started += 1
finally:
    print("started=%d" % started, flush=True)
"#,
        &["--pids", "32", "--timeout", "10"],
    );
    let started: u32 = r.out("started").parse().unwrap();
    assert!(started < 32, "{started} threads with --pids 32");
    assert_eq!(r.exit_code(), Some(1), "{:#}", r.verdict);
    assert!(
        r.stderr_out().contains("can't start new thread"),
        "{:#}",
        r.verdict
    );
    // The program died of the failed thread creation: the verdict must name the limit (as the
    // engine's classifier does when it sees the pids cgroup hit), or at least the error.
    match r.category() {
        "process_limit" => assert!(r.message().contains("32 processes"), "{}", r.message()),
        "runtime_error" => assert!(
            r.message().contains("can't start new thread"),
            "{}",
            r.message()
        ),
        other => panic!("unexpected category {other}: {:#}", r.verdict),
    }
}

#[test]
fn orphans_are_reaped_so_they_do_not_use_up_pids() {
    // 200 double forks: each grandchild is orphaned, reparented to the sandbox's pid 1 and
    // exits. If pid 1 did not reap them, the zombies would exhaust --pids 16 quickly.
    let r = run(
        "python",
        r#"
import os, errno
done = 0
err = "none"
for i in range(200):
    try:
        pid = os.fork()
    except OSError as e:
        err = errno.errorcode[e.errno]
        break
    if pid == 0:
        try:
            if os.fork() == 0:
                os._exit(0)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    done += 1
print("done=%d" % done)
print("error=" + err)
"#,
        &["--pids", "16", "--timeout", "20"],
    );
    r.assert_ok();
    r.expect(&[("done", "200"), ("error", "none")]);
}

// ---------------------------------------------------------------------------------------------
// Disk
// ---------------------------------------------------------------------------------------------

#[test]
fn filling_the_workspace_hits_the_disk_limit() {
    let r = run(
        "python",
        "f = open('/workspace/big', 'wb')\nfor i in range(200):\n    f.write(b'x' * (1 << 20))\n    f.flush()",
        &["--disk", "16M", "--timeout", "20"],
    );
    r.assert_category("disk_limit");
    assert_eq!(
        r.exit_code(),
        Some(1),
        "Python dies of the ENOSPC: {:#}",
        r.verdict
    );
    assert!(
        r.stderr_out().contains("No space left on device"),
        "{:#}",
        r.verdict
    );
    assert!(r.message().contains("16 MiB"), "{}", r.message());
}

#[test]
fn tmp_workspace_and_dev_shm_share_one_disk_cap() {
    let r = run(
        "python",
        &py(r#"
for d in ["/tmp", "/workspace", "/dev/shm"]:
    print(f"blocks{d}=%d" % os.statvfs(d).f_blocks)
write("tmp_6m", "/tmp/a", b"x" * (6 << 20))
write("workspace_6m", "/workspace/b", b"x" * (6 << 20))
free = os.statvfs("/dev/shm").f_bavail * os.statvfs("/dev/shm").f_frsize
print("shm_free_mb=%d" % (free >> 20))
write("shm_6m", "/dev/shm/c", b"x" * (6 << 20))
"#),
        &["--disk", "16M"],
    );
    r.assert_ok();
    let blocks = r.out("blocks/tmp");
    assert_eq!(r.out("blocks/workspace"), blocks);
    assert_eq!(r.out("blocks/dev/shm"), blocks);
    let free: u64 = r.out("shm_free_mb").parse().unwrap();
    assert!(
        free <= 4,
        "/dev/shm still had {free} MiB after 12 MiB went to /tmp and /workspace"
    );
    r.expect(&[
        ("tmp_6m", "OK"),
        ("workspace_6m", "OK"),
        ("shm_6m", "ENOSPC"),
    ]);
}

#[test]
fn filling_dev_shm_hits_the_disk_limit() {
    let r = run(
        "python",
        "f = open('/dev/shm/big', 'wb')\nfor i in range(100):\n    f.write(b'x' * (1 << 20))\n    f.flush()",
        &["--disk", "8M"],
    );
    r.assert_category("disk_limit");
    assert_eq!(r.exit_code(), Some(1), "{:#}", r.verdict);
}

#[test]
fn exhausting_inodes_hits_the_disk_limit() {
    let r = run(
        "python",
        "for i in range(100000):\n    open('/workspace/f%d' % i, 'w').close()",
        &["--disk", "1M", "--timeout", "20"],
    );
    r.assert_category("disk_limit");
    assert!(
        r.stderr_out().contains("No space left on device"),
        "{:#}",
        r.verdict
    );
}

// ---------------------------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------------------------

#[test]
fn a_stdout_flood_is_cut_at_1_mib_and_stopped() {
    let r = run(
        "python",
        "while True:\n    print('x' * 1000)",
        &["--timeout", "30"],
    );
    r.assert_category("output_limit");
    // The cap is on the size as delivered in JSON, where each newline is `\n`.
    assert!(
        ((1 << 20) - 1..=1 << 20).contains(&delivered(r.stdout())),
        "{}",
        delivered(r.stdout())
    );
    assert!(r.stdout().starts_with(&"x".repeat(1000)));
    assert_eq!(r.verdict["stdout_truncated"], true);
    assert_eq!(r.verdict["stderr_truncated"], false);
    assert_eq!(r.exit_code(), Some(137));
    assert!(r.message().contains("stdout"), "{}", r.message());
    assert!(
        r.execution_time() < LOADED_MARGIN.as_secs_f64(),
        "the run went on after the cap: {}",
        r.execution_time()
    );
}

#[test]
fn a_stderr_flood_is_cut_at_1_mib_and_stopped() {
    let r = run(
        "python",
        "import sys\nwhile True:\n    sys.stderr.write('e' * 1000)",
        &["--timeout", "30"],
    );
    r.assert_category("output_limit");
    assert_eq!(r.stderr_out().len(), 1 << 20);
    assert_eq!(r.stdout(), "");
    assert_eq!(r.verdict["stderr_truncated"], true);
    assert_eq!(r.verdict["stdout_truncated"], false);
    assert!(r.message().contains("stderr"), "{}", r.message());
    assert!(r.execution_time() < LOADED_MARGIN.as_secs_f64());
}

#[test]
fn output_cap_keeps_exactly_the_cap() {
    let r = run("python", "print('y' * 5000)", &["--output", "100"]);
    r.assert_category("output_limit");
    assert_eq!(r.stdout(), "y".repeat(100));
    assert_eq!(r.verdict["stdout_truncated"], true);
    assert_eq!(r.verdict["limits"]["output_bytes"], 100);
}

#[test]
fn output_exactly_at_the_cap_is_not_truncated() {
    // 98 characters and a newline (`\n`, two in JSON) are 100 delivered.
    let r = run("python", "print('y' * 98)", &["--output", "100"]);
    r.assert_ok();
    assert_eq!(delivered(r.stdout()), 100);
    assert_eq!(r.verdict["stdout_truncated"], false);
    let r = run("python", "print('y' * 99)", &["--output", "100"]);
    r.assert_category("output_limit");
    assert_eq!(r.stdout(), "y".repeat(99));
}

/// The size of output as a verdict delivers it: in a JSON string.
fn delivered(text: &str) -> usize {
    serde_json::to_string(text).unwrap().len() - 2
}

#[test]
fn a_flood_from_a_background_child_is_capped_too() {
    let r = run(
        "python",
        "import os, time\nif os.fork() == 0:\n    while True:\n        os.write(1, b'z' * 4096)\ntime.sleep(20)",
        &["--output", "64K", "--timeout", "30"],
    );
    r.assert_category("output_limit");
    assert_eq!(r.stdout().len(), 64 << 10);
    assert!(
        r.execution_time() < LOADED_MARGIN.as_secs_f64(),
        "{}",
        r.execution_time()
    );
}

// ---------------------------------------------------------------------------------------------
// Files, CPU, stdin, signals
// ---------------------------------------------------------------------------------------------

#[test]
fn open_files_are_capped() {
    let r = run(
        "python",
        r#"
import errno, resource
fs = []
err = "none"
try:
    for i in range(100):
        fs.append(open("/dev/null"))
except OSError as e:
    err = errno.errorcode[e.errno]
print("opened=%d" % len(fs))
print("error=" + err)
import os
total = 0
for fd in range(4096):
    try:
        os.fstat(fd)
        total += 1
    except OSError:
        pass
print("total_open=%d" % total)
print("nofile=%s" % (resource.getrlimit(resource.RLIMIT_NOFILE),))
"#,
        &["--open-files", "32"],
    );
    r.assert_ok();
    // The cap was reached exactly: 32 descriptors open in all when open() failed.
    r.expect(&[
        ("error", "EMFILE"),
        ("nofile", "(32, 32)"),
        ("total_open", "32"),
    ]);
    let opened: u32 = r.out("opened").parse().unwrap();
    assert!((20..=30).contains(&opened), "opened {opened}");
}

#[test]
fn rlimits_are_set_for_the_program() {
    let r = run(
        "python",
        r#"
import resource as r
for name in ["RLIMIT_CORE", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_CPU"]:
    print(f"{name}=%s" % (r.getrlimit(getattr(r, name)),))
"#,
        &[
            "--disk",
            "16M",
            "--pids",
            "20",
            "--open-files",
            "100",
            "--timeout",
            "5",
        ],
    );
    r.assert_ok();
    r.expect(&[
        ("RLIMIT_CORE", "(0, 0)"),
        ("RLIMIT_FSIZE", "(16777216, 16777216)"),
        ("RLIMIT_NOFILE", "(100, 100)"),
    ]);
    // The sandbox's pid 1 shares the uid (+1), and with a pids cgroup the rlimit sits one
    // above the cgroup's limit (+1) so that the cgroup is the one that refuses, and counts the
    // refusal; CPU seconds are a backstop.
    assert_eq!(r.out("RLIMIT_NPROC"), "(22, 22)");
    let cpu = r.out("RLIMIT_CPU");
    assert!(cpu != "(-1, -1)", "RLIMIT_CPU is unlimited");
}

#[test]
fn cpu_bandwidth_is_capped_by_cpus() {
    // Five processes spin for 2 s of wall time. With --cpus 0.5 they share half a core, so the
    // CPU time stays near 1 s whatever the host has. Loose bounds: this is about enforcement,
    // not speed.
    let r = run(
        "python",
        r#"
import os, time
def burn():
    t = time.time()
    while time.time() - t < 2:
        pass
kids = []
for i in range(4):
    p = os.fork()
    if p == 0:
        burn()
        os._exit(0)
    kids.append(p)
burn()
for p in kids:
    os.waitpid(p, 0)
"#,
        &["--cpus", "0.5", "--timeout", "20"],
    );
    r.assert_ok();
    let cpu = r.verdict["usage"]["cpu_time"].as_f64().unwrap();
    let wall = r.execution_time();
    let ratio = cpu / wall;
    assert!(
        ratio <= 0.65,
        "cpu {cpu} s over {wall} s = {ratio:.2} cores with --cpus 0.5"
    );
    assert!(
        cpu >= 0.5,
        "the CPU time is counted for all processes: {cpu}"
    );
}

#[test]
fn stdin_file_is_fed_to_the_program() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input.txt");
    std::fs::write(&input, "line one\nline two\n").unwrap();
    let r = run(
        "python",
        "import sys\ndata = sys.stdin.read()\nprint(repr(data))\nprint(len(data.splitlines()))",
        &["--stdin", input.to_str().unwrap()],
    );
    r.assert_ok();
    assert_eq!(r.stdout(), "'line one\\nline two\\n'\n2\n");
}

#[test]
fn without_stdin_the_program_reads_eof() {
    let r = run(
        "python",
        "import sys\nprint(repr(sys.stdin.read()))",
        &["--timeout", "5"],
    );
    r.assert_ok();
    assert_eq!(r.stdout(), "''\n");
}

#[test]
fn signals_give_128_plus_n() {
    for (code, sig, name) in [
        (
            "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)",
            15,
            "SIGTERM",
        ),
        ("import ctypes\nctypes.string_at(0)", 11, "SIGSEGV"),
        ("import os\nos.abort()", 6, "SIGABRT"),
    ] {
        let r = run("python", code, &[]);
        r.assert_category("runtime_error");
        assert_eq!(r.exit_code(), Some(128 + sig), "{name}: {:#}", r.verdict);
        assert_eq!(r.code, Some(128 + sig as i32));
        assert!(r.message().contains(name), "{}", r.message());
    }
}

/// The parent cgroup every run's group is made in has a memory limit that leaves the host a
/// reserve (before, it had none: one run's tmpfs, or many runs at once, could push the host
/// itself into OOM).
#[test]
#[cfg_attr(not(host_root), ignore = "needs root (runcell's own cgroups)")]
fn all_runs_together_leave_the_host_a_reserve() {
    run("bash", "true", &[]).assert_ok();
    let total_kb: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    let total = total_kb * 1024;
    let limit_file = [
        "/sys/fs/cgroup/memory/runcell/memory.limit_in_bytes",
        "/sys/fs/cgroup/runcell/memory.max",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists())
    .expect("runcell's parent cgroup");
    let limit: u64 = std::fs::read_to_string(limit_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap_or(u64::MAX);
    let reserve = (total / 8).max(1 << 30).min(total / 2);
    // The kernel rounds a limit down to whole pages.
    assert!(
        limit <= total - reserve && limit > total - reserve - 4096,
        "{limit_file}: {limit} for {total} bytes of memory"
    );
}

/// Reads and writes of the host's disk are throttled per run (before, a run that evicted host
/// files from the page cache and reread them took the disk from everyone): the run's group
/// carries its `io_read` and `io_write` for the disk the host's files are on.
#[test]
#[cfg_attr(not(host_root), ignore = "needs root (runcell's own cgroups)")]
fn reads_and_writes_of_the_hosts_disk_are_throttled() {
    let tag = unique_digits();
    let p = spawn(
        "bash",
        &format!("exec -a sleep-{tag} sleep 30"),
        &[
            "--limit",
            "io_read=8M",
            "--limit",
            "io_write=4M",
            "--timeout",
            "3",
        ],
    );
    assert!(
        wait_for_marker(&tag, START_WITHIN),
        "the program never ran (test is void)"
    );
    let groups: Vec<std::path::PathBuf> =
        ["/sys/fs/cgroup/blkio/runcell", "/sys/fs/cgroup/runcell"]
            .iter()
            .filter_map(|base| std::fs::read_dir(base).ok())
            .flat_map(|rd| rd.flatten().map(|e| e.path()))
            .filter(|d| {
                d.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(&format!("{}-", p.pid)))
            })
            .collect();
    let settings: String = groups
        .iter()
        .flat_map(|g| {
            [
                "blkio.throttle.read_bps_device",
                "blkio.throttle.write_bps_device",
                "io.max",
            ]
            .map(|f| std::fs::read_to_string(g.join(f)).unwrap_or_default())
        })
        .collect();
    let r = p.finish();
    r.assert_category("timeout");
    assert!(
        settings.contains(" 8388608") || settings.contains("rbps=8388608"),
        "{groups:?}: {settings:?}"
    );
    assert!(
        settings.contains(" 4194304") || settings.contains("wbps=4194304"),
        "{settings:?}"
    );
}
