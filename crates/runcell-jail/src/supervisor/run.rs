//! The run loop: hand pid 1 one program, then wait on the control socket, both output pipes
//! and the kill switch at once until the program ends, is stopped, or the sandbox is killed.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags};

use super::capture::Capture;
use super::error::io_err;
use super::{timespec, KillSwitch, OutputSink, Sandbox, SandboxError, Stream};
use crate::cgroup::CgroupVersion;
use crate::config::{ExecStep, FileSpec, Rlimits};
use crate::protocol::{self, CellStep, ExitStatus, LandlockStatus, Report, Request};
use crate::template::Template;
use std::os::fd::OwnedFd;

/// Time allowed on top of a program's wall-clock limit before pid 1 reports `Started`: pid 1
/// first writes the input files (up to the memory limit's worth, into tmpfs) and forks, and
/// the program's own clock only starts once it runs. Five seconds covers writing a few hundred
/// megabytes on a loaded two-core host; a pid 1 that needs longer is treated as a timeout.
const START_ALLOWANCE: Duration = Duration::from_secs(5);

/// How long pid 1 gets to answer a `Stop` (kill the program and everything it started, reap
/// them, report `Exited`). It needs a few sweeps of 50 ms at most; three seconds leaves room
/// for a loaded host before the supervisor falls back to killing the whole sandbox (and with
/// it the files a timed-out program wrote). `docs/isolation.md` states the same figure.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// How long the supervisor keeps reading the output pipes after it killed the sandbox. Every
/// writer is dead then, so EOF comes at once; the bound only matters if some process of the
/// sandbox is stuck in the kernel (uninterruptible sleep) and still holds a pipe.
const DRAIN_AFTER_KILL: Duration = Duration::from_secs(2);

/// How long a session's interpreter gets to abandon its cell after SIGINT (a timeout, an
/// output flood, a cancellation) before the supervisor stops the run the hard way, which ends
/// the interpreter and its state: time for a KeyboardInterrupt to unwind and its traceback
/// to print, even on a loaded host.
const INTERRUPT_GRACE: Duration = Duration::from_secs(2);

/// How long pid 1 may take to write the files of a `Put` (up to the disk limit's worth).
/// How long pid 1 may take to answer a `Graft` (it places the inputs first), and to give one
/// up.
const GRAFT_ANSWER_WITHIN: Duration = Duration::from_secs(30);

/// The parent of host process `pid`, from `/proc/<pid>/stat`.
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    after.split(' ').nth(1)?.parse().ok()
}

const PUT_ALLOWANCE: Duration = Duration::from_secs(30);

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
    /// Caps of stdout and stderr, on their size as delivered in JSON text (see
    /// `capture::Capture`): what a server holds for a run's output is bounded by them.
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
    /// A session's interpreter survived the cell (always false for programs and one-shot
    /// cells).
    pub interpreter_alive: bool,
}

/// The wire form of a program: its step, and the blobs (files, then stdin) it refers to.
fn exec_step(program: &Program) -> (ExecStep, Vec<&[u8]>) {
    let (files, mut blobs) = file_specs(&program.files);
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
    (step, blobs)
}

/// The wire form of files: their specs, and the blobs (their contents) the specs index.
fn file_specs(files: &[InputFile]) -> (Vec<FileSpec>, Vec<&[u8]>) {
    let blobs: Vec<&[u8]> = files.iter().map(|f| f.content.as_slice()).collect();
    let specs = files
        .iter()
        .enumerate()
        .map(|(blob, f)| FileSpec {
            path: f.path.clone(),
            mode: f.mode,
            blob,
        })
        .collect();
    (specs, blobs)
}

/// How a program ended, as pid 1 reported it (or as the supervisor inferred it when pid 1
/// itself was killed by the OOM killer).
#[derive(Debug, Clone, Copy)]
struct ExitRecord {
    status: ExitStatus,
    wall: Duration,
    /// CPU time of the program and its reaped descendants (rusage); used when the cgroup
    /// cannot account CPU.
    cpu: Duration,
    /// Largest resident set of any single process of the program; 0 when unknown.
    max_rss_bytes: u64,
    /// The scratch filesystem was full when the program ended.
    disk_full: bool,
    /// A session's interpreter survived.
    interpreter: bool,
}

impl ExitRecord {
    /// The record of an `Exited` report; `None` for any other report.
    fn from_report(report: &Report) -> Option<ExitRecord> {
        match *report {
            Report::Exited {
                status,
                wall_ns,
                cpu_ns,
                max_rss_bytes,
                disk_full,
                interpreter,
            } => Some(ExitRecord {
                status,
                wall: Duration::from_nanos(wall_ns),
                cpu: Duration::from_nanos(cpu_ns),
                max_rss_bytes,
                disk_full,
                interpreter,
            }),
            _ => None,
        }
    }

    /// A program that got no report of its own: it was SIGKILLed (with pid 1, by the OOM
    /// killer) after running for `wall`.
    fn killed(wall: Duration) -> ExitRecord {
        ExitRecord {
            status: ExitStatus::Signal(libc::SIGKILL),
            wall,
            cpu: Duration::ZERO,
            max_rss_bytes: 0,
            disk_full: false,
            interpreter: false,
        }
    }
}

impl Sandbox {
    /// Run a program and wait for it to end (or be stopped). The sandbox stays usable after a
    /// normal exit; after a timeout, output limit or cancellation it is dead.
    pub fn run(
        &mut self,
        program: &Program,
        sink: &mut dyn OutputSink,
        cancel: Option<&KillSwitch>,
    ) -> Result<Outcome, SandboxError> {
        let (step, blobs) = exec_step(program);
        let blobs: Vec<&[u8]> = blobs;
        self.drive(
            Some(&Request::Exec(step)),
            &blobs,
            program,
            sink,
            cancel,
            false,
        )
        .map(|(o, _)| o)
    }

    /// Start `program` as a warm interpreter that runs cells ([`Sandbox::run_cell`]), and wait
    /// until it is ready (within `program.wall_timeout`). `Ok(None)` when it is ready; the
    /// outcome of the interpreter when it ended (or was stopped) before that: it printed why.
    pub fn start_interpreter(
        &mut self,
        program: &Program,
        sink: &mut dyn OutputSink,
    ) -> Result<Option<Outcome>, SandboxError> {
        let (step, blobs) = exec_step(program);
        let (outcome, ready) = self.drive(
            Some(&Request::Start(step)),
            &blobs,
            program,
            sink,
            None,
            true,
        )?;
        Ok((!ready).then_some(outcome))
    }

    /// As [`Sandbox::start_interpreter`], but the interpreter is forked from `template`
    /// instead of started (docs/isolation.md, F1-F8): `program` must be the interpreter
    /// `template` stands for (`[python, "-c", code, args...]` with its environment). On an
    /// error the sandbox is as before (no interpreter), and the caller may start one the usual
    /// way.
    pub fn start_interpreter_forked(
        &mut self,
        template: &mut Template,
        program: &Program,
        sink: &mut dyn OutputSink,
    ) -> Result<Option<Outcome>, SandboxError> {
        if !self.alive {
            return Err(SandboxError::Dead);
        }
        if !self.templated {
            return Err(SandboxError::Template(
                "the sandbox was not built for a forked interpreter".into(),
            ));
        }
        if program.env != template.spec().env {
            return Err(SandboxError::Template(
                "the program's environment is not the template's".into(),
            ));
        }
        let pid1 = self
            .pid1
            .ok_or_else(|| SandboxError::Protocol("no pid 1 to graft onto".into()))?;
        // pid 1's namespaces, opened here (pid 1 is not dumpable: only the supervisor may),
        // while pid 1 is alive (its helper has not exited: the pid is not reused).
        let mut fds: Vec<OwnedFd> = Vec::with_capacity(12);
        for ns in ["user", "mnt", "pid", "net", "ipc", "uts", "cgroup"] {
            let path = format!("/proc/{pid1}/ns/{ns}");
            let fd = rustix::fs::open(
                path.as_str(),
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_err(|e| io_err("open a namespace of pid 1")(e.into()))?;
            fds.push(fd);
        }
        if !self.is_ready() {
            return Err(SandboxError::Dead);
        }
        // Cgroup v1: the fork's placement below waits for an RCU grace period unless one
        // passed lately; start paying it now, beside the graft and the fork (as S2a does for
        // pid 1's placement).
        if self.cgroup.as_ref().map(crate::cgroup::Cgroup::version) == Some(CgroupVersion::V1) {
            super::ownership::warm_cgroup_migrations();
        }
        let (step, blobs) = exec_step(program);
        protocol::send(&self.ctrl, &Request::Graft(step.clone()), &blobs)
            .map_err(io_err("send graft"))?;
        match self.wait_report(Instant::now() + GRAFT_ANSWER_WITHIN)? {
            Some(Report::GraftChannel) if self.graft_fds.len() == 4 => {}
            Some(Report::Failed { step, path, error }) => {
                return Err(SandboxError::Setup {
                    step,
                    path,
                    source: error,
                })
            }
            Some(other) => return Err(SandboxError::Protocol(format!("{other:?}"))),
            None => {
                self.kill();
                return Err(SandboxError::Protocol("no answer to graft".into()));
            }
        }
        fds.append(&mut self.graft_fds);
        let (go_r, go_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| io_err("pipe")(e.into()))?;
        fds.push(go_r);
        let forked = template
            .fork(
                self.enforcement.host_uid,
                self.host_gid,
                &step,
                &crate::template::borrow_all(&fds),
            )
            .map_err(|e| SandboxError::Template(crate::errno::error_chain(&e)));
        drop(fds);
        // The fork (C) goes into the sandbox's cgroup before it does anything, and only if it
        // is the template's own child.
        let placed = forked.and_then(|pid| {
            if parent_of(pid) != Some(template.pid() as i32) {
                return Err(SandboxError::Template(
                    "the fork is not the template's child".into(),
                ));
            }
            if let Some(cg) = &self.cgroup {
                cg.add_process(pid as u32)?;
            }
            Ok(())
        });
        if let Err(e) = placed {
            // pid 1 is waiting for a hello that will not come: tell it, and read its answer.
            drop(go_w);
            let _ = protocol::send(&self.ctrl, &Request::Stop, &[]);
            match self.wait_report(Instant::now() + GRAFT_ANSWER_WITHIN) {
                Ok(Some(Report::Failed { .. })) => {}
                _ => self.kill(),
            }
            return Err(e);
        }
        rustix::io::write(&go_w, b"g").map_err(|e| io_err("go")(e.into()))?;
        drop(go_w);
        let (outcome, ready) = self.drive(None, &[], program, sink, None, true)?;
        Ok((!ready).then_some(outcome))
    }

    /// Run one cell in the warm interpreter: the `files` (the cell's source among them) are
    /// written first, the interpreter runs its source file with `stdin`; the outcome is that
    /// of a program (`Exited` with the cell's exit code). In a one-shot sandbox every process
    /// of the run is killed afterwards: the interpreter serves one cell. In a persistent one
    /// ([`Sandbox::set_persistent`]) the interpreter runs `source` and keeps its state for the
    /// next cell; [`Outcome::interpreter_alive`] says whether it still can.
    pub fn run_cell(
        &mut self,
        cell: &Program,
        source: Option<&std::path::Path>,
        sink: &mut dyn OutputSink,
        cancel: Option<&KillSwitch>,
    ) -> Result<Outcome, SandboxError> {
        let (step, blobs) = exec_step(cell);
        let cell_step = CellStep {
            files: step.files,
            stdin_blob: step.stdin_blob,
            keep: self.persistent,
            source: source.map(PathBuf::from),
        };
        self.drive(
            Some(&Request::Cell(cell_step)),
            &blobs,
            cell,
            sink,
            cancel,
            false,
        )
        .map(|(o, _)| o)
    }

    /// Write files into the sandbox between programs (under /workspace or /tmp).
    pub fn put_files(&mut self, files: &[InputFile]) -> Result<(), SandboxError> {
        if !self.alive {
            return Err(SandboxError::Dead);
        }
        let (specs, blobs) = file_specs(files);
        protocol::send(&self.ctrl, &Request::Put { files: specs }, &blobs)
            .map_err(io_err("send files"))?;
        match self.wait_report(Instant::now() + PUT_ALLOWANCE)? {
            Some(Report::Written) => Ok(()),
            Some(Report::Failed { step, path, error }) => Err(SandboxError::Setup {
                step,
                path,
                source: error,
            }),
            Some(other) => Err(SandboxError::Protocol(format!("{other:?}"))),
            None => {
                self.kill();
                Err(SandboxError::Protocol("no answer to put".into()))
            }
        }
    }

    /// Send `request` (an `Exec`, `Start` or `Cell`) and follow the program it starts until it
    /// ends, is stopped, or (with `until_ready`) says it is ready: true in the second value.
    fn drive(
        &mut self,
        request: Option<&Request>,
        blobs: &[&[u8]],
        program: &Program,
        sink: &mut dyn OutputSink,
        cancel: Option<&KillSwitch>,
        until_ready: bool,
    ) -> Result<(Outcome, bool), SandboxError> {
        if !self.alive {
            return Err(SandboxError::Dead);
        }
        let before = self.cgroup_stats();
        if let Some(cg) = &self.cgroup {
            cg.reset_peak();
        }
        if let Some(request) = request {
            protocol::send(&self.ctrl, request, blobs).map_err(io_err("send program"))?;
        }
        let mut ready = false;

        let started = Instant::now();
        let mut deadline = started + program.wall_timeout + START_ALLOWANCE;
        let mut out = Capture::new(program.stdout_cap);
        let mut err = Capture::new(program.stderr_cap);
        let mut end: Option<End> = None;
        let mut exited: Option<ExitRecord> = None;
        let mut landlock = None;
        let mut program_started: Option<Instant> = None;

        while exited.is_none() && end.is_none() && !ready {
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
            let n_ready = match poll(&mut fds, Some(&timespec(left))) {
                Ok(n) => n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(io_err("poll")(e.into())),
            };
            let revents: Vec<PollFlags> = fds.iter().map(|f| f.revents()).collect();
            drop(fds);
            if n_ready == 0 {
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
                        exited = Some(ExitRecord::killed(
                            program_started.map(|s| s.elapsed()).unwrap_or_default(),
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
                    Report::Exited { .. } => exited = ExitRecord::from_report(&report),
                    Report::InterpreterReady if until_ready => ready = true,
                    Report::Failed { step, .. } if step == "cell" => {
                        return Err(SandboxError::NoInterpreter)
                    }
                    Report::Failed { step, path, error } => {
                        // A session's inputs that could not be written (its disk is full):
                        // nothing started and pid 1 waits for the next request; its files and
                        // its interpreter stay.
                        if !(self.persistent && program_started.is_none()) {
                            self.kill();
                        }
                        return Err(SandboxError::Setup {
                            step,
                            path,
                            source: error,
                        });
                    }
                    other => return Err(SandboxError::Protocol(format!("{other:?}"))),
                }
            }
        }

        if self.persistent && end.is_some() && exited.is_none() {
            // A session: Ctrl-C first, so that an interpreter can keep its state; the output
            // it prints meanwhile (the traceback) still counts, within the caps.
            exited = self.interrupt_program(&mut out, &mut err, sink);
        }
        let stop = matches!(end, Some(End::TimedOut | End::OutputLimit(_)))
            || (self.persistent && end == Some(End::Cancelled));
        if stop && exited.is_none() {
            // Ask pid 1 to kill the program and everything it started: the sandbox and its
            // files survive (outputs written before a timeout are still collected). If pid 1
            // does not answer in time, fall through to the hard kill below.
            exited = self.stop_program(STOP_GRACE);
        }
        if end.is_some() && exited.is_none() {
            // Cancellation, or a Stop that got no answer: kill the whole sandbox (which reaps
            // the helper), then drain what the pipes still hold (all writers are dead, so EOF
            // comes quickly).
            self.kill();
            let drain_until = Instant::now() + DRAIN_AFTER_KILL;
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
        if ready {
            // Started and waiting: what it printed while starting (flushed before it said so)
            // is the outcome's output, never the first request's.
            let now = Instant::now();
            out.drain(&self.stdout, Stream::Stdout, sink, now);
            err.drain(&self.stderr, Stream::Stderr, sink, now);
            let wall = program_started.map(|s| s.elapsed()).unwrap_or_default();
            return Ok((
                Outcome {
                    end: End::Exited(ExitStatus::Code(0)),
                    wall,
                    cpu: Duration::ZERO,
                    peak_memory_bytes: after.memory_peak_bytes,
                    oom_kills: 0,
                    pids_limit_hits: 0,
                    disk_full: false,
                    stdout_truncated: out.over,
                    stderr_truncated: err.over,
                    stdout: out.data,
                    stderr: err.data,
                    landlock,
                    interpreter_alive: false,
                },
                true,
            ));
        }
        let (status_end, record) = match exited {
            Some(r) => (End::Exited(r.status), r),
            // Stopped or killed without a report from pid 1: only the wall time is known.
            None => (
                end.unwrap_or(End::Cancelled),
                ExitRecord::killed(program_started.map(|s| s.elapsed()).unwrap_or_default()),
            ),
        };
        let end = end.unwrap_or(status_end);
        let cpu = match (before.cpu_usage_ns, after.cpu_usage_ns) {
            (Some(b), Some(a)) => Duration::from_nanos(a.saturating_sub(b)),
            _ => record.cpu,
        };
        let max_rss = record.max_rss_bytes;
        let peak = after.memory_peak_bytes.or((max_rss > 0).then_some(max_rss));
        Ok((
            Outcome {
                end,
                wall: match end {
                    End::TimedOut => program.wall_timeout,
                    _ => record.wall,
                },
                cpu,
                peak_memory_bytes: peak,
                oom_kills: after.oom_kills.saturating_sub(before.oom_kills),
                pids_limit_hits: after.pids_limit_hits.saturating_sub(before.pids_limit_hits),
                disk_full: record.disk_full,
                stdout_truncated: out.over,
                stderr_truncated: err.over,
                stdout: out.data,
                stderr: err.data,
                landlock,
                interpreter_alive: exited.is_some_and(|r| r.interpreter),
            },
            false,
        ))
    }

    /// Send `Interrupt` and wait up to [`INTERRUPT_GRACE`] for pid 1's `Exited`, reading the
    /// output meanwhile (a program blocked on a full pipe could not unwind).
    fn interrupt_program(
        &mut self,
        out: &mut Capture,
        err: &mut Capture,
        sink: &mut dyn OutputSink,
    ) -> Option<ExitRecord> {
        protocol::send(&self.ctrl, &Request::Interrupt, &[]).ok()?;
        let deadline = Instant::now() + INTERRUPT_GRACE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            let mut fds = [
                PollFd::new(&self.ctrl, PollFlags::IN),
                PollFd::new(&self.stdout, PollFlags::IN),
                PollFd::new(&self.stderr, PollFlags::IN),
            ];
            match poll(&mut fds, Some(&timespec(left))) {
                Ok(0) => return None,
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => return None,
            }
            let revents: Vec<PollFlags> = fds.iter().map(|f| f.revents()).collect();
            if !revents[1].is_empty() {
                out.read_from(&self.stdout, Stream::Stdout, sink);
            }
            if !revents[2].is_empty() {
                err.read_from(&self.stderr, Stream::Stderr, sink);
            }
            if !revents[0].is_empty() {
                match self.read_report() {
                    Ok(report @ Report::Exited { .. }) => return ExitRecord::from_report(&report),
                    Ok(Report::Started { .. }) => continue,
                    _ => return None,
                }
            }
        }
    }

    /// Send `Stop` and wait up to `grace` for pid 1's `Exited`.
    fn stop_program(&mut self, grace: Duration) -> Option<ExitRecord> {
        protocol::send(&self.ctrl, &Request::Stop, &[]).ok()?;
        let deadline = Instant::now() + grace;
        loop {
            match self.wait_report(deadline) {
                Ok(Some(report @ Report::Exited { .. })) => {
                    return ExitRecord::from_report(&report)
                }
                // The program had only just started when the deadline hit.
                Ok(Some(Report::Started { .. })) => continue,
                _ => return None,
            }
        }
    }
}
