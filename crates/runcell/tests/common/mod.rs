//! Shared helpers for the integration tests: run the real `runcell` binary, parse its verdict,
//! and check from the host that nothing of the run was left behind.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod upstream;

/// The margin a time bound allows on top of the limit under test: runcell's start-up, the
/// sandbox's setup and teardown, and the scheduling delays of a loaded 2-core machine (the
/// tests run in parallel, next to other builds). A run limited to `T` must end within
/// `T + LOADED_MARGIN`; a run that must stop early (at a cap, at a kill) within
/// `LOADED_MARGIN`; a process that must be gone is polled for up to `LOADED_MARGIN`.
pub const LOADED_MARGIN: Duration = Duration::from_secs(5);

/// How long a test waits for something it started to show up (a sandboxed process, a server
/// listening) before it gives up: protection against a hang, not a measurement.
pub const START_WITHIN: Duration = Duration::from_secs(10);

pub fn runcell_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_runcell"))
}

/// The result of one `runcell run --json`.
#[derive(Debug)]
pub struct Run {
    pub verdict: Value,
    /// runcell's own exit code.
    pub code: Option<i32>,
    /// The supervisor's pid (cgroups are named after it).
    pub pid: u32,
    /// What runcell printed on its own stderr (must be empty with --json).
    pub stderr: String,
    /// Wall-clock time runcell took, measured by the test.
    pub elapsed: Duration,
}

impl Run {
    pub fn stdout(&self) -> &str {
        self.verdict["stdout"].as_str().unwrap_or_default()
    }
    pub fn stderr_out(&self) -> &str {
        self.verdict["stderr"].as_str().unwrap_or_default()
    }
    pub fn exit_code(&self) -> Option<i64> {
        self.verdict["exit_code"].as_i64()
    }
    /// The error category, or "ok".
    pub fn category(&self) -> &str {
        self.verdict["error"]["category"].as_str().unwrap_or("ok")
    }
    pub fn message(&self) -> &str {
        self.verdict["error"]["message"]
            .as_str()
            .unwrap_or_default()
    }
    /// Panic with the whole verdict unless the run succeeded.
    pub fn assert_ok(&self) -> &Self {
        assert_eq!(self.category(), "ok", "verdict: {:#}", self.verdict);
        assert_eq!(self.exit_code(), Some(0), "verdict: {:#}", self.verdict);
        self
    }
    pub fn assert_category(&self, cat: &str) -> &Self {
        assert_eq!(self.category(), cat, "verdict: {:#}", self.verdict);
        self
    }
    pub fn execution_time(&self) -> f64 {
        self.verdict["execution_time"]
            .as_f64()
            .expect("execution_time is a number")
    }
    /// The `label=value` lines the program printed (see `PY` and the other preludes).
    pub fn outcomes(&self) -> BTreeMap<String, String> {
        self.stdout()
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect()
    }
    /// The value the program printed for `label`; panics with the verdict if it did not.
    pub fn out(&self, label: &str) -> String {
        self.outcomes().remove(label).unwrap_or_else(|| {
            panic!(
                "the program printed no {label}=...; verdict: {:#}",
                self.verdict
            )
        })
    }
    /// Check many `label=value` outcomes at once and report every mismatch together.
    pub fn expect(&self, expected: &[(&str, &str)]) -> &Self {
        let got = self.outcomes();
        let bad: Vec<String> = expected
            .iter()
            .filter(|(k, v)| got.get(*k).map(String::as_str) != Some(*v))
            .map(|(k, v)| format!("{k}: expected {v}, got {:?}", got.get(*k)))
            .collect();
        assert!(
            bad.is_empty(),
            "{}\nverdict: {:#}",
            bad.join("\n"),
            self.verdict
        );
        self
    }
}

/// Run `code` in `lang` with extra CLI arguments, wait, and check the host afterwards.
pub fn run(lang: &str, code: &str, extra: &[&str]) -> Run {
    run_with(lang, code, extra, |_| {})
}

/// Like `run`, with a hook to adjust the command (environment, stdin).
pub fn run_with(lang: &str, code: &str, extra: &[&str], adjust: impl FnOnce(&mut Command)) -> Run {
    spawn_with(lang, code, extra, adjust).finish()
}

/// `runcell run --json ARGS...` (no --lang/-c added), waited for and checked like `run`.
pub fn run_args(args: &[&str], adjust: impl FnOnce(&mut Command)) -> Run {
    let mut cmd = Command::new(runcell_bin());
    cmd.args(["run", "--json"]).args(args);
    spawn_cmd(cmd, adjust).finish()
}

/// Run an arbitrary command line that ends up exec'ing runcell with `--json` (e.g. through
/// `setpriv`), waited for and checked like `run`. `argv[0]` is the program.
pub fn run_argv(argv: &[String], adjust: impl FnOnce(&mut Command)) -> Run {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    spawn_cmd(cmd, adjust).finish()
}

/// Like `run_argv`, not waited for: to act on the started process (write its user
/// namespace's id maps, say) before `finish`.
pub fn spawn_argv(argv: &[String], adjust: impl FnOnce(&mut Command)) -> Pending {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    spawn_cmd(cmd, adjust)
}

/// A run that was started and not yet waited for (to watch the host while it runs).
pub struct Pending {
    child: Child,
    pub pid: u32,
    mounts_before: BTreeSet<String>,
    started: Instant,
}

impl Pending {
    /// Wait for runcell, parse its verdict and check the host is clean.
    pub fn finish(self) -> Run {
        let Pending {
            child,
            pid,
            mounts_before,
            started,
        } = self;
        let out = child.wait_with_output().expect("wait runcell");
        let elapsed = started.elapsed();
        let mut run = parse(out, pid);
        run.elapsed = elapsed;
        assert_host_clean(pid);
        assert_eq!(
            mounts_before,
            host_mounts(),
            "the host's mount table changed"
        );
        run
    }

    /// Kill runcell itself (the supervisor) with SIGKILL and reap it; no verdict.
    pub fn kill_supervisor(mut self) -> std::process::ExitStatus {
        self.child.kill().expect("SIGKILL runcell");
        self.child.wait().expect("reap runcell")
    }
}

/// Start `runcell run --json --lang LANG -c CODE EXTRA...` without waiting.
pub fn spawn(lang: &str, code: &str, extra: &[&str]) -> Pending {
    spawn_with(lang, code, extra, |_| {})
}

pub fn spawn_with(
    lang: &str,
    code: &str,
    extra: &[&str],
    adjust: impl FnOnce(&mut Command),
) -> Pending {
    let mut cmd = Command::new(runcell_bin());
    cmd.args(["run", "--json", "--lang", lang, "-c", code])
        .args(extra);
    spawn_cmd(cmd, adjust)
}

fn spawn_cmd(mut cmd: Command, adjust: impl FnOnce(&mut Command)) -> Pending {
    let mounts_before = host_mounts();
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    adjust(&mut cmd);
    let started = Instant::now();
    let child = cmd.spawn().expect("spawn runcell");
    let pid = child.id();
    Pending {
        child,
        pid,
        mounts_before,
        started,
    }
}

/// Run runcell with `args` (no `--json` added) and return its raw output, after checking the
/// host is clean.
pub fn runcell_raw(args: &[&str], adjust: impl FnOnce(&mut Command)) -> Output {
    let mounts_before = host_mounts();
    let mut cmd = Command::new(runcell_bin());
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    adjust(&mut cmd);
    let child = cmd.spawn().expect("spawn runcell");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait runcell");
    assert_host_clean(pid);
    assert_eq!(
        mounts_before,
        host_mounts(),
        "the host's mount table changed"
    );
    out
}

fn parse(out: Output, pid: u32) -> Run {
    let stdout = String::from_utf8(out.stdout).expect("runcell's stdout is UTF-8");
    let verdict: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "--json must print exactly one JSON object ({e}); got stdout={stdout:?} stderr={:?}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(verdict.is_object());
    assert_eq!(
        stdout.trim().lines().count(),
        1,
        "exactly one JSON line: {stdout:?}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_no_panic(&stderr);
    Run {
        verdict,
        code: out.status.code(),
        pid,
        stderr,
        elapsed: Duration::ZERO,
    }
}

/// runcell's own stderr shows no Rust panic or backtrace hint.
pub fn assert_no_panic(stderr: &str) {
    assert!(
        !stderr.contains("panicked") && !stderr.contains("RUST_BACKTRACE"),
        "runcell panicked: {stderr}"
    );
}

/// The cgroup version runcell enforces with on the host the test runs on (`"v1"` or `"v2"`),
/// looked at when the test runs, not when it was built: scripts/cgroup-v2-guest.sh runs test
/// binaries built on a v1 host in a v2 guest. A unified hierarchy mounted at /sys/fs/cgroup
/// (it has `cgroup.controllers` at its root) is v2; a v1 or hybrid host has a tmpfs there
/// with the v1 hierarchies below it.
pub fn host_cgroup_version() -> &'static str {
    if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        "v2"
    } else {
        "v1"
    }
}

/// The cgroup v1 controller directories and the v2 root runcell uses on this host.
pub fn cgroup_roots() -> Vec<PathBuf> {
    let mut roots = Vec::new();
    for ctrl in ["memory", "pids", "cpu", "cpuacct", "freezer", "cpu,cpuacct"] {
        let p = Path::new("/sys/fs/cgroup").join(ctrl).join("runcell");
        if p.is_dir() {
            roots.push(p);
        }
    }
    let v2 = Path::new("/sys/fs/cgroup/runcell");
    if v2.join("cgroup.procs").exists() {
        roots.push(v2.to_path_buf());
    }
    roots
}

/// Nothing of the run of supervisor `pid` remains: no cgroup (runcell names them
/// "<pid>-<random>"), hence no process (a cgroup with processes cannot be removed), and no
/// process anywhere that still claims such a cgroup.
///
/// A supervisor still running keeps its templates (their groups end in "-template": the
/// processes sandboxes' interpreters are forked from); once it is gone, they must be too.
pub fn assert_host_clean(pid: u32) {
    let prefix = format!("{pid}-");
    let deadline = Instant::now() + LOADED_MARGIN;
    loop {
        let alive = Path::new(&format!("/proc/{pid}")).exists()
            && !fs::read_to_string(format!("/proc/{pid}/stat"))
                .unwrap_or_default()
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z');
        let kept = |name: &str| alive && name.ends_with("-template");
        let mut left = Vec::new();
        for root in cgroup_roots() {
            if let Ok(rd) = fs::read_dir(&root) {
                for e in rd.flatten() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if name.starts_with(&prefix) && !kept(&name) {
                        left.push(e.path());
                    }
                }
            }
        }
        let procs: Vec<u32> = processes_in_cgroup_prefix(&format!("/runcell/{prefix}"))
            .into_iter()
            .filter(|p| {
                let cg = fs::read_to_string(format!("/proc/{p}/cgroup")).unwrap_or_default();
                !(alive && cg.contains("-template"))
            })
            .collect();
        if left.is_empty() && procs.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            panic!("run of supervisor {pid} left cgroups {left:?} and processes {procs:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn processes_in_cgroup_prefix(needle: &str) -> Vec<u32> {
    let mut found = Vec::new();
    if let Ok(rd) = fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            if let Ok(cg) = fs::read_to_string(e.path().join("cgroup")) {
                if cg.contains(needle) {
                    found.push(pid);
                }
            }
        }
    }
    found
}

/// Host processes whose command line contains `marker`.
pub fn processes_with_marker(marker: &str) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    let me = std::process::id();
    if let Ok(rd) = fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            if pid == me {
                continue;
            }
            if let Ok(cmd) = fs::read(e.path().join("cmdline")) {
                let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
                if cmd.contains(marker) && !cmd.contains("runcell run") {
                    found.push((pid, cmd));
                }
            }
        }
    }
    found
}

/// The host's mount table (mount points and sources), to prove a run changed nothing.
pub fn host_mounts() -> BTreeSet<String> {
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // mount point and options, plus everything after the separator
            let sep = f.iter().position(|x| *x == "-").unwrap_or(f.len());
            format!(
                "{} {} {}",
                f.get(4).unwrap_or(&""),
                f.get(5).unwrap_or(&""),
                f[sep..].join(" ")
            )
        })
        .collect()
}

/// A unique marker for this test process (to find leftover processes by command line).
pub fn marker(tag: &str) -> String {
    format!("rcmark{}{}", tag, std::process::id())
}

pub fn have(bin: &str) -> bool {
    Path::new(bin).exists()
}

/// A string unique to this call (digits only, so it can be a `sleep` argument).
pub fn unique_digits() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{}{:04}{:09}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        nanos
    )
}

/// Poll until a host process whose command line contains `marker` exists.
pub fn wait_for_marker(marker: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if !processes_with_marker(marker).is_empty() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Poll until no host process carries `marker`; panics with the survivors otherwise.
pub fn assert_marker_gone(marker: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let left = processes_with_marker(marker);
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "processes survived the run: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A file on the host, removed when dropped.
pub struct HostFile {
    pub path: PathBuf,
}

impl HostFile {
    pub fn create(path: impl Into<PathBuf>, content: &[u8]) -> HostFile {
        let path = path.into();
        fs::write(&path, content).expect("create host file");
        HostFile { path }
    }
    pub fn path_str(&self) -> &str {
        self.path.to_str().expect("UTF-8 path")
    }
}

impl Drop for HostFile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// A host path the attack tried to create must not exist afterwards; removes it if it does,
/// then fails.
pub fn assert_not_on_host(path: &str) {
    let p = Path::new(path);
    if p.exists() || p.symlink_metadata().is_ok() {
        let _ = fs::remove_file(p);
        panic!("the sandbox created {path} on the host");
    }
}

/// Cgroup directories of supervisor `pid`'s sandboxes that exist right now (its templates'
/// groups, "<...>-template", are not sandboxes: docs/isolation.md, "Templates").
pub fn cgroups_of(pid: u32) -> Vec<PathBuf> {
    let prefix = format!("{pid}-");
    let mut found = Vec::new();
    for root in cgroup_roots() {
        if let Ok(rd) = fs::read_dir(&root) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with(&prefix) && !name.ends_with("-template") {
                    found.push(e.path());
                }
            }
        }
    }
    found
}

/// A process by pid and start time (field 22 of `/proc/<pid>/stat`), so that a reused pid is
/// never taken for the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ProcessId {
    pub pid: u32,
    pub start: u64,
}

/// The fields of `/proc/<pid>/stat` after the command name: state, ppid, ...
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// Every process supervisor `pid` runs sandboxes with, right now: its children (the
/// `runcell __jail` helpers) and every process in its runs' cgroups (each sandbox's pid 1, the
/// program, whatever it started).
pub fn sandbox_processes_of(pid: u32) -> BTreeSet<ProcessId> {
    let mut pids = BTreeSet::new();
    for group in cgroups_of(pid) {
        if let Ok(procs) = fs::read_to_string(group.join("cgroup.procs")) {
            pids.extend(procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
    }
    if let Ok(rd) = fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Ok(child) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            if stat_fields(child).and_then(|f| f.get(1)?.parse::<u32>().ok()) == Some(pid) {
                pids.insert(child);
            }
        }
    }
    pids.into_iter()
        .filter_map(|p| {
            let start = stat_fields(p)?.get(19)?.parse().ok()?;
            Some(ProcessId { pid: p, start })
        })
        .collect()
}

/// Poll until none of `procs` runs any more (gone, a zombie, or its pid reused); panics with
/// the survivors otherwise.
pub fn assert_processes_gone(procs: &BTreeSet<ProcessId>, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let alive: Vec<(ProcessId, String)> = procs
            .iter()
            .filter_map(|p| {
                let f = stat_fields(p.pid)?;
                let same = f.get(19).and_then(|s| s.parse::<u64>().ok()) == Some(p.start);
                let running = f.first().is_some_and(|state| state != "Z" && state != "X");
                let cmd = fs::read(format!("/proc/{}/cmdline", p.pid)).unwrap_or_default();
                (same && running).then(|| (*p, String::from_utf8_lossy(&cmd).replace('\0', " ")))
            })
            .collect();
        if alive.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "sandbox processes survived their supervisor: {alive:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Python prelude for attack programs: each probe prints one `label=OUTCOME` line, where
/// OUTCOME is `OK`, an errno name (`EPERM`, `ENOENT`...), or for reads `EMPTY`/`DATA`.
pub const PY: &str = r#"
import ctypes, errno, json, os, signal, socket, sys, time
def _en(n):
    return errno.errorcode.get(n, str(n))
def attempt(label, f):
    try:
        r = f()
    except OSError as e:
        print(f"{label}={_en(e.errno)}", flush=True)
        return None
    print(f"{label}=OK", flush=True)
    return r
def read(label, path):
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as e:
        print(f"{label}={_en(e.errno)}", flush=True)
        return None
    print(f"{label}={'DATA' if data else 'EMPTY'}", flush=True)
    return data
def write(label, path, data=b"x"):
    def w():
        with open(path, "wb") as fh:
            fh.write(data)
    return attempt(label, w)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(label, nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    print(f"{label}={'OK' if r >= 0 else _en(ctypes.get_errno())}", flush=True)
    return r
"#;

/// `PY` followed by `body`.
pub fn py(body: &str) -> String {
    format!("{PY}\n{body}")
}

/// `runcell serve` as a child process on a free loopback port (`--listen 127.0.0.1:0`, the
/// port read from its log), with its stderr collected. Killed when dropped; a panic in its log
/// fails the test.
pub struct ServeProcess {
    pub child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl ServeProcess {
    /// Start it with `args`, in an environment without runcell's server variables plus `env`.
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> ServeProcess {
        ServeProcess::start_via(&[], "127.0.0.1:0", args, env)
    }

    /// As [`ServeProcess::start`], listening on `listen`.
    pub fn start_on(listen: &str, args: &[&str], env: &[(&str, &str)]) -> ServeProcess {
        ServeProcess::start_via(&[], listen, args, env)
    }

    /// Start it through `wrapper` (a command that ends by exec'ing its arguments: a shell that
    /// first moves itself into a cgroup, `unshare`, ...), listening on `listen`.
    pub fn start_via(
        wrapper: &[&str],
        listen: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> ServeProcess {
        use std::io::{BufRead, BufReader};
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(runcell_bin());
                c
            }
            None => Command::new(runcell_bin()),
        };
        cmd.args(["serve", "--listen", listen]).args(args);
        for var in [
            "RUNCELL_API_KEY",
            "RUNCELL_LISTEN",
            "RUNCELL_CONFIG",
            "RUNCELL_MAX_LIMITS",
            "RUNCELL_DEFAULT_LIMITS",
            "RUNCELL_CAPS",
            "RUNCELL_AUDIT_LOG",
            "RUNCELL_POD_NAME",
            "RUNCELL_CLUSTER_KEY",
            "RUNCELL_CLUSTER_PEER_URL",
            "RUNCELL_CLUSTER_PEERS",
        ] {
            cmd.env_remove(var);
        }
        cmd.envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start runcell serve");
        let stderr = child.stderr.take().unwrap();
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let log2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let addr = rest.split_whitespace().next().unwrap_or("").to_string();
                    let _ = tx.send(addr);
                }
                log2.lock().unwrap().push_str(&(line + "\n"));
            }
        });
        let addr = rx
            .recv_timeout(START_WITHIN)
            .unwrap_or_else(|_| panic!("server did not start: {}", log.lock().unwrap()));
        ServeProcess {
            child,
            base: format!("http://{addr}"),
            log,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn port(&self) -> &str {
        self.base.rsplit(':').next().unwrap()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// SIGTERM, then its exit status (panics if it takes longer than `within`).
    pub fn terminate(&mut self, within: Duration) -> std::process::ExitStatus {
        let ok = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok);
        let deadline = Instant::now() + within;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "server did not exit: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ServeProcess {
    /// Stops the server as an operator would (SIGTERM: it destroys its warm sandboxes on the
    /// way out), and kills it should it not be gone within a few seconds.
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let log = self.log();
        assert!(!log.contains("panicked"), "the server panicked: {log}");
    }
}
