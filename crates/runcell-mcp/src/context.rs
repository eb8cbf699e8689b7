//! What a tool call needs from its surroundings: who is calling (the HTTP request that
//! carried it, over Streamable HTTP), whether that request's response is still wanted, and how
//! a refusal reads. The call itself runs through runcell's one run service
//! ([`runcell_core::RunService`]), as every other door's requests do.

use runcell_core::{Caller, RunError};

/// Who is calling: for a call over Streamable HTTP, what the server's middleware put in the
/// extensions of the HTTP request that carried it (its id, the peer, the API key's id);
/// otherwise the local user (`mcp-stdio`).
pub fn caller(http: Option<&http::request::Parts>, interface: &'static str) -> Caller {
    http.and_then(|p| p.extensions.get::<Caller>())
        .cloned()
        .unwrap_or_default()
        .with_interface(interface)
}

/// Put in an HTTP request's extensions by the server: cancelled once the response that
/// carries the answers to the request is finished or dropped. A tool call whose stream the
/// client closed is cancelled (its sandbox killed): nobody is left to receive its result, and
/// a run kept to its timeout for nobody would hold a slot of the server's capacity. (The
/// protocol lets a server keep such a call for a client that resumes; runcell does not.)
#[derive(Debug, Clone, Default)]
pub struct StreamClosed(pub tokio_util::sync::CancellationToken);

/// A call the run service refused: the server is at capacity, shutting down, or the request
/// breaks the operator's policy. It becomes an `isError` tool result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{category}: {message}")]
pub struct Rejection {
    /// Machine-readable, as in the HTTP API: `rate_limited`, `unavailable`,
    /// `invalid_request`, `internal`.
    pub category: String,
    /// What happened, in words a model can act on.
    pub message: String,
}

impl Rejection {
    pub fn new(category: impl Into<String>, message: impl Into<String>) -> Rejection {
        Rejection {
            category: category.into(),
            message: message.into(),
        }
    }
}

impl From<RunError> for Rejection {
    fn from(e: RunError) -> Rejection {
        Rejection::new(e.category(), e.message)
    }
}
