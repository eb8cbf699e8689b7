//! runcell-server: the HTTP API (`runcell serve`).
//!
//! * `POST /v1/execute`: run code, answer the verdict (JSON), or stream server-sent events
//!   (`stdout`, `stderr`, then `result`) with `Accept: text/event-stream`.
//! * `GET /v1/runtimes`: languages, versions, availability, default and maximum limits.
//! * `GET /healthz`: liveness, without authentication.
//!
//! Every run executes on a blocking thread (the engine starts its helper with
//! `std::process::Command`; nothing forks the threaded server). A bounded number run at once
//! with a bounded queue behind them; beyond that: 429. A run whose client goes away, and every
//! run still going when the shutdown grace period ends, is killed through its `KillSwitch`.
#![forbid(unsafe_code)]

pub mod audit;
pub mod auth;
pub mod body;
pub mod config;
pub mod deliver;
pub mod error;
pub mod mcp;
pub mod metrics;
pub mod stream;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::header::{HeaderValue, ACCEPT, CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use runcell_core::verdict::ErrorCategory;
use runcell_core::{Engine, EngineConfig, ExecRequest, Verdict};
use runcell_jail::{KillSwitch, NoSink, OutputSink, Stream};
use runcell_runtimes::Language;
use serde::Serialize;
use serde_json::json;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use utoipa::{Modify, OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use crate::audit::{AuditLog, AuditTarget, Caller};
use crate::auth::Keys;
pub use crate::auth::{ApiKey, KeyId};
use crate::body::ExecuteBody;
pub use crate::deliver::Hold;
pub use crate::error::{ApiError, ErrorBody};
pub use crate::metrics::Metrics;
use crate::stream::{ChannelSink, Message};

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
    /// On SIGTERM/SIGINT, how long running executions may take before they are killed.
    pub shutdown_grace: Duration,
    /// Where the audit log goes (default: stderr).
    pub audit: AuditTarget,
    pub engine: EngineConfig,
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfig")
            .field("listen", &self.listen)
            .field("api_keys", &self.api_keys)
            .field("max_concurrent", &self.max_concurrent)
            .field("max_queue", &self.max_queue)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("audit", &self.audit)
            .field("engine", &self.engine)
            .finish()
    }
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
            shutdown_grace: Duration::from_secs(30),
            audit: AuditTarget::Stderr,
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
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// The kill switches of the runs whose sandboxes exist right now.
#[derive(Clone, Default)]
pub struct RunRegistry(Arc<Mutex<Registry>>);

#[derive(Default)]
struct Registry {
    next: u64,
    runs: HashMap<u64, KillSwitch>,
    /// Set once the grace period is over: runs registered afterwards are killed at once.
    killing: bool,
}

/// A registered run; leaves the registry when dropped (when its blocking task ends).
pub struct RunEntry {
    registry: RunRegistry,
    id: u64,
}

impl Drop for RunEntry {
    fn drop(&mut self) {
        self.registry.lock().runs.remove(&self.id);
    }
}

impl RunRegistry {
    fn lock(&self) -> MutexGuard<'_, Registry> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn register(&self, ks: KillSwitch) -> RunEntry {
        let mut r = self.lock();
        if r.killing {
            ks.trigger();
        }
        r.next += 1;
        let id = r.next;
        r.runs.insert(id, ks);
        RunEntry {
            registry: self.clone(),
            id,
        }
    }

    /// Kill every running sandbox (and any started from now on). Returns how many.
    pub fn kill_all(&self) -> usize {
        let mut r = self.lock();
        r.killing = true;
        for ks in r.runs.values() {
            ks.trigger();
        }
        r.runs.len()
    }

    /// Sandboxes running now.
    pub fn active(&self) -> usize {
        self.lock().runs.len()
    }
}

/// Shared by every handler.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Engine,
    keys: Keys,
    /// Running plus queued: beyond it, 429.
    admission: Arc<Semaphore>,
    /// Running.
    running: Arc<Semaphore>,
    max_concurrent: usize,
    max_queue: usize,
    max_body_bytes: usize,
    /// Bytes of MCP request bodies being received at once (their room in memory, like the
    /// bodies of `max_concurrent + max_queue` executions); beyond it, 429.
    body_budget: Arc<Semaphore>,
    runs: RunRegistry,
    keep_alive: Duration,
    metrics: Metrics,
    audit: AuditLog,
    runtimes: Mutex<Option<(Instant, Arc<Vec<RuntimeInfo>>)>>,
    /// Cancelled when the grace period is over: ends long-lived MCP streams.
    shutdown: runcell_mcp::CancellationToken,
}

impl AppState {
    pub fn new(config: &ServerConfig, audit: AuditLog) -> AppState {
        let max_concurrent = config.max_concurrent.clamp(1, MAX_SLOTS);
        let max_queue = config.max_queue.min(MAX_SLOTS);
        let body_budget = (max_concurrent + max_queue)
            .max(1)
            .saturating_mul(config.max_body_bytes)
            .min(Semaphore::MAX_PERMITS);
        AppState {
            inner: Arc::new(Inner {
                engine: Engine::new(config.engine.clone()),
                keys: Keys::new(&config.api_keys),
                admission: Arc::new(Semaphore::new(max_concurrent + max_queue)),
                running: Arc::new(Semaphore::new(max_concurrent)),
                max_concurrent,
                max_queue,
                max_body_bytes: config.max_body_bytes,
                body_budget: Arc::new(Semaphore::new(body_budget)),
                runs: RunRegistry::default(),
                keep_alive: Duration::from_secs(1),
                metrics: Metrics::new(max_concurrent, max_queue),
                audit,
                runtimes: Mutex::new(None),
                shutdown: runcell_mcp::CancellationToken::new(),
            }),
        }
    }

    pub fn runs(&self) -> &RunRegistry {
        &self.inner.runs
    }

    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// Cancelled when the shutdown grace period is over.
    pub fn shutdown_token(&self) -> runcell_mcp::CancellationToken {
        self.inner.shutdown.clone()
    }

    pub fn auth_enabled(&self) -> bool {
        !self.inner.keys.is_empty()
    }

    /// A place in line (running or queued), taken before a request body is read: an
    /// overloaded server must not buffer bodies it will refuse anyway. 429 when full.
    pub fn reserve(&self) -> Result<Reservation, ApiError> {
        let s = &self.inner;
        match s.admission.clone().try_acquire_owned() {
            Ok(permit) => Ok(Reservation {
                state: self.clone(),
                permit,
            }),
            Err(_) => {
                s.metrics.rejected("rate_limited");
                Err(ApiError::rate_limited(format!(
                    "The server is at capacity ({} executions running, {} waiting). Retry shortly.",
                    s.max_concurrent, s.max_queue
                )))
            }
        }
    }

    /// [`AppState::reserve`] and [`Reservation::admit`] in one: for front ends that have the
    /// request in hand (MCP).
    pub fn admit(&self, req: ExecRequest, caller: Caller) -> Result<Admitted, ApiError> {
        self.reserve()?.admit(req, caller)
    }

    /// The runtimes of this host. Finding a runtime and asking its version runs host
    /// programs, so the answer is kept for a minute.
    pub async fn runtimes(&self) -> Result<Arc<Vec<RuntimeInfo>>, ApiError> {
        if let Some((at, list)) = &*lock(&self.inner.runtimes) {
            if at.elapsed() < Duration::from_secs(60) {
                return Ok(list.clone());
            }
        }
        let host = self.inner.engine.config().host.clone();
        let list = tokio::task::spawn_blocking(move || {
            Language::ALL
                .iter()
                .map(|&l| match runcell_runtimes::locate(l, &host) {
                    Ok(rt) => RuntimeInfo {
                        language: l.name().to_string(),
                        available: true,
                        version: rt.version(),
                        reason: None,
                    },
                    Err(e) => RuntimeInfo {
                        language: l.name().to_string(),
                        available: false,
                        version: None,
                        reason: Some(e.to_string()),
                    },
                })
                .collect::<Vec<_>>()
        })
        .await
        .map_err(|_| ApiError::internal("Listing the runtimes failed."))?;
        let list = Arc::new(list);
        *lock(&self.inner.runtimes) = Some((Instant::now(), list.clone()));
        Ok(list)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The most sandboxes or queued requests the server counts (a semaphore's limit is lower than
/// `usize::MAX`); far beyond anything a host can run.
pub const MAX_SLOTS: usize = 1 << 20;

/// A place in line, before the request is known.
pub struct Reservation {
    state: AppState,
    permit: OwnedSemaphorePermit,
}

impl Reservation {
    /// Check the request against the operator's policy (400 naming the limit and its
    /// maximum); a refused request is counted and audited.
    pub fn admit(self, req: ExecRequest, caller: Caller) -> Result<Admitted, ApiError> {
        let s = &self.state.inner;
        if let Err(e) = body::precheck(&s.engine.config().policy, &req) {
            s.metrics.rejected(e.category);
            s.audit.record(&caller, &req, Err(e.category), 0.0);
            return Err(e);
        }
        Ok(Admitted {
            state: self.state,
            permit: Arc::new(self.permit),
            req,
            caller,
            admitted: Instant::now(),
        })
    }
}

/// A request that may run: it waits for a sandbox slot, runs, and is counted and audited.
pub struct Admitted {
    state: AppState,
    /// Also kept by the response until it is delivered (see [`Admitted::hold_until_delivered`]).
    permit: Arc<OwnedSemaphorePermit>,
    req: ExecRequest,
    caller: Caller,
    admitted: Instant,
}

impl Admitted {
    /// Keep this request's place in line until the response of the HTTP request that carries
    /// `hold` has been delivered (or dropped), and not only until the run is over: a response
    /// waiting for a client that reads slowly holds the verdict in memory.
    pub fn hold_until_delivered(&self, hold: &Hold) {
        hold.keep(self.permit.clone());
    }

    /// Wait for a slot and run. Dropping the future (a client that went away, a cancelled
    /// MCP call) kills the sandbox; the run is still counted and audited, as `cancelled`.
    pub async fn run(self, mut sink: Box<dyn OutputSink + Send>) -> Result<Verdict, ApiError> {
        let Admitted {
            state,
            permit,
            req,
            caller,
            admitted,
        } = self;
        let s = &state.inner;
        let running = {
            let _queued = s.metrics.queued();
            s.running
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| ApiError::unavailable("The server is shutting down."))?
        };
        let ks = KillSwitch::new().map_err(|e| {
            ApiError::unavailable(format!("The server cannot start a run right now ({e})."))
        })?;
        let entry = s.runs.register(ks.clone());
        let mut guard = ks.kill_on_drop();
        let st = state.clone();
        let verdict = tokio::task::spawn_blocking(move || {
            let _slot = (permit, running, entry);
            let verdict = st.inner.engine.execute(&req, &mut *sink, Some(&ks));
            // Flushes what a streaming sink held back, before the verdict is sent.
            drop(sink);
            let seconds = admitted.elapsed().as_secs_f64();
            st.inner
                .metrics
                .executed(caller.interface, &verdict, seconds);
            st.inner.audit.record(&caller, &req, Ok(&verdict), seconds);
            verdict
        })
        .await
        .map_err(|_| ApiError::internal("The execution failed unexpectedly."))?;
        guard.disarm();
        Ok(verdict)
    }
}

/// A request's id and peer, set by the outermost middleware.
#[derive(Debug, Clone)]
pub struct RequestMeta {
    pub request_id: String,
    pub peer: Option<SocketAddr>,
}

async fn request_meta(mut req: Request, next: Next) -> Response {
    let request_id = uuid::Uuid::new_v4().simple().to_string();
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    req.extensions_mut().insert(RequestMeta {
        request_id: request_id.clone(),
        peer,
    });
    let hold = Hold::default();
    req.extensions_mut().insert(hold.clone());
    let mut res = next.run(req).await;
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        res.headers_mut().insert("x-request-id", v);
    }
    deliver::guard(res, hold)
}

/// Who is calling, from the request's extensions.
fn caller_of(parts: &axum::http::request::Parts, interface: &'static str) -> Caller {
    let meta = parts.extensions.get::<RequestMeta>();
    Caller {
        request_id: meta.map(|m| m.request_id.clone()).unwrap_or_default(),
        key_id: parts.extensions.get::<KeyId>().and_then(|k| k.0.clone()),
        interface,
        peer: meta.and_then(|m| m.peer),
    }
}

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

/// `GET /v1/runtimes`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RuntimesResponse {
    pub runtimes: Vec<RuntimeInfo>,
    pub limits: LimitsInfo,
    /// The whole policy: limits plus the caps on code, stdin and files.
    pub policy: runcell_core::Policy,
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

#[derive(OpenApi)]
#[openapi(
    info(
        title = "runcell",
        description = "Run untrusted code (Python, JavaScript, Ruby, Go, bash) in a sandbox and \
                       get a structured verdict.",
        license(name = "Apache-2.0")
    ),
    modifiers(&SecuritySchemes, &McpPath),
    security(("bearer" = []), ("api_key" = [])),
    tags(
        (name = "execute", description = "Running code"),
        (name = "operations", description = "Health, metrics and this document"),
        (name = "mcp", description = "The MCP server")
    )
)]
struct ApiDoc;

struct SecuritySchemes;

impl Modify for SecuritySchemes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{
            ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme,
        };
        let c = openapi.components.get_or_insert_with(Default::default);
        c.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        c.add_security_scheme(
            "api_key",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("X-API-Key"))),
        );
    }
}

/// `/mcp` is served by the MCP SDK, not by a handler of ours: it is described here by hand,
/// as a pointer to the protocol.
struct McpPath;

impl Modify for McpPath {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::path::{HttpMethod, OperationBuilder, PathItem};
        use utoipa::openapi::{Response as OaResponse, ResponsesBuilder};
        let op = |summary: &str| {
            OperationBuilder::new()
                .tag("mcp")
                .summary(Some(summary))
                .description(Some(
                    "The Model Context Protocol over Streamable HTTP (JSON-RPC; protocol \
                     versions 2025-06-18 to 2026-07-28): tools code_exec_python, code_exec_node, \
                     code_exec_ruby, code_exec_go, code_exec_bash. Same API keys as the rest of \
                     the API. See docs/mcp.md.",
                ))
                .responses(
                    ResponsesBuilder::new()
                        .response(
                            "200",
                            OaResponse::new("A JSON-RPC response or an event stream"),
                        )
                        .response("401", OaResponse::new("No or a wrong API key")),
                )
                .build()
        };
        let mut item = PathItem::new(HttpMethod::Post, op("Send a JSON-RPC message"));
        item.get = Some(op(
            "Open the event stream of a session (older protocol versions)",
        ));
        item.delete = Some(op("End a session (older protocol versions)"));
        openapi.paths.paths.insert("/mcp".to_string(), item);
    }
}

/// The routes that need a key, with their OpenAPI description.
fn authenticated() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(execute))
        .routes(routes!(runtimes))
        .routes(routes!(metrics))
}

fn public() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(openapi_json))
}

/// The OpenAPI document of the API, generated from the handlers and the types they use.
pub fn openapi() -> utoipa::openapi::OpenApi {
    OpenApiRouter::<AppState>::with_openapi(ApiDoc::openapi())
        .merge(authenticated())
        .merge(public())
        .into_openapi()
}

/// The API as a router, without a socket (for tests and embedding).
pub fn app(state: AppState) -> Router {
    let (keyed, _) = authenticated()
        .route("/mcp", mcp::endpoint(&state))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_key,
        ))
        .split_for_parts();
    let (open, _) = public().split_for_parts();
    Router::new()
        .merge(open)
        .merge(keyed)
        .with_state(state)
        .layer(middleware::map_response(error::json_errors))
        .layer(middleware::from_fn(request_meta))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            error::panic_response,
        ))
}

/// Liveness. Needs no key.
#[utoipa::path(get, path = "/healthz", tag = "operations", security(()),
    responses((status = 200, description = "The server is up", body = Health)))]
async fn healthz(State(state): State<AppState>) -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        sandboxes_running: state.runs().active(),
    })
}

/// This document. Needs no key.
#[utoipa::path(get, path = "/openapi.json", tag = "operations", security(()),
    responses((status = 200, description = "The OpenAPI 3.1 document of this API", content_type = "application/json")))]
async fn openapi_json() -> Response {
    static DOC: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let doc = DOC.get_or_init(|| openapi().to_pretty_json().unwrap_or_default());
    ([(CONTENT_TYPE, "application/json")], doc.clone()).into_response()
}

/// Prometheus metrics: executions by language and category, latency, sandboxes running,
/// queue depth, rejections.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses(
        (status = 200, description = "OpenMetrics text", content_type = "application/openmetrics-text", body = String),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
    ))]
async fn metrics(State(state): State<AppState>) -> Response {
    let text = state.inner.metrics.render(state.runs().active());
    (
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// The languages of this host, their versions, and the default and maximum limits.
#[utoipa::path(get, path = "/v1/runtimes", tag = "execute",
    responses(
        (status = 200, body = RuntimesResponse),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
    ))]
async fn runtimes(State(state): State<AppState>) -> Result<Json<RuntimesResponse>, ApiError> {
    let list = state.runtimes().await?;
    let p = state.inner.engine.config().policy.clone();
    Ok(Json(RuntimesResponse {
        runtimes: list.as_ref().clone(),
        limits: LimitsInfo {
            default: p.defaults,
            maximum: p.max,
        },
        policy: p,
    }))
}

fn wants_events(headers: &HeaderMap) -> bool {
    headers
        .get_all(ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| {
            t.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .eq_ignore_ascii_case("text/event-stream")
        })
}

/// How long a request body may take to arrive.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Read a request body: 413 beyond `limit` (from `Content-Length` at once, otherwise once the
/// cap is crossed), 408 if it takes longer than [`BODY_READ_TIMEOUT`]. With a `budget`, the
/// bytes received take permits from it while the body is read; 429 when it is exhausted (many
/// large bodies arriving at once, or trickling in).
pub(crate) async fn read_body(
    body: Body,
    headers: &HeaderMap,
    limit: usize,
    budget: Option<&Arc<Semaphore>>,
) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    let collect = async {
        let mut body = Limited::new(body, limit);
        let mut buf = Vec::new();
        let mut held: Option<OwnedSemaphorePermit> = None;
        while let Some(frame) = body.frame().await {
            let frame = match frame {
                Ok(f) => f,
                Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
                    return Err(ApiError::too_large(limit))
                }
                Err(e) => {
                    return Err(ApiError::invalid(format!(
                        "The request body could not be read: {e}."
                    )))
                }
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            if let Some(budget) = budget {
                let n = u32::try_from(data.len()).unwrap_or(u32::MAX);
                let permit = budget.clone().try_acquire_many_owned(n).map_err(|_| {
                    ApiError::rate_limited(
                        "The server is receiving too many request bodies at once. Retry shortly.",
                    )
                })?;
                match &mut held {
                    Some(h) => h.merge(permit),
                    None => held = Some(permit),
                }
            }
            buf.extend_from_slice(&data);
        }
        Ok(Bytes::from(buf))
    };
    // A body trickled in slowly would hold its place in line: it gets a deadline.
    match tokio::time::timeout(BODY_READ_TIMEOUT, collect).await {
        Ok(r) => r,
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            format!(
                "The request body did not arrive within {} s.",
                BODY_READ_TIMEOUT.as_secs()
            ),
        )),
    }
}

fn parse_body(bytes: &[u8]) -> Result<ExecRequest, ApiError> {
    let body: ExecuteBody = serde_json::from_slice(bytes).map_err(|e| {
        use serde_json::error::Category;
        match e.classify() {
            Category::Data => ApiError::invalid(format!("Invalid request: {e}.")),
            _ => ApiError::invalid(format!("The request body is not valid JSON: {e}.")),
        }
    })?;
    body.into_request()
}

/// The verdict as a response: an `invalid_request` verdict is the client's error (400);
/// every other verdict, failures of the program included, is a 200.
fn verdict_response(verdict: Verdict) -> Response {
    match &verdict.error {
        Some(e) if e.category == ErrorCategory::InvalidRequest => {
            ApiError::invalid(e.message.clone()).into_response()
        }
        _ => Json(verdict).into_response(),
    }
}

/// Aborts the run's task (which kills its sandbox) when the event stream is dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Run code and answer its verdict. A failing program is still a 200 with the failure in
/// `error`; only a request the server refuses is an error status. With
/// `Accept: text/event-stream` the answer is a stream of server-sent events: `stdout` and
/// `stderr` (`{"text": ...}`) as the program writes, then one `result` carrying the verdict
/// (or `error` carrying an error body).
#[utoipa::path(post, path = "/v1/execute", tag = "execute", request_body = ExecuteBody,
    responses(
        (status = 200, description = "The verdict (JSON), or with `Accept: text/event-stream` \
            events `stdout`/`stderr` (`{\"text\": \"...\"}`) then `result` (the verdict)",
            content(
                (Verdict = "application/json"),
                (String = "text/event-stream"),
            )),
        (status = 400, description = "Invalid request: malformed JSON, a wrong type, an unknown \
            language, a limit above the operator's maximum (`limit` names it)", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 408, description = "The body did not arrive within 30 s", body = ErrorBody),
        (status = 413, description = "The body is larger than the server's cap", body = ErrorBody),
        (status = 429, description = "At capacity: all sandboxes busy and the queue full; see \
            `Retry-After`", body = ErrorBody),
        (status = 503, description = "Shutting down", body = ErrorBody),
    ))]
async fn execute(State(state): State<AppState>, req: Request) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let reservation = state.reserve()?;
    let parsed = match read_body(body, &parts.headers, state.inner.max_body_bytes, None).await {
        Ok(bytes) => parse_body(&bytes),
        Err(e) => Err(e),
    };
    let req = parsed.inspect_err(|e| state.inner.metrics.rejected(e.category))?;
    let admitted = reservation.admit(req, caller_of(&parts, "http"))?;
    if let Some(hold) = parts.extensions.get::<Hold>() {
        admitted.hold_until_delivered(hold);
    }

    if !wants_events(&parts.headers) {
        return Ok(verdict_response(admitted.run(Box::new(NoSink)).await?));
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let done = tx.clone();
    let task = tokio::spawn(async move {
        let result = admitted.run(Box::new(ChannelSink::new(tx))).await;
        let _ = done.send(Message::Done(Box::new(result)));
    });
    let abort = AbortOnDrop(task.abort_handle());
    let events = futures_util::stream::unfold((rx, Some(abort)), |(mut rx, abort)| async move {
        // Once the result is out (the abort guard gone), the stream ends.
        abort.as_ref()?;
        let (event, abort) = match rx.recv().await {
            Some(Message::Output(stream, text)) => (
                Event::default()
                    .event(match stream {
                        Stream::Stdout => "stdout",
                        Stream::Stderr => "stderr",
                    })
                    .data(json!({ "text": text }).to_string()),
                abort,
            ),
            Some(Message::Done(result)) => {
                let event = match *result {
                    Ok(v) => Event::default()
                        .event("result")
                        .data(serde_json::to_string(&v).unwrap_or_default()),
                    Err(e) => Event::default().event("error").data(e.body().to_string()),
                };
                // The run is over: dropping the guard aborts nothing.
                (event, None)
            }
            None => (
                Event::default().event("error").data(
                    ApiError::internal("The execution failed unexpectedly.")
                        .body()
                        .to_string(),
                ),
                None,
            ),
        };
        Some((Ok::<_, Infallible>(event), (rx, abort)))
    });
    let mut res = Sse::new(events)
        .keep_alive(KeepAlive::new().interval(state.inner.keep_alive))
        .into_response();
    res.headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(res)
}

fn limits_summary(l: &runcell_core::Limits) -> String {
    use runcell_core::units::{format_duration, format_size};
    format!(
        "timeout {}, memory {}, cpus {}, pids {}, disk {}, output {}",
        format_duration(l.timeout()),
        format_size(l.memory_bytes),
        l.cpu_millis as f64 / 1000.0,
        l.pids,
        format_size(l.disk_bytes),
        format_size(l.output_bytes)
    )
}

/// Counts SIGTERM/SIGINT: the first starts a graceful shutdown, a second ends the grace.
fn signals() -> std::io::Result<tokio::sync::watch::Receiver<u32>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let (tx, rx) = tokio::sync::watch::channel(0u32);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tx.send_modify(|n| *n += 1);
        }
    });
    Ok(rx)
}

async fn signalled(mut rx: tokio::sync::watch::Receiver<u32>, times: u32) {
    if rx.wait_for(|n| *n >= times).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// How long a client may take to send the head of a request, and how long a kept-alive
/// connection may sit idle before its next one.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Serve `router` on the connections `listener` accepts until `stop` completes; then stop
/// accepting and return once the requests in flight are answered. A connection that does not
/// send a complete request head within [`HEADER_READ_TIMEOUT`] is closed: without that, idle
/// or trickling connections (no key needed to open them) would pile up until the process runs
/// out of file descriptors. So is one whose writes make no progress for [`WRITE_STALL`].
pub async fn serve_connections(
    listener: tokio::net::TcpListener,
    router: Router,
    stop: impl std::future::Future<Output = ()>,
) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    tokio::pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    use std::io::ErrorKind::*;
                    if !matches!(e.kind(), ConnectionRefused | ConnectionAborted | ConnectionReset) {
                        // Out of file descriptors, most likely: do not spin.
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        let router = router.clone();
        let service = hyper::service::service_fn(move |mut req: Request<hyper::body::Incoming>| {
            req.extensions_mut().insert(ConnectInfo(peer));
            tower::ServiceExt::oneshot(router.clone(), req)
        });
        let io = hyper_util::rt::TokioIo::new(WriteStall::new(stream));
        let conn = http.serve_connection(io, service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// How long a write to a client may make no progress at all before the connection is closed.
pub const WRITE_STALL: Duration = Duration::from_secs(60);

/// A connection whose writes fail once they have made no progress for [`WRITE_STALL`]: a
/// client that stops reading would otherwise keep its connection, and what is buffered for
/// it, for as long as it likes.
struct WriteStall<T> {
    io: T,
    stalled: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl<T> WriteStall<T> {
    fn new(io: T) -> Self {
        WriteStall { io, stalled: None }
    }

    fn progress<R>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        r: std::task::Poll<std::io::Result<R>>,
    ) -> std::task::Poll<std::io::Result<R>> {
        use std::future::Future;
        use std::task::Poll;
        if r.is_ready() {
            self.stalled = None;
            return r;
        }
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(WRITE_STALL)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client stopped reading",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for WriteStall<T> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for WriteStall<T> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = std::pin::Pin::new(&mut this.io).poll_write(cx, buf);
        this.progress(cx, r)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = std::pin::Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.progress(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let r = std::pin::Pin::new(&mut this.io).poll_flush(cx);
        this.progress(cx, r)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let r = std::pin::Pin::new(&mut this.io).poll_shutdown(cx);
        this.progress(cx, r)
    }
}

/// Listen and serve until SIGTERM or SIGINT; then stop accepting, let running executions
/// finish within the grace period, kill the rest and return once their sandboxes are gone.
pub async fn serve(config: ServerConfig) -> Result<(), ServerError> {
    if config.max_concurrent == 0 {
        return Err(ServerError::Config(
            "max_concurrent must be at least 1".into(),
        ));
    }
    let audit = AuditLog::open(&config.audit).map_err(|e| {
        ServerError::Config(format!("cannot open the audit log {:?}: {e}", config.audit))
    })?;
    let state = AppState::new(&config, audit);
    if !state.auth_enabled() && !config.listen.ip().is_loopback() {
        return Err(ServerError::NoKeyOnPublicAddress(config.listen));
    }
    let signals = signals()?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServerError::Bind {
            addr: config.listen,
            source,
        })?;
    let addr = listener.local_addr()?;
    if !state.auth_enabled() {
        eprintln!(
            "runcell serve: WARNING: NO API KEY IS SET. Anyone who can reach {addr} can run \
             code on this host.\nruncell serve: WARNING: this is only allowed on loopback; set \
             RUNCELL_API_KEY for any other use."
        );
    }
    eprintln!(
        "runcell serve: listening on http://{addr} ({} at once, {} queued, bodies up to {}, {})",
        config.max_concurrent,
        config.max_queue,
        runcell_core::units::format_size(config.max_body_bytes as u64),
        if state.auth_enabled() {
            "API key required"
        } else {
            "no API key"
        }
    );
    if state.auth_enabled() {
        let ids: Vec<&str> = config.api_keys.iter().map(|k| k.id.as_str()).collect();
        eprintln!("runcell serve: API keys: {}", ids.join(", "));
    }
    let p = &config.engine.policy;
    eprintln!(
        "runcell serve: limits: default {}, maximum {}; audit log: {}{}",
        limits_summary(&p.defaults),
        limits_summary(&p.max),
        match &config.audit {
            AuditTarget::Stderr => "stderr".to_string(),
            AuditTarget::Off => "off".to_string(),
            AuditTarget::File(f) => f.display().to_string(),
        },
        if config.engine.strict { "; strict" } else { "" }
    );
    let runs = state.runs().clone();
    let shutdown = state.shutdown_token();
    let server = serve_connections(listener, app(state), signalled(signals.clone(), 1));
    tokio::pin!(server);
    let grace = config.shutdown_grace;
    let grace_over = async {
        signalled(signals.clone(), 1).await;
        eprintln!(
            "runcell serve: shutting down: no new connections; {} running execution(s) get {:?} to finish",
            runs.active(),
            grace
        );
        tokio::select! {
            _ = tokio::time::sleep(grace) => {}
            _ = signalled(signals.clone(), 2) => {}
        }
    };
    tokio::select! {
        _ = &mut server => {}
        _ = grace_over => {
            let n = runs.kill_all();
            shutdown.cancel();
            eprintln!("runcell serve: grace period over: killing {n} execution(s)");
            if tokio::time::timeout(Duration::from_secs(15), &mut server).await.is_err() {
                eprintln!("runcell serve: connections still open; closing them");
            }
        }
    }
    // Handlers wait for their runs, but a run whose client left is still being torn down.
    runs.kill_all();
    shutdown.cancel();
    let deadline = Instant::now() + Duration::from_secs(15);
    while runs.active() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("runcell serve: stopped");
    Ok(())
}
