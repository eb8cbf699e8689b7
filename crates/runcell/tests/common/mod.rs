//! Shared helpers for the integration tests: run the real `runcell` binary, parse its verdict,
//! and check from the host that nothing of the run was left behind.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

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
        self.verdict["error"]["message"].as_str().unwrap_or_default()
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
}

/// Run `code` in `lang` with extra CLI arguments, wait, and check the host afterwards.
pub fn run(lang: &str, code: &str, extra: &[&str]) -> Run {
    run_with(lang, code, extra, |_| {})
}

/// Like `run`, with a hook to adjust the command (environment, stdin).
pub fn run_with(lang: &str, code: &str, extra: &[&str], adjust: impl FnOnce(&mut Command)) -> Run {
    let mounts_before = host_mounts();
    let mut cmd = Command::new(runcell_bin());
    cmd.args(["run", "--json", "--lang", lang, "-c", code])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    adjust(&mut cmd);
    let child = cmd.spawn().expect("spawn runcell");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait runcell");
    let run = parse(out, pid);
    assert_host_clean(pid);
    assert_eq!(mounts_before, host_mounts(), "the host's mount table changed");
    run
}

fn parse(out: Output, pid: u32) -> Run {
    let stdout = String::from_utf8(out.stdout).expect("runcell's stdout is UTF-8");
    let verdict: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!("--json must print exactly one JSON object ({e}); got stdout={stdout:?}")
    });
    assert!(verdict.is_object());
    Run {
        verdict,
        code: out.status.code(),
        pid,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
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
pub fn assert_host_clean(pid: u32) {
    let prefix = format!("{pid}-");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut left = Vec::new();
        for root in cgroup_roots() {
            if let Ok(rd) = fs::read_dir(&root) {
                for e in rd.flatten() {
                    if e.file_name().to_string_lossy().starts_with(&prefix) {
                        left.push(e.path());
                    }
                }
            }
        }
        let procs = processes_in_cgroup_prefix(&format!("/runcell/{prefix}"));
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
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
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
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
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
            format!("{} {} {}", f.get(4).unwrap_or(&""), f.get(5).unwrap_or(&""), f[sep..].join(" "))
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
