//! The audit log: one JSON line per execution, to stderr or appended to a file.
//!
//! A line says who ran what and how it ended: time, request id, the key's id (never the key),
//! the interface and peer, the language, the sha256 and size of the code, the number of input
//! files, the limits, the verdict's category, the exit code and the duration. The code itself
//! and its output are not logged: they may hold the user's data.
//!
//! The last [`RECENT_RUNS`] run lines are also kept in memory, for the operator's console
//! (`GET /v1/admin/overview`), whatever the log's target.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::SystemTime;

use runcell_core::{Limits, Verdict};
use serde::Serialize;

/// Where audit lines go (the policy's).
pub use runcell_core::policy::AuditTarget;

enum Out {
    Stderr,
    File(File),
    Off,
}

/// The open audit log. Each line is written with one `write` call (on an `O_APPEND` file),
/// so lines of concurrent runs never interleave.
pub struct AuditLog {
    out: Mutex<Out>,
    recent: Mutex<VecDeque<RecentRun>>,
}

/// How many run records the console's "recent runs" keeps.
pub const RECENT_RUNS: usize = 200;

/// A run's audit record as the console shows it: who, which language, how it ended, and the
/// code's digest. Never the code or its output.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct RecentRun {
    /// RFC 3339, UTC, when the run ended or was refused.
    pub time: String,
    pub request_id: String,
    /// The API key's id (never the key); absent without keys.
    pub key_id: Option<String>,
    /// The door: `http`, `mcp-http`, `agent`, ...
    pub interface: String,
    pub language: String,
    pub session_id: Option<String>,
    /// `ok`, a verdict's error category, or the API category of a refusal.
    pub category: String,
    pub exit_code: Option<i32>,
    pub duration_seconds: f64,
    pub code_sha256: String,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuditLog")
    }
}

/// Who asked for an execution (the run service's notion).
pub use runcell_core::Caller;

/// What the audit log says about a request: never its code, files or stdin (they may hold the
/// user's data), only their digest and sizes (the run service's summary).
pub use runcell_core::RunSummary as AuditRequest;

#[derive(Serialize)]
struct Line<'a> {
    time: String,
    request_id: &'a str,
    key_id: Option<&'a str>,
    interface: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    peer: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session_id: Option<&'a str>,
    language: &'a str,
    code_sha256: &'a str,
    code_bytes: usize,
    input_files: usize,
    limits: Option<&'a Limits>,
    /// What a refused request asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    requested_limits: Option<serde_json::Map<String, serde_json::Value>>,
    /// `ok`, a verdict category, or the API category of a refusal.
    category: &'a str,
    exit_code: Option<i32>,
    duration_seconds: f64,
}

/// What the audit log says about one call to the agent loop's model.
#[derive(Debug, Serialize)]
pub struct ModelCall<'a> {
    /// `anthropic` or `openai`.
    pub upstream: &'static str,
    pub model: &'a str,
    /// `ok`, or the model error's category.
    pub outcome: &'static str,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// The tool calls the answer asked for.
    pub tool_calls: usize,
    pub duration_seconds: f64,
}

impl AuditLog {
    /// Opens (creates, appends to) a file log with mode 0640.
    pub fn open(target: &AuditTarget) -> std::io::Result<AuditLog> {
        let out = match target {
            AuditTarget::Stderr => Out::Stderr,
            AuditTarget::Off => Out::Off,
            AuditTarget::File(p) => Out::File(open_append(p)?),
        };
        Ok(AuditLog {
            out: Mutex::new(out),
            recent: Mutex::default(),
        })
    }

    pub fn off() -> AuditLog {
        AuditLog {
            out: Mutex::new(Out::Off),
            recent: Mutex::default(),
        }
    }

    /// The last [`RECENT_RUNS`] runs recorded, newest first.
    pub fn recent(&self) -> Vec<RecentRun> {
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        recent.iter().rev().cloned().collect()
    }

    fn remember(&self, line: &Line<'_>) {
        let run = RecentRun {
            time: line.time.clone(),
            request_id: line.request_id.to_string(),
            key_id: line.key_id.map(str::to_string),
            interface: line.interface.to_string(),
            language: line.language.to_string(),
            session_id: line.session_id.map(str::to_string),
            category: line.category.to_string(),
            exit_code: line.exit_code,
            duration_seconds: line.duration_seconds,
            code_sha256: line.code_sha256.to_string(),
        };
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if recent.len() == RECENT_RUNS {
            recent.pop_front();
        }
        recent.push_back(run);
    }

    /// Log one execution: its verdict, or the API category it was refused with.
    pub fn record(
        &self,
        caller: &Caller,
        req: &AuditRequest,
        outcome: Result<&Verdict, &'static str>,
        duration_seconds: f64,
    ) {
        let (category, exit_code, limits) = match outcome {
            Ok(v) => (
                v.error.as_ref().map_or("ok", |e| e.category.as_str()),
                v.exit_code,
                v.limits.as_ref(),
            ),
            Err(category) => (category, None, None),
        };
        let line = Line {
            time: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            request_id: &caller.request_id,
            key_id: caller.key_id.as_deref(),
            interface: caller.interface,
            peer: caller.peer.map(|p| p.to_string()),
            session_id: req.session_id.as_deref(),
            language: req.language,
            code_sha256: &req.code_sha256,
            code_bytes: req.code_bytes,
            input_files: req.input_files,
            limits,
            requested_limits: outcome
                .is_err()
                .then(|| req.requested.to_wire_with_legacy()),
            category,
            exit_code,
            duration_seconds: (duration_seconds * 1000.0).round() / 1000.0,
        };
        self.remember(&line);
        self.write(&line);
    }

    /// Log one call to the agent loop's model: which upstream and model, how it ended, its
    /// tokens and time. Never the conversation (it holds the user's data and code).
    pub fn model_call(&self, caller: &Caller, call: &ModelCall<'_>) {
        #[derive(Serialize)]
        struct ModelLine<'a> {
            time: String,
            event: &'static str,
            request_id: &'a str,
            key_id: Option<&'a str>,
            interface: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            peer: Option<String>,
            #[serde(flatten)]
            call: &'a ModelCall<'a>,
        }
        self.write(&ModelLine {
            time: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            event: "model_call",
            request_id: &caller.request_id,
            key_id: caller.key_id.as_deref(),
            interface: caller.interface,
            peer: caller.peer.map(|p| p.to_string()),
            call,
        });
    }

    /// Log each connection a run made or tried through its egress proxy: destination,
    /// address, decision, reason, bytes each way, time.
    pub fn network(&self, caller: &Caller, report: &runcell_core::NetworkReport) {
        #[derive(Serialize)]
        struct NetLine<'a> {
            time: String,
            event: &'static str,
            request_id: &'a str,
            key_id: Option<&'a str>,
            interface: &'a str,
            #[serde(flatten)]
            connection: &'a runcell_core::NetworkConnection,
        }
        for c in &report.connections {
            self.write(&NetLine {
                time: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
                event: "network",
                request_id: &caller.request_id,
                key_id: caller.key_id.as_deref(),
                interface: caller.interface,
                connection: c,
            });
        }
    }

    /// Log an operation on a session that runs no code (`session_paused`,
    /// `session_resumed`, `session_forked`): which session, and for a fork, its parent.
    pub fn session_event(
        &self,
        caller: &Caller,
        event: &'static str,
        session_id: &str,
        parent_id: Option<&str>,
    ) {
        #[derive(Serialize)]
        struct SessionLine<'a> {
            time: String,
            event: &'static str,
            request_id: &'a str,
            key_id: Option<&'a str>,
            interface: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            peer: Option<String>,
            session_id: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            parent_id: Option<&'a str>,
        }
        self.write(&SessionLine {
            time: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            event,
            request_id: &caller.request_id,
            key_id: caller.key_id.as_deref(),
            interface: caller.interface,
            peer: caller.peer.map(|p| p.to_string()),
            session_id,
            parent_id,
        });
    }

    fn write(&self, line: &impl Serialize) {
        let Ok(mut text) = serde_json::to_string(line) else {
            return;
        };
        text.push('\n');
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        let written = match &mut *out {
            Out::Off => Ok(()),
            Out::Stderr => std::io::stderr().lock().write_all(text.as_bytes()),
            Out::File(f) => f.write_all(text.as_bytes()),
        };
        if let Err(e) = written {
            // The log must not take the server down, but it must not fail silently either.
            tracing::error!(error = %e, "cannot write the audit log");
        }
    }
}

fn open_append(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o640)
        // The audit file is never reached through a symlink someone planted.
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use runcell_core::verdict::ErrorCategory;
    use runcell_core::ExecRequest;
    use sha2::{Digest, Sha256};

    #[test]
    fn a_line_per_execution_without_code_or_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&AuditTarget::File(path.clone())).unwrap();
        let caller = Caller {
            request_id: "r1".into(),
            key_id: Some("team-a".into()),
            interface: "http",
            peer: Some("127.0.0.1:5000".parse().unwrap()),
            credential: None,
        };
        let req = ExecRequest::new("py", "print('secret')");
        let mut v = Verdict::failed(ErrorCategory::Timeout, "slow");
        v.exit_code = Some(124);
        v.limits = Some(Limits::DEFAULT);
        let req = AuditRequest::from(&req);
        log.record(&caller, &req, Ok(&v), 1.23456);
        log.record(&caller, &req, Err("invalid_request"), 0.0);
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        let l = &lines[0];
        assert_eq!(l["request_id"], "r1");
        assert_eq!(l["key_id"], "team-a");
        assert_eq!(l["language"], "python");
        assert_eq!(l["category"], "timeout");
        assert_eq!(l["exit_code"], 124);
        assert_eq!(l["duration_seconds"], 1.235);
        assert_eq!(l["limits"]["timeout_ms"], 30_000);
        assert_eq!(
            l["code_sha256"],
            runcell_core::to_hex(&Sha256::digest(b"print('secret')")).as_str()
        );
        assert!(l["time"].as_str().unwrap().ends_with('Z'));
        assert_eq!(lines[1]["category"], "invalid_request");
        assert!(lines[1]["exit_code"].is_null());
        assert!(lines[1]["requested_limits"].is_object());
        let mut asked = ExecRequest::new("python", "");
        asked.limits.timeout = Some(runcell_core::limits::Millis(5000));
        log.record(
            &caller,
            &AuditRequest::from(&asked),
            Err("invalid_request"),
            0.0,
        );
        let text = std::fs::read_to_string(&path).unwrap();
        let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        assert_eq!(
            last["requested_limits"],
            serde_json::json!({"timeout": 5, "timeout_ms": 5000}),
            "the wire name, and the name the audit log used before"
        );
        assert!(lines[0].get("requested_limits").is_none());
        assert!(!text.contains("secret"));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o640);
    }

    #[test]
    fn a_model_call_is_a_line_without_the_conversation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&AuditTarget::File(path.clone())).unwrap();
        let caller = Caller {
            request_id: "r2".into(),
            key_id: Some("team-b".into()),
            interface: "http",
            peer: None,
            credential: None,
        };
        log.model_call(
            &caller,
            &ModelCall {
                upstream: "anthropic",
                model: "claude-x",
                outcome: "upstream_rate_limited",
                prompt_tokens: 0,
                completion_tokens: 0,
                tool_calls: 0,
                duration_seconds: 1.5,
            },
        );
        let l: serde_json::Value =
            serde_json::from_str(std::fs::read_to_string(&path).unwrap().trim()).unwrap();
        assert_eq!(l["event"], "model_call");
        assert_eq!(l["request_id"], "r2");
        assert_eq!(l["key_id"], "team-b");
        assert_eq!(l["upstream"], "anthropic");
        assert_eq!(l["model"], "claude-x");
        assert_eq!(l["outcome"], "upstream_rate_limited");
        assert_eq!(l["duration_seconds"], 1.5);
        assert!(l.get("peer").is_none());
    }

    #[test]
    fn the_last_runs_are_kept_newest_first_without_code() {
        let log = AuditLog::off();
        let caller = Caller {
            request_id: "r".into(),
            key_id: Some("team-a".into()),
            interface: "http",
            peer: None,
            credential: None,
        };
        for i in 0..RECENT_RUNS + 5 {
            let req = ExecRequest::new("python", format!("print({i})"));
            log.record(
                &caller,
                &AuditRequest::from(&req),
                Err("invalid_request"),
                0.0,
            );
        }
        let recent = log.recent();
        assert_eq!(recent.len(), RECENT_RUNS);
        assert_eq!(
            recent[0].code_sha256,
            runcell_core::to_hex(&Sha256::digest(
                format!("print({})", RECENT_RUNS + 4).as_bytes()
            ))
        );
        assert_eq!(recent[0].key_id.as_deref(), Some("team-a"));
        assert_eq!(recent[0].category, "invalid_request");
        let text = serde_json::to_string(&recent).unwrap();
        assert!(!text.contains("print("));
    }

    #[test]
    fn a_symlinked_log_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("audit.jsonl");
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), &link).unwrap();
        assert!(AuditLog::open(&AuditTarget::File(link)).is_err());
    }
}
