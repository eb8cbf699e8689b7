//! What every handler shares: the engine, the keys, the admission semaphores, the registry of
//! running sandboxes, metrics and the audit log.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use runcell_core::{Engine, ExecRequest, KillSwitch};
use tokio::sync::Semaphore;

use crate::admission::{Admitted, Reservation};
use crate::audit::{AuditLog, Caller};
use crate::auth::Keys;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::routes::ops::RuntimeInfo;
use crate::ServerConfig;

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

    pub(crate) fn register(&self, ks: KillSwitch) -> RunEntry {
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
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) engine: Engine,
    pub(crate) keys: Keys,
    /// Running plus queued: beyond it, 429.
    pub(crate) admission: Arc<Semaphore>,
    /// Running.
    pub(crate) running: Arc<Semaphore>,
    pub(crate) max_concurrent: usize,
    pub(crate) max_queue: usize,
    pub(crate) max_body_bytes: usize,
    /// Bytes of MCP request bodies being received at once (their room in memory, like the
    /// bodies of `max_concurrent + max_queue` executions); beyond it, 429.
    pub(crate) body_budget: Arc<Semaphore>,
    pub(crate) runs: RunRegistry,
    pub(crate) keep_alive: Duration,
    pub(crate) metrics: Metrics,
    pub(crate) audit: AuditLog,
    pub(crate) runtimes: Mutex<Option<(Instant, Arc<Vec<RuntimeInfo>>)>>,
    /// Cancelled when the grace period is over: ends long-lived MCP streams.
    pub(crate) shutdown: runcell_mcp::CancellationToken,
    /// Live sessions.
    pub(crate) sessions: Arc<runcell_core::Sessions>,
    /// The agent loop's model, when configured.
    pub(crate) agent: Option<crate::AgentSettings>,
    /// Keys whose runs may ask only for these destinations (within the server's policy).
    pub(crate) key_networks: std::collections::HashMap<String, Vec<runcell_proxy::NetRule>>,
    /// Keys that may approve runs waiting for network.
    pub(crate) admin_keys: std::collections::HashSet<String>,
    /// Runs waiting for network approval.
    pub(crate) approvals: Arc<crate::approvals::Approvals>,
}

impl AppState {
    pub fn new(config: &ServerConfig, audit: AuditLog) -> AppState {
        let max_concurrent = config.max_concurrent.clamp(1, MAX_SLOTS);
        let max_queue = config.max_queue.min(MAX_SLOTS);
        let body_budget = (max_concurrent + max_queue)
            .max(1)
            .saturating_mul(config.max_body_bytes)
            .min(Semaphore::MAX_PERMITS);
        let mut engine = Engine::new(config.engine.clone());
        engine.start_pool(&config.pool, &config.preload);
        let sessions = runcell_core::Sessions::new(engine.clone(), config.sessions);
        AppState {
            inner: Arc::new(Inner {
                engine,
                keys: Keys::new(&config.api_keys),
                key_networks: config
                    .api_keys
                    .iter()
                    .filter_map(|k| Some((k.id.clone(), k.allow_net.clone()?)))
                    .collect(),
                admin_keys: config
                    .api_keys
                    .iter()
                    .filter(|k| k.admin)
                    .map(|k| k.id.clone())
                    .collect(),
                approvals: Arc::default(),
                admission: Arc::new(Semaphore::new(max_concurrent + max_queue)),
                running: Arc::new(Semaphore::new(max_concurrent)),
                max_concurrent,
                max_queue,
                max_body_bytes: config.max_body_bytes,
                body_budget: Arc::new(Semaphore::new(body_budget)),
                runs: RunRegistry::default(),
                keep_alive: Duration::from_secs(1),
                metrics: {
                    let mut m = Metrics::new(max_concurrent, max_queue);
                    if let Some(c) = &config.commit {
                        m.set_commit(c);
                    }
                    m
                },
                audit,
                runtimes: Mutex::new(None),
                shutdown: runcell_mcp::CancellationToken::new(),
                sessions,
                agent: config.agent.clone(),
            }),
        }
    }

    pub fn runs(&self) -> &RunRegistry {
        &self.inner.runs
    }

    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    pub fn sessions(&self) -> &Arc<runcell_core::Sessions> {
        &self.inner.sessions
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
    pub async fn admit(&self, req: ExecRequest, caller: Caller) -> Result<Admitted, ApiError> {
        self.reserve()?.admit(req, caller).await
    }

    /// The runtimes of this host. Finding a runtime and asking its version runs host
    /// programs, so the answer is kept for a minute.
    pub async fn runtimes(&self) -> Result<Arc<Vec<RuntimeInfo>>, ApiError> {
        if let Some((at, list)) = &*lock(&self.inner.runtimes) {
            if at.elapsed() < Duration::from_secs(60) {
                return Ok(list.clone());
            }
        }
        let engine = self.inner.engine.clone();
        let list = tokio::task::spawn_blocking(move || {
            engine
                .runtimes()
                .into_iter()
                .map(RuntimeInfo::from)
                .collect::<Vec<_>>()
        })
        .await
        .map_err(|_| ApiError::internal("Listing the runtimes failed."))?;
        let list = Arc::new(list);
        *lock(&self.inner.runtimes) = Some((Instant::now(), list.clone()));
        Ok(list)
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The most sandboxes or queued requests the server counts (a semaphore's limit is lower than
/// `usize::MAX`); far beyond anything a host can run.
pub const MAX_SLOTS: usize = 1 << 20;
