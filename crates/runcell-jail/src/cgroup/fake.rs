//! A fake cgroupfs for unit tests: real directories and plain files in a temp dir, plus
//! the kernel's side effects that the manager relies on:
//!
//! * `mkdir` populates the interface files of the hierarchy (on v2 only for the
//!   controllers the parent enabled in `cgroup.subtree_control`);
//! * writes to `cgroup.subtree_control` apply `+ctrl` tokens (failing with ENOENT for a
//!   controller the group does not have, like the kernel), `cgroup.procs` moves a pid (out
//!   of every other group of the hierarchy), `cgroup.kill` empties the group,
//!   `cgroup.freeze` updates `cgroup.events`;
//! * v2's *no internal processes* rule: a group other than the hierarchy's root (one with
//!   `cgroup.type`) refuses with EBUSY to enable controllers while it holds processes, and
//!   to take processes while it distributes controllers;
//! * `rmdir` fails with EBUSY while pids or child groups remain, otherwise removes the
//!   files with the directory;
//! * `kill` records the pid and removes it from every `cgroup.procs`.
//!
//! Every effect is logged so tests can assert order.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::fs::CgroupFs;

#[derive(Debug, Clone, Copy)]
pub(crate) struct V2Features {
    pub kill: bool,
    pub swap: bool,
    pub peak: bool,
    pub oom_group: bool,
    pub freeze: bool,
}

impl V2Features {
    /// A current kernel with swap accounting.
    pub const MODERN: V2Features = V2Features {
        kill: true,
        swap: true,
        peak: true,
        oom_group: true,
        freeze: true,
    };
}

#[derive(Debug, Clone)]
enum Kind {
    V2(V2Features),
    V1 {
        controllers: Vec<String>,
        memsw: bool,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    Mkdir(PathBuf),
    Rmdir(PathBuf),
    Write(PathBuf, String),
    Kill(u32),
}

#[derive(Debug, Default)]
pub(crate) struct FakeFs {
    roots: Vec<(PathBuf, Kind)>,
    log: Mutex<Vec<Event>>,
    not_writable: Mutex<Vec<PathBuf>>,
    failing_files: Mutex<Vec<String>>,
}

/// Create interface files; those that exist keep their content (a group whose parent enables
/// a controller later gets the new controller's files, as the kernel gives them).
fn write_files(dir: &Path, files: &[(&str, &str)]) {
    for (name, content) in files {
        let path = dir.join(name);
        if !path.exists() {
            fs::write(path, content).expect("fake: write file");
        }
    }
}

fn busy() -> io::Error {
    io::Error::from_raw_os_error(libc::EBUSY)
}

impl FakeFs {
    pub fn new() -> FakeFs {
        FakeFs::default()
    }

    /// A v2 mount root at `root` offering `controllers` (space separated).
    pub fn add_v2_root(&mut self, root: &Path, controllers: &str, features: V2Features) {
        fs::create_dir_all(root).expect("fake: create root");
        write_files(
            root,
            &[
                ("cgroup.controllers", controllers),
                ("cgroup.subtree_control", ""),
                ("cgroup.procs", ""),
                ("cpu.stat", "usage_usec 0\n"),
            ],
        );
        self.roots.push((root.to_path_buf(), Kind::V2(features)));
    }

    /// A v1 hierarchy root at `root` with `controllers` co-mounted.
    pub fn add_v1_root(&mut self, root: &Path, controllers: &[&str], memsw: bool) {
        fs::create_dir_all(root).expect("fake: create root");
        let kind = Kind::V1 {
            controllers: controllers.iter().map(|c| (*c).to_owned()).collect(),
            memsw,
        };
        populate(root, &kind);
        if controllers.contains(&"cpuset") {
            fs::write(root.join("cpuset.cpus"), "0-7\n").expect("fake: write file");
            fs::write(root.join("cpuset.mems"), "0\n").expect("fake: write file");
        }
        self.roots.push((root.to_path_buf(), kind));
    }

    pub fn deny_write(&self, path: &Path) {
        lock(&self.not_writable).push(path.to_path_buf());
    }

    /// Writes to files named `file_name` fail with EINVAL from now on.
    pub fn fail_writes_to(&self, file_name: &str) {
        lock(&self.failing_files).push(file_name.to_owned());
    }

    pub fn events(&self) -> Vec<Event> {
        lock(&self.log).clone()
    }

    pub fn writes_to(&self, file_name: &str) -> Vec<(PathBuf, String)> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Event::Write(p, v) if p.file_name().is_some_and(|n| n == file_name) => Some((p, v)),
                _ => None,
            })
            .collect()
    }

    pub fn killed(&self) -> Vec<u32> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Event::Kill(pid) => Some(pid),
                _ => None,
            })
            .collect()
    }

    fn kind_for(&self, path: &Path) -> Option<&Kind> {
        self.roots
            .iter()
            .filter(|(root, _)| path.starts_with(root))
            .max_by_key(|(root, _)| root.components().count())
            .map(|(_, kind)| kind)
    }

    fn is_v2_root(&self, dir: &Path) -> bool {
        self.roots
            .iter()
            .any(|(root, kind)| root == dir && matches!(kind, Kind::V2(_)))
    }

    /// v2 `cgroup.controllers` is not stored: it always mirrors the parent's
    /// `cgroup.subtree_control` (roots keep the fixed list they were made with).
    fn v2_available(&self, dir: &Path) -> io::Result<String> {
        match (self.kind_for(dir), dir.parent()) {
            (Some(Kind::V2(_)), Some(parent)) if !self.is_v2_root(dir) => {
                fs::read_to_string(parent.join("cgroup.subtree_control"))
            }
            _ => fs::read_to_string(dir.join("cgroup.controllers")),
        }
    }

    /// A v2 group the no-internal-processes rule binds: any but the hierarchy's root, which
    /// the kernel marks by giving every other group a `cgroup.type`.
    fn v2_non_root(&self, dir: &Path) -> bool {
        matches!(self.kind_for(dir), Some(Kind::V2(_))) && dir.join("cgroup.type").is_file()
    }

    /// The root of the hierarchy `dir` is in (the innermost one the fake was given).
    fn root_for(&self, dir: &Path) -> Option<&Path> {
        self.roots
            .iter()
            .filter(|(root, _)| dir.starts_with(root))
            .max_by_key(|(root, _)| root.components().count())
            .map(|(root, _)| root.as_path())
    }

    fn record(&self, event: Event) {
        lock(&self.log).push(event);
    }

    fn remove_pid_everywhere(&self, pid: u32) {
        for (root, _) in &self.roots {
            remove_pid_below(root, pid);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn remove_pid_below(dir: &Path, pid: u32) {
    let procs = dir.join("cgroup.procs");
    if let Ok(content) = fs::read_to_string(&procs) {
        let kept: String = content
            .lines()
            .filter(|l| l.trim().parse::<u32>().ok() != Some(pid))
            .map(|l| format!("{l}\n"))
            .collect();
        fs::write(&procs, kept).expect("fake: rewrite procs");
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_pid_below(&entry.path(), pid);
            }
        }
    }
}

/// The interface files the kernel creates in a new group.
fn populate(dir: &Path, kind: &Kind) {
    match kind {
        Kind::V2(features) => {
            let parent = dir.parent().expect("fake: group has a parent");
            let enabled =
                fs::read_to_string(parent.join("cgroup.subtree_control")).unwrap_or_default();
            let on = |c: &str| enabled.split_whitespace().any(|e| e == c);
            write_files(
                dir,
                &[
                    ("cgroup.controllers", enabled.trim()),
                    ("cgroup.subtree_control", ""),
                    ("cgroup.procs", ""),
                    ("cgroup.type", "domain\n"),
                    ("cgroup.events", "populated 0\nfrozen 0\n"),
                    ("cpu.stat", "usage_usec 0\nuser_usec 0\nsystem_usec 0\n"),
                ],
            );
            if features.kill {
                write_files(dir, &[("cgroup.kill", "")]);
            }
            if features.freeze {
                write_files(dir, &[("cgroup.freeze", "0\n")]);
            }
            if on("memory") {
                write_files(
                    dir,
                    &[
                        ("memory.max", "max\n"),
                        ("memory.current", "0\n"),
                        (
                            "memory.events",
                            "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
                        ),
                    ],
                );
                if features.swap {
                    write_files(dir, &[("memory.swap.max", "max\n")]);
                }
                if features.peak {
                    write_files(dir, &[("memory.peak", "0\n")]);
                }
                if features.oom_group {
                    write_files(dir, &[("memory.oom.group", "0\n")]);
                }
            }
            if on("pids") {
                write_files(
                    dir,
                    &[
                        ("pids.max", "max\n"),
                        ("pids.current", "0\n"),
                        ("pids.events", "max 0\n"),
                    ],
                );
            }
            if on("io") {
                write_files(dir, &[("io.max", "")]);
            }
            if on("cpu") {
                write_files(dir, &[("cpu.max", "max 100000\n"), ("cpu.weight", "100\n")]);
            }
        }
        Kind::V1 { controllers, memsw } => {
            write_files(
                dir,
                &[
                    ("cgroup.procs", ""),
                    ("tasks", ""),
                    ("notify_on_release", "0\n"),
                ],
            );
            for controller in controllers {
                match controller.as_str() {
                    "memory" => {
                        write_files(
                            dir,
                            &[
                                ("memory.limit_in_bytes", "9223372036854771712\n"),
                                ("memory.max_usage_in_bytes", "0\n"),
                                ("memory.usage_in_bytes", "0\n"),
                                ("memory.failcnt", "0\n"),
                                (
                                    "memory.oom_control",
                                    "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
                                ),
                            ],
                        );
                        if *memsw {
                            write_files(
                                dir,
                                &[
                                    ("memory.memsw.limit_in_bytes", "9223372036854771712\n"),
                                    ("memory.memsw.max_usage_in_bytes", "0\n"),
                                ],
                            );
                        }
                        // Like memsw, present in the standard fake and absent in the other.
                        if *memsw {
                            write_files(
                                dir,
                                &[("memory.kmem.tcp.limit_in_bytes", "9223372036854771712\n")],
                            );
                        }
                    }
                    "pids" => write_files(
                        dir,
                        &[
                            ("pids.max", "max\n"),
                            ("pids.current", "0\n"),
                            ("pids.events", "max 0\n"),
                        ],
                    ),
                    "cpu" => write_files(
                        dir,
                        &[
                            ("cpu.cfs_period_us", "100000\n"),
                            ("cpu.cfs_quota_us", "-1\n"),
                            ("cpu.shares", "1024\n"),
                        ],
                    ),
                    "cpuacct" => write_files(dir, &[("cpuacct.usage", "0\n")]),
                    "freezer" => write_files(dir, &[("freezer.state", "THAWED\n")]),
                    "blkio" => write_files(
                        dir,
                        &[
                            ("blkio.throttle.read_bps_device", ""),
                            ("blkio.throttle.write_bps_device", ""),
                            ("blkio.throttle.read_iops_device", ""),
                            ("blkio.throttle.write_iops_device", ""),
                        ],
                    ),
                    "cpuset" => {
                        write_files(dir, &[("cpuset.cpus", "\n"), ("cpuset.mems", "\n")]);
                    }
                    _ => {}
                }
            }
        }
    }
}

impl CgroupFs for FakeFs {
    fn mkdir(&self, path: &Path) -> io::Result<()> {
        fs::create_dir(path)?;
        self.record(Event::Mkdir(path.to_path_buf()));
        if let Some(kind) = self.kind_for(path) {
            populate(path, kind);
        }
        Ok(())
    }

    fn rmdir(&self, path: &Path) -> io::Result<()> {
        if !path.is_dir() {
            return Err(io::ErrorKind::NotFound.into());
        }
        for entry in fs::read_dir(path)? {
            if entry?.file_type()?.is_dir() {
                return Err(busy());
            }
        }
        let procs = fs::read_to_string(path.join("cgroup.procs")).unwrap_or_default();
        if !procs.trim().is_empty() {
            return Err(busy());
        }
        fs::remove_dir_all(path)?;
        self.record(Event::Rmdir(path.to_path_buf()));
        Ok(())
    }

    fn read(&self, path: &Path) -> io::Result<String> {
        let dir = path.parent().expect("fake: file has a parent");
        if path.file_name().is_some_and(|n| n == "cgroup.controllers") && path.is_file() {
            return self.v2_available(dir);
        }
        fs::read_to_string(path)
    }

    fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        if !path.is_file() {
            return Err(io::ErrorKind::NotFound.into());
        }
        let dir = path.parent().expect("fake: file has a parent");
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if lock(&self.failing_files).iter().any(|f| f == name) {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        self.record(Event::Write(path.to_path_buf(), value.to_owned()));
        match name {
            "cgroup.subtree_control" => {
                let has_procs = fs::read_to_string(dir.join("cgroup.procs"))
                    .is_ok_and(|p| !p.trim().is_empty());
                if value.contains('+') && has_procs && self.v2_non_root(dir) {
                    return Err(busy());
                }
                let available = self.v2_available(dir)?;
                let mut enabled: Vec<String> = fs::read_to_string(path)?
                    .split_whitespace()
                    .map(str::to_owned)
                    .collect();
                for token in value.split_whitespace() {
                    let (add, controller) = match token.split_at(1) {
                        ("+", c) => (true, c),
                        ("-", c) => (false, c),
                        _ => return Err(io::ErrorKind::InvalidInput.into()),
                    };
                    if !available.split_whitespace().any(|a| a == controller) {
                        return Err(io::ErrorKind::NotFound.into());
                    }
                    enabled.retain(|e| e != controller);
                    if add {
                        enabled.push(controller.to_owned());
                    }
                }
                fs::write(path, enabled.join(" "))?;
                // The children that exist get the enabled controllers' files.
                if let Some(kind) = self.kind_for(dir) {
                    for child in fs::read_dir(dir)?.flatten() {
                        if child.path().is_dir() {
                            populate(&child.path(), kind);
                        }
                    }
                }
                Ok(())
            }
            "cgroup.procs" => {
                let pid: u32 = value
                    .trim()
                    .parse()
                    .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
                let distributes = fs::read_to_string(dir.join("cgroup.subtree_control"))
                    .is_ok_and(|c| !c.trim().is_empty());
                if distributes && self.v2_non_root(dir) {
                    return Err(busy());
                }
                // A process is in exactly one group of a hierarchy: it leaves the old one.
                if let Some(root) = self.root_for(dir) {
                    remove_pid_below(root, pid);
                }
                let mut content = fs::read_to_string(path)?;
                content.push_str(&format!("{pid}\n"));
                fs::write(path, content)
            }
            "cgroup.kill" => fs::write(dir.join("cgroup.procs"), ""),
            "cgroup.freeze" => {
                fs::write(path, value)?;
                fs::write(
                    dir.join("cgroup.events"),
                    format!("populated 1\nfrozen {}\n", value.trim()),
                )
            }
            _ => fs::write(path, value),
        }
    }

    fn writable(&self, path: &Path) -> bool {
        path.exists() && !lock(&self.not_writable).iter().any(|p| p == path)
    }

    fn kill(&self, pid: u32) -> io::Result<()> {
        self.record(Event::Kill(pid));
        self.remove_pid_everywhere(pid);
        Ok(())
    }
}
