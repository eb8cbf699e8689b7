//! Who asks, what is remembered of what they asked, and who is told how it ended: the run
//! service reports every refusal and every finished run to an [`Observer`] (the server's
//! metrics and audit log; nothing for the command line).

use std::net::SocketAddr;

use sha2::{Digest, Sha256};

use crate::error::RunError;
use crate::limits::LimitOverrides;
use crate::request::ExecRequest;
use crate::verdict::Verdict;
use runcell_runtimes::Language;

/// Who is asking.
#[derive(Debug, Clone, Default)]
pub struct Caller {
    /// The request id (the HTTP API sends it back as `X-Request-Id`).
    pub request_id: String,
    /// The id of the API key used; `None` without keys.
    pub key_id: Option<String>,
    /// The door: `http`, `mcp-http`, `mcp-stdio`, `agent`, `cli`.
    pub interface: &'static str,
    pub peer: Option<SocketAddr>,
    /// What the caller authenticated with, for a call another server carries out.
    pub credential: Option<super::remote::Credential>,
}

impl Caller {
    /// The operator at the command line, through `interface`.
    pub fn local(interface: &'static str) -> Caller {
        Caller {
            interface,
            ..Caller::default()
        }
    }

    pub fn with_interface(mut self, interface: &'static str) -> Caller {
        self.interface = interface;
        self
    }
}

/// The bounded label of a requested language (`unknown` for any other text).
pub fn language_label(requested: &str) -> &'static str {
    Language::parse(requested).map_or("unknown", Language::name)
}

/// What is remembered of a request while it runs, for the audit log: never its code, files or
/// stdin (they may hold the user's data), only their digest and sizes. Taken when the request
/// arrives, so that the request itself need not be kept.
#[derive(Debug, Clone, Default)]
pub struct RunSummary {
    pub language: &'static str,
    pub code_sha256: String,
    pub code_bytes: usize,
    pub input_files: usize,
    /// The limits it asked for.
    pub requested: LimitOverrides,
    /// The session it ran in.
    pub session_id: Option<String>,
}

impl From<&ExecRequest> for RunSummary {
    fn from(req: &ExecRequest) -> RunSummary {
        RunSummary {
            language: language_label(req.language()),
            code_sha256: crate::to_hex(&Sha256::digest(req.code().as_bytes())),
            code_bytes: req.code().len(),
            input_files: req.files.len(),
            requested: req.limits,
            session_id: None,
        }
    }
}

impl RunSummary {
    /// A request that could not be read, of the language a door knows (a tool's).
    pub fn of_language(language: &str) -> RunSummary {
        RunSummary {
            language: language_label(language),
            code_sha256: crate::to_hex(&Sha256::digest(b"")),
            ..RunSummary::default()
        }
    }
}

/// Told about every request the run service refuses and every run it finishes.
pub trait Observer: Send + Sync + 'static {
    /// A request refused before it ran (by the intake, admission, an approval).
    fn refused(&self, _caller: &Caller, _run: &RunSummary, _error: &RunError) {}

    /// A run that ended with a verdict (whatever the verdict says), after `seconds` since it
    /// was admitted.
    fn finished(&self, _caller: &Caller, _run: &RunSummary, _verdict: &Verdict, _seconds: f64) {}

    /// An operation on a session that runs no code (`session_paused`, `session_resumed`,
    /// `session_forked` with its `parent`).
    fn session_event(
        &self,
        _caller: &Caller,
        _event: &'static str,
        _session: &str,
        _parent: Option<&str>,
    ) {
    }
}

/// Tells nobody (the command line).
pub struct Quiet;

impl Observer for Quiet {}
