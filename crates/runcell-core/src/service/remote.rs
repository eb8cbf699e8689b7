//! Calls into a session that another server of the cluster holds, when the session is named
//! in the call's body (an MCP tool's `session_id`), where no HTTP router can see it.
//!
//! The core knows no HTTP: it decides *whether* a call goes elsewhere (the session id's HMAC
//! tag is valid and names a peer, see [`crate::cluster`]) and hands the call to a
//! [`RemoteSessions`] port, which the HTTP server implements with its peer client. A forged
//! or tampered id never gets here (it names no peer): it is answered here as unknown, and
//! nobody is contacted. The owner admits, approves, runs and audits the call as its own; this
//! server renders the owner's verdict or error as the door's own result.

use std::future::Future;
use std::pin::Pin;

use runcell_jail::OutputSink;

use crate::error::RunError;
use crate::request::ExecRequest;
use crate::verdict::Verdict;

/// What a caller presented to authenticate (an API key), kept opaque so that a call carried
/// out by another server goes there with the caller's own credentials: the owner checks
/// them, as for any request it receives.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential(String);

impl Credential {
    pub fn new(secret: impl Into<String>) -> Credential {
        Credential(secret.into())
    }

    /// The secret itself, for the one place that sends it on.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credential(<redacted>)")
    }
}

/// What a remote call returns.
pub type RemoteFuture<'a> = Pin<Box<dyn Future<Output = Result<Verdict, RunError>> + Send + 'a>>;

/// The port through which calls reach the sessions of other servers.
pub trait RemoteSessions: Send + Sync {
    /// Run `request` in session `id`, held by server `pod` (a name taken from an id whose tag
    /// was verified), as `credential`'s holder; the program's output goes to `sink` as it
    /// comes. The owner's refusals come back as the same [`RunError`]s a local call meets
    /// (`session_lost` after its restart, `not_found`, `session_busy`, ...); a peer that
    /// cannot be reached is `peer_unavailable`.
    fn execute<'a>(
        &'a self,
        pod: &'a str,
        id: &'a str,
        request: &'a ExecRequest,
        credential: Option<&'a Credential>,
        sink: Box<dyn OutputSink + Send>,
    ) -> RemoteFuture<'a>;
}
