//! Templates: a prepared Python interpreter (started, its preload modules imported) from which
//! the interpreters of sandboxes are forked, so that the imports are shared copy-on-write and
//! each new interpreter costs a fork instead of a start and the imports.
//!
//! A sandbox is still built exactly as before (helper, pid 1, its namespaces, root, cgroup);
//! only its interpreter comes from the template instead of an exec by pid 1. The steps are in
//! `docs/isolation.md` ("Templates"): T0-T6 for the template itself (`zygote.rs`), F1-F8 for
//! each fork. This side, the supervisor's, starts the template ([`Template::start`]) and hands
//! it each fork's descriptors ([`Template::fork`]).

mod filter;
mod python;
mod zygote;

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags};
use serde::{Deserialize, Serialize};

use crate::cgroup::{Cgroup, CgroupLimits};
use crate::config::Rlimits;
use crate::identity::IdPool;
use crate::protocol;
use crate::supervisor::template_support::{cgroup_manager_for_template, template_group_name};

pub use zygote::{template_main, TEMPLATE_ARG};

/// Processes a template's own cgroup may hold: itself, and its forks for the moment before the
/// supervisor moves them into their sandbox's group.
const TEMPLATE_PIDS_MAX: u64 = 64;

/// How long one fork may take to be answered.
const FORK_ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// Why a template could not start or fork.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("template: {0}")]
    Python(String),
    #[error("template: {step}")]
    Io {
        step: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("template failed: {0}")]
    Failed(String),
    #[error("the template did not answer in time")]
    Timeout,
    #[error("the template is gone")]
    Gone,
}

fn io_err(step: &'static str) -> impl FnOnce(io::Error) -> TemplateError {
    move |source| TemplateError::Io { step, source }
}

/// What a template is: the interpreter it runs as, and what it imports.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateSpec {
    /// The Python executable it stands for (`sys.executable`; a virtual environment's python
    /// finds its `pyvenv.cfg` from it).
    pub program: PathBuf,
    /// That Python's shared library (`libpython3.X.so.1.0`), see [`find_libpython`].
    pub library: PathBuf,
    /// The exact environment of the interpreters forked from it (a run with another
    /// environment cannot use this template).
    pub env: Vec<(String, String)>,
    /// Modules imported once, before any fork.
    pub preload: Vec<String>,
}

/// Supervisor -> template.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum TemplateRequest {
    /// First message: what to be, and the ids its forks take (the templated half of the
    /// supervisor's pool, for its seccomp filter).
    Spec { spec: TemplateSpec, ids: IdPool },
    /// Fork one interpreter into a sandbox. Attached, in order: the sandbox's user, mnt, pid,
    /// net, ipc, uts and cgroup namespaces, the cell channel, stdin, stdout, stderr, and the
    /// read end of the "go" pipe.
    Fork(ForkOrder),
}

/// Descriptors a [`TemplateRequest::Fork`] carries.
const FORK_FDS: usize = 12;

/// One fork: who the interpreter runs as, and the program it stands for.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ForkOrder {
    host_uid: u32,
    host_gid: u32,
    /// The program's argv: `[python, "-c", code, args...]`.
    argv: Vec<String>,
    cwd: PathBuf,
    rlimits: Rlimits,
}

/// Template -> supervisor.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum TemplateReport {
    /// The preloads are imported: send forks.
    Ready,
    /// A fork exists (host pid of the first process, C); it waits for "go".
    Forked { pid: i32 },
    /// The template could not become ready, or could not fork.
    Failed { message: String },
}

/// A running template, owned by the supervisor. Dropping it kills it.
pub struct Template {
    spec: TemplateSpec,
    child: Child,
    ctrl: UnixStream,
    cgroup: Option<Cgroup>,
    started: Instant,
    forks: u64,
    /// How long it took to become ready.
    start_time: Duration,
}

/// The shared library of the Python at `program`, as its own `sysconfig` names it; `Err` says
/// why there is none (a Python built without `--enable-shared` whose library is not
/// installed: on Debian the `libpython3.X` package).
pub fn find_libpython(program: &Path) -> Result<PathBuf, TemplateError> {
    let out = Command::new(program)
        .args([
            "-I",
            "-c",
            "import os, sysconfig as s; print(os.path.join(s.get_config_var('LIBDIR') or '', \
             s.get_config_var('INSTSONAME') or ''))",
        ])
        .env_clear()
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map_err(io_err("ask python for its library"))?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !out.status.success() || !name.starts_with("libpython") || !name.contains(".so") {
        return Err(TemplateError::Python(format!(
            "{} names no shared library of its own",
            program.display()
        )));
    }
    if !path.exists() {
        return Err(TemplateError::Python(format!(
            "{} is not installed (on Debian: apt-get install {})",
            path.display(),
            name.split(".so").next().unwrap_or("libpython3")
        )));
    }
    Ok(path)
}

impl Template {
    /// Start a template (`exe __template`) and wait, bounded, until its preloads are imported.
    pub fn start(
        spec: &TemplateSpec,
        exe: &Path,
        timeout: Duration,
    ) -> Result<Template, TemplateError> {
        let started = Instant::now();
        // Forks take the sandboxes' host uids: only root with a pool of ids has templates.
        let shape = crate::identity::Shape::current();
        let ids = match (shape.identity, shape.powers.switch_ids, shape.pool) {
            (crate::identity::Identity::HostRoot, true, Some(pool)) => pool,
            _ => {
                return Err(TemplateError::Failed(
                    "templates need runcell to run as root on the host with a pool of ids".into(),
                ))
            }
        };
        let (ours, theirs) = UnixStream::pair().map_err(io_err("socketpair"))?;
        let theirs_hi =
            rustix::io::fcntl_dupfd_cloexec(&theirs, 64).map_err(|e| io_err("dup")(e.into()))?;
        drop(theirs);
        let raw = std::os::fd::AsRawFd::as_raw_fd(&theirs_hi);
        let mut cmd = Command::new(exe);
        cmd.arg0("runcell-template")
            .arg(TEMPLATE_ARG)
            .env_clear()
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // A preload that fails to import prints its traceback here: the server's log.
            .stderr(Stdio::inherit())
            .process_group(0);
        // SAFETY: the closure runs between fork and exec and only calls dup2 and the oom hook
        // (open, write, close), which are async-signal-safe; `raw` is a valid inherited fd.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(raw, 3) == -1 {
                    return Err(io::Error::last_os_error());
                }
                crate::oom::raise_to_sandbox_score()?;
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(io_err("spawn the template"))?;
        drop(theirs_hi);
        // Its own group, with a small process limit, before it runs anything of Python's.
        let cgroup = match cgroup_manager_for_template() {
            Some(m) => {
                let limits = CgroupLimits {
                    pids_max: Some(TEMPLATE_PIDS_MAX),
                    ..CgroupLimits::default()
                };
                let group = m
                    .create(&template_group_name(), &limits)
                    .map_err(|e| TemplateError::Failed(format!("its cgroup: {e}")))?;
                if let Err(e) = group.add_process(child.id()) {
                    let mut t = Template::wrap(spec, child, ours, Some(group), started);
                    t.kill();
                    return Err(TemplateError::Failed(format!(
                        "placing it in its cgroup: {e}"
                    )));
                }
                Some(group)
            }
            None => None,
        };
        let mut t = Template::wrap(spec, child, ours, cgroup, started);
        let request = TemplateRequest::Spec {
            spec: spec.clone(),
            ids: ids.half(true),
        };
        protocol::send(&t.ctrl, &request, &[]).map_err(io_err("send the spec"))?;
        match t.answer(started + timeout)? {
            TemplateReport::Ready => {
                t.start_time = started.elapsed();
                Ok(t)
            }
            TemplateReport::Failed { message } => Err(TemplateError::Failed(message)),
            other => Err(TemplateError::Failed(format!("unexpected {other:?}"))),
        }
    }

    fn wrap(
        spec: &TemplateSpec,
        child: Child,
        ctrl: UnixStream,
        cgroup: Option<Cgroup>,
        started: Instant,
    ) -> Template {
        Template {
            spec: spec.clone(),
            child,
            ctrl,
            cgroup,
            started,
            forks: 0,
            start_time: Duration::ZERO,
        }
    }

    pub fn spec(&self) -> &TemplateSpec {
        &self.spec
    }

    /// The template's host pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Forks made so far.
    pub fn forks(&self) -> u64 {
        self.forks
    }

    pub fn age(&self) -> Duration {
        self.started.elapsed()
    }

    /// How long it took to start and import its preloads.
    pub fn start_time(&self) -> Duration {
        self.start_time
    }

    /// Whether it still serves forks: alive, and alone in its cgroup (between forks every fork
    /// has been moved out; anything else there is a process it started on its own).
    pub fn is_healthy(&mut self) -> bool {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return false;
        }
        match &self.cgroup {
            Some(cg) => cg.pids() == [self.child.id()],
            None => true,
        }
    }

    /// Wait for one report until `deadline`.
    fn answer(&mut self, deadline: Instant) -> Result<TemplateReport, TemplateError> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(TemplateError::Timeout);
            }
            let mut fds = [PollFd::new(&self.ctrl, PollFlags::IN)];
            match poll(&mut fds, Some(&crate::supervisor::timespec(left))) {
                Ok(0) => return Err(TemplateError::Timeout),
                Ok(_) => break,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(io_err("poll")(e.into())),
            }
        }
        match protocol::recv_with::<TemplateReport>(&self.ctrl, protocol::FrameLimits::REPORT) {
            Ok(Some(f)) => Ok(f.message),
            _ => Err(TemplateError::Gone),
        }
    }

    /// Fork one interpreter: send the order with its descriptors (see
    /// [`TemplateRequest::Fork`]); returns the host pid of the fork's first process, which
    /// waits on the go pipe until the caller has placed it in the sandbox's cgroup.
    pub(crate) fn fork(
        &mut self,
        host_uid: u32,
        host_gid: u32,
        step: &crate::config::ExecStep,
        fds: &[BorrowedFd<'_>],
    ) -> Result<i32, TemplateError> {
        if fds.len() != FORK_FDS {
            return Err(TemplateError::Failed(format!(
                "{} descriptors for a fork",
                fds.len()
            )));
        }
        let order = ForkOrder {
            host_uid,
            host_gid,
            argv: step.argv.clone(),
            cwd: step.cwd.clone(),
            rlimits: step.rlimits,
        };
        let bytes =
            protocol::encode(&TemplateRequest::Fork(order), &[]).map_err(io_err("encode"))?;
        crate::sys::send_with_fds(&self.ctrl, &bytes, fds).map_err(io_err("send the fork"))?;
        self.forks += 1;
        match self.answer(Instant::now() + FORK_ANSWER_WITHIN)? {
            TemplateReport::Forked { pid } => Ok(pid),
            TemplateReport::Failed { message } => Err(TemplateError::Failed(message)),
            other => Err(TemplateError::Failed(format!("unexpected {other:?}"))),
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(mut cg) = self.cgroup.take() {
            let _ = cg.kill_all();
            let _ = cg.destroy();
        }
    }
}

impl Drop for Template {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Keep the owned descriptors of a fork alive while borrowing them in order.
pub(crate) fn borrow_all(fds: &[OwnedFd]) -> Vec<BorrowedFd<'_>> {
    fds.iter().map(AsFd::as_fd).collect()
}
