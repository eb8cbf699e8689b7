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

pub mod auth;
pub mod body;
pub mod error;
pub mod stream;

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header::{HeaderValue, ACCEPT, CONTENT_LENGTH};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{middleware, Json, Router};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use runcell_core::verdict::ErrorCategory;
use runcell_core::{Engine, EngineConfig, ExecRequest, Verdict};
use runcell_jail::{KillSwitch, Stream};
use runcell_runtimes::Language;
use serde_json::json;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use crate::auth::Keys;
use crate::body::ExecuteBody;
pub use crate::error::ApiError;
use crate::stream::{ChannelSink, Message};

/// How the server runs. `Debug` never shows the keys.
#[derive(Clone)]
pub struct ServerConfig {
    /// Default 127.0.0.1:8080.
    pub listen: SocketAddr,
    /// Accepted API keys. Empty: no authentication, which is only allowed on loopback.
    pub api_keys: Vec<String>,
    /// Sandboxes running at once. Default: the number of cores.
    pub max_concurrent: usize,
    /// Requests waiting for a sandbox beyond those. Default: 4 × max_concurrent.
    pub max_queue: usize,
    /// Largest request body. Default: the policy's code, stdin and input-file caps (base64
    /// counted) plus 1 MiB.
    pub max_body_bytes: usize,
    /// On SIGTERM/SIGINT, how long running executions may take before they are killed.
    pub shutdown_grace: Duration,
    pub engine: EngineConfig,
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfig")
            .field("listen", &self.listen)
            .field(
                "api_keys",
                &format_args!("[{} redacted]", self.api_keys.len()),
            )
            .field("max_concurrent", &self.max_concurrent)
            .field("max_queue", &self.max_queue)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("shutdown_grace", &self.shutdown_grace)
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

/// Triggers the kill switch when dropped armed: the handler's future (or the event stream)
/// was dropped before the run ended, i.e. the client went away.
struct CancelOnDrop(Option<KillSwitch>);

impl CancelOnDrop {
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(ks) = self.0.take() {
            ks.trigger();
        }
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
    runs: RunRegistry,
    keep_alive: Duration,
}

impl AppState {
    pub fn new(config: &ServerConfig) -> AppState {
        let max_concurrent = config.max_concurrent.max(1);
        AppState {
            inner: Arc::new(Inner {
                engine: Engine::new(config.engine.clone()),
                keys: Keys::new(&config.api_keys),
                admission: Arc::new(Semaphore::new(max_concurrent + config.max_queue)),
                running: Arc::new(Semaphore::new(max_concurrent)),
                max_concurrent,
                max_queue: config.max_queue,
                max_body_bytes: config.max_body_bytes,
                runs: RunRegistry::default(),
                keep_alive: Duration::from_secs(1),
            }),
        }
    }

    pub fn runs(&self) -> &RunRegistry {
        &self.inner.runs
    }

    pub fn auth_enabled(&self) -> bool {
        !self.inner.keys.is_empty()
    }
}

/// The API as a router, without a socket (for tests and embedding).
pub fn app(state: AppState) -> Router {
    let v1 = Router::new()
        .route("/v1/execute", post(execute))
        .route("/v1/runtimes", get(runtimes))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_key,
        ));
    Router::new()
        .route("/healthz", get(healthz))
        .merge(v1)
        .with_state(state)
        .layer(middleware::map_response(error::json_errors))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            error::panic_response,
        ))
}

async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

async fn runtimes(State(state): State<AppState>) -> Result<Json<serde_json::Value>, ApiError> {
    let config = state.inner.engine.config().clone();
    let host = config.host.clone();
    // Locating a runtime and asking its version runs host programs: a blocking thread.
    let list = tokio::task::spawn_blocking(move || {
        Language::ALL
            .iter()
            .map(|&l| match runcell_runtimes::locate(l, &host) {
                Ok(rt) => json!({
                    "language": l.name(),
                    "available": true,
                    "version": rt.version(),
                }),
                Err(e) => json!({
                    "language": l.name(),
                    "available": false,
                    "version": null,
                    "reason": e.to_string(),
                }),
            })
            .collect::<Vec<_>>()
    })
    .await
    .map_err(|_| ApiError::internal("Listing the runtimes failed."))?;
    let p = &config.policy;
    Ok(Json(json!({
        "runtimes": list,
        "limits": {"default": p.defaults, "maximum": p.max},
        "policy": p,
    })))
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

async fn read_body(body: Body, headers: &HeaderMap, limit: usize) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    match Limited::new(body, limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(ApiError::too_large(limit)),
        Err(e) => Err(ApiError::invalid(format!(
            "The request body could not be read: {e}."
        ))),
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

/// Holds a place in line until the run's blocking task ends.
struct Slot {
    _admission: OwnedSemaphorePermit,
    _running: OwnedSemaphorePermit,
    _entry: RunEntry,
}

async fn execute(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    // Admission before the body is read: an overloaded server must not buffer bodies it
    // will refuse anyway.
    let admission = s.admission.clone().try_acquire_owned().map_err(|_| {
        ApiError::rate_limited(format!(
            "The server is at capacity ({} executions running, {} waiting). Retry shortly.",
            s.max_concurrent, s.max_queue
        ))
    })?;
    let bytes = read_body(body, &headers, s.max_body_bytes).await?;
    let req = parse_body(&bytes)?;
    drop(bytes);
    body::precheck(&s.engine.config().policy, &req)?;
    let running = s
        .running
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| ApiError::unavailable("The server is shutting down."))?;
    let ks = KillSwitch::new().map_err(|e| {
        ApiError::unavailable(format!("The server cannot start a run right now ({e})."))
    })?;
    let slot = Slot {
        _admission: admission,
        _running: running,
        _entry: s.runs.register(ks.clone()),
    };
    let mut guard = CancelOnDrop(Some(ks.clone()));
    let engine = s.engine.clone();

    if wants_events(&headers) {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::task::spawn_blocking(move || {
            let _slot = slot;
            let mut sink = ChannelSink::new(tx);
            let verdict = engine.execute(&req, &mut sink, Some(&ks));
            sink.finish(verdict);
        });
        let events =
            futures_util::stream::unfold((rx, Some(guard)), |(mut rx, mut guard)| async move {
                // Once the result is out (guard disarmed and gone), the stream ends.
                guard.as_ref()?;
                let event = match rx.recv().await {
                    Some(Message::Output(stream, text)) => Event::default()
                        .event(match stream {
                            Stream::Stdout => "stdout",
                            Stream::Stderr => "stderr",
                        })
                        .data(json!({ "text": text }).to_string()),
                    Some(Message::Done(verdict)) => {
                        if let Some(mut g) = guard.take() {
                            g.disarm();
                        }
                        Event::default()
                            .event("result")
                            .data(serde_json::to_string(&verdict).unwrap_or_default())
                    }
                    None => {
                        guard = None;
                        Event::default().event("error").data(
                            ApiError::internal("The execution failed unexpectedly.")
                                .body()
                                .to_string(),
                        )
                    }
                };
                Some((Ok::<_, Infallible>(event), (rx, guard)))
            });
        let mut res = Sse::new(events)
            .keep_alive(KeepAlive::new().interval(s.keep_alive))
            .into_response();
        res.headers_mut()
            .insert("x-accel-buffering", HeaderValue::from_static("no"));
        return Ok(res);
    }

    let verdict = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        engine.execute(&req, &mut runcell_jail::NoSink, Some(&ks))
    })
    .await
    .map_err(|_| ApiError::internal("The execution failed unexpectedly."))?;
    guard.disarm();
    Ok(verdict_response(verdict))
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

/// Listen and serve until SIGTERM or SIGINT; then stop accepting, let running executions
/// finish within the grace period, kill the rest and return once their sandboxes are gone.
pub async fn serve(config: ServerConfig) -> Result<(), ServerError> {
    if config.max_concurrent == 0 {
        return Err(ServerError::Config(
            "max_concurrent must be at least 1".into(),
        ));
    }
    let state = AppState::new(&config);
    if !state.auth_enabled() {
        if !config.listen.ip().is_loopback() {
            return Err(ServerError::NoKeyOnPublicAddress(config.listen));
        }
        eprintln!(
            "runcell serve: WARNING: NO API KEY IS SET. Anyone who can reach {} can run code \
             on this host.\nruncell serve: WARNING: this is only allowed on loopback; set \
             RUNCELL_API_KEY for any other use.",
            config.listen
        );
    }
    let signals = signals()?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServerError::Bind {
            addr: config.listen,
            source,
        })?;
    let addr = listener.local_addr()?;
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
    let runs = state.runs().clone();
    let server = axum::serve(listener, app(state))
        .with_graceful_shutdown(signalled(signals.clone(), 1))
        .into_future();
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
        r = &mut server => r?,
        _ = grace_over => {
            let n = runs.kill_all();
            eprintln!("runcell serve: grace period over: killing {n} execution(s)");
            if tokio::time::timeout(Duration::from_secs(15), &mut server).await.is_err() {
                eprintln!("runcell serve: connections still open; closing them");
            }
        }
    }
    // Handlers wait for their runs, but a run whose client left is still being torn down.
    runs.kill_all();
    let deadline = Instant::now() + Duration::from_secs(15);
    while runs.active() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("runcell serve: stopped");
    Ok(())
}
