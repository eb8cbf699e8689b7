//! What the tests against a real cgroup hierarchy share (`real_v1_tests`, `real_v2_tests`):
//! a manager discovered from the host's own mount table, a child process that waits to be put
//! in a group before it does anything, and cleanup guards that run even when an assertion
//! fails.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::{Cgroup, CgroupManager, CgroupVersion};

pub(super) const PYTHON: &str = "/usr/bin/python3";

/// The manager for a test, plus cleanup of its base dirs on drop (declare it first so it
/// is dropped last, after the groups below it are gone).
pub(super) struct Fixture {
    pub(super) manager: CgroupManager,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        for base in self.manager.base_dirs() {
            // rmdir only succeeds on an empty group, which is exactly the intent.
            let _ = std::fs::remove_dir(&base);
        }
    }
}

/// The manager for a test, under its own base group (`runcell-test-base-<test>-<pid>`). The
/// build-time probe said this host has root and a `version` memory hierarchy; if that no
/// longer holds (built elsewhere, or as another user), fail loudly.
pub(super) fn fixture(version: CgroupVersion, test: &str) -> Fixture {
    assert!(
        rustix::process::geteuid().is_root(),
        "{test}: built for root (cfg host_root) but running as another user; rebuild"
    );
    let base = format!("runcell-test-base-{test}-{}", std::process::id());
    let manager = CgroupManager::discover(
        Path::new("/proc/self/mountinfo"),
        Path::new("/proc/self/cgroup"),
        &base,
    )
    .expect("discover")
    .unwrap_or_else(|| panic!("a usable hierarchy on a root {version} host"));
    assert_eq!(manager.version(), version);
    Fixture { manager }
}

/// Kills and reaps the child if the test bails out early.
pub(super) struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl ChildGuard {
    pub(super) fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Lets a `sh -c 'read x; ...'` child continue past its `read`.
    pub(super) fn release(&mut self) {
        let stdin = self.0.stdin.as_mut().expect("piped stdin");
        stdin.write_all(b"go\n").expect("write to child");
        stdin.flush().expect("flush");
    }

    pub(super) fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.0.try_wait().expect("try_wait") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A shell that waits for a line on stdin before running `script`, so it can be put in
/// the group before it does anything interesting.
pub(super) fn gated_shell(script: &str) -> ChildGuard {
    let child = Command::new("/bin/sh")
        .arg("-c")
        .arg(format!("read x; {script}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn sh");
    ChildGuard(child)
}

pub(super) fn read_trimmed(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
        .trim()
        .to_owned()
}

pub(super) fn dirs_of(group: &Cgroup) -> Vec<PathBuf> {
    group
        .procs_files()
        .iter()
        .map(|f| f.parent().expect("dir").to_path_buf())
        .collect()
}
