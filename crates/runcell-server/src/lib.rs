//! runcell-server: the HTTP API (`runcell serve`).
//!
//! * `POST /v1/execute`: run code, answer the verdict (JSON), or stream server-sent events
//!   (`stdout`, `stderr`, then `result`) with `Accept: text/event-stream`.
//! * `GET /v1/runtimes`: languages, versions, availability, default and maximum limits.
//! * `GET /healthz`: liveness, and `GET /readyz`: readiness, without authentication.
//! * `/mcp`: the MCP server (Streamable HTTP), behind the same keys and admission.
//! * `GET /console`: the operator's console ([`console`]), a page over
//!   `GET /v1/admin/overview` and the approvals, for admin keys.
//! * On a second address, when the operator names one: agent-sandbox's runtime contract
//!   ([`agent_sandbox`]).
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

pub mod agent_sandbox;
pub mod audit;
pub mod auth;
pub mod cluster;
pub mod connections;
pub mod console;
pub mod deliver;
pub mod e2b;
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

use axum::Router;

pub use crate::audit::{AuditLog, AuditTarget, Caller};
pub use crate::auth::{ApiKey, KeyId};
pub use crate::deliver::Hold;
pub use crate::error::{ApiError, ErrorBody};
pub use crate::listener::{serve, serve_connections, HEADER_READ_TIMEOUT, WRITE_STALL};
pub use crate::metrics::Metrics;
pub use crate::middleware::RequestMeta;
pub use crate::openapi::openapi;
pub use crate::state::{AppState, Observe, MAX_SLOTS};

/// How the server runs: the operator's whole policy (runcell-core's, resolved from the
/// settings by the binary).
pub use runcell_core::Policy as ServerConfig;

/// The default body cap for a limits policy.
pub use runcell_core::policy::default_max_body_bytes;

/// The agent loop's upstream and bounds, built from the policy's agent settings.
#[derive(Debug, Clone)]
pub struct AgentSettings {
    pub upstream: runcell_agent::Upstream,
    pub policy: runcell_agent::api::AgentPolicy,
}

impl AgentSettings {
    /// The model the settings name (`None` for an upstream the settings model would have
    /// refused).
    pub fn from_settings(s: &runcell_core::policy::AgentSettings) -> Option<AgentSettings> {
        Some(AgentSettings {
            upstream: runcell_agent::api::upstream_from_settings(s)?,
            policy: runcell_agent::api::AgentPolicy::from_settings(s),
        })
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
        // A page and its assets, not API: they are not in the OpenAPI document.
        .merge(console::router())
        .nest("/e2b", e2b::router(&state))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            cluster::route,
        ))
        .with_state(state)
        .layer(axum::middleware::map_response(error::json_errors))
        .layer(axum::middleware::from_fn(middleware::request_meta))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            error::panic_response,
        ))
}
