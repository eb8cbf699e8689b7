//! The supervisor's side of a sandbox: create it, hand it programs, tear it down.
//!
//! A [`Sandbox`] is created (namespaces, filesystem and cgroup set up, pid 1 waiting), then
//! given [`Program`]s one after the other (a compile step, then a run step; later a session's
//! cells), then dropped. Creating ahead of time is what a warm pool will do; running several
//! programs in one sandbox is what a session will do.
//!
//! The supervisor never forks: it spawns the runcell binary itself (`runcell __jail`) with
//! `std::process::Command`, which is safe in a multi-threaded process, and all namespace work
//! happens in that single-threaded helper (see `init.rs`).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};
use rustix::pipe::{pipe_with, PipeFlags};

use crate::cgroup::{
    Cgroup, CgroupError, CgroupLimits, CgroupManager, CgroupStats, CgroupVersion, CpuQuota,
    Enforced,
};
use crate::config::{ExecStep, FileSpec, JailConfig, Overlay, Rlimits, RootEntry};
use crate::init::HELPER_ARG;
use crate::protocol::{
    self, CollectLimits, CollectedFile, ExitStatus, LandlockStatus, Report, Request,
};

/// First host uid used for sandboxes when runcell runs as root. Each sandbox gets its own uid
/// in [`HOST_ID_BASE`, `HOST_ID_BASE + HOST_ID_RANGE`): unprivileged, in no /etc/passwd, and
/// far above the ranges distributions hand out (system users, regular users, /etc/subuid).
pub const HOST_ID_BASE: u32 = 2_000_000_000;
pub const HOST_ID_RANGE: u32 = 1_000_000;

/// Everything that can go wrong while creating or driving a sandbox.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("cannot start the sandbox helper {exe}: {source}")]
    Spawn { exe: PathBuf, source: io::Error },
    #[error("{step}: {source}")]
    Io {
        step: &'static str,
        source: io::Error,
    },
    #[error("sandbox setup failed at '{step}'{}: {message}", path.as_ref().map(|p| format!(" ({})", p.display())).unwrap_or_default())]
    Setup {
        step: String,
        path: Option<PathBuf>,
        errno: Option<i32>,
        message: String,
    },
    #[error("the sandbox did not become ready within {0:?}")]
    SetupTimeout(Duration),
    #[error("the sandbox helper exited unexpectedly ({0})")]
    HelperDied(String),
    #[error("unexpected message from the sandbox: {0}")]
    Protocol(String),
    #[error("cgroup: {0}")]
    Cgroup(#[from] CgroupError),
    #[error("the sandbox is no longer running")]
    Dead,
    #[error("the program's files and stdin do not fit in the memory limit")]
    InputExceedsMemory,
}

fn io_err(step: &'static str) -> impl FnOnce(io::Error) -> SandboxError {
    move |source| SandboxError::Io { step, source }
}

/// Limits enforced by the cgroup for the whole sandbox.
#[derive(Debug, Clone, Copy)]
pub struct CgroupRequest {
    pub memory_bytes: u64,
    /// Processes and threads of the program (the sandbox's pid 1 is added on top).
    pub pids: u64,
    /// CPU bandwidth in thousandths of a core.
    pub cpu_millis: u64,
}

/// What to build.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    pub hostname: String,
    pub root: Vec<RootEntry>,
    pub scratch_bytes: u64,
    pub scratch_inodes: u64,
    pub cgroup: CgroupRequest,
    /// Give up if the sandbox is not ready within this time.
    pub setup_timeout: Duration,
    /// The runcell binary to run as the helper (normally /proc/self/exe).
    pub helper_exe: PathBuf,
    /// Read-only host directories shown writable through an overlay (prepared caches).
    pub overlays: Vec<Overlay>,
}

/// Which isolation layers a sandbox really has, for the verdict and `runcell doctor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enforcement {
    pub namespaces: Vec<&'static str>,
    pub seccomp: bool,
    /// Reported by the program itself after restricting itself; `None` until a program ran.
    pub landlock: Option<LandlockStatus>,
    pub cgroup: Option<CgroupVersion>,
    pub cgroup_limits: Enforced,
    /// The sandbox uid maps to this host uid.
    pub host_uid: u32,
    pub rootless: bool,
    /// The host has swap space (so a memory limit without swap accounting leaks into it).
    pub host_has_swap: bool,
}

impl Enforcement {
    /// Layers that are missing or partial, in words (empty when everything is enforced).
    pub fn missing(&self) -> Vec<String> {
        let mut m = Vec::new();
        if !self.seccomp {
            m.push("seccomp".to_string());
        }
        match self.landlock {
            Some(LandlockStatus::Full) => {}
            Some(LandlockStatus::Partial) => m.push("landlock (partial: older kernel ABI)".into()),
            Some(LandlockStatus::None) => m.push("landlock".into()),
            None => {}
        }
        match self.cgroup {
            None => m.push(
                "cgroup (no limit on the run's total memory, CPU share or process count: \
                 per-process rlimits only)"
                    .into(),
            ),
            Some(_) => {
                let l = self.cgroup_limits;
                if !l.memory {
                    m.push("cgroup memory limit".into());
                } else if !l.memory_swap && self.host_has_swap {
                    m.push("swap accounting (the memory limit does not cover swap)".into());
                }
                if l.memory && !l.socket_memory {
                    m.push("socket memory accounting (TCP buffers are not charged to the memory limit)".into());
                }
                if !l.pids {
                    m.push("cgroup pids limit".into());
                }
                if !l.cpu {
                    m.push("cgroup cpu limit".into());
                }
            }
        }
        m
    }
}

/// All namespaces every sandbox gets.
pub const NAMESPACES: [&str; 7] = ["user", "pid", "mount", "net", "ipc", "uts", "cgroup"];

/// Which output stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Receives output as the program writes it (for streaming). Chunks are what a read returned,
/// cut at the cap.
pub trait OutputSink {
    fn output(&mut self, stream: Stream, chunk: &[u8]);
}

/// Discards live output (the outcome still carries it).
pub struct NoSink;
impl OutputSink for NoSink {
    fn output(&mut self, _: Stream, _: &[u8]) {}
}

/// A file to place in the sandbox before a program starts.
#[derive(Debug, Clone)]
pub struct InputFile {
    /// Absolute path under /workspace or /tmp.
    pub path: PathBuf,
    pub mode: u32,
    pub content: Vec<u8>,
}

/// One program to run in a sandbox.
#[derive(Debug, Clone)]
pub struct Program {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub files: Vec<InputFile>,
    pub stdin: Option<Vec<u8>>,
    pub rlimits: Rlimits,
    pub wall_timeout: Duration,
    pub stdout_cap: u64,
    pub stderr_cap: u64,
}

/// Why a program stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// It exited (or was killed by a signal from inside, the kernel's OOM killer, an rlimit).
    Exited(ExitStatus),
    /// The wall-clock limit ran out and the sandbox was killed.
    TimedOut,
    /// stdout or stderr went past its cap and the sandbox was killed.
    OutputLimit(Stream),
    /// The caller cancelled and the sandbox was killed.
    Cancelled,
}

/// What happened to one program.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub end: End,
    pub wall: Duration,
    pub cpu: Duration,
    pub peak_memory_bytes: Option<u64>,
    pub oom_kills: u64,
    pub pids_limit_hits: u64,
    pub disk_full: bool,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub landlock: Option<LandlockStatus>,
}

/// Files returned by [`Sandbox::collect`].
#[derive(Debug, Clone, Default)]
pub struct CollectedFiles {
    /// Sorted by path; `blob` indexes into `blobs`.
    pub files: Vec<CollectedFile>,
    pub blobs: Vec<Vec<u8>>,
    /// Files left out because of the count or entry caps.
    pub omitted: u64,
}

/// What pid 1 reports when a program ended: status, wall time, CPU time, largest RSS, disk full.
type ExitedReport = (ExitStatus, Duration, Duration, u64, bool);

/// Kills a running sandbox from another thread (client went away, server shutting down).
/// Once triggered it stays triggered: use one per run.
#[derive(Clone, Debug)]
pub struct KillSwitch(Arc<OwnedFd>);

impl KillSwitch {
    pub fn new() -> io::Result<Self> {
        let fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(KillSwitch(Arc::new(fd)))
    }
    pub fn trigger(&self) {
        let _ = rustix::io::write(&*self.0, &1u64.to_ne_bytes());
    }

    /// A guard that triggers this switch when dropped, unless disarmed first: hold it in the
    /// future that waits for the run, so that dropping the future (a client that went away, a
    /// cancelled call) kills the sandbox.
    pub fn kill_on_drop(&self) -> KillOnDrop {
        KillOnDrop(Some(self.clone()))
    }
    fn fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// See [`KillSwitch::kill_on_drop`].
#[derive(Debug)]
pub struct KillOnDrop(Option<KillSwitch>);

impl KillOnDrop {
    /// The run ended: dropping the guard no longer kills anything.
    pub fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(ks) = self.0.take() {
            ks.trigger();
        }
    }
}

/// A running sandbox.
pub struct Sandbox {
    helper: Child,
    /// A pidfd for the helper, to wait for its exit without polling. Opening it by pid is
    /// race-free: the helper is our child and is not reaped until we wait for it.
    helper_pidfd: Option<OwnedFd>,
    ctrl: UnixStream,
    stdout: OwnedFd,
    stderr: OwnedFd,
    /// Dropping it (or our death) tells the helper to kill the sandbox.
    lifeline: Option<OwnedFd>,
    cgroup: Option<Cgroup>,
    enforcement: Enforcement,
    alive: bool,
}

/// The host's cgroup hierarchy, discovered once per process.
fn cgroup_manager() -> Option<&'static CgroupManager> {
    static MANAGER: OnceLock<Option<CgroupManager>> = OnceLock::new();
    MANAGER
        .get_or_init(|| {
            let m = CgroupManager::discover(
                "/proc/self/mountinfo".as_ref(),
                "/proc/self/cgroup".as_ref(),
                "runcell",
            )
            .ok()
            .flatten()?;
            // Groups left by a supervisor that was SIGKILLed: their processes died with it (the
            // lifeline), only the empty directories remain.
            m.sweep_stale(&|name| {
                group_is_stale(name, &self_identity(), &|pid| process_start(pid))
            });
            Some(m)
        })
        .as_ref()
}

/// Groups whose removal failed at teardown (a process in uninterruptible sleep, say); retried
/// whenever a sandbox is created, so a long-running server does not leak them.
fn pending_removal() -> &'static std::sync::Mutex<Vec<Cgroup>> {
    static PENDING: OnceLock<std::sync::Mutex<Vec<Cgroup>>> = OnceLock::new();
    PENDING.get_or_init(Default::default)
}

fn retry_pending_removals() {
    let mut pending = pending_removal().lock().unwrap_or_else(|p| p.into_inner());
    // Only the empty ones: destroy() on a busy group would wait for it.
    pending.retain_mut(|cg| !(cg.is_empty() && cg.destroy().is_ok()));
}

/// The host's cgroup version, if runcell can use cgroups here.
pub fn cgroup_version() -> Option<CgroupVersion> {
    cgroup_manager().map(CgroupManager::version)
}

/// Who owns a cgroup: the supervisor's pid, its pid namespace, and its start time (so that a
/// reused pid, or a supervisor with the same pid in another container sharing the cgroup
/// hierarchy, is never mistaken for the owner).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Owner {
    pid: u32,
    pidns: u64,
    start: u64,
}

fn self_identity() -> Owner {
    let pid = std::process::id();
    Owner {
        pid,
        pidns: std::fs::metadata("/proc/self/ns/pid")
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            .unwrap_or(0),
        start: process_start(pid).unwrap_or(0),
    }
}

/// A process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat).
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// `<pid>-<pid namespace inode>-<start time>-<random>`.
fn group_name(owner: &Owner, random: u64) -> String {
    format!(
        "{}-{}-{}-{random:016x}",
        owner.pid, owner.pidns, owner.start
    )
}

/// A group is stale when its owner, in our pid namespace, is no longer running (its pid is
/// gone or belongs to a process that started at another time). Groups of other pid
/// namespaces are left alone: we cannot see their supervisors.
fn group_is_stale(name: &str, me: &Owner, start_of: &dyn Fn(u32) -> Option<u64>) -> bool {
    let mut parts = name.split('-');
    let (Some(pid), Some(pidns), Some(start), Some(_)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let (Ok(pid), Ok(pidns), Ok(start)) = (
        pid.parse::<u32>(),
        pidns.parse::<u64>(),
        start.parse::<u64>(),
    ) else {
        return false;
    };
    if pidns != me.pidns || (pid == me.pid && start == me.start) {
        return false;
    }
    start_of(pid) != Some(start)
}

/// SwapTotal from a meminfo file (normally /proc/meminfo), in bytes; 0 when unknown.
pub fn host_swap_bytes(meminfo: &std::path::Path) -> u64 {
    std::fs::read_to_string(meminfo)
        .ok()
        .and_then(|t| {
            let line = t.lines().find(|l| l.starts_with("SwapTotal:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kb| kb * 1024)
}

/// The next sandbox host uid: sequential within this process from a random start, so two
/// sandboxes of one supervisor never share a uid (and with it per-uid kernel budgets), and two
/// supervisors are unlikely to.
fn next_host_id() -> u32 {
    static START: OnceLock<u64> = OnceLock::new();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let start = *START.get_or_init(|| random_u64() % HOST_ID_RANGE as u64);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    HOST_ID_BASE + ((start + n) % HOST_ID_RANGE as u64) as u32
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    let _ = rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty());
    u64::from_ne_bytes(b)
}

impl Sandbox {
    /// Build a sandbox and wait until its pid 1 is ready for programs.
    pub fn create(spec: &SandboxSpec) -> Result<Sandbox, SandboxError> {
        let euid = rustix::process::geteuid().as_raw();
        let privileged = euid == 0;
        let (host_uid, host_gid) = if privileged {
            let id = next_host_id();
            (id, id)
        } else {
            (euid, rustix::process::getegid().as_raw())
        };

        retry_pending_removals();
        // The cgroup first: if it cannot be created the run must not start half-limited.
        let cgroup = match cgroup_manager() {
            Some(m) => {
                let name = group_name(&self_identity(), random_u64());
                let limits = CgroupLimits {
                    memory_bytes: Some(spec.cgroup.memory_bytes),
                    // +1 for the sandbox's pid 1.
                    pids_max: Some(spec.cgroup.pids + 1),
                    cpu_quota: Some(CpuQuota {
                        quota_us: spec.cgroup.cpu_millis * 100,
                        period_us: 100_000,
                    }),
                };
                Some(m.create(&name, &limits)?)
            }
            None => None,
        };

        let (sup_sock, child_sock) = UnixStream::pair().map_err(io_err("socketpair"))?;
        let (life_r, life_w) =
            pipe_with(PipeFlags::CLOEXEC).map_err(|e| io_err("pipe")(e.into()))?;
        let (out_r, out_w) = pipe_with(PipeFlags::CLOEXEC).map_err(|e| io_err("pipe")(e.into()))?;
        let (err_r, err_w) = pipe_with(PipeFlags::CLOEXEC).map_err(|e| io_err("pipe")(e.into()))?;
        // Park the helper's descriptors at high numbers so that moving them to 3 and 4 in the
        // child can never clobber one another.
        let sock_hi = rustix::io::fcntl_dupfd_cloexec(&child_sock, 64)
            .map_err(|e| io_err("dup")(e.into()))?;
        let life_hi =
            rustix::io::fcntl_dupfd_cloexec(&life_r, 64).map_err(|e| io_err("dup")(e.into()))?;
        drop(child_sock);
        drop(life_r);
        let (sock_raw, life_raw) = (sock_hi.as_raw_fd(), life_hi.as_raw_fd());

        let mut cmd = Command::new(&spec.helper_exe);
        cmd.arg0("runcell-jail")
            .arg(HELPER_ARG)
            // Nothing of runcell's environment reaches the sandbox, not even via the helper's
            // /proc/<pid>/environ.
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::from(out_w))
            .stderr(Stdio::from(err_w));
        // SAFETY: the closure runs between fork and exec in the child and only calls dup2,
        // which is async-signal-safe; the raw fds are valid in the child (inherited copies).
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(sock_raw, 3) == -1 || libc::dup2(life_raw, 4) == -1 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let helper = cmd.spawn().map_err(|source| SandboxError::Spawn {
            exe: spec.helper_exe.clone(),
            source,
        })?;
        drop(cmd);
        drop(sock_hi);
        drop(life_hi);
        for fd in [&out_r, &err_r] {
            rustix::fs::fcntl_setfl(fd, rustix::fs::OFlags::NONBLOCK)
                .map_err(|e| io_err("nonblock")(e.into()))?;
        }

        let enforcement = Enforcement {
            namespaces: NAMESPACES.to_vec(),
            seccomp: true,
            landlock: None,
            cgroup: cgroup.as_ref().map(Cgroup::version),
            cgroup_limits: cgroup.as_ref().map(Cgroup::enforced).unwrap_or_default(),
            host_uid,
            rootless: !privileged,
            host_has_swap: host_swap_bytes("/proc/meminfo".as_ref()) > 0,
        };
        let helper_pidfd = rustix::process::Pid::from_raw(helper.id() as i32).and_then(|pid| {
            rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
        });
        let mut sandbox = Sandbox {
            helper,
            helper_pidfd,
            ctrl: sup_sock,
            stdout: out_r,
            stderr: err_r,
            lifeline: Some(life_w),
            cgroup,
            enforcement,
            alive: true,
        };
        let config = JailConfig {
            hostname: spec.hostname.clone(),
            host_uid,
            host_gid,
            privileged,
            root: spec.root.clone(),
            scratch_bytes: spec.scratch_bytes,
            scratch_inodes: spec.scratch_inodes,
            cgroup_procs: sandbox
                .cgroup
                .as_ref()
                .map(Cgroup::procs_files)
                .unwrap_or_default(),
            overlays: spec.overlays.clone(),
        };
        protocol::send(&sandbox.ctrl, &Request::Setup(config), &[])
            .map_err(io_err("send setup"))?;
        let deadline = Instant::now() + spec.setup_timeout;
        loop {
            match sandbox.wait_report(deadline)? {
                Some(Report::Spawned { .. }) => continue,
                Some(Report::Ready) => break,
                Some(Report::Failed {
                    step,
                    path,
                    errno,
                    message,
                }) => {
                    return Err(SandboxError::Setup {
                        step,
                        path,
                        errno,
                        message,
                    })
                }
                Some(other) => return Err(SandboxError::Protocol(format!("{other:?}"))),
                None => return Err(SandboxError::SetupTimeout(spec.setup_timeout)),
            }
        }
        Ok(sandbox)
    }

    /// The helper's host pid (for diagnostics and tests).
    pub fn helper_pid(&self) -> u32 {
        self.helper.id()
    }

    pub fn enforcement(&self) -> &Enforcement {
        &self.enforcement
    }

    /// Wait for one report from the sandbox until `deadline`; `Ok(None)` on timeout.
    fn wait_report(&mut self, deadline: Instant) -> Result<Option<Report>, SandboxError> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let mut fds = [PollFd::new(&self.ctrl, PollFlags::IN)];
            match poll(&mut fds, Some(&timespec(left))) {
                Ok(0) => return Ok(None),
                Ok(_) => return self.read_report().map(Some),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(io_err("poll")(e.into())),
            }
        }
    }

    fn read_report(&mut self) -> Result<Report, SandboxError> {
        match protocol::recv_with::<Report>(&self.ctrl, protocol::FrameLimits::REPORT) {
            Ok(Some(f)) => Ok(f.message),
            Ok(None) | Err(_) => {
                self.alive = false;
                let status = self.reap_helper(Duration::from_secs(2));
                Err(SandboxError::HelperDied(status))
            }
        }
    }

    /// Wait up to `grace` for the helper to exit (event-driven through its pidfd), then kill it.
    fn reap_helper(&mut self, grace: Duration) -> String {
        if let Ok(Some(st)) = self.helper.try_wait() {
            return st.to_string();
        }
        if let Some(pidfd) = &self.helper_pidfd {
            let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
            let _ = poll(&mut fds, Some(&timespec(grace)));
        }
        match self.helper.try_wait() {
            Ok(Some(st)) => st.to_string(),
            Ok(None) => {
                let _ = self.helper.kill();
                self.helper
                    .wait()
                    .map(|s| s.to_string())
                    .unwrap_or_else(|e| e.to_string())
            }
            Err(e) => e.to_string(),
        }
    }

    /// Kill every process of the sandbox now. pid 1 is killed, and the death of pid 1 kills its
    /// whole pid namespace: double forks, setsid, ignored SIGTERM and new sessions cannot
    /// escape that. The cgroup is killed as well when there is one.
    pub fn kill(&mut self) {
        // Closing the lifeline makes the helper SIGKILL pid 1 through its pidfd; pid 1's death
        // takes the pid namespace with it. The cgroup kill is a second, independent layer; and
        // should the helper not exit promptly, reap_helper SIGKILLs it, which kills pid 1 by
        // its parent-death signal.
        self.lifeline = None;
        if let Some(cg) = &self.cgroup {
            let _ = cg.kill_all();
        }
        let _ = self.reap_helper(Duration::from_secs(2));
        self.alive = false;
    }

    /// Run a program and wait for it to end (or be stopped). The sandbox stays usable after a
    /// normal exit; after a timeout, output limit or cancellation it is dead.
    pub fn run(
        &mut self,
        program: &Program,
        sink: &mut dyn OutputSink,
        cancel: Option<&KillSwitch>,
    ) -> Result<Outcome, SandboxError> {
        if !self.alive {
            return Err(SandboxError::Dead);
        }
        let mut blobs: Vec<&[u8]> = Vec::new();
        let files = program
            .files
            .iter()
            .map(|f| {
                blobs.push(&f.content);
                FileSpec {
                    path: f.path.clone(),
                    mode: f.mode,
                    blob: blobs.len() - 1,
                }
            })
            .collect();
        let stdin_blob = program.stdin.as_ref().map(|s| {
            blobs.push(s);
            blobs.len() - 1
        });
        let step = ExecStep {
            argv: program.argv.clone(),
            env: program.env.clone(),
            cwd: program.cwd.clone(),
            files,
            stdin_blob,
            rlimits: program.rlimits,
        };
        let before = self.cgroup_stats();
        if let Some(cg) = &self.cgroup {
            cg.reset_peak();
        }
        protocol::send(&self.ctrl, &Request::Exec(step), &blobs).map_err(io_err("send program"))?;

        let started = Instant::now();
        // Writing the files and starting the program happen before the clock of the program
        // itself starts; allow them a little time on top of the program's own limit.
        let mut deadline = started + program.wall_timeout + Duration::from_secs(5);
        let mut out = Capture::new(program.stdout_cap);
        let mut err = Capture::new(program.stderr_cap);
        let mut end: Option<End> = None;
        let mut exited: Option<ExitedReport> = None;
        let mut landlock = None;
        let mut program_started: Option<Instant> = None;

        while exited.is_none() && end.is_none() {
            // Checked on every pass, not only when poll times out: a program that writes a
            // little output all the time must not postpone its own timeout.
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                end = Some(End::TimedOut);
                break;
            }
            let mut fds = vec![
                PollFd::new(&self.ctrl, PollFlags::IN),
                PollFd::new(&self.stdout, PollFlags::IN),
                PollFd::new(&self.stderr, PollFlags::IN),
            ];
            if let Some(c) = cancel {
                fds.push(PollFd::from_borrowed_fd(c.fd(), PollFlags::IN));
            }
            let ready = match poll(&mut fds, Some(&timespec(left))) {
                Ok(n) => n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(io_err("poll")(e.into())),
            };
            let revents: Vec<PollFlags> = fds.iter().map(|f| f.revents()).collect();
            drop(fds);
            if ready == 0 {
                end = Some(End::TimedOut);
                break;
            }
            if !revents[1].is_empty() && out.read_from(&self.stdout, Stream::Stdout, sink) {
                end = Some(End::OutputLimit(Stream::Stdout));
                break;
            }
            if !revents[2].is_empty() && err.read_from(&self.stderr, Stream::Stderr, sink) {
                end = Some(End::OutputLimit(Stream::Stderr));
                break;
            }
            if revents.len() > 3 && !revents[3].is_empty() {
                end = Some(End::Cancelled);
                break;
            }
            if !revents[0].is_empty() {
                let report = match self.read_report() {
                    Ok(r) => r,
                    // pid 1 died in an OOM of the run's cgroup (the kernel's choice of victim,
                    // or a cgroup v2 host where an operator set memory.oom.group): that is
                    // the program hitting its memory limit, not a broken sandbox.
                    Err(SandboxError::HelperDied(_))
                        if self.cgroup_stats().oom_kills > before.oom_kills
                            && program_started.is_none() =>
                    {
                        // pid 1 ran out of memory while writing the inputs: they do not fit.
                        return Err(SandboxError::InputExceedsMemory);
                    }
                    Err(SandboxError::HelperDied(_))
                        if self.cgroup_stats().oom_kills > before.oom_kills =>
                    {
                        exited = Some((
                            ExitStatus::Signal(libc::SIGKILL),
                            program_started.map(|s| s.elapsed()).unwrap_or_default(),
                            Duration::ZERO,
                            0,
                            false,
                        ));
                        break;
                    }
                    Err(e) => return Err(e),
                };
                match report {
                    Report::Started { landlock: l, .. } => {
                        landlock = Some(l);
                        self.enforcement.landlock = Some(l);
                        let now = Instant::now();
                        program_started = Some(now);
                        deadline = now + program.wall_timeout;
                    }
                    Report::Exited {
                        status,
                        wall_ns,
                        cpu_ns,
                        max_rss_bytes,
                        disk_full,
                    } => {
                        exited = Some((
                            status,
                            Duration::from_nanos(wall_ns),
                            Duration::from_nanos(cpu_ns),
                            max_rss_bytes,
                            disk_full,
                        ));
                    }
                    Report::Failed {
                        step,
                        path,
                        errno,
                        message,
                    } => {
                        self.kill();
                        return Err(SandboxError::Setup {
                            step,
                            path,
                            errno,
                            message,
                        });
                    }
                    other => return Err(SandboxError::Protocol(format!("{other:?}"))),
                }
            }
        }

        if matches!(end, Some(End::TimedOut | End::OutputLimit(_))) && exited.is_none() {
            // Ask pid 1 to kill the program and everything it started: the sandbox and its
            // files survive (outputs written before a timeout are still collected). If pid 1
            // does not answer in time, fall through to the hard kill below.
            exited = self.stop_program(Duration::from_secs(3));
        }
        if end.is_some() && exited.is_none() {
            // Cancellation, or a Stop that got no answer: kill the whole sandbox, then drain
            // what the pipes still hold (all writers are dead, so EOF comes quickly).
            self.kill();
            let _ = self.reap_helper(Duration::from_secs(5));
            let drain_until = Instant::now() + Duration::from_secs(2);
            out.drain(&self.stdout, Stream::Stdout, sink, drain_until);
            err.drain(&self.stderr, Stream::Stderr, sink, drain_until);
        } else {
            // The program exited and pid 1 killed and reaped everything else before reporting,
            // so the pipes hold all the output there will ever be: read until empty.
            let now = Instant::now();
            out.drain(&self.stdout, Stream::Stdout, sink, now);
            err.drain(&self.stderr, Stream::Stderr, sink, now);
            if out.over || err.over {
                // The cap was crossed in the final burst: same verdict as a flood.
                end = Some(End::OutputLimit(if out.over {
                    Stream::Stdout
                } else {
                    Stream::Stderr
                }));
            }
        }
        let after = self.cgroup_stats();
        let (status_end, wall, rusage_cpu, max_rss, disk_full) = match exited {
            Some((status, wall, cpu, rss, disk)) => (End::Exited(status), wall, cpu, rss, disk),
            None => (
                end.unwrap_or(End::Cancelled),
                program_started.map(|s| s.elapsed()).unwrap_or_default(),
                Duration::ZERO,
                0,
                false,
            ),
        };
        let end = end.unwrap_or(status_end);
        let cpu = match (before.cpu_usage_ns, after.cpu_usage_ns) {
            (Some(b), Some(a)) => Duration::from_nanos(a.saturating_sub(b)),
            _ => rusage_cpu,
        };
        let peak = after.memory_peak_bytes.or((max_rss > 0).then_some(max_rss));
        Ok(Outcome {
            end,
            wall: match end {
                End::TimedOut => program.wall_timeout,
                _ => wall,
            },
            cpu,
            peak_memory_bytes: peak,
            oom_kills: after.oom_kills.saturating_sub(before.oom_kills),
            pids_limit_hits: after.pids_limit_hits.saturating_sub(before.pids_limit_hits),
            disk_full,
            stdout_truncated: out.over,
            stderr_truncated: err.over,
            stdout: out.data,
            stderr: err.data,
            landlock,
        })
    }

    /// Send `Stop` and wait up to `grace` for pid 1's `Exited`.
    fn stop_program(&mut self, grace: Duration) -> Option<ExitedReport> {
        protocol::send(&self.ctrl, &Request::Stop, &[]).ok()?;
        let deadline = Instant::now() + grace;
        loop {
            match self.wait_report(deadline) {
                Ok(Some(Report::Exited {
                    status,
                    wall_ns,
                    cpu_ns,
                    max_rss_bytes,
                    disk_full,
                })) => {
                    return Some((
                        status,
                        Duration::from_nanos(wall_ns),
                        Duration::from_nanos(cpu_ns),
                        max_rss_bytes,
                        disk_full,
                    ))
                }
                // The program had only just started when the deadline hit.
                Ok(Some(Report::Started { .. })) => continue,
                _ => return None,
            }
        }
    }

    /// The files the last program(s) created or changed under /workspace, with contents within
    /// the caps. Call between programs (after `run` returned with the sandbox alive).
    pub fn collect(&mut self, limits: &CollectLimits) -> Result<CollectedFiles, SandboxError> {
        if !self.alive {
            return Err(SandboxError::Dead);
        }
        protocol::send(&self.ctrl, &Request::Collect(*limits), &[])
            .map_err(io_err("send collect"))?;
        let mut fds = [PollFd::new(&self.ctrl, PollFlags::IN)];
        // pid 1 bounds the collection to `deadline_ms`; allow for the transfer on top.
        let wait = Duration::from_millis(limits.deadline_ms) + Duration::from_secs(20);
        match poll(&mut fds, Some(&timespec(wait))) {
            Ok(n) if n > 0 => {}
            _ => return Err(SandboxError::Protocol("no answer to collect".into())),
        }
        // The file list and the contents, within the caps the request set (plus framing).
        let files_limits = protocol::FrameLimits {
            max_json: protocol::MAX_JSON,
            max_blob_count: limits.max_files.min(u32::MAX as u64) as u32,
            max_blobs_total: limits.max_total_bytes,
        };
        let frame = protocol::recv_with::<Report>(&self.ctrl, files_limits)
            .map_err(io_err("read files"))?
            .ok_or_else(|| SandboxError::HelperDied("during collect".into()))?;
        match frame.message {
            Report::Files { files, omitted } => Ok(CollectedFiles {
                files,
                blobs: frame.blobs,
                omitted,
            }),
            other => Err(SandboxError::Protocol(format!("{other:?}"))),
        }
    }

    fn cgroup_stats(&self) -> CgroupStats {
        self.cgroup.as_ref().map(Cgroup::stats).unwrap_or_default()
    }

    /// Tear down: end pid 1 (which kills its namespace), reap the helper, remove the cgroup.
    /// Dropping a sandbox does the same.
    pub fn destroy(mut self) -> Result<(), SandboxError> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<(), SandboxError> {
        // Closing the control socket ends pid 1's service loop; closing the lifeline makes the
        // helper kill pid 1 in any case.
        self.lifeline = None;
        let _ = self.ctrl.shutdown(std::net::Shutdown::Both);
        if self.alive {
            let _ = self.reap_helper(Duration::from_secs(2));
            self.alive = false;
        } else {
            let _ = self.reap_helper(Duration::from_millis(0));
        }
        if let Some(mut cg) = self.cgroup.take() {
            if let Err(e) = cg.destroy() {
                // Keep it (not dropped: Drop would wait all over again) and retry later.
                pending_removal()
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(cg);
                return Err(e.into());
            }
        }
        Ok(())
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}

/// Output of one stream, kept up to a cap.
struct Capture {
    data: Vec<u8>,
    cap: u64,
    over: bool,
}

impl Capture {
    fn new(cap: u64) -> Self {
        Capture {
            data: Vec::new(),
            cap,
            over: false,
        }
    }

    /// Read what is available. Returns true once the cap has been crossed.
    fn read_from(&mut self, fd: &OwnedFd, stream: Stream, sink: &mut dyn OutputSink) -> bool {
        let mut buf = [0u8; 65536];
        loop {
            match rustix::io::read(fd, &mut buf) {
                Ok(0) => return self.over,
                Ok(n) => {
                    let room = self.cap.saturating_sub(self.data.len() as u64) as usize;
                    let keep = n.min(room);
                    if keep > 0 {
                        self.data.extend_from_slice(&buf[..keep]);
                        sink.output(stream, &buf[..keep]);
                    }
                    if n > room {
                        self.over = true;
                        return true;
                    }
                }
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => return self.over,
            }
        }
    }

    /// Read until EOF, or until the pipe is empty once `until` has passed.
    fn drain(&mut self, fd: &OwnedFd, stream: Stream, sink: &mut dyn OutputSink, until: Instant) {
        loop {
            if self.over {
                return;
            }
            let mut buf = [0u8; 65536];
            match rustix::io::read(fd, &mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    let room = self.cap.saturating_sub(self.data.len() as u64) as usize;
                    let keep = n.min(room);
                    self.data.extend_from_slice(&buf[..keep]);
                    if keep > 0 {
                        sink.output(stream, &buf[..keep]);
                    }
                    if n > room {
                        self.over = true;
                    }
                }
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::AGAIN) => {
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return;
                    }
                    let mut fds = [PollFd::new(fd, PollFlags::IN)];
                    let _ = poll(&mut fds, Some(&timespec(left)));
                }
                Err(_) => return,
            }
        }
    }
}

fn timespec(d: Duration) -> Timespec {
    Timespec {
        tv_sec: d.as_secs() as _,
        tv_nsec: d.subsec_nanos() as _,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_groups_are_recognised_by_pid_namespace_and_start_time() {
        let me = Owner {
            pid: 100,
            pidns: 7,
            start: 555,
        };
        let name = |pid: u32, ns: u64, start: u64| {
            group_name(
                &Owner {
                    pid,
                    pidns: ns,
                    start,
                },
                1,
            )
        };
        let running = |pid: u32| match pid {
            200 => Some(900),
            _ => None,
        };
        assert!(
            !group_is_stale(&name(100, 7, 555), &me, &running),
            "our own"
        );
        assert!(
            !group_is_stale(&name(200, 7, 900), &me, &running),
            "a live supervisor"
        );
        assert!(
            group_is_stale(&name(200, 7, 800), &me, &running),
            "pid reused by another process"
        );
        assert!(
            group_is_stale(&name(300, 7, 1), &me, &running),
            "owner gone"
        );
        assert!(
            !group_is_stale(&name(300, 8, 1), &me, &running),
            "another pid namespace"
        );
        assert!(!group_is_stale("not-ours", &me, &running));
        assert!(!group_is_stale("12-abc", &me, &running), "unknown format");
    }

    #[test]
    fn host_ids_are_unique_within_a_supervisor_and_never_privileged() {
        let ids: std::collections::HashSet<u32> = (0..1000).map(|_| next_host_id()).collect();
        assert_eq!(ids.len(), 1000);
        assert!(ids
            .iter()
            .all(|&id| (HOST_ID_BASE..HOST_ID_BASE + HOST_ID_RANGE).contains(&id)));
    }

    #[test]
    fn process_start_reads_proc_stat() {
        assert!(process_start(std::process::id()).unwrap() > 0);
        assert_eq!(process_start(u32::MAX), None);
    }

    #[test]
    fn swap_is_read_from_meminfo() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("meminfo");
        std::fs::write(&p, "MemTotal: 100 kB\nSwapTotal:     2048 kB\n").unwrap();
        assert_eq!(host_swap_bytes(&p), 2048 * 1024);
        assert_eq!(host_swap_bytes(&d.path().join("none")), 0);
    }
}
