//! What every handler shares: the run service (engine, sessions, admission, approvals), the
//! keys, metrics and the audit log, which the service reports to through [`Observe`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use runcell_core::{
    Caller, Engine, RunError, RunService, RunSummary, RuntimeStatus, ServiceConfig, Verdict,
};

use crate::audit::AuditLog;
use crate::auth::Keys;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::routes::ops::RuntimeInfo;
use crate::ServerConfig;

/// Shared by every handler.
#[derive(Clone)]
pub struct AppState {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) service: RunService,
    pub(crate) keys: Keys,
    pub(crate) max_body_bytes: usize,
    pub(crate) keep_alive: Duration,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) audit: Arc<AuditLog>,
    pub(crate) runtimes: tokio::sync::Mutex<Option<(Instant, Arc<Vec<RuntimeStatus>>)>>,
    /// Cancelled when the grace period is over: ends long-lived MCP streams.
    pub(crate) shutdown: runcell_mcp::CancellationToken,
    /// The agent loop's model, when configured.
    pub(crate) agent: Option<crate::AgentSettings>,
    /// Keys that may approve runs waiting for network.
    pub(crate) admin_keys: std::collections::HashSet<String>,
    /// The E2B door's sandboxes (each a session of the run service).
    pub(crate) e2b: crate::e2b::Registry,
    /// Whether the server takes traffic (`/readyz`).
    pub(crate) readiness: crate::cluster::Readiness,
}

/// The run service's observer here: every refusal and every verdict is counted in the
/// metrics and written to the audit log.
pub struct Observe {
    pub metrics: Arc<Metrics>,
    pub audit: Arc<AuditLog>,
}

impl runcell_core::Observer for Observe {
    fn refused(&self, caller: &Caller, run: &RunSummary, error: &RunError) {
        self.metrics.rejected(error.category());
        // A refusal before anything of the request was read (a full line) has no request to
        // describe: it is counted, not audited.
        if !run.language.is_empty() {
            self.audit.record(caller, run, Err(error.category()), 0.0);
        }
    }

    fn finished(&self, caller: &Caller, run: &RunSummary, verdict: &Verdict, seconds: f64) {
        self.metrics.executed(caller.interface, verdict, seconds);
        self.audit.record(caller, run, Ok(verdict), seconds);
        if let Some(net) = &verdict.network {
            self.metrics.network(net);
            self.audit.network(caller, net);
        }
    }

    fn session_event(
        &self,
        caller: &Caller,
        event: &'static str,
        session: &str,
        parent: Option<&str>,
    ) {
        self.audit.session_event(caller, event, session, parent);
    }
}

impl AppState {
    pub fn new(config: &ServerConfig, audit: AuditLog) -> AppState {
        let max_concurrent = config.max_concurrent.clamp(1, MAX_SLOTS);
        let max_queue = config.max_queue.min(MAX_SLOTS);
        let mut engine = Engine::new(config.engine.clone());
        engine.start_pool(&config.pool, &config.preload);
        let metrics = Arc::new({
            let mut m = Metrics::new(max_concurrent, max_queue);
            if let Some(c) = &config.commit {
                m.set_commit(c);
            }
            m
        });
        let audit = Arc::new(audit);
        // Keys share the server's capacity: its line, its body budget, what idle sessions
        // hold. Without keys there is one caller.
        let keys = config.api_keys.len().max(1);
        let mut sessions = config.sessions;
        sessions.keys = keys;
        let service = RunService::new(
            engine,
            ServiceConfig {
                admission: runcell_core::AdmissionPolicy {
                    max_concurrent,
                    max_queue,
                    max_body_bytes: config.max_body_bytes as u64,
                    keys,
                },
                sessions,
                memory_ledger: true,
                key_networks: config
                    .api_keys
                    .iter()
                    .filter_map(|k| Some((k.id.clone(), k.allow_net.clone()?)))
                    .collect::<HashMap<_, _>>(),
                ids: runcell_core::cluster::SessionIds::new(config.cluster.clone()),
            },
            Arc::new(Observe {
                metrics: metrics.clone(),
                audit: audit.clone(),
            }),
        );
        if let Some(cluster) = &config.cluster {
            service.set_remote(Arc::new(crate::cluster::PeerSessions::new(cluster.clone())));
        }
        AppState {
            inner: Arc::new(Inner {
                service,
                keys: Keys::new(&config.api_keys),
                admin_keys: config
                    .api_keys
                    .iter()
                    .filter(|k| k.admin)
                    .map(|k| k.id.clone())
                    .collect(),
                max_body_bytes: config.max_body_bytes,
                keep_alive: Duration::from_secs(1),
                metrics,
                audit,
                runtimes: tokio::sync::Mutex::new(None),
                shutdown: runcell_mcp::CancellationToken::new(),
                agent: config
                    .agent
                    .as_ref()
                    .and_then(crate::AgentSettings::from_settings),
                e2b: crate::e2b::Registry::default(),
                readiness: crate::cluster::Readiness::default(),
            }),
        }
    }

    pub fn service(&self) -> &RunService {
        &self.inner.service
    }

    pub fn runs(&self) -> &runcell_core::service::RunRegistry {
        self.inner.service.runs()
    }

    pub fn engine(&self) -> &Engine {
        self.inner.service.engine()
    }

    pub fn sessions(&self) -> &Arc<runcell_core::Sessions> {
        self.inner.service.sessions()
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

    /// The runtimes of this host. Finding a runtime and asking its version runs host
    /// programs, so the answer is kept for a minute, and found by one request at a time (the
    /// others wait for its answer).
    pub async fn runtime_statuses(&self) -> Result<Arc<Vec<RuntimeStatus>>, ApiError> {
        let mut cached = self.inner.runtimes.lock().await;
        if let Some((at, list)) = &*cached {
            if at.elapsed() < Duration::from_secs(60) {
                return Ok(list.clone());
            }
        }
        let engine = self.engine().clone();
        let list = tokio::task::spawn_blocking(move || engine.runtimes())
            .await
            .map_err(|_| ApiError::internal("Listing the runtimes failed."))?;
        let list = Arc::new(list);
        *cached = Some((Instant::now(), list.clone()));
        Ok(list)
    }

    /// The runtimes of this host, as the API describes them.
    pub async fn runtimes(&self) -> Result<Vec<RuntimeInfo>, ApiError> {
        let list = self.runtime_statuses().await?;
        Ok(list.iter().cloned().map(RuntimeInfo::from).collect())
    }
}

/// The most sandboxes or queued requests the server counts; far beyond anything a host can
/// run.
pub const MAX_SLOTS: usize = 1 << 20;
