//! The two transports: stdio (`runcell mcp`, launched by the client) and Streamable HTTP
//! (mounted at `/mcp` by `runcell serve`, behind its API keys).
//!
//! Both serve the current protocol (2026-07-28, stateless: every request names its version)
//! and the handshake-era ones (2025-06-18, 2025-11-25, ...: `initialize` first, and over HTTP
//! an `Mcp-Session-Id`); rmcp tells them apart per request.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::Stream;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError,
};
use rmcp::transport::streamable_http_server::session::{
    ServerSseMessage, SessionId, SessionManager,
};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::ServiceExt;
use runcell_core::RunService;
use tokio_util::sync::CancellationToken;

use crate::catalog::Catalog;
use crate::server::McpServer;

/// Why the stdio server stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error("the MCP session could not start")]
    Start(#[from] Box<rmcp::service::ServerInitializeError>),
    #[error("the MCP session ended abnormally")]
    Join(#[from] tokio::task::JoinError),
}

/// Serve MCP on stdin/stdout until the client closes stdin. Nothing else may write to stdout
/// meanwhile. Calls still running when the client goes away are cancelled, which kills their
/// sandboxes.
pub async fn serve_stdio(server: McpServer) -> Result<(), McpError> {
    let running = server
        .serve(rmcp::transport::io::stdio_pipes())
        .await
        .map_err(Box::new)?;
    running.waiting().await?;
    Ok(())
}

/// How the Streamable HTTP endpoint guards itself.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// `Host` values accepted (names, or `name:port`); empty: any. Against DNS rebinding a
    /// server without API keys accepts only loopback names: a web page whose name resolves
    /// to 127.0.0.1 still sends its own name as `Host`.
    pub allowed_hosts: Vec<String>,
    /// `Origin` values accepted from browsers (`scheme://host:port`, `:*` for any port);
    /// `None`: no check. Requests without `Origin` (every non-browser client) pass.
    pub allowed_origins: Option<Vec<String>>,
    /// Largest JSON-RPC message (a call with its input files).
    pub max_body_bytes: usize,
    /// Handshake-era sessions open at once; `initialize` beyond it fails until one ends.
    pub max_sessions: usize,
    /// A handshake-era session idle this long is closed (the client re-initializes).
    pub session_idle: Duration,
    /// Mints the handshake-era sessions' ids (`Mcp-Session-Id`): the run service's, so that
    /// in a cluster an id names its server and any server forwards the session's requests
    /// there.
    pub session_ids: runcell_core::cluster::SessionIds,
}

impl HttpOptions {
    /// For a server without API keys, which runcell only allows on loopback: loopback `Host`
    /// names and loopback `Origin`s only.
    pub fn loopback(max_body_bytes: usize) -> HttpOptions {
        HttpOptions {
            allowed_hosts: vec!["localhost".into(), "127.0.0.1".into(), "[::1]".into()],
            allowed_origins: Some(vec![
                "http://localhost:*".into(),
                "http://127.0.0.1:*".into(),
                "http://[::1]:*".into(),
                "https://localhost:*".into(),
                "https://127.0.0.1:*".into(),
                "https://[::1]:*".into(),
            ]),
            max_body_bytes,
            max_sessions: 1024,
            session_idle: Duration::from_secs(10 * 60),
            session_ids: runcell_core::cluster::SessionIds::local(),
        }
    }

    /// For a server that requires an API key: any `Host` (it is reached under its public
    /// name) and any `Origin`. A rebinding page or a foreign origin cannot present the key (a
    /// browser sends no `Authorization` header cross-origin without a CORS preflight, which
    /// this server never grants), so the key is the guard.
    pub fn keyed(max_body_bytes: usize) -> HttpOptions {
        HttpOptions {
            allowed_hosts: Vec::new(),
            allowed_origins: None,
            ..HttpOptions::loopback(max_body_bytes)
        }
    }
}

/// The session manager of the handshake-era clients: rmcp's in-memory one with a cap on how
/// many sessions exist at once (each holds a task and its channels until it ends or idles
/// out).
pub struct BoundedSessions {
    inner: LocalSessionManager,
    max: usize,
    ids: runcell_core::cluster::SessionIds,
}

/// What the error of a refused `initialize` says when the session cap is reached (rmcp answers
/// it as a 500 with this text; the HTTP server turns that into a 429).
pub const TOO_MANY_SESSIONS: &str = "too many MCP sessions are open";

/// Why a session operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("{TOO_MANY_SESSIONS} ({0}); retry when one has ended")]
    TooMany(usize),
    #[error(transparent)]
    Local(#[from] LocalSessionManagerError),
}

/// How long a finished call's result is kept for a client that resumes its stream (older
/// protocol versions): long enough for a reconnect, short enough that results do not pile up.
pub const COMPLETED_RESULTS_KEPT: Duration = Duration::from_secs(10);

impl BoundedSessions {
    pub fn new(max: usize, idle: Duration) -> BoundedSessions {
        BoundedSessions::with_ids(max, idle, runcell_core::cluster::SessionIds::local())
    }

    /// As [`BoundedSessions::new`], minting session ids with `ids`.
    pub fn with_ids(
        max: usize,
        idle: Duration,
        ids: runcell_core::cluster::SessionIds,
    ) -> BoundedSessions {
        let mut inner = LocalSessionManager::default();
        inner.session_config.keep_alive = Some(idle);
        // A finished call's result is kept for a client that lost its stream and resumes it;
        // each may be a whole verdict, so not for rmcp's default minute.
        inner.session_config.completed_cache_ttl = COMPLETED_RESULTS_KEPT;
        BoundedSessions {
            inner,
            max: max.max(1),
            ids,
        }
    }

    /// Sessions open now.
    pub async fn open(&self) -> usize {
        self.inner.sessions.read().await.len()
    }
}

impl SessionManager for BoundedSessions {
    type Error = SessionError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), SessionError> {
        // Checked, then created without holding the lock: concurrent initializes may overshoot
        // by a few, which is harmless; what matters is that the number stays bounded.
        let open = self.open().await;
        if open >= self.max {
            return Err(SessionError::TooMany(open));
        }
        // rmcp's own manager would name it with a UUID; the id is ours (see `HttpOptions::
        // session_ids`), the session rmcp's in-memory one.
        let id: SessionId = self.ids.mint().into();
        let (handle, worker) =
            rmcp::transport::streamable_http_server::session::local::create_local_session(
                id.clone(),
                self.inner.session_config.clone(),
            );
        self.inner.sessions.write().await.insert(id.clone(), handle);
        Ok((id, rmcp::transport::WorkerTransport::spawn(worker)))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, SessionError> {
        Ok(self.inner.initialize_session(id, message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, SessionError> {
        Ok(self.inner.has_session(id).await?)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), SessionError> {
        Ok(self.inner.close_session(id).await?)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, SessionError> {
        Ok(self.inner.create_stream(id, message).await?)
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), SessionError> {
        Ok(self.inner.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, SessionError> {
        Ok(self.inner.create_standalone_stream(id).await?)
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, SessionError> {
        Ok(self.inner.resume(id, last_event_id).await?)
    }
}

/// The Streamable HTTP endpoint as a tower service, to mount at `/mcp` behind the server's
/// authentication.
pub type HttpService = StreamableHttpService<McpServer, BoundedSessions>;

/// Build the endpoint. Cancelling `shutdown` ends every open session and stream (and with them
/// the calls still running in them).
pub fn http_service(
    server: McpServer,
    options: &HttpOptions,
    shutdown: CancellationToken,
) -> HttpService {
    let mut config = StreamableHttpServerConfig::default()
        // Handshake-era clients need their Mcp-Session-Id; current ones are served
        // statelessly whatever this says.
        .with_legacy_session_mode(true)
        .with_max_request_body_bytes(options.max_body_bytes)
        .with_cancellation_token(shutdown);
    config = if options.allowed_hosts.is_empty() {
        config.disable_allowed_hosts()
    } else {
        config.with_allowed_hosts(options.allowed_hosts.clone())
    };
    config = match &options.allowed_origins {
        Some(origins) => config
            .with_allowed_origins(origins.clone())
            .enforce_origin_validation(),
        None => config.disable_allowed_origins(),
    };
    let sessions = Arc::new(BoundedSessions::with_ids(
        options.max_sessions,
        options.session_idle,
        options.session_ids.clone(),
    ));
    StreamableHttpService::new(move || Ok(server.clone()), sessions, config)
}

/// The Streamable HTTP endpoint with its tool catalog built on first use: finding the
/// runtimes and asking their versions runs host programs, which belongs on a blocking thread
/// and not in the synchronous construction of a router (nor in every test that builds one).
#[derive(Clone)]
pub struct HttpEndpoint {
    shared: Arc<Endpoint>,
}

struct Endpoint {
    runs: RunService,
    options: HttpOptions,
    shutdown: CancellationToken,
    service: tokio::sync::OnceCell<HttpService>,
}

impl HttpEndpoint {
    /// Tools for the runtimes of the run service's host under its policy, run through it
    /// (interface `mcp-http`).
    pub fn new(
        runs: RunService,
        options: HttpOptions,
        shutdown: CancellationToken,
    ) -> HttpEndpoint {
        HttpEndpoint {
            shared: Arc::new(Endpoint {
                runs,
                options,
                shutdown,
                service: tokio::sync::OnceCell::new(),
            }),
        }
    }

    async fn service(&self) -> HttpService {
        let s = &self.shared;
        s.service
            .get_or_init(|| async {
                let engine = s.runs.engine().clone();
                let mut catalog = tokio::task::spawn_blocking(move || Catalog::for_host(&engine))
                    .await
                    // Only a panic in the probe gets here: serve no tools rather than none
                    // of MCP.
                    .unwrap_or_else(|_| Catalog::new(s.runs.engine().config(), &[]));
                // Over HTTP the client is the caller itself: its "user" approves only where
                // the operator says so; otherwise approval is the server's admin queue.
                if !s.runs.engine().config().network.approval_by_client {
                    catalog.set_approval(None);
                }
                let server = McpServer::new(s.runs.clone(), Arc::new(catalog), "mcp-http");
                http_service(server, &s.options, s.shutdown.clone())
            })
            .await
            .clone()
    }
}

impl<B> tower::Service<http::Request<B>> for HttpEndpoint
where
    B: Send + 'static,
    HttpService: tower::Service<http::Request<B>, Error = Infallible> + Send + 'static,
    <HttpService as tower::Service<http::Request<B>>>::Future: Send + 'static,
    <HttpService as tower::Service<http::Request<B>>>::Response: Send + 'static,
{
    type Response = <HttpService as tower::Service<http::Request<B>>>::Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let mut service = this.service().await;
            tower::ServiceExt::oneshot(&mut service, req).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sessions_are_capped_and_free_again_when_closed() {
        let sessions = BoundedSessions::new(2, Duration::from_secs(60));
        let (a, _ta) = sessions.create_session().await.unwrap();
        let (_b, _tb) = sessions.create_session().await.unwrap();
        assert!(matches!(
            sessions.create_session().await,
            Err(SessionError::TooMany(2))
        ));
        sessions.close_session(&a).await.unwrap();
        assert!(sessions.create_session().await.is_ok());
    }

    #[test]
    fn loopback_guards_hosts_and_origins_keyed_does_not() {
        let l = HttpOptions::loopback(1 << 20);
        assert!(l.allowed_hosts.contains(&"127.0.0.1".to_string()));
        assert!(l.allowed_origins.is_some());
        let k = HttpOptions::keyed(1 << 20);
        assert!(k.allowed_hosts.is_empty() && k.allowed_origins.is_none());
        assert_eq!(k.max_sessions, l.max_sessions);
    }
}
