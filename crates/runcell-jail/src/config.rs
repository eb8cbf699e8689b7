//! What the supervisor tells the helper processes: the sandbox to build ([`JailConfig`]) and
//! each program to run in it ([`ExecStep`]). Both are plain data, serialised over the control
//! socket, and fully resolved by the supervisor (host paths checked, limits validated) before
//! any process is created.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The uid and gid the sandboxed code runs as, inside its user namespace.
pub const SANDBOX_UID: u32 = 1000;
pub const SANDBOX_GID: u32 = 1000;

/// One entry of the new root filesystem, taken from the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum RootEntry {
    /// Bind-mount a host directory or file read-only (recursively, nosuid, nodev) at the same path.
    Bind { path: PathBuf, dir: bool },
    /// Show a host directory read-only (as [`RootEntry::Bind`]) at another path, `at`: for
    /// what lives wherever the operator put it (a package layer in the data directory), shown
    /// at a fixed path that no host path and none of the sandbox's own mounts decides.
    BindAt { path: PathBuf, at: PathBuf },
    /// Recreate a host symlink (e.g. merged-/usr `/bin -> usr/bin`).
    Symlink { path: PathBuf, target: PathBuf },
}

/// The sandbox to build. Sent once by the supervisor to the helper.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JailConfig {
    pub hostname: String,
    /// The host uid/gid that the sandbox's uid/gid 1000 map to. Never 0.
    pub host_uid: u32,
    pub host_gid: u32,
    /// What the helper may do beyond an unprivileged user (root, in the host's user namespace
    /// or in a container's); each power it lacks makes it take the rootless path for that step.
    pub powers: crate::identity::HelperPowers,
    /// Read-only parts of the host to expose, in order.
    pub root: Vec<RootEntry>,
    /// Size cap of the one tmpfs that backs /tmp, /workspace and /dev/shm together.
    pub scratch_bytes: u64,
    /// Inode cap of that tmpfs (stops a million empty files).
    pub scratch_inodes: u64,
    /// Files (`cgroup.procs`) the sandbox's pid 1 must be written to before it serves programs.
    pub cgroup_procs: Vec<PathBuf>,
    /// cgroup v2: the run's group directory. pid 1 is created in it (`clone3` with
    /// `CLONE_INTO_CGROUP`), and `cgroup_procs` is only the fallback where clone3 is refused.
    #[serde(default)]
    pub cgroup_dir: Option<PathBuf>,
    /// Host directories shown writable inside through an overlay whose upper layer lives in
    /// the scratch filesystem (prepared caches, e.g. Go's build cache).
    #[serde(default)]
    pub overlays: Vec<Overlay>,
    /// A TCP port on the sandbox's loopback where pid 1 listens for the run's egress proxy
    /// (P16a): the listening socket is handed to the supervisor with `Ready`, which serves it
    /// from outside the sandbox's network namespace. `None`: no network at all.
    #[serde(default)]
    pub proxy_port: Option<u16>,
}

/// A read-only host directory made writable in the sandbox by an overlay: reads come from the
/// host, writes go to the scratch filesystem (and count against the disk limit).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Overlay {
    /// Host directory (the lower layer; never written).
    pub lower: PathBuf,
    /// Absolute sandbox path; must be under /tmp.
    pub target: PathBuf,
}

/// Per-process resource limits (the second layer behind cgroups).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rlimits {
    /// RLIMIT_CPU in seconds (backstop for the wall-clock timeout).
    pub cpu_seconds: u64,
    /// RLIMIT_NOFILE.
    pub open_files: u64,
    /// RLIMIT_NPROC: processes and threads of the sandbox uid.
    pub processes: u64,
    /// RLIMIT_FSIZE: the largest file that can be written.
    pub file_size_bytes: u64,
    /// RLIMIT_AS, only when the cgroup memory limit is unavailable and the runtime tolerates it.
    pub address_space_bytes: Option<u64>,
}

/// A file the sandbox's pid 1 writes into the sandbox before starting a program.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSpec {
    /// Absolute path inside the sandbox; must be under /workspace or /tmp.
    pub path: PathBuf,
    pub mode: u32,
    /// Index of the blob (sent after the message) holding the content.
    pub blob: usize,
}

/// One program to run inside an existing sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecStep {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub files: Vec<FileSpec>,
    /// Blob index of the program's stdin, if any (otherwise /dev/null).
    pub stdin_blob: Option<usize>,
    pub rlimits: Rlimits,
}
