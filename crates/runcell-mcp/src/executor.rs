//! Where a tool call's program runs. The MCP server never calls the engine itself: it goes
//! through an [`Executor`], so that `runcell serve` can put its own admission control (429),
//! metrics and audit log in front of MCP calls exactly as it does for `POST /v1/execute`,
//! while `runcell mcp` (stdio) uses the plain [`LocalExecutor`].

use std::sync::Arc;

use futures_util::future::BoxFuture;
use runcell_core::{
    Engine, ErrorCategory, ExecRequest, KillSwitch, OutputSink, SessionError, SessionPolicy,
    SessionTarget, Sessions, Verdict,
};
use tokio::sync::Semaphore;

/// Who is calling.
#[derive(Debug, Clone)]
pub struct Caller {
    /// `mcp-stdio` or `mcp-http`.
    pub interface: &'static str,
    /// The HTTP request that carried the call (Streamable HTTP only): its method, URI, headers
    /// and the extensions the server's middleware put there (the API key's id, the request
    /// id). The server derives its own notion of the caller from them; this crate does not
    /// need to know the server's types.
    pub http: Option<http::request::Parts>,
}

impl Caller {
    pub fn stdio() -> Caller {
        Caller {
            interface: "mcp-stdio",
            http: None,
        }
    }
}

/// Put in an HTTP request's extensions by the server: cancelled once the response that
/// carries the answers to the request is finished or dropped. A tool call whose stream the
/// client closed is cancelled (its sandbox killed): nobody is left to receive its result, and
/// a run kept to its timeout for nobody would hold a slot of the server's capacity. (The
/// protocol lets a server keep such a call for a client that resumes; runcell does not.)
#[derive(Debug, Clone, Default)]
pub struct StreamClosed(pub tokio_util::sync::CancellationToken);

/// A call the executor refused to run: the server is at capacity, shutting down, or the
/// request breaks the operator's policy. It becomes an `isError` tool result.
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

/// Runs tool calls.
pub trait Executor: Send + Sync + 'static {
    /// Run one request, sending its output to `sink` as it is written. Dropping the returned
    /// future before it completes must kill the sandbox (a cancelled call).
    fn execute(
        &self,
        req: ExecRequest,
        caller: Caller,
        sink: Box<dyn OutputSink + Send>,
    ) -> BoxFuture<'static, Result<Verdict, Rejection>>;

    /// Run one request in a session (`New`: a session created for it, whose id the verdict
    /// carries). Dropping the future interrupts the call (the session survives it).
    fn execute_in_session(
        &self,
        target: SessionTarget,
        req: ExecRequest,
        caller: Caller,
        sink: Box<dyn OutputSink + Send>,
    ) -> BoxFuture<'static, Result<Verdict, Rejection>>;

    /// A call refused before it reached the executor (arguments that are not a request, an
    /// approval the user did not give): counted and audited where the executor keeps those.
    fn refused(&self, _language: &str, _caller: &Caller, _category: &'static str) {}
}

/// A session operation that was refused, as a rejection.
pub fn session_rejection(e: SessionError) -> Rejection {
    let category = match &e {
        SessionError::NotFound(_) => "not_found",
        SessionError::Busy => "session_busy",
        SessionError::Conflict(_) => "conflict",
        SessionError::Invalid(_) => "invalid_request",
        SessionError::TooMany(_) => "rate_limited",
        SessionError::ShuttingDown => "unavailable",
        SessionError::Failed(v) => match v.category() {
            Some(ErrorCategory::InvalidRequest) => "invalid_request",
            Some(ErrorCategory::RuntimeUnavailable) => "runtime_unavailable",
            _ => "sandbox_failure",
        },
    };
    Rejection::new(category, e.to_string())
}

impl<E: Executor + ?Sized> Executor for Arc<E> {
    fn execute(
        &self,
        req: ExecRequest,
        caller: Caller,
        sink: Box<dyn OutputSink + Send>,
    ) -> BoxFuture<'static, Result<Verdict, Rejection>> {
        (**self).execute(req, caller, sink)
    }

    fn execute_in_session(
        &self,
        target: SessionTarget,
        req: ExecRequest,
        caller: Caller,
        sink: Box<dyn OutputSink + Send>,
    ) -> BoxFuture<'static, Result<Verdict, Rejection>> {
        (**self).execute_in_session(target, req, caller, sink)
    }

    fn refused(&self, language: &str, caller: &Caller, category: &'static str) {
        (**self).refused(language, caller, category)
    }
}

/// The engine, in-process: at most as many sandboxes at once as the host has cores (more
/// calls wait for a slot), each on a blocking thread (the engine starts its helper with
/// `std::process::Command`; nothing forks this threaded process).
pub struct LocalExecutor {
    engine: Engine,
    slots: Arc<Semaphore>,
    sessions: Arc<Sessions>,
}

impl LocalExecutor {
    pub fn new(engine: Engine) -> LocalExecutor {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        LocalExecutor::with_slots(engine, cores)
    }

    /// At most `slots` sandboxes at once (at least one).
    pub fn with_slots(engine: Engine, slots: usize) -> LocalExecutor {
        LocalExecutor {
            sessions: Sessions::new(engine.clone(), SessionPolicy::default()),
            engine,
            slots: Arc::new(Semaphore::new(slots.max(1))),
        }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }
}

/// A sandbox slot (waited for) and a kill switch for one call.
async fn slot_and_switch(
    slots: &Arc<Semaphore>,
) -> Result<(tokio::sync::OwnedSemaphorePermit, KillSwitch), Rejection> {
    let permit = slots
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| Rejection::new("unavailable", "The server is shutting down."))?;
    let ks = KillSwitch::new().map_err(|e| {
        tracing::error!(error = %e, "cannot create a kill switch");
        Rejection::new(
            "unavailable",
            "The server cannot start a run right now. Retry shortly.",
        )
    })?;
    Ok((permit, ks))
}

impl Executor for LocalExecutor {
    fn execute(
        &self,
        req: ExecRequest,
        _caller: Caller,
        sink: Box<dyn OutputSink + Send>,
    ) -> BoxFuture<'static, Result<Verdict, Rejection>> {
        let engine = self.engine.clone();
        let slots = self.slots.clone();
        Box::pin(async move {
            let req = engine
                .validate(&req)
                .map_err(|e| Rejection::new("invalid_request", e.to_string()))?;
            let (permit, ks) = slot_and_switch(&slots).await?;
            // The slot is held until the sandbox is gone, also when the call was cancelled
            // and nobody waits for the verdict any more.
            engine
                .execute_blocking(req, sink, ks, permit, |_| {})
                .await
                .map_err(|_| Rejection::new("internal", "The execution failed unexpectedly."))
        })
    }

    fn execute_in_session(
        &self,
        target: SessionTarget,
        req: ExecRequest,
        _caller: Caller,
        sink: Box<dyn OutputSink + Send>,
    ) -> BoxFuture<'static, Result<Verdict, Rejection>> {
        let sessions = self.sessions.clone();
        let slots = self.slots.clone();
        Box::pin(async move {
            let (permit, ks) = slot_and_switch(&slots).await?;
            sessions
                .run_request_blocking(None, target, req, sink, ks, permit, |_| {})
                .await
                .map_err(session_rejection)
        })
    }
}
