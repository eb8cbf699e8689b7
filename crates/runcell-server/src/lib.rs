//! runcell-server: the HTTP API (`runcell serve`).
//!
//! * `POST /v1/execute`: run code, answer the verdict (JSON), or stream server-sent events
//!   (`stdout`, `stderr`, then `result`) with `Accept: text/event-stream`.
//! * `GET /v1/runtimes`: languages, versions, availability, default and maximum limits.
//! * `GET /healthz`: liveness, without authentication.
//! * `/mcp`: the MCP server (Streamable HTTP), behind the same keys and admission.
//!
//! Modules, in the order a request meets them: [`listener`] (accept loop, timeouts, graceful
//! shutdown), [`middleware`] (request id, tracing span, delivery), [`auth`], [`extract`] (the
//! caller, and a place in line before any body is read), [`routes`], and [`state`] (what
//! every handler shares: the run service, metrics, the audit log). Every run goes through
//! runcell-core's run service ([`runcell_core::RunService`]: admission, intake, approval, a
//! slot, the engine or the session, audit and metrics); a run whose client goes away, and
//! every run still going when the shutdown grace period ends, is killed through its kill
//! switch.
#![forbid(unsafe_code)]

pub mod audit;
pub mod auth;
pub mod config;
pub mod connections;
pub mod deliver;
pub mod error;
pub mod extract;
pub mod listener;
pub mod mcp;
pub mod metrics;
pub mod middleware;
pub mod openapi;
pub mod routes;
pub mod state;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use runcell_core::EngineConfig;

pub use crate::audit::{AuditLog, AuditTarget, Caller};
pub use crate::auth::{ApiKey, KeyId};
pub use crate::deliver::Hold;
pub use crate::error::{ApiError, ErrorBody};
pub use crate::listener::{serve, serve_connections, HEADER_READ_TIMEOUT, WRITE_STALL};
pub use crate::metrics::Metrics;
pub use crate::middleware::RequestMeta;
pub use crate::openapi::openapi;
pub use crate::state::{AppState, Observe, MAX_SLOTS};

/// How the server runs. `Debug` never shows the keys.
#[derive(Clone)]
pub struct ServerConfig {
    /// Default 127.0.0.1:8080.
    pub listen: SocketAddr,
    /// Accepted API keys. Empty: no authentication, which is only allowed on loopback.
    pub api_keys: Vec<ApiKey>,
    /// Sandboxes running at once. Default: the number of cores.
    pub max_concurrent: usize,
    /// Requests waiting for a sandbox beyond those. Default: 4 × max_concurrent.
    pub max_queue: usize,
    /// Largest request body. Default: the policy's code, stdin and input-file caps (base64
    /// counted) plus 1 MiB.
    pub max_body_bytes: usize,
    /// Client connections open at once, in total and from one address; beyond them a new
    /// connection is closed at once. `None`: derived at start from the open-files limit
    /// (see [`connections::ConnectionLimits::for_fd_limit`]).
    pub max_connections: Option<usize>,
    pub max_connections_per_peer: Option<usize>,
    /// On SIGTERM/SIGINT, how long running executions may take before they are killed.
    pub shutdown_grace: Duration,
    /// Where the audit log goes (default: stderr).
    pub audit: AuditTarget,
    /// Warm sandboxes kept ready per language (none by default here; `runcell serve`'s
    /// configuration sets a small Python pool unless told otherwise).
    pub pool: runcell_core::PoolSizes,
    /// Modules the warm Python interpreters import before they are ready.
    pub preload: runcell_core::Preload,
    /// What sessions may do: how many, how long.
    pub sessions: runcell_core::SessionPolicy,
    /// The model behind `POST /v1/agents`; `None`: not configured (the route says how).
    pub agent: Option<AgentSettings>,
    pub engine: EngineConfig,
    /// The commit this server was built from (`runcell_build_info`).
    pub commit: Option<String>,
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfig")
            .field("listen", &self.listen)
            .field("api_keys", &self.api_keys)
            .field("max_concurrent", &self.max_concurrent)
            .field("max_queue", &self.max_queue)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_connections", &self.max_connections)
            .field("max_connections_per_peer", &self.max_connections_per_peer)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("audit", &self.audit)
            .field("pool", &self.pool)
            .field("preload", &self.preload)
            .field("sessions", &self.sessions)
            .field("agent", &self.agent)
            .field("engine", &self.engine)
            .finish()
    }
}

/// The agent loop's upstream and bounds.
#[derive(Debug, Clone)]
pub struct AgentSettings {
    pub upstream: runcell_agent::Upstream,
    pub policy: runcell_agent::api::AgentPolicy,
}

/// The default body cap for a policy: room for the largest code, stdin and input files
/// (base64 is 4/3 of the bytes) plus JSON overhead.
pub fn default_max_body_bytes(policy: &runcell_core::Policy) -> usize {
    let total = policy.max_code_bytes
        + policy.max_stdin_bytes
        + policy.max_input_total_bytes.div_ceil(3) * 4
        + (1 << 20);
    usize::try_from(total).unwrap_or(usize::MAX)
}

impl ServerConfig {
    pub fn new(engine: EngineConfig) -> ServerConfig {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            api_keys: Vec::new(),
            max_concurrent: cores,
            max_queue: 4 * cores,
            max_body_bytes: default_max_body_bytes(&engine.policy),
            max_connections: None,
            max_connections_per_peer: None,
            shutdown_grace: Duration::from_secs(30),
            audit: AuditTarget::Stderr,
            pool: runcell_core::PoolSizes::default(),
            preload: runcell_core::Preload::default(),
            sessions: runcell_core::SessionPolicy::default(),
            agent: None,
            commit: None,
            engine,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig::new(EngineConfig::for_host())
    }
}

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(
        "refusing to listen on {0} without an API key: set RUNCELL_API_KEY (or --api-key), \
         or listen on a loopback address such as 127.0.0.1"
    )]
    NoKeyOnPublicAddress(SocketAddr),
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot open the audit log {target}")]
    AuditLog {
        target: String,
        source: std::io::Error,
    },
    #[error("cannot set up the server's signal handlers")]
    Signals(#[source] std::io::Error),
}

/// The API as a router, without a socket (for tests and embedding).
pub fn app(state: AppState) -> Router {
    let (keyed, _) = routes::authenticated()
        .route("/mcp", mcp::endpoint(&state))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_key,
        ))
        .split_for_parts();
    let (open, _) = routes::public().split_for_parts();
    Router::new()
        .merge(open)
        .merge(keyed)
        .with_state(state)
        .layer(axum::middleware::map_response(error::json_errors))
        .layer(axum::middleware::from_fn(middleware::request_meta))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            error::panic_response,
        ))
}
