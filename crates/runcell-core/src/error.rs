//! How errors become messages. One rule for the whole workspace: an error's `Display` says
//! what failed at its own level and never repeats its source; the source is reachable through
//! [`std::error::Error::source`], and the edge that shows an error to a person or a model
//! prints the whole chain with [`chain`].

use std::error::Error;

use serde::{Deserialize, Serialize};

/// "creating the cgroup: writing memory.max: Permission denied (os error 13)": an error and
/// its sources, each once (the jail's implementation, shared by every crate).
pub use runcell_jail::error_chain as chain;

/// The OS error behind a failure, as a verdict reports it.
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, utoipa::ToSchema,
)]
pub struct OsError {
    /// The errno value (13).
    pub errno: i32,
    /// Its symbolic name (EACCES), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// The first OS error in an error's chain of sources: an I/O error's errno, or one the sandbox
/// reported from inside (a [`runcell_jail::SandboxError`] knows where to look).
pub fn os_error(e: &(dyn Error + 'static)) -> Option<OsError> {
    let found = match e.downcast_ref::<runcell_jail::SandboxError>() {
        Some(sandbox) => sandbox.os_error(),
        None => {
            let mut cur: Option<&(dyn Error + 'static)> = Some(e);
            let mut found = None;
            while let Some(err) = cur {
                if let Some(os) = err
                    .downcast_ref::<std::io::Error>()
                    .and_then(runcell_jail::OsError::from_io)
                {
                    found = Some(os);
                    break;
                }
                cur = err.source();
            }
            found
        }
    }?;
    Some(OsError {
        errno: found.errno,
        name: found.name.map(str::to_string),
    })
}

/// What kind of refusal or failure a request met before (or instead of) a verdict: one table
/// of categories, statuses and retry hints that every door renders (HTTP as a status and an
/// error body, MCP as an `isError` result, the agent loop as a tool error, the CLI as an exit
/// code).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The request is malformed or outside the operator's policy.
    InvalidRequest,
    /// No such session (or resource) for this caller.
    NotFound,
    /// The session is running another call.
    SessionBusy,
    /// What is in the session's workspace conflicts with the operation.
    Conflict,
    /// No room: the line, the caller's share of it, the body budget, a cap on sessions.
    RateLimited,
    /// The server is shutting down, or cannot start a run right now.
    Unavailable,
    /// The server is draining (it is being removed): it takes no new session, while calls
    /// into its existing sessions go on. Another server behind the same address takes it.
    Draining,
    /// The server holding the session (another server of the cluster) could not be reached.
    PeerUnavailable,
    /// The session's server restarted since the session was created: its state is gone.
    SessionLost,
    /// The request body is larger than the server's cap.
    PayloadTooLarge,
    /// The request body did not arrive in time.
    RequestTimeout,
    /// A person denied the run's network access.
    ApprovalDenied,
    /// Nobody decided on the run's network access in time.
    ApprovalTimeout,
    /// The language's runtime is not installed (where no verdict carries it: a session).
    RuntimeUnavailable,
    /// The host could not build or keep the sandbox.
    SandboxFailure,
    /// Something failed that should not have.
    Internal,
}

impl ErrorKind {
    /// Every kind, for documentation and tests.
    pub const ALL: &'static [ErrorKind] = &[
        ErrorKind::InvalidRequest,
        ErrorKind::NotFound,
        ErrorKind::SessionBusy,
        ErrorKind::Conflict,
        ErrorKind::RateLimited,
        ErrorKind::Unavailable,
        ErrorKind::Draining,
        ErrorKind::PeerUnavailable,
        ErrorKind::SessionLost,
        ErrorKind::PayloadTooLarge,
        ErrorKind::RequestTimeout,
        ErrorKind::ApprovalDenied,
        ErrorKind::ApprovalTimeout,
        ErrorKind::RuntimeUnavailable,
        ErrorKind::SandboxFailure,
        ErrorKind::Internal,
    ];

    /// The machine-readable category (the HTTP API's `error.category`, MCP's result
    /// category).
    pub fn category(self) -> &'static str {
        self.row().0
    }

    /// The kind whose category is `category` (as another server's error body names it).
    pub fn from_category(category: &str) -> Option<ErrorKind> {
        ErrorKind::ALL
            .iter()
            .copied()
            .find(|k| k.category() == category)
    }

    /// The HTTP status it is answered with.
    pub fn status(self) -> u16 {
        self.row().1
    }

    /// Whether the same request may succeed later as it is (`Retry-After` for HTTP).
    pub fn retry_after(self) -> Option<u32> {
        self.row().2
    }

    fn row(self) -> (&'static str, u16, Option<u32>) {
        match self {
            ErrorKind::InvalidRequest => ("invalid_request", 400, None),
            ErrorKind::NotFound => ("not_found", 404, None),
            ErrorKind::SessionBusy => ("session_busy", 409, None),
            ErrorKind::Conflict => ("conflict", 409, None),
            ErrorKind::RateLimited => ("rate_limited", 429, Some(1)),
            ErrorKind::Unavailable => ("unavailable", 503, Some(1)),
            ErrorKind::Draining => ("draining", 503, Some(1)),
            ErrorKind::PeerUnavailable => ("peer_unavailable", 503, Some(1)),
            ErrorKind::SessionLost => ("session_lost", 410, None),
            ErrorKind::PayloadTooLarge => ("payload_too_large", 413, None),
            ErrorKind::RequestTimeout => ("request_timeout", 408, None),
            ErrorKind::ApprovalDenied => ("approval_denied", 403, None),
            ErrorKind::ApprovalTimeout => ("approval_timeout", 504, None),
            ErrorKind::RuntimeUnavailable => ("runtime_unavailable", 400, None),
            ErrorKind::SandboxFailure => ("sandbox_failure", 500, None),
            ErrorKind::Internal => ("internal", 500, None),
        }
    }
}

/// A request refused, or a service step that failed, before any verdict: the kind (category,
/// status, retry hint), a message a model or a person can act on, and the limit it is about.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct RunError {
    pub kind: ErrorKind,
    pub message: String,
    /// The limit (as a request names it) the error is about.
    pub limit: Option<crate::limits::Limit>,
}

impl RunError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> RunError {
        RunError {
            kind,
            message: message.into(),
            limit: None,
        }
    }

    pub fn invalid(message: impl Into<String>) -> RunError {
        RunError::new(ErrorKind::InvalidRequest, message)
    }

    pub fn rate_limited(message: impl Into<String>) -> RunError {
        RunError::new(ErrorKind::RateLimited, message)
    }

    pub fn unavailable(message: impl Into<String>) -> RunError {
        RunError::new(ErrorKind::Unavailable, message)
    }

    /// The session `id` was on a server that restarted since.
    pub fn session_lost(id: &str) -> RunError {
        RunError::new(
            ErrorKind::SessionLost,
            format!(
                "Session {}: the session's server restarted; its state (variables, files) is \
                 gone. Create a new session and run what is needed again.",
                crate::request::prefix(id, 64)
            ),
        )
    }

    pub fn internal(message: impl Into<String>) -> RunError {
        RunError::new(ErrorKind::Internal, message)
    }

    pub fn with_limit(mut self, limit: crate::limits::Limit) -> RunError {
        self.limit = Some(limit);
        self
    }

    pub fn category(&self) -> &'static str {
        self.kind.category()
    }
}

impl From<crate::engine::ValidationError> for RunError {
    fn from(e: crate::engine::ValidationError) -> RunError {
        RunError {
            kind: ErrorKind::InvalidRequest,
            limit: e.limit(),
            message: e.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("writing memory.max")]
    struct Step(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("creating the cgroup")]
    struct Outer(#[source] Step);

    #[test]
    fn a_category_names_its_kind() {
        for &k in ErrorKind::ALL {
            assert_eq!(ErrorKind::from_category(k.category()), Some(k));
        }
        assert_eq!(ErrorKind::from_category("unauthorized"), None);
    }

    #[test]
    fn every_kind_has_one_category_and_a_client_or_server_status() {
        let mut seen = std::collections::HashSet::new();
        for &k in ErrorKind::ALL {
            assert!(seen.insert(k.category()), "{k:?}");
            assert!((400..600).contains(&k.status()), "{k:?}");
            // Only what may succeed later as it is says when to retry.
            assert_eq!(
                k.retry_after().is_some(),
                matches!(k.status(), 429 | 503),
                "{k:?}"
            );
        }
    }

    #[test]
    fn the_chain_is_printed_once_and_the_errno_found() {
        let e = Outer(Step(std::io::Error::from_raw_os_error(13)));
        let text = chain(&e);
        assert!(
            text.starts_with("creating the cgroup: writing memory.max: "),
            "{text}"
        );
        assert_eq!(text.matches("os error 13").count(), 1, "{text}");
        let os = os_error(&e).unwrap();
        assert_eq!(os.errno, 13);
        assert_eq!(os.name.as_deref(), Some("EACCES"));
    }
}
