//! The verdict: the JSON contract shared by the CLI, the HTTP API, the MCP server and the tests.
//!
//! ```json
//! {"stdout": "1\n", "stderr": "", "exit_code": 0, "execution_time": 0.012,
//!  "stdout_truncated": false, "stderr_truncated": false, "error": null,
//!  "usage": {"cpu_time": 0.009, "peak_memory_bytes": 8388608}, "files": [],
//!  "enforcement": {"namespaces": [...], "seccomp": true, "landlock": "full", "cgroup": "v1"}}
//! ```

use std::time::Duration;

use runcell_jail::{End, Enforcement, ExitStatus, Outcome};
use serde::{Deserialize, Serialize};

use crate::limits::Limits;
use crate::units::{format_duration, format_size};

/// Why a run did not succeed.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCategory {
    /// The program exited with a non-zero code or was killed by a signal of its own making.
    RuntimeError,
    /// The program did not compile.
    CompileError,
    /// The wall-clock (or CPU) time limit ran out.
    Timeout,
    /// The memory limit was hit and the kernel killed the program.
    MemoryLimit,
    /// The process/thread limit was hit.
    ProcessLimit,
    /// stdout or stderr went past its cap.
    OutputLimit,
    /// /tmp + /workspace + /dev/shm ran full.
    DiskLimit,
    /// The language's runtime is not installed on this host.
    RuntimeUnavailable,
    /// The request itself is wrong (unknown language, bad limits, code too large, ...).
    InvalidRequest,
    /// The sandbox could not be set up; a problem of the host, not of the program.
    SandboxFailure,
    /// The run was stopped from outside: its client went away or cancelled it, or the server
    /// shut down.
    Cancelled,
}

impl ErrorCategory {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCategory::RuntimeError => "runtime_error",
            ErrorCategory::CompileError => "compile_error",
            ErrorCategory::Timeout => "timeout",
            ErrorCategory::MemoryLimit => "memory_limit",
            ErrorCategory::ProcessLimit => "process_limit",
            ErrorCategory::OutputLimit => "output_limit",
            ErrorCategory::DiskLimit => "disk_limit",
            ErrorCategory::RuntimeUnavailable => "runtime_unavailable",
            ErrorCategory::InvalidRequest => "invalid_request",
            ErrorCategory::SandboxFailure => "sandbox_failure",
            ErrorCategory::Cancelled => "cancelled",
        }
    }

    /// Whether a changed program (or request) can succeed where this one failed.
    pub fn retryable(self) -> bool {
        !matches!(
            self,
            ErrorCategory::RuntimeUnavailable | ErrorCategory::SandboxFailure
        )
    }
}

/// The error part of a verdict.
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, utoipa::ToSchema,
)]
pub struct VerdictError {
    pub category: ErrorCategory,
    pub retryable: bool,
    /// One or two sentences a model can act on.
    pub message: String,
    /// The OS error behind a `sandbox_failure` (EACCES, EBUSY, ...), when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os_error: Option<crate::error::OsError>,
}

impl VerdictError {
    pub fn new(category: ErrorCategory, message: impl Into<String>) -> Self {
        VerdictError {
            category,
            retryable: category.retryable(),
            message: message.into(),
            os_error: None,
        }
    }
}

/// Resources the program used.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    utoipa::ToSchema,
)]
pub struct Usage {
    /// CPU seconds of the program and all its processes.
    pub cpu_time: f64,
    /// Peak memory of the sandbox (cgroup), or of its largest process without a cgroup.
    pub peak_memory_bytes: Option<u64>,
}

/// A file the program created or changed under /workspace.
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, utoipa::ToSchema,
)]
pub struct OutputFile {
    pub path: String,
    pub size: u64,
    pub mime_type: String,
    /// Hex sha256 of the whole file; null when the file was too large to read within the
    /// run's limits (a sparse file claiming more than the disk limit).
    pub sha256: Option<String>,
    /// The content, unless the file was over the per-file or total cap.
    pub content_base64: Option<String>,
    /// True when the content was left out because of a cap.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// Set by `runcell run --output-dir` only: why this file was not written to the output
    /// directory (absent when it was written, and in every other front end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_written: Option<String>,
}

/// Which isolation layers were in force for this run.
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, utoipa::ToSchema,
)]
pub struct EnforcementReport {
    pub namespaces: Vec<String>,
    pub seccomp: bool,
    /// "full", "partial" or "none".
    pub landlock: String,
    /// "v1", "v2" or "none".
    pub cgroup: String,
    /// runcell ran without root in the host's user namespace (unprivileged, or root in a
    /// container's user namespace).
    pub rootless: bool,
    /// Who runcell ran as: "root", "root_in_user_namespace" or "unprivileged".
    #[serde(default)]
    pub identity: String,
    /// The sandbox's /dev: "private" (device nodes of its own) or "host" (the host's nodes
    /// bound in, shared with the host and other runs: no CAP_MKNOD where runcell runs).
    #[serde(default)]
    pub devices: String,
    /// Each sandbox ran as a uid of its own (false: as runcell's own uid).
    #[serde(default)]
    pub own_uid: bool,
    /// Layers that could not be set up on this host, in words. Empty when all are enforced.
    pub missing: Vec<String>,
}

impl From<&Enforcement> for EnforcementReport {
    fn from(e: &Enforcement) -> Self {
        EnforcementReport {
            namespaces: e.namespaces.iter().map(|s| s.to_string()).collect(),
            seccomp: e.seccomp,
            landlock: e
                .landlock
                .map(|l| l.as_str().to_string())
                .unwrap_or_else(|| "none".into()),
            cgroup: e
                .cgroup
                .map(|v| v.to_string())
                .unwrap_or_else(|| "none".into()),
            rootless: e.rootless,
            identity: e.identity.as_str().into(),
            devices: if e.private_dev { "private" } else { "host" }.into(),
            own_uid: e.own_uid,
            missing: e.missing(),
        }
    }
}

impl EnforcementReport {
    /// For verdicts of runs that never reached a sandbox.
    pub fn none() -> Self {
        EnforcementReport {
            namespaces: Vec::new(),
            seccomp: false,
            landlock: "none".into(),
            cgroup: "none".into(),
            rootless: false,
            identity: String::new(),
            devices: String::new(),
            own_uid: false,
            missing: Vec::new(),
        }
    }
}

/// The result of one execution.
#[derive(
    Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema, utoipa::ToSchema,
)]
pub struct Verdict {
    pub stdout: String,
    pub stderr: String,
    /// The program's exit code (128 + N for signal N; 124 on timeout, 137 on memory limit).
    /// `null` when no program ran (invalid request, missing runtime, sandbox failure).
    pub exit_code: Option<i32>,
    /// Wall-clock seconds of the program.
    pub execution_time: f64,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub error: Option<VerdictError>,
    pub usage: Usage,
    pub files: Vec<OutputFile>,
    /// Output files left out of `files`: because of the file-count cap, or because their
    /// paths could not be returned faithfully (not valid UTF-8, longer than 1024 bytes; a
    /// warning then says so).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub files_omitted: u64,
    pub enforcement: EnforcementReport,
    /// The language that ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// Seconds spent compiling (compiled languages only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compile_time: Option<f64>,
    /// The limits the run had.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    /// What the operator should know although the run itself is complete: a memory limit that
    /// could only be enforced per process, a teardown step that failed. Isolation layers that
    /// are missing are in `enforcement.missing`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Sessions only: the session the code ran in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Sessions only: this call's number in the session (1 for the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_count: Option<u64>,
    /// Sessions only: true when the session's state (variables, imports, definitions) did not
    /// survive this call: its interpreter ended (a memory kill, a crash, an exit, an
    /// interruption it did not survive) and was restarted. `warnings` says what was lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_lost: Option<bool>,
    /// Runs that asked for network: every connection the run made or tried through runcell's
    /// egress proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkReport>,
    /// Runs that asked for packages: the layer they ran with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packages: Option<PackagesReport>,
    /// Sessions only: what the call displayed, as a notebook shows it: the value of its last
    /// expression (`is_main_result`) and everything passed to `display()` or shown as a
    /// figure, in order, each as a MIME bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub results: Option<Vec<DisplayResult>>,
    /// Sessions only: the exception that ended the call, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exception: Option<ExceptionReport>,
}

/// One thing a session call displayed, as a MIME bundle (Jupyter's `display_data` and
/// `execute_result`).
#[derive(
    Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema, utoipa::ToSchema,
)]
pub struct DisplayResult {
    /// True for the value of the call's last expression (at most one per call).
    pub is_main_result: bool,
    /// MIME type to content: `text/plain` always; `text/html`, `text/markdown`,
    /// `text/latex`, `image/svg+xml` as text; `image/png` and `image/jpeg` as base64;
    /// `application/json` as JSON.
    #[schema(value_type = Object)]
    pub data: std::collections::BTreeMap<String, serde_json::Value>,
}

/// An exception that ended a session call.
#[derive(
    Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema, utoipa::ToSchema,
)]
pub struct ExceptionReport {
    /// The exception's type, e.g. `ZeroDivisionError`.
    pub name: String,
    /// Its message, e.g. `division by zero`.
    pub value: String,
    /// The traceback as printed.
    pub traceback: String,
}

/// The package layer a run had.
#[derive(
    Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema, utoipa::ToSchema,
)]
pub struct PackagesReport {
    /// The requirements, normalised (one per name, PEP 503 names, sorted extras and
    /// specifiers).
    pub requirements: Vec<String>,
    /// The layer's name in the cache (the hash of the files it holds: sets that install the
    /// same files share it).
    pub layer: String,
    /// Whether the layer was in the cache already (nothing was installed).
    pub cached: bool,
    /// How long the install took, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install_seconds: Option<f64>,
}

/// What a run did on the network.
#[derive(
    Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema, utoipa::ToSchema,
)]
pub struct NetworkReport {
    pub connections: Vec<NetworkConnection>,
}

/// One connection a run made, or tried, through the egress proxy.
#[derive(
    Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema, utoipa::ToSchema,
)]
pub struct NetworkConnection {
    /// The destination as the run asked for it.
    pub host: String,
    pub port: u16,
    /// Whether the policy let it through (it may still have failed to connect).
    pub allowed: bool,
    /// The address the proxy connected to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Why it was refused, failed or cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Bytes from the run to the destination.
    pub bytes_out: u64,
    /// Bytes from the destination to the run.
    pub bytes_in: u64,
    pub duration_seconds: f64,
}

impl From<runcell_proxy::Connection> for NetworkConnection {
    fn from(c: runcell_proxy::Connection) -> Self {
        NetworkConnection {
            host: c.host,
            port: c.port,
            allowed: c.allowed,
            address: c.address,
            reason: c.reason,
            bytes_out: c.bytes_out,
            bytes_in: c.bytes_in,
            duration_seconds: c.duration_seconds,
        }
    }
}

impl Verdict {
    /// A verdict for a run that never started.
    pub fn failed(category: ErrorCategory, message: impl Into<String>) -> Verdict {
        Verdict {
            stdout: String::new(),
            stderr: String::new(),
            exit_code: None,
            execution_time: 0.0,
            stdout_truncated: false,
            stderr_truncated: false,
            error: Some(VerdictError::new(category, message)),
            usage: Usage::default(),
            files: Vec::new(),
            files_omitted: 0,
            enforcement: EnforcementReport::none(),
            language: None,
            compile_time: None,
            limits: None,
            warnings: Vec::new(),
            session_id: None,
            execution_count: None,
            state_lost: None,
            network: None,
            packages: None,
            results: None,
            exception: None,
        }
    }

    pub fn category(&self) -> Option<ErrorCategory> {
        self.error.as_ref().map(|e| e.category)
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Output bytes as a JSON-safe string: invalid UTF-8 becomes U+FFFD.
pub fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The line of an error output that best says what went wrong: a Go `panic:` line, the last
/// `SomethingError: ...` / `...Exception: ...` line (Python, Node), a Ruby `... (NameError)`
/// line, otherwise the last line that is not a stack frame or a version banner.
pub fn error_hint(stderr: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.trim().is_empty())
        .collect();
    let is_error_line = |l: &&str| {
        let head = l.split(':').next().unwrap_or("");
        !l.starts_with(char::is_whitespace)
            && head
                .chars()
                .all(|c| c.is_alphanumeric() || c == '_' || c == '.')
            && (head.ends_with("Error")
                || head.ends_with("Exception")
                || head.ends_with("Interrupt"))
            && l.contains(':')
    };
    let ruby_error = |l: &&str| {
        l.ends_with(')')
            && l.contains(": ")
            && l.rsplit('(')
                .next()
                .is_some_and(|e| e.contains("Error") || e.contains("Exception"))
    };
    let pick = lines
        .iter()
        .find(|l| l.starts_with("panic: ") || l.starts_with("fatal error: "))
        .or_else(|| lines.iter().rev().find(|l| is_error_line(l)))
        .or_else(|| lines.iter().find(|l| ruby_error(l)))
        .or_else(|| {
            lines.iter().rev().find(|l| {
                !l.starts_with(char::is_whitespace)
                    && !l.starts_with("Node.js v")
                    && !l.starts_with("goroutine ")
            })
        })?;
    Some(truncate_chars(pick.trim(), 300))
}

/// The first meaningful line (a compiler's first error).
pub fn first_line(out: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(out);
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))?;
    Some(truncate_chars(line, 300))
}

fn truncate_chars(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        s.chars().take(max).collect::<String>() + "…"
    }
}

fn signal_name(sig: i32) -> String {
    let name = match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        24 => "SIGXCPU",
        25 => "SIGXFSZ",
        31 => "SIGSYS",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

const SIGKILL: i32 = 9;
const SIGXCPU: i32 = 24;
const SIGXFSZ: i32 = 25;
const SIGSYS: i32 = 31;

/// Which phase a program belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Compile,
    Run,
}

/// Turn what happened to a program into an exit code and, unless it succeeded, an error.
/// Pure, so every branch is unit-tested.
pub fn classify(outcome: &Outcome, limits: &Limits, phase: Phase) -> (i32, Option<VerdictError>) {
    use ErrorCategory::*;
    let timeout = match phase {
        Phase::Compile => limits.compile_timeout(),
        Phase::Run => limits.timeout(),
    };
    let what = match phase {
        Phase::Compile => "The compiler",
        Phase::Run => "The program",
    };
    let pids_hit = outcome.pids_limit_hits > 0;
    let pids_msg = || {
        format!(
            "{what} hit the limit of {} processes and threads (fork or thread creation failed). \
             Use fewer processes or threads, and make sure it does not spawn them in a loop.",
            limits.pids.0
        )
    };
    match outcome.end {
        End::TimedOut => {
            if pids_hit {
                return (
                    124,
                    Some(VerdictError::new(
                        ProcessLimit,
                        format!(
                            "{} It then ran until the {} time limit and was stopped.",
                            pids_msg(),
                            format_duration(timeout)
                        ),
                    )),
                );
            }
            (
                124,
                Some(VerdictError::new(
                    Timeout,
                    timeout_message(what, timeout, phase),
                )),
            )
        }
        End::OutputLimit(stream) => {
            let name = match stream {
                runcell_jail::Stream::Stdout => "stdout",
                runcell_jail::Stream::Stderr => "stderr",
            };
            (
                137,
                Some(VerdictError::new(
                    OutputLimit,
                    format!(
                        "{what} wrote more than {} to {name} and was stopped; the output shown is \
                 truncated. Print less: summaries, counts or the first rows instead of everything.",
                        format_size(limits.output.0)
                    ),
                )),
            )
        }
        End::Cancelled => (
            137,
            Some(VerdictError::new(
                Cancelled,
                "The run was cancelled before it finished (the client went away or cancelled \
                 it, or the server shut down). Nothing is wrong with the code; run it again.",
            )),
        ),
        End::Exited(status) => {
            let code = status.code();
            if code == 0 {
                return (0, None);
            }
            if outcome.oom_kills > 0 {
                return (
                    137,
                    Some(VerdictError::new(
                        MemoryLimit,
                        format!(
                    "{what} was killed because it used more than the {} memory limit (swap \
                     included). Use less memory: process data in chunks, use smaller types, \
                     avoid holding everything in lists.",
                    format_size(limits.memory.0)
                ),
                    )),
                );
            }
            if status == ExitStatus::Signal(SIGXFSZ) || outcome.disk_full {
                return (
                    code,
                    Some(VerdictError::new(
                        DiskLimit,
                        format!(
                    "{what} ran out of disk space: /tmp, /workspace and /dev/shm share {}. \
                     Write less data or smaller files.",
                    format_size(limits.disk.0)
                ),
                    )),
                );
            }
            // SIGXCPU at the soft CPU rlimit, or SIGKILL at the hard one (a second later) for a
            // program that catches SIGXCPU.
            let cpu_limit = Duration::from_secs(limits.cpu_rlimit_seconds(timeout));
            if status == ExitStatus::Signal(SIGXCPU)
                || (status == ExitStatus::Signal(SIGKILL) && outcome.cpu >= cpu_limit)
            {
                return (124, Some(VerdictError::new(Timeout, format!(
                    "{what} used up its CPU time ({} of CPU) and was stopped. Make it do less work.",
                    format_duration(timeout)
                ))));
            }
            if pids_hit {
                return (code, Some(VerdictError::new(ProcessLimit, pids_msg())));
            }
            let detail = match status {
                ExitStatus::Signal(SIGSYS) => format!(
                    "was killed by {} (a forbidden system call)",
                    signal_name(SIGSYS)
                ),
                ExitStatus::Signal(s) => {
                    format!("was killed by {} (exit code {code})", signal_name(s))
                }
                ExitStatus::Code(c) => format!("exited with code {c}"),
            };
            let hint = error_hint(&outcome.stderr)
                .map(|l| format!(": {l}"))
                .unwrap_or_default();
            (code, Some(match phase {
                Phase::Compile => VerdictError::new(CompileError, format!(
                    "Compilation failed{}. Fix the code and run it again.",
                    first_line(&outcome.stderr).or_else(|| first_line(&outcome.stdout)).map(|l| format!(": {l}")).unwrap_or_default()
                )),
                Phase::Run => VerdictError::new(RuntimeError, format!(
                    "The program {detail}{hint}. See stderr for details, fix the code and run it again."
                )),
            }))
        }
    }
}

fn timeout_message(what: &str, timeout: Duration, phase: Phase) -> String {
    match phase {
        Phase::Compile => format!(
            "The compiler did not finish within the {} compile time limit.",
            format_duration(timeout)
        ),
        Phase::Run => format!(
            "{what} was stopped after the {} time limit. Make it faster, check that it does not \
             wait for input or loop forever, or ask for a longer timeout.",
            format_duration(timeout)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(end: End) -> Outcome {
        Outcome {
            end,
            wall: Duration::from_millis(10),
            cpu: Duration::from_millis(5),
            peak_memory_bytes: Some(1 << 20),
            oom_kills: 0,
            pids_limit_hits: 0,
            disk_full: false,
            stdout: Vec::new(),
            stderr: Vec::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            landlock: None,
            interpreter_alive: false,
        }
    }

    fn cat(o: &Outcome, phase: Phase) -> (i32, Option<ErrorCategory>) {
        let (code, e) = classify(o, &Limits::DEFAULT, phase);
        (code, e.map(|e| e.category))
    }

    #[test]
    fn success_has_no_error() {
        assert_eq!(
            cat(&outcome(End::Exited(ExitStatus::Code(0))), Phase::Run),
            (0, None)
        );
    }

    #[test]
    fn non_zero_exit_is_a_runtime_error_with_the_last_stderr_line() {
        let mut o = outcome(End::Exited(ExitStatus::Code(1)));
        o.stderr =
            b"Traceback (most recent call last):\n  File x\nNameError: name 'y' is not defined\n"
                .to_vec();
        let (code, e) = classify(&o, &Limits::DEFAULT, Phase::Run);
        let e = e.unwrap();
        assert_eq!(
            (code, e.category, e.retryable),
            (1, ErrorCategory::RuntimeError, true)
        );
        assert!(
            e.message.contains("NameError: name 'y' is not defined"),
            "{}",
            e.message
        );
    }

    #[test]
    fn limits_map_to_their_categories_and_exit_codes() {
        assert_eq!(
            cat(&outcome(End::TimedOut), Phase::Run),
            (124, Some(ErrorCategory::Timeout))
        );
        let mut o = outcome(End::Exited(ExitStatus::Signal(9)));
        o.oom_kills = 1;
        assert_eq!(cat(&o, Phase::Run), (137, Some(ErrorCategory::MemoryLimit)));
        assert_eq!(
            cat(&outcome(End::Exited(ExitStatus::Signal(25))), Phase::Run),
            (153, Some(ErrorCategory::DiskLimit))
        );
        let mut o = outcome(End::Exited(ExitStatus::Code(1)));
        o.disk_full = true;
        assert_eq!(cat(&o, Phase::Run), (1, Some(ErrorCategory::DiskLimit)));
        assert_eq!(
            cat(&outcome(End::Exited(ExitStatus::Signal(24))), Phase::Run),
            (124, Some(ErrorCategory::Timeout))
        );
        // SIGKILL after using up the CPU rlimit (31 s for 30 s at one core) is the hard limit.
        let mut o = outcome(End::Exited(ExitStatus::Signal(9)));
        o.cpu = Duration::from_secs(32);
        assert_eq!(cat(&o, Phase::Run), (124, Some(ErrorCategory::Timeout)));
        o.cpu = Duration::from_secs(2);
        assert_eq!(
            cat(&o, Phase::Run),
            (137, Some(ErrorCategory::RuntimeError))
        );
        let mut o = outcome(End::Exited(ExitStatus::Code(1)));
        o.pids_limit_hits = 3;
        assert_eq!(cat(&o, Phase::Run), (1, Some(ErrorCategory::ProcessLimit)));
        let mut o = outcome(End::TimedOut);
        o.pids_limit_hits = 3;
        assert_eq!(
            cat(&o, Phase::Run),
            (124, Some(ErrorCategory::ProcessLimit))
        );
        assert_eq!(
            cat(
                &outcome(End::OutputLimit(runcell_jail::Stream::Stdout)),
                Phase::Run
            ),
            (137, Some(ErrorCategory::OutputLimit))
        );
    }

    #[test]
    fn a_successful_exit_wins_over_limit_counters() {
        let mut o = outcome(End::Exited(ExitStatus::Code(0)));
        o.oom_kills = 1;
        o.pids_limit_hits = 1;
        assert_eq!(cat(&o, Phase::Run), (0, None));
    }

    #[test]
    fn compile_failures_carry_the_first_compiler_line() {
        let mut o = outcome(End::Exited(ExitStatus::Code(1)));
        o.stderr = b"# command-line-arguments\n./main.go:3:2: undefined: fmt.Printn\n".to_vec();
        let (_, e) = classify(&o, &Limits::DEFAULT, Phase::Compile);
        let e = e.unwrap();
        assert_eq!(e.category, ErrorCategory::CompileError);
        assert!(
            e.message.contains("./main.go:3:2: undefined: fmt.Printn"),
            "{}",
            e.message
        );
        assert_eq!(
            cat(&outcome(End::TimedOut), Phase::Compile).1,
            Some(ErrorCategory::Timeout)
        );
    }

    #[test]
    fn retryable_follows_the_category() {
        assert!(ErrorCategory::Timeout.retryable());
        assert!(ErrorCategory::InvalidRequest.retryable());
        assert!(!ErrorCategory::RuntimeUnavailable.retryable());
        assert!(!ErrorCategory::SandboxFailure.retryable());
    }

    #[test]
    fn verdict_json_keeps_the_contract_field_names() {
        let v = Verdict::failed(ErrorCategory::InvalidRequest, "bad");
        let j = serde_json::to_value(&v).unwrap();
        for k in [
            "stdout",
            "stderr",
            "exit_code",
            "execution_time",
            "stdout_truncated",
            "stderr_truncated",
            "error",
            "usage",
            "files",
            "enforcement",
        ] {
            assert!(j.get(k).is_some(), "missing {k}");
        }
        assert_eq!(j["error"]["category"], "invalid_request");
        assert_eq!(j["usage"]["cpu_time"], 0.0);
    }

    #[test]
    fn error_hints_pick_the_telling_line_in_each_language() {
        let cases: [(&str, &str); 5] = [
            ("Traceback (most recent call last):\n  File \"/workspace/main.py\", line 1, in <module>\nZeroDivisionError: division by zero\n", "ZeroDivisionError: division by zero"),
            ("/workspace/main.js:1\nfoo()\n^\n\nReferenceError: foo is not defined\n    at Object.<anonymous> (/workspace/main.js:1:1)\n\nNode.js v20.20.2\n", "ReferenceError: foo is not defined"),
            ("/workspace/main.rb:1:in `<main>': undefined local variable or method `x' for main:Object (NameError)\n\tfrom x\n", "/workspace/main.rb:1:in `<main>': undefined local variable or method `x' for main:Object (NameError)"),
            ("panic: boom\n\ngoroutine 1 [running]:\nmain.main()\n\t/workspace/main.go:2 +0x27\nexit status 2\n", "panic: boom"),
            ("cat: nope: No such file or directory\n", "cat: nope: No such file or directory"),
        ];
        for (stderr, want) in cases {
            assert_eq!(error_hint(stderr.as_bytes()).as_deref(), Some(want));
        }
        assert_eq!(error_hint(b""), None);
    }

    #[test]
    fn invalid_utf8_output_becomes_a_valid_string() {
        assert_eq!(lossy(b"ok\xff\xfe"), "ok\u{fffd}\u{fffd}");
    }
}
