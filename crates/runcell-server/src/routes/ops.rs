//! Operations: liveness, metrics, this API's OpenAPI document, and the runtimes.

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::Json;
use runcell_core::RuntimeStatus;
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::{ApiError, ErrorBody};
use crate::state::AppState;

/// One language of `GET /v1/runtimes`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RuntimeInfo {
    pub language: String,
    /// Whether it can run on this host now.
    pub available: bool,
    pub version: Option<String>,
    /// Why it is not available.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl From<RuntimeStatus> for RuntimeInfo {
    fn from(r: RuntimeStatus) -> Self {
        RuntimeInfo {
            language: r.language.name().to_string(),
            available: r.unavailable.is_none(),
            version: r.version,
            reason: r.unavailable,
        }
    }
}

/// `GET /v1/runtimes`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RuntimesResponse {
    pub runtimes: Vec<RuntimeInfo>,
    pub limits: LimitsInfo,
    /// The whole policy: limits plus the caps on code, stdin and files.
    pub policy: runcell_core::LimitPolicy,
    /// The memory the limits were sized from; absent when it is unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryInfo>,
}

/// The memory runcell may use, where the figure came from, and what runs may hold of it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct MemoryInfo {
    /// The machine's memory, or the lower limit of the cgroup runcell runs in.
    pub bytes: u64,
    /// Where `bytes` came from, e.g. "cgroup limit of /kubepods/pod1 (memory.max)".
    pub source: String,
    /// What one-shot runs, live sessions and warm sandboxes may hold together (the rest is
    /// the server's reserve).
    pub all_runs_bytes: Option<u64>,
    /// What one-shot runs and live sessions may hold together: `all_runs_bytes` less the
    /// warm pool.
    pub ledger_bytes: Option<u64>,
    /// Held now by running one-shot runs and live sessions.
    pub held_bytes: u64,
}

/// What a request gets without asking, and the most it may ask for.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LimitsInfo {
    pub default: runcell_core::Limits,
    pub maximum: runcell_core::Limits,
}

/// `GET /healthz`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Health {
    /// Always "ok" when the server answers.
    pub status: String,
    pub sandboxes_running: usize,
}
/// Liveness. Needs no key.
#[utoipa::path(get, path = "/healthz", tag = "operations", security(()),
    responses((status = 200, description = "The server is up", body = Health)))]
pub(crate) async fn healthz(State(state): State<AppState>) -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        sandboxes_running: state.runs().active(),
    })
}

/// This document. Needs no key.
#[utoipa::path(get, path = "/openapi.json", tag = "operations", security(()),
    responses((status = 200, description = "The OpenAPI 3.1 document of this API", content_type = "application/json")))]
pub(crate) async fn openapi_json(State(state): State<AppState>) -> Response {
    // Built per request (cheap, a few hundred microseconds): the request schemas depend on
    // this server's policy, so it cannot be a process-wide static.
    let doc = crate::openapi::served(
        state.engine().config(),
        state.sessions().policy(),
        state.inner.agent.as_ref().map(|a| &a.policy),
    );
    let doc = serde_json::to_string_pretty(&doc).unwrap_or_default();
    ([(CONTENT_TYPE, "application/json")], doc).into_response()
}

/// Prometheus metrics: executions by language and category, latency, sandboxes running,
/// queue depth, rejections.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses(
        (status = 200, description = "The metrics: OpenMetrics text when the Accept header asks for it, else Prometheus' classic text format", content(
            (String = "text/plain"),
            (String = "application/openmetrics-text"),
        )),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
    ))]
pub(crate) async fn metrics(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
) -> Response {
    let text = state.inner.metrics.render(
        state.runs().active(),
        state.service().admission().stats().waiting,
        &state.engine().pool_stats(),
        state.sessions().stats(),
        &state.engine().templates().report(),
    );
    let accept = headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok());
    if crate::metrics::wants_openmetrics(accept) {
        (
            [(
                CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response()
    } else {
        (
            [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
            crate::metrics::to_classic(&text),
        )
            .into_response()
    }
}

/// The languages of this host, their versions, and the default and maximum limits.
#[utoipa::path(get, path = "/v1/runtimes", tag = "execute",
    responses(
        (status = 200, description = "The runtimes and the limits a request may ask for", body = RuntimesResponse),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
    ))]
pub(crate) async fn runtimes(
    State(state): State<AppState>,
) -> Result<Json<RuntimesResponse>, ApiError> {
    let list = state.runtimes().await?;
    let p = state.engine().policy().clone();
    let config = state.engine().config();
    let admission = state.service().admission();
    let memory = config.memory.as_ref().map(|m| MemoryInfo {
        bytes: m.bytes,
        source: m.source.to_string(),
        all_runs_bytes: config.all_runs_memory_bytes,
        ledger_bytes: admission.memory_budget(),
        held_bytes: admission.stats().memory,
    });
    Ok(Json(RuntimesResponse {
        runtimes: list,
        limits: LimitsInfo {
            default: p.defaults,
            maximum: p.max,
        },
        policy: p,
        memory,
    }))
}
