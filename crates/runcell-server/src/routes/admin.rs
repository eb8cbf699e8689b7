//! `GET /v1/admin/overview`: what the operator's console (`/console`) shows, in one call: the
//! runs whose sandboxes exist now, every live session with its owner, the last runs of the
//! audit log, the approval queue, the warm pool and the templates, and the counters. Needs an
//! admin key, like the approvals (a server without keys, on loopback only, lets any caller
//! see it). Nothing in it is code or output: runs are described by their code's digest.

use std::time::SystemTime;

use axum::extract::State;
use axum::Json;
use runcell_core::service::PendingRun;
use runcell_core::session::rfc3339;
use serde::Serialize;
use utoipa::ToSchema;

use crate::audit::RecentRun;
use crate::error::{ApiError, ErrorBody};
use crate::extract::Requester;
use crate::metrics::Totals;
use crate::state::AppState;

/// `GET /v1/admin/overview`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Overview {
    /// When this answer was made (RFC 3339, UTC).
    pub time: String,
    /// This server's version.
    pub version: String,
    /// The commit it was built from (`unknown` when not given at build time).
    pub commit: String,
    /// Runs whose sandboxes exist now, oldest first.
    pub runs: Vec<LiveRunInfo>,
    /// Every live session, whoever owns it, oldest first.
    pub sessions: Vec<SessionOverview>,
    /// The last runs the audit log recorded (at most 200), newest first.
    pub recent_runs: Vec<RecentRun>,
    /// Runs waiting for network approval, oldest first (as `GET /v1/approvals`).
    pub approvals: Vec<PendingRun>,
    /// The warm pool, per language it keeps sandboxes for.
    pub pool: Vec<PoolInfo>,
    /// The templates Python interpreters are forked from.
    pub templates: TemplatesInfo,
    pub metrics: MetricsSnapshot,
}

/// A run whose sandbox exists now.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LiveRunInfo {
    /// `one-shot` (a fresh sandbox), `session` (a call in a session) or `probe` (the
    /// server's own readiness check).
    pub kind: String,
    pub language: String,
    /// The API key's id (never the key); absent without keys and for a probe.
    pub key_id: Option<String>,
    pub request_id: String,
    /// The session a session call runs in (absent for a new session's first call).
    pub session_id: Option<String>,
    /// RFC 3339, UTC.
    pub started_at: String,
    pub elapsed_seconds: f64,
}

/// A live session and its owner.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SessionOverview {
    pub id: String,
    /// The id of the API key that owns it; absent without keys.
    pub key_id: Option<String>,
    pub language: String,
    /// `running` or `paused`.
    pub state: runcell_core::SessionState,
    /// A call is running now.
    pub busy: bool,
    /// RFC 3339, UTC.
    pub created_at: String,
    pub last_used_at: String,
    pub expires_at: String,
    pub execution_count: u64,
}

/// One language of the warm pool.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PoolInfo {
    /// The language (`any` for sandboxes of no language yet).
    pub language: String,
    /// Warm sandboxes wanted.
    pub target: usize,
    /// Warm sandboxes ready now.
    pub ready: usize,
    /// Requests that took a warm sandbox.
    pub hits: u64,
    /// Requests built cold (other limits, or an empty pool).
    pub misses: u64,
    /// Sandboxes built for the pool, the seconds that took in all, and the builds that failed.
    pub refills: u64,
    pub refill_seconds: f64,
    pub refill_failures: u64,
}

/// The templates (`runcell_templates{state}`, `runcell_template_*`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TemplatesInfo {
    /// Alive and serving forks.
    pub live: u64,
    /// Waiting to be tried again after a failure.
    pub failed: u64,
    pub starts: u64,
    pub start_failures: u64,
    pub forks: u64,
    pub fork_failures: u64,
    /// The mean time of a fork that succeeded; absent before the first.
    pub mean_fork_seconds: Option<f64>,
}

/// The server's counters and gauges now.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct MetricsSnapshot {
    /// `runcell_sandboxes_running`.
    pub sandboxes_running: usize,
    /// `runcell_queue_depth`.
    pub queue_depth: usize,
    /// `runcell_max_concurrent` and `runcell_max_queue`.
    pub max_concurrent: usize,
    pub max_queue: usize,
    /// `runcell_sessions`.
    pub sessions: usize,
    /// `runcell_sessions_created_total`, `..._expired_total`, `..._deleted_total`.
    pub sessions_created: u64,
    pub sessions_expired: u64,
    pub sessions_deleted: u64,
    /// Runs waiting for network approval now.
    pub approvals_waiting: usize,
    /// Bytes of the memory ledger held by running one-shot runs and live sessions.
    pub memory_held_bytes: u64,
    /// The counters since the server started.
    #[serde(flatten)]
    pub totals: Totals,
}

/// Everything the operator's console shows, in one call.
#[utoipa::path(get, path = "/v1/admin/overview", tag = "admin", operation_id = "admin_overview",
    responses(
        (status = 200, description = "Live runs, sessions with their owners, recent runs, the approval queue, the pool, the templates and the counters", body = Overview),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 403, description = "Not an admin key", body = ErrorBody),
    ))]
pub(crate) async fn overview(
    State(state): State<AppState>,
    Requester(caller): Requester,
) -> Result<Json<Overview>, ApiError> {
    super::approvals::require_admin(&state, &caller, "The operator's console")?;
    let now = SystemTime::now();
    let metrics = state.metrics();
    let runs = state
        .runs()
        .list()
        .into_iter()
        .map(|r| LiveRunInfo {
            kind: r.kind.as_str().to_string(),
            language: r.language.to_string(),
            key_id: r.key_id,
            request_id: r.request_id,
            session_id: r.session_id,
            started_at: rfc3339(r.started_at),
            elapsed_seconds: round_ms(r.started.elapsed().as_secs_f64()),
        })
        .collect();
    let sessions = state
        .sessions()
        .list_all()
        .into_iter()
        .map(|s| SessionOverview {
            id: s.info.id,
            key_id: s.owner,
            language: s.info.language,
            state: s.info.state,
            busy: s.info.busy,
            created_at: s.info.created_at,
            last_used_at: s.last_used_at,
            expires_at: s.info.expires_at,
            execution_count: s.info.execution_count,
        })
        .collect();
    let pool = state
        .engine()
        .pool_stats()
        .into_iter()
        .map(|p| PoolInfo {
            language: p.language.map_or("any", |l| l.name()).to_string(),
            target: p.target,
            ready: p.ready,
            hits: p.hits,
            misses: p.misses,
            refills: p.refills,
            refill_seconds: round_ms(p.refill_seconds),
            refill_failures: p.refill_failures,
        })
        .collect();
    let t = state.engine().templates().report();
    let templates = TemplatesInfo {
        live: t.now.live,
        failed: t.now.failed,
        starts: t.starts,
        start_failures: t.start_failures,
        forks: t.forks_ok,
        fork_failures: t.forks_failed,
        mean_fork_seconds: (t.forks_ok > 0).then(|| t.fork_seconds / t.forks_ok as f64),
    };
    let approvals = state.service().approvals().list();
    let admission = state.service().admission().stats();
    let session_stats = state.sessions().stats();
    let (max_concurrent, max_queue) = metrics.capacity();
    let (version, commit) = metrics.build();
    Ok(Json(Overview {
        time: rfc3339(now),
        version: version.to_string(),
        commit: commit.to_string(),
        metrics: MetricsSnapshot {
            sandboxes_running: state.runs().active(),
            queue_depth: admission.waiting,
            max_concurrent,
            max_queue,
            sessions: session_stats.live,
            sessions_created: session_stats.created,
            sessions_expired: session_stats.expired,
            sessions_deleted: session_stats.deleted,
            approvals_waiting: approvals.len(),
            memory_held_bytes: admission.memory,
            totals: metrics.totals_now(),
        },
        runs,
        sessions,
        recent_runs: state.inner.audit.recent(),
        approvals,
        pool,
        templates,
    }))
}

fn round_ms(seconds: f64) -> f64 {
    (seconds * 1000.0).round() / 1000.0
}
