//! The lifecycle of a sandbox: create it (cgroup, helper, pid 1 ready), report which layers it
//! has, collect the files its programs wrote, destroy it.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags};
use rustix::pipe::{pipe_with, PipeFlags};

use super::error::io_err;
use super::ownership::{
    cgroup_manager, defer_removal, new_group_name, random_u64, retry_pending_removals, CGROUP_ROOT,
    SELF_CGROUP,
};
use super::{timespec, SandboxError};
use crate::cgroup::{Cgroup, CgroupLimits, CgroupStats, CgroupVersion, Enforced};
use crate::config::{JailConfig, Overlay, RootEntry};
use crate::identity::{IdPool, Identity, Shape};
use crate::init::HELPER_ARG;
use crate::meminfo::MemInfo;
use crate::protocol::{self, CollectLimits, CollectedFile, LandlockStatus, Report, Request};

/// The helper's descriptors are parked at or above this number before it is spawned, so that
/// moving them to 3 and 4 in the child can never clobber one another.
const PARKED_FD_MIN: i32 = 64;

/// How long the helper gets to exit after the lifeline or the control socket closed. It only
/// has to SIGKILL pid 1 and exit, which takes microseconds; past this it is SIGKILLed itself
/// (which still kills pid 1, through pid 1's parent-death signal).
pub(super) const HELPER_EXIT_GRACE: Duration = Duration::from_secs(2);

/// How long the supervisor waits for pid 1's answer to `Collect` beyond the collection's own
/// deadline (which pid 1 enforces): the transfer of up to `max_total_bytes` over the socket on
/// a loaded host.
const COLLECT_TRANSFER_ALLOWANCE: Duration = Duration::from_secs(20);

/// Where the host's memory totals are read (for [`Enforcement::host_has_swap`]).
const HOST_MEMINFO: &str = "/proc/meminfo";

/// All namespaces every sandbox gets.
const NAMESPACES: [&str; 7] = ["user", "pid", "mount", "net", "ipc", "uts", "cgroup"];

/// What to build.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    pub hostname: String,
    pub root: Vec<RootEntry>,
    pub scratch_bytes: u64,
    pub scratch_inodes: u64,
    /// Limits of the sandbox's cgroup. `pids_max` counts the program's processes and threads:
    /// the sandbox's pid 1 is added on top.
    pub cgroup: CgroupLimits,
    /// Give up if the sandbox is not ready within this time.
    pub setup_timeout: Duration,
    /// The runcell binary to run as the helper (normally /proc/self/exe).
    pub helper_exe: PathBuf,
    /// Read-only host directories shown writable through an overlay (prepared caches).
    pub overlays: Vec<Overlay>,
    /// The memory of all runs together: the limit of the parent group every sandbox's group
    /// is made in, so that the host keeps a reserve whatever the runs do. `None`: not set.
    pub all_runs_memory_bytes: Option<u64>,
    /// Network by permission: a port on the sandbox's loopback where its pid 1 listens for the
    /// run's egress proxy ([`Sandbox::take_proxy_listener`]). `None`: loopback only.
    pub proxy_port: Option<u16>,
    /// Its interpreter may be forked from a template ([`Sandbox::start_interpreter_forked`]):
    /// its host uid then comes from the pool's half for such sandboxes ([`IdPool::half`]).
    pub templated: bool,
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
    /// The sandbox uid maps to this uid of the supervisor's user namespace.
    pub host_uid: u32,
    /// Not root in the host's user namespace (unprivileged, or root in a container's).
    pub rootless: bool,
    /// Who the supervisor is: host root, root in a user namespace, unprivileged.
    pub identity: Identity,
    /// The sandbox's /dev holds device nodes of its own (`false`: the host's nodes are bound,
    /// so their inodes, and locks on them, are shared with the host and the other runs).
    pub private_dev: bool,
    /// Each sandbox maps to a uid of its own (`false`: to the supervisor's uid, shared by
    /// every sandbox and the supervisor, with the per-uid kernel budgets that go with it).
    pub own_uid: bool,
    /// Root could not drop its supplementary groups (`setgroups` is denied in its user
    /// namespace): the sandbox's processes keep them.
    pub kept_groups: bool,
    /// The host has swap space (so a memory limit without swap accounting leaks into it).
    pub host_has_swap: bool,
    /// Whether the memory of all runs together is limited (`None`: it was not asked for).
    pub all_runs_memory: Option<bool>,
    /// I/O limits were asked for (the host's files are on a disk runcell can throttle).
    pub io_requested: bool,
}

impl Enforcement {
    /// Layers that are missing or partial, in words (empty when everything is enforced).
    pub fn missing(&self) -> Vec<String> {
        let mut m = Vec::new();
        if self.host_uid == 0 {
            // Root in a user namespace that maps no other id (`unshare --map-root-user`), or
            // root without CAP_SETUID: the sandbox's uid is the supervisor's uid 0 outside.
            m.push(
                "a uid of its own (the sandbox runs as the supervisor's uid 0 outside its \
                 namespace: map more ids, e.g. --uidmap 0:100000:65536, or grant CAP_SETUID \
                 and CAP_SETGID)"
                    .into(),
            );
        }
        if self.kept_groups {
            m.push(
                "dropping supplementary groups (setgroups is denied in runcell's user \
                 namespace: the sandbox keeps runcell's groups)"
                    .into(),
            );
        }
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
                if self.io_requested && !l.io {
                    m.push("cgroup io limit (reads and writes of the host's disk)".into());
                }
                if self.all_runs_memory == Some(false) {
                    m.push(
                        "a memory limit on all runs together (the host keeps no reserve)".into(),
                    );
                }
            }
        }
        m
    }
}

/// Files returned by [`Sandbox::collect`].
#[derive(Debug, Clone, Default)]
pub struct CollectedFiles {
    /// Sorted by path; `blob` indexes into `blobs`.
    pub files: Vec<CollectedFile>,
    pub blobs: Vec<Vec<u8>>,
    /// Files left out because of the count or entry caps, or because their names could not
    /// be returned faithfully (see `notes`).
    pub omitted: u64,
    /// Why files were left out beyond the caps, one sentence each.
    pub notes: Vec<String>,
}

/// A running sandbox.
pub struct Sandbox {
    helper: Child,
    /// A pidfd for the helper, to wait for its exit without polling. Opening it by pid is
    /// race-free: the helper is our child and is not reaped until we wait for it.
    helper_pidfd: Option<OwnedFd>,
    pub(super) ctrl: UnixStream,
    pub(super) stdout: OwnedFd,
    pub(super) stderr: OwnedFd,
    /// Dropping it (or our death) tells the helper to kill the sandbox.
    lifeline: Option<OwnedFd>,
    pub(super) cgroup: Option<Cgroup>,
    pub(super) enforcement: Enforcement,
    pub(super) alive: bool,
    /// A session's sandbox: it outlives its programs (see [`Sandbox::set_persistent`]).
    pub(super) persistent: bool,
    /// The listening socket in the sandbox's network namespace, for the egress proxy.
    proxy_listener: Option<OwnedFd>,
    /// pid 1's host pid (from the helper's `Spawned`): whose namespaces a template's fork
    /// joins.
    pub(super) pid1: Option<i32>,
    /// The descriptors of pid 1's last `GraftChannel`.
    pub(super) graft_fds: Vec<OwnedFd>,
    /// The host gid the sandbox's gid maps to.
    pub(super) host_gid: u32,
    /// Built for a forked interpreter (its host uid from the templated half of the pool).
    pub(super) templated: bool,
}

/// The next sandbox host uid from `pool`: sequential within this process from a random start,
/// so two sandboxes of one supervisor never share a uid (and with it per-uid kernel budgets),
/// and two supervisors are unlikely to. (One process has one pool: its user namespace's.)
fn next_host_id(pool: IdPool) -> u32 {
    static START: OnceLock<u64> = OnceLock::new();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let len = pool.len.max(1) as u64;
    let start = *START.get_or_init(random_u64);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    pool.start + (start.wrapping_add(n) % len) as u32
}

impl Sandbox {
    /// Build a sandbox and wait until its pid 1 is ready for programs.
    pub fn create(spec: &SandboxSpec) -> Result<Sandbox, SandboxError> {
        // S1. As root, a fresh unprivileged uid per sandbox: host root from 2000000000 up, root
        //     in a user namespace from the ids its namespace maps (identity::namespace_pool);
        //     rootless (or root that cannot switch ids), our own (the only one we may map).
        let shape = Shape::current();
        let (host_uid, host_gid) = match (shape.powers.switch_ids, shape.pool) {
            (true, Some(pool)) => {
                let id = next_host_id(pool.half(spec.templated));
                (id, id)
            }
            _ => (
                rustix::process::geteuid().as_raw(),
                rustix::process::getegid().as_raw(),
            ),
        };

        retry_pending_removals();
        // S2. The cgroup first: if it cannot be created the run must not start half-limited.
        let mut all_runs_memory = None;
        let cgroup = match cgroup_manager() {
            Some(m) => {
                let limits = CgroupLimits {
                    // +1 for the sandbox's pid 1.
                    pids_max: spec.cgroup.pids_max.map(|p| p + 1),
                    ..spec.cgroup
                };
                let group = m.create(&new_group_name(), &limits)?;
                // S2a. Cgroup v1: pid 1 enters this group with a `cgroup.procs` write (H7),
                //      whose first of a moment waits for an RCU grace period holding the
                //      cgroup mutex. Pay it now, on a thread, with a write that moves nothing,
                //      so that it runs beside the helper's exec and pid 1's start instead of
                //      after them (cgroup::warm). After the mkdirs: they need that mutex too.
                if group.version() == CgroupVersion::V1 {
                    crate::cgroup::warm_migrations(SELF_CGROUP.as_ref(), CGROUP_ROOT.as_ref());
                }
                // Every time: another runcell process may have set another value, and the
                // parent group exists (with its controllers) once a group is made in it.
                if let Some(total) = spec.all_runs_memory_bytes {
                    all_runs_memory = Some(m.limit_all_groups(total).unwrap_or(false));
                }
                Some(group)
            }
            None => None,
        };

        // S3. The control socket, the output pipes and the lifeline; spawn the helper with an
        //     empty environment and only fds 0-4.
        let (sup_sock, child_sock) = UnixStream::pair().map_err(io_err("socketpair"))?;
        let (life_r, life_w) =
            pipe_with(PipeFlags::CLOEXEC).map_err(|e| io_err("pipe")(e.into()))?;
        let (out_r, out_w) = pipe_with(PipeFlags::CLOEXEC).map_err(|e| io_err("pipe")(e.into()))?;
        let (err_r, err_w) = pipe_with(PipeFlags::CLOEXEC).map_err(|e| io_err("pipe")(e.into()))?;
        let sock_hi = rustix::io::fcntl_dupfd_cloexec(&child_sock, PARKED_FD_MIN)
            .map_err(|e| io_err("dup")(e.into()))?;
        let life_hi = rustix::io::fcntl_dupfd_cloexec(&life_r, PARKED_FD_MIN)
            .map_err(|e| io_err("dup")(e.into()))?;
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
            .stderr(Stdio::from(err_w))
            // Its own process group: a terminal's Ctrl-C (SIGINT to the foreground group) is
            // for the supervisor to act on (`runcell repl` interrupts the running input), not
            // a signal that kills the helper and with it the sandbox behind its back. The
            // supervisor's death still ends the sandbox (the lifeline).
            .process_group(0);
        // SAFETY: the closure runs between fork and exec in the child and only calls dup2 and
        // the oom hook (open, write, close), which are async-signal-safe; the raw fds are
        // valid in the child (inherited copies).
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(sock_raw, 3) == -1 || libc::dup2(life_raw, 4) == -1 {
                    return Err(io::Error::last_os_error());
                }
                // The OOM killer takes sandbox processes first (crate::oom): every process of
                // the sandbox inherits this. Raising is always permitted.
                crate::oom::raise_to_sandbox_score()?;
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
            rootless: shape.identity != Identity::HostRoot,
            identity: shape.identity,
            private_dev: shape.powers.private_dev,
            own_uid: shape.powers.switch_ids && shape.pool.is_some(),
            kept_groups: shape.kept_groups,
            host_has_swap: MemInfo::read(HOST_MEMINFO.as_ref())
                .ok()
                .and_then(|m| m.swap_total_bytes)
                .is_some_and(|b| b > 0),
            all_runs_memory,
            io_requested: spec.cgroup.io.is_some(),
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
            persistent: false,
            proxy_listener: None,
            pid1: None,
            graft_fds: Vec::new(),
            host_gid,
            templated: spec.templated,
        };
        // S4. The sandbox description goes over the socket, never through argv or the
        //     environment (which /proc would show); then wait, bounded, for `Ready`.
        let config = JailConfig {
            hostname: spec.hostname.clone(),
            host_uid,
            host_gid,
            powers: shape.powers,
            root: spec.root.clone(),
            scratch_bytes: spec.scratch_bytes,
            scratch_inodes: spec.scratch_inodes,
            cgroup_procs: sandbox
                .cgroup
                .as_ref()
                .map(Cgroup::procs_files)
                .unwrap_or_default(),
            cgroup_dir: sandbox.cgroup.as_ref().and_then(Cgroup::clone_into_dir),
            overlays: spec.overlays.clone(),
            proxy_port: spec.proxy_port,
        };
        protocol::send(&sandbox.ctrl, &Request::Setup(config), &[])
            .map_err(io_err("send setup"))?;
        let deadline = Instant::now() + spec.setup_timeout;
        loop {
            match sandbox.wait_report(deadline)? {
                Some(Report::Spawned { pid }) => {
                    sandbox.pid1 = Some(pid);
                    continue;
                }
                Some(Report::Ready)
                    if spec.proxy_port.is_some() && sandbox.proxy_listener.is_none() =>
                {
                    return Err(SandboxError::Protocol(
                        "Ready came without the proxy's listening socket".into(),
                    ))
                }
                Some(Report::Ready) => break,
                Some(Report::Failed { step, path, error }) => {
                    return Err(SandboxError::Setup {
                        step,
                        path,
                        source: error,
                    })
                }
                Some(other) => return Err(SandboxError::Protocol(format!("{other:?}"))),
                None => return Err(SandboxError::SetupTimeout(spec.setup_timeout)),
            }
        }
        Ok(sandbox)
    }

    /// The listening socket of the run's egress proxy, in the sandbox's network namespace
    /// (once; `None` without `proxy_port`).
    pub fn take_proxy_listener(&mut self) -> Option<std::net::TcpListener> {
        self.proxy_listener.take().map(std::net::TcpListener::from)
    }

    /// The helper's host pid (for diagnostics and tests).
    pub fn helper_pid(&self) -> u32 {
        self.helper.id()
    }

    pub fn enforcement(&self) -> &Enforcement {
        &self.enforcement
    }

    /// Freeze every process of the sandbox (its cgroup's freezer): memory kept, no CPU used
    /// until [`Sandbox::thaw`]. False when the sandbox has no cgroup or no freezer. Nothing
    /// may be asked of a frozen sandbox's pid 1 (it would not answer): thaw first.
    pub fn freeze(&mut self) -> bool {
        self.cgroup.as_ref().is_some_and(Cgroup::freeze_group)
    }

    /// Thaw a sandbox frozen by [`Sandbox::freeze`].
    pub fn thaw(&mut self) {
        if let Some(c) = &self.cgroup {
            c.thaw_group();
        }
    }

    /// Wait for one report from the sandbox until `deadline`; `Ok(None)` on timeout.
    pub(super) fn wait_report(
        &mut self,
        deadline: Instant,
    ) -> Result<Option<Report>, SandboxError> {
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

    pub(super) fn read_report(&mut self) -> Result<Report, SandboxError> {
        let mut reader = FdCatcher {
            sock: &self.ctrl,
            fds: Vec::new(),
            first: true,
        };
        let frame = protocol::recv_with::<Report>(&mut reader, protocol::FrameLimits::REPORT);
        let mut fds = std::mem::take(&mut reader.fds);
        match frame {
            Ok(Some(f)) => {
                // Only `Ready` may carry a descriptor (the proxy's listener), and
                // `GraftChannel` its four; any other is closed right here.
                match f.message {
                    Report::Ready if fds.len() == 1 => self.proxy_listener = fds.pop(),
                    Report::GraftChannel => self.graft_fds = fds,
                    _ => {}
                }
                Ok(f.message)
            }
            Ok(None) | Err(_) => {
                self.alive = false;
                let status = self.reap_helper(HELPER_EXIT_GRACE);
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

    /// Whether the sandbox is still waiting for programs: its helper (and with it pid 1) has
    /// not exited. For sandboxes kept ready ahead of requests (a warm pool).
    pub fn is_ready(&mut self) -> bool {
        self.alive && matches!(self.helper.try_wait(), Ok(None))
    }

    /// Make this a session's sandbox: its interpreter keeps its state between cells, and a
    /// cell or program that runs out of time or output, or is cancelled, is interrupted
    /// (SIGINT) and then stopped, never the whole sandbox killed, so that its files survive.
    pub fn set_persistent(&mut self, persistent: bool) {
        self.persistent = persistent;
    }

    /// Every file under /workspace (`path: None`), or the one regular file at `path`
    /// (relative to /workspace), with contents within `limits`. Call between programs.
    pub fn browse(
        &mut self,
        limits: &CollectLimits,
        path: Option<&str>,
    ) -> Result<CollectedFiles, SandboxError> {
        let request = Request::Browse(protocol::Browse {
            limits: *limits,
            path: path.map(str::to_string),
            area: protocol::BrowseArea::Workspace,
        });
        self.files_request(&request, limits)
    }

    /// The one regular file `name` directly in the sandbox's /tmp (never through a link, never
    /// a FIFO or device), with its content within `limits`: how a session interpreter's report
    /// of a cell's results is read. Call between programs.
    pub fn read_tmp_file(
        &mut self,
        limits: &CollectLimits,
        name: &str,
    ) -> Result<CollectedFiles, SandboxError> {
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(SandboxError::Protocol(format!(
                "not a file name in /tmp: {name:?}"
            )));
        }
        let request = Request::Browse(protocol::Browse {
            limits: *limits,
            path: Some(name.to_string()),
            area: protocol::BrowseArea::Tmp,
        });
        self.files_request(&request, limits)
    }

    /// Kill every process of the sandbox now. pid 1 is killed, and the death of pid 1 kills its
    /// whole pid namespace: double forks, setsid, ignored SIGTERM and new sessions cannot
    /// escape that. The cgroup is killed as well when there is one. The helper is reaped
    /// before this returns.
    pub fn kill(&mut self) {
        // Closing the lifeline makes the helper SIGKILL pid 1 through its pidfd; pid 1's death
        // takes the pid namespace with it. The cgroup kill is a second, independent layer; and
        // should the helper not exit promptly, reap_helper SIGKILLs it, which kills pid 1 by
        // its parent-death signal.
        self.lifeline = None;
        if let Some(cg) = &self.cgroup {
            let _ = cg.kill_all();
        }
        let _ = self.reap_helper(HELPER_EXIT_GRACE);
        self.alive = false;
    }

    /// The files the last program(s) created or changed under /workspace, with contents within
    /// the caps. Call between programs (after `run` returned with the sandbox alive).
    pub fn collect(&mut self, limits: &CollectLimits) -> Result<CollectedFiles, SandboxError> {
        self.files_request(&Request::Collect(*limits), limits)
    }

    /// Send a `Collect` or `Browse` and read the `Files` answer.
    fn files_request(
        &mut self,
        request: &Request,
        limits: &CollectLimits,
    ) -> Result<CollectedFiles, SandboxError> {
        if !self.alive {
            return Err(SandboxError::Dead);
        }
        protocol::send(&self.ctrl, request, &[]).map_err(io_err("send collect"))?;
        let mut fds = [PollFd::new(&self.ctrl, PollFlags::IN)];
        // pid 1 bounds the collection to `deadline_ms`; allow for the transfer on top.
        let wait = Duration::from_millis(limits.deadline_ms) + COLLECT_TRANSFER_ALLOWANCE;
        match poll(&mut fds, Some(&timespec(wait))) {
            Ok(n) if n > 0 => {}
            _ => {
                // A late answer would be read as the answer to the next request: the sandbox
                // cannot be used any more.
                self.kill();
                return Err(SandboxError::Protocol("no answer to collect".into()));
            }
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
            Report::Files {
                files,
                omitted,
                notes,
            } => Ok(CollectedFiles {
                files,
                blobs: frame.blobs,
                omitted,
                notes,
            }),
            other => Err(SandboxError::Protocol(format!("{other:?}"))),
        }
    }

    pub(super) fn cgroup_stats(&self) -> CgroupStats {
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
            let _ = self.reap_helper(HELPER_EXIT_GRACE);
            self.alive = false;
        } else {
            let _ = self.reap_helper(Duration::ZERO);
        }
        if let Some(mut cg) = self.cgroup.take() {
            if let Err(e) = cg.destroy() {
                defer_removal(cg);
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

/// Reads frames from the control socket, catching a descriptor sent with a frame's first
/// bytes (`SCM_RIGHTS` arrives with the first byte read of the message it was sent with).
struct FdCatcher<'a> {
    sock: &'a UnixStream,
    fds: Vec<OwnedFd>,
    first: bool,
}

impl io::Read for FdCatcher<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if std::mem::take(&mut self.first) {
            let (n, fds) = crate::sys::recv_with_fds(self.sock, buf)?;
            self.fds = fds;
            return Ok(n);
        }
        (&mut &*self.sock).read(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_ids_are_unique_within_a_supervisor_and_never_privileged() {
        let pool = crate::identity::HOST_ROOT_POOL;
        let ids: std::collections::HashSet<u32> = (0..1000).map(|_| next_host_id(pool)).collect();
        assert_eq!(ids.len(), 1000);
        assert!(ids
            .iter()
            .all(|&id| (pool.start..pool.start + pool.len).contains(&id)));
    }
}
