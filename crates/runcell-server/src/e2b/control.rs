//! The control plane: create, connect, kill, set the timeout of, describe and list
//! sandboxes. Behind the server's API keys (`X-API-Key`, as the SDKs send it); a sandbox is
//! its owner's, and another key's sandbox does not exist (404).
//!
//! A sandbox is created as a Python session through the one intake (`Source::Api`, the
//! create-session target: `envVars` are its `env`, `timeout` its TTL, both checked there
//! against the policy) and the one run service (a place in line, a slot to build it,
//! audit, metrics). E2B's `timeout` is the sandbox's time to live from now; here it is the
//! session's idle TTL, restarted by every use and by `set_timeout`, and bounded by the
//! session policy (its maximum TTL and lifetime).

use std::collections::BTreeMap;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use runcell_core::{intake, Call, SessionInfo, Source, Target, TargetKind};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{E2bError, Sandbox, ENVD_VERSION, TEMPLATES};
use crate::extract::{Requester, Reserved};
use crate::state::AppState;

/// What a sandbox's metadata may hold.
pub const MAX_METADATA_ENTRIES: usize = 64;
pub const MAX_METADATA_KEY: usize = 256;
pub const MAX_METADATA_VALUE: usize = 1024;
/// E2B's default timeout, seconds.
pub const DEFAULT_TIMEOUT: u64 = 300;
/// The most sandboxes one page of a listing holds.
pub const MAX_PAGE: usize = 100;

/// `NewSandbox` (`POST /sandboxes`) and `NewSandboxV2` (`POST /v2/sandboxes`). Fields this
/// door does not serve are ignored, as E2B's own optional fields are: `secure` (the tokens
/// are always issued), `autoPause`, `mcp`. `allow_internet_access` opens nothing by itself
/// (older SDKs send `true` on every create): a sandbox reaches only the destinations its
/// `network.allowOut` names, within the operator's policy.
#[derive(Debug, Deserialize)]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(default)]
    pub timeout: Option<u64>,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    #[serde(default, rename = "envVars")]
    pub env_vars: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub network: Option<NetworkConfig>,
}

/// The session variable that keeps a Python cell's last value out of its stdout.
const PRINT_RESULT: &str = "RUNCELL_PRINT_RESULT";

/// The most `allowOut` entries a sandbox may name.
pub const MAX_ALLOW_OUT: usize = 64;

/// E2B's `SandboxNetworkConfig`, as far as runcell serves it. runcell denies every
/// destination by default, so `denyOut` is already in force (and E2B's allow entries win
/// over its deny entries anyway); what a sandbox may not reach from outside
/// (`allowPublicTraffic`, `maskRequestHost`) does not apply, since nothing reaches in.
/// Rules that rewrite traffic or route it elsewhere (`rules`, `egressProxy`) are refused,
/// never dropped: they would change what the sandbox's traffic is.
#[derive(Debug, Default, Deserialize)]
pub struct NetworkConfig {
    #[serde(default, rename = "allowOut")]
    pub allow_out: Option<Vec<String>>,
    #[serde(default, rename = "denyOut")]
    pub _deny_out: Option<Vec<String>>,
    #[serde(default)]
    pub rules: Option<serde_json::Value>,
    #[serde(default, rename = "egressProxy")]
    pub egress_proxy: Option<serde_json::Value>,
}

/// The destinations of runcell's request for `allowOut`: host names, `*.domain` wildcards and
/// addresses (a CIDR block of one address is that address); every port. The intake checks
/// each against the operator's policy (and the key's), and the run service asks for approval
/// where the policy says so.
fn destinations(network: Option<&NetworkConfig>) -> Result<Vec<String>, E2bError> {
    let Some(n) = network else {
        return Ok(Vec::new());
    };
    let is_set = |v: &Option<serde_json::Value>| {
        v.as_ref().is_some_and(|v| match v {
            serde_json::Value::Null => false,
            serde_json::Value::Array(a) => !a.is_empty(),
            serde_json::Value::Object(o) => !o.is_empty(),
            _ => true,
        })
    };
    if is_set(&n.rules) || is_set(&n.egress_proxy) {
        return Err(E2bError::invalid(
            "network.rules and network.egressProxy are not supported: runcell's egress proxy \
             lets a sandbox's connections through to the destinations its network.allowOut \
             names (within the operator's policy), unchanged.",
        ));
    }
    let allow = n.allow_out.as_deref().unwrap_or_default();
    if allow.len() > MAX_ALLOW_OUT {
        return Err(E2bError::invalid(format!(
            "network.allowOut has {} entries, above the maximum of {MAX_ALLOW_OUT}.",
            allow.len()
        )));
    }
    allow
        .iter()
        .map(|entry| {
            let e = entry.trim();
            let one = e
                .strip_suffix("/32")
                .filter(|a| a.parse::<std::net::Ipv4Addr>().is_ok())
                .or_else(|| {
                    e.strip_suffix("/128")
                        .filter(|a| a.parse::<std::net::Ipv6Addr>().is_ok())
                });
            match one {
                // An IPv6 address is given in brackets, so that a port is never read into it.
                Some(a) if a.contains(':') => Ok(format!("[{a}]")),
                Some(a) => Ok(a.to_string()),
                None if e.contains('/') => Err(E2bError::invalid(format!(
                    "network.allowOut entry {:?}: runcell does not open address blocks; name \
                     hosts (api.example.com, *.example.com) or single addresses, within the \
                     operator's policy.",
                    e.chars().take(64).collect::<String>()
                ))),
                None => Ok(e.to_string()),
            }
        })
        .collect()
}

/// `{"timeout": seconds}` (set_timeout, and the v1 connect).
#[derive(Debug, Default, Deserialize)]
pub struct TimeoutBody {
    #[serde(default)]
    pub timeout: Option<u64>,
}

/// The `Sandbox` answer of create and connect.
#[derive(Debug, Serialize)]
pub struct SandboxAnswer {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: &'static str,
    #[serde(rename = "envdVersion")]
    pub envd_version: &'static str,
    #[serde(rename = "envdAccessToken")]
    pub envd_access_token: String,
    #[serde(rename = "trafficAccessToken")]
    pub traffic_access_token: String,
    pub alias: String,
}

/// `SandboxDetail` and `ListedSandbox`.
#[derive(Debug, Serialize)]
pub struct SandboxDetail {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: &'static str,
    pub alias: String,
    #[serde(rename = "startedAt")]
    pub started_at: String,
    #[serde(rename = "endAt")]
    pub end_at: String,
    #[serde(rename = "envdVersion")]
    pub envd_version: &'static str,
    #[serde(rename = "cpuCount")]
    pub cpu_count: u64,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    pub state: &'static str,
    pub metadata: BTreeMap<String, String>,
    #[serde(rename = "envdAccessToken", skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
}

fn answer(s: &Sandbox) -> SandboxAnswer {
    SandboxAnswer {
        template_id: s.template.clone(),
        sandbox_id: s.id.clone(),
        client_id: "runcell",
        envd_version: ENVD_VERSION,
        envd_access_token: s.envd_token().to_string(),
        traffic_access_token: s.traffic_token().to_string(),
        alias: s.template.clone(),
    }
}

fn detail(s: &Sandbox, info: &SessionInfo, with_token: bool) -> SandboxDetail {
    const MB: u64 = 1 << 20;
    SandboxDetail {
        template_id: s.template.clone(),
        sandbox_id: s.id.clone(),
        client_id: "runcell",
        alias: s.template.clone(),
        started_at: info.created_at.clone(),
        end_at: info.expires_at.clone(),
        envd_version: ENVD_VERSION,
        cpu_count: info.limits.cpus.0.div_ceil(1000).max(1),
        memory_mb: info.limits.memory.0 / MB,
        disk_size_mb: info.limits.disk.0 / MB,
        state: match info.state {
            runcell_core::SessionState::Paused => "paused",
            runcell_core::SessionState::Running => "running",
        },
        metadata: s.metadata.clone(),
        envd_access_token: with_token.then(|| s.envd_token().to_string()),
    }
}

fn check_metadata(m: &BTreeMap<String, String>) -> Result<(), E2bError> {
    if m.len() > MAX_METADATA_ENTRIES {
        return Err(E2bError::invalid(format!(
            "metadata has {} entries, above the maximum of {MAX_METADATA_ENTRIES}.",
            m.len()
        )));
    }
    if let Some((k, v)) = m
        .iter()
        .find(|(k, v)| k.len() > MAX_METADATA_KEY || v.len() > MAX_METADATA_VALUE)
    {
        return Err(E2bError::invalid(format!(
            "metadata {:?} is too long: keys may have {MAX_METADATA_KEY} bytes and values \
             {MAX_METADATA_VALUE} ({} and {} here).",
            k.chars().take(64).collect::<String>(),
            k.len(),
            v.len()
        )));
    }
    Ok(())
}

fn parse<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, E2bError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return serde_json::from_slice(b"{}").map_err(|e| E2bError::invalid(e.to_string()));
    }
    serde_json::from_slice(bytes)
        .map_err(|e| E2bError::invalid(format!("Invalid request body: {e}.")))
}

/// The sessions of sandboxes that ended are forgotten.
fn prune(state: &AppState) {
    let sessions = state.sessions().clone();
    state
        .inner
        .e2b
        .prune(|s| sessions.get(s.owner.as_deref(), &s.session).is_ok());
}

/// `POST /sandboxes`, `POST /v2/sandboxes`: 201 and the sandbox, once its interpreter runs.
pub async fn create(
    State(state): State<AppState>,
    mut req: Reserved,
) -> Result<Response, E2bError> {
    req.caller.interface = "e2b";
    let bytes = req.read_json(None).await?;
    let new: NewSandbox = parse(&bytes)?;
    drop(bytes);
    if !TEMPLATES.contains(&new.template_id.as_str()) {
        return Err(E2bError::invalid(format!(
            "Template {:?} is not available here: runcell serves {} (both a Python sandbox); \
             custom templates are not supported.",
            new.template_id.chars().take(64).collect::<String>(),
            TEMPLATES.join(" and ")
        )));
    }
    let metadata = new.metadata.unwrap_or_default();
    check_metadata(&metadata)?;
    let allow = destinations(new.network.as_ref())?;
    // A notebook's behaviour: a cell's last value is its result, not also printed to stdout
    // (`run_code("x + 1")` has `text == "2"` and no logs), as E2B's code interpreter does.
    let mut env = new.env_vars.unwrap_or_default();
    env.entry(PRINT_RESULT.to_string())
        .or_insert_with(|| "0".to_string());
    prune(&state);
    // The one request, as the HTTP API would send it: the intake checks the environment's
    // names and sizes, the TTL and the destinations against the policy.
    let mut body = json!({
        "language": "python",
        "ttl": new.timeout.unwrap_or(DEFAULT_TIMEOUT),
        "env": env,
    });
    if !allow.is_empty() {
        body["network"] = json!({ "allow": allow });
    }
    let request = intake::parse_value(
        body,
        Source::Api,
        TargetKind::CreateSession,
        state.service().offers(),
    )
    .inspect_err(|e| state.inner.metrics.rejected(e.category()))?;
    let (Some(envd), Some(traffic)) = (super::new_token(), super::new_token()) else {
        return Err(E2bError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "No random token could be made.",
        ));
    };
    let call = Call::new(
        req.caller.clone(),
        Source::Api,
        Target::CreateSession,
        request,
    );
    let info = state
        .service()
        .admit(req.ticket.clone(), call)
        .await?
        .create()
        .await?;
    let sandbox = Sandbox::new(
        info.id.clone(),
        req.caller.key_id.clone(),
        new.template_id,
        metadata,
        &envd,
        &traffic,
    );
    let sandbox = match state.inner.e2b.insert(sandbox) {
        Ok(s) => s,
        Err(e) => {
            let _ = state.service().delete_session(&req.caller, info.id).await;
            return Err(e);
        }
    };
    Ok((StatusCode::CREATED, Json(answer(&sandbox))).into_response())
}

/// The caller's sandbox `id`, with its session's description.
fn owned(
    state: &AppState,
    caller: &runcell_core::Caller,
    id: &str,
) -> Result<(std::sync::Arc<Sandbox>, SessionInfo), E2bError> {
    let s = state
        .inner
        .e2b
        .get(caller.key_id.as_deref(), id)
        .ok_or_else(|| super::missing(state, id, E2bError::not_found(id)))?;
    match state.service().session(caller, &s.session) {
        Ok(info) => Ok((s, info)),
        Err(_) => {
            state.inner.e2b.remove(&s.id);
            Err(E2bError::not_found(id))
        }
    }
}

/// The caller's sandbox `id`, its TTL restarted at the body's `{"timeout": seconds}` when
/// there is one (`required`: set_timeout's body must have it).
async fn with_timeout(
    state: &AppState,
    req: &mut Reserved,
    id: &str,
    required: bool,
) -> Result<(std::sync::Arc<Sandbox>, SessionInfo), E2bError> {
    let bytes = req.read_json(Some(4096)).await?;
    let body: TimeoutBody = parse(&bytes)?;
    if required && body.timeout.is_none() {
        return Err(E2bError::invalid("Send {\"timeout\": <seconds>}."));
    }
    let found = owned(state, &req.caller, id)?;
    if let Some(t) = body.timeout {
        state
            .service()
            .set_session_ttl(&req.caller, &found.0.session, Some(t as f64))?;
    }
    Ok(found)
}

/// `POST [/v2]/sandboxes/{id}/connect`: the sandbox's answer again, 200 when it was running,
/// 201 when it was paused and this resumed it (as E2B's control plane answers). A `timeout`,
/// when sent, restarts its TTL.
pub async fn connect(
    State(state): State<AppState>,
    Path(id): Path<String>,
    mut req: Reserved,
) -> Result<Response, E2bError> {
    req.caller.interface = "e2b";
    let (s, info) = owned(&state, &req.caller, &id)?;
    let status = resume_if_paused(&state, &req.caller, &s, &info).await?;
    with_timeout(&state, &mut req, &id, false).await?;
    Ok((status, Json(answer(&s))).into_response())
}

/// Resume the sandbox's session when it is paused: 201 then, 200 when it was running.
async fn resume_if_paused(
    state: &AppState,
    caller: &runcell_core::Caller,
    s: &Sandbox,
    info: &SessionInfo,
) -> Result<StatusCode, E2bError> {
    if info.state != runcell_core::SessionState::Paused {
        return Ok(StatusCode::OK);
    }
    let (_, resumed) = state
        .service()
        .resume_session(caller, s.session.clone())
        .await?;
    Ok(match resumed {
        runcell_core::Resumed::Thawed => StatusCode::CREATED,
        runcell_core::Resumed::AlreadyRunning => StatusCode::OK,
    })
}

/// `{"timeout": seconds, "count": n}` (fork).
#[derive(Debug, Default, Deserialize)]
pub struct ForkBody {
    #[serde(default)]
    pub timeout: Option<u64>,
    #[serde(default)]
    pub count: Option<u64>,
}

/// The most forks one request may ask for (the SDK's own bound).
const MAX_FORKS: u64 = 20;

/// `POST /sandboxes/{id}/fork`: 201 with one result per fork asked for (`count`, default 1),
/// each `{"sandbox": <Sandbox>}` or `{"error": {"code", "message"}}`. Each fork is runcell's
/// session fork (a new session with a copy of the parent's workspace and interpreter state,
/// admitted like any new one); the parent runs on untouched. 404 when the parent is not the
/// caller's.
pub async fn fork(
    State(state): State<AppState>,
    Path(id): Path<String>,
    mut req: Reserved,
) -> Result<Response, E2bError> {
    req.caller.interface = "e2b";
    let bytes = req.read_json(Some(4096)).await?;
    let body: ForkBody = parse(&bytes)?;
    let count = body.count.unwrap_or(1);
    if !(1..=MAX_FORKS).contains(&count) {
        return Err(E2bError::invalid(format!(
            "count must be between 1 and {MAX_FORKS}."
        )));
    }
    let (parent, _) = owned(&state, &req.caller, &id)?;
    let mut results = Vec::new();
    for _ in 0..count {
        let forked = async {
            let (info, _) = state
                .service()
                .fork_session(req.ticket.clone(), &req.caller, parent.session.clone())
                .await?;
            let (Some(envd), Some(traffic)) = (super::new_token(), super::new_token()) else {
                let _ = state.service().delete_session(&req.caller, info.id).await;
                return Err(E2bError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "No random token could be made.",
                ));
            };
            if let Some(t) = body.timeout {
                state
                    .service()
                    .set_session_ttl(&req.caller, &info.id, Some(t as f64))?;
            }
            let sandbox = Sandbox::new(
                info.id.clone(),
                req.caller.key_id.clone(),
                parent.template.clone(),
                parent.metadata.clone(),
                &envd,
                &traffic,
            );
            match state.inner.e2b.insert(sandbox) {
                Ok(s) => Ok(s),
                Err(e) => {
                    let _ = state.service().delete_session(&req.caller, info.id).await;
                    Err(e)
                }
            }
        }
        .await;
        results.push(match forked {
            Ok(s) => json!({ "sandbox": answer(&s) }),
            Err(e) => json!({ "error": { "code": e.status.as_u16(), "message": e.message } }),
        });
    }
    Ok((StatusCode::CREATED, Json(results)).into_response())
}

/// `{"memory": bool, "requireHealthyGuest": bool}` (pause). A paused sandbox here always
/// keeps its memory (its processes are frozen), so `memory: false` pauses it the same way.
#[derive(Debug, Default, Deserialize)]
#[allow(dead_code)]
pub struct PauseBody {
    #[serde(default)]
    pub memory: Option<bool>,
    #[serde(default, rename = "requireHealthyGuest")]
    pub require_healthy_guest: Option<bool>,
}

/// `POST /sandboxes/{id}/pause`: 204, its processes frozen with their memory kept; 409 when
/// it is paused already (the SDK's `pause()` then says `False`).
pub async fn pause(
    State(state): State<AppState>,
    Path(id): Path<String>,
    mut req: Reserved,
) -> Result<StatusCode, E2bError> {
    req.caller.interface = "e2b";
    let bytes = req.read_json(Some(4096)).await?;
    let _body: PauseBody = parse(&bytes)?;
    let (s, _) = owned(&state, &req.caller, &id)?;
    state
        .service()
        .pause_session(&req.caller, s.session.clone())
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/resume` (`{"timeout": seconds, "autoPause": bool}`): 201 with the
/// sandbox's answer, its processes running again; a running sandbox is answered 201 too
/// (nothing to do). A `timeout` restarts its TTL.
pub async fn resume(
    State(state): State<AppState>,
    Path(id): Path<String>,
    mut req: Reserved,
) -> Result<Response, E2bError> {
    req.caller.interface = "e2b";
    let (s, _) = with_timeout(&state, &mut req, &id, false).await?;
    state
        .service()
        .resume_session(&req.caller, s.session.clone())
        .await?;
    Ok((StatusCode::CREATED, Json(answer(&s))).into_response())
}

/// `DELETE /sandboxes/{id}`: 204, its processes and sandbox gone; 404 if there is none.
pub async fn kill(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Requester(mut caller): Requester,
) -> Result<StatusCode, E2bError> {
    // Audited as this door's.
    caller.interface = "e2b";
    let s = state
        .inner
        .e2b
        .get(caller.key_id.as_deref(), &id)
        .ok_or_else(|| E2bError::not_found(&id))?;
    let r = state
        .service()
        .delete_session(&caller, s.session.clone())
        .await;
    state.inner.e2b.remove(&s.id);
    r.map_err(|_| E2bError::not_found(&id))?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/timeout`: the sandbox lives `timeout` seconds from now (204).
pub async fn set_timeout(
    State(state): State<AppState>,
    Path(id): Path<String>,
    mut req: Reserved,
) -> Result<StatusCode, E2bError> {
    with_timeout(&state, &mut req, &id, true).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /sandboxes/{id}`.
pub async fn info(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Requester(caller): Requester,
) -> Result<Json<SandboxDetail>, E2bError> {
    let (s, info) = owned(&state, &caller, &id)?;
    Ok(Json(detail(&s, &info, true)))
}

/// The listing's query (`GET /v2/sandboxes`).
#[derive(Debug, Default, Deserialize)]
pub struct ListQuery {
    #[serde(default)]
    pub limit: Option<usize>,
    #[serde(default, rename = "nextToken")]
    pub next_token: Option<String>,
    /// `k=v&k2=v2`: sandboxes whose metadata has all of them.
    #[serde(default)]
    pub metadata: Option<String>,
    /// `running,paused`: the states wanted (both when absent).
    #[serde(default)]
    pub state: Option<String>,
}

/// The caller's sandboxes that match, sorted by start then id, and the page after
/// `next_token`.
fn listing(
    state: &AppState,
    caller: &runcell_core::Caller,
    q: &ListQuery,
) -> (Vec<SandboxDetail>, Option<String>) {
    prune(state);
    // `running,paused` (form, not exploded): the states asked for; none asked, both.
    let states: Option<Vec<&str>> = q
        .state
        .as_deref()
        .map(|s| s.split(',').map(str::trim).collect());
    let wanted: Vec<(&str, &str)> = q
        .metadata
        .as_deref()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
        .collect();
    let mut all: Vec<SandboxDetail> = state
        .inner
        .e2b
        .of(caller.key_id.as_deref())
        .into_iter()
        .filter(|s| {
            wanted
                .iter()
                .all(|(k, v)| s.metadata.get(*k).is_some_and(|x| x == v))
        })
        .filter_map(|s| {
            let info = state.service().session(caller, &s.session).ok()?;
            Some(detail(&s, &info, false))
        })
        .filter(|d| states.as_ref().is_none_or(|w| w.contains(&d.state)))
        .collect();
    all.sort_by(|a, b| {
        (a.started_at.as_str(), a.sandbox_id.as_str())
            .cmp(&(b.started_at.as_str(), b.sandbox_id.as_str()))
    });
    if let Some(after) = &q.next_token {
        if let Some(i) = all.iter().position(|d| &d.sandbox_id == after) {
            all.drain(..=i);
        } else {
            all.clear();
        }
    }
    let limit = q.limit.unwrap_or(MAX_PAGE).clamp(1, MAX_PAGE);
    let next = (all.len() > limit).then(|| all[limit - 1].sandbox_id.clone());
    all.truncate(limit);
    (all, next)
}

/// `GET /v2/sandboxes`: a page, and `X-Next-Token` when there is another.
pub async fn list(
    State(state): State<AppState>,
    Requester(caller): Requester,
    Query(q): Query<ListQuery>,
) -> Response {
    let (page, next) = listing(&state, &caller, &q);
    let mut res = Json(page).into_response();
    if let Some(t) = next.and_then(|t| HeaderValue::from_str(&t).ok()) {
        res.headers_mut().insert("x-next-token", t);
    }
    res
}

/// `GET /sandboxes` (the older SDKs' list): every running sandbox of the caller.
pub async fn list_v1(State(state): State<AppState>, Requester(caller): Requester) -> Response {
    let q = ListQuery::default();
    Json(listing(&state, &caller, &q).0).into_response()
}

/// The control plane's errors as E2B answers them, `{"code": <status>, "message"}`: the
/// server's own error bodies (the key check's 401, a 429 from the line) are re-rendered.
pub async fn e2b_errors(res: Response) -> Response {
    let status = res.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return res;
    }
    let (parts, body) = res.into_parts();
    // Error bodies are small; anything else is passed on as it is.
    let Ok(bytes) = axum::body::to_bytes(body, 64 * 1024).await else {
        return E2bError::new(status, "The request failed.").into_response();
    };
    let message = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v.pointer("/error/message")?.as_str().map(str::to_string));
    match message {
        Some(m) => {
            let mut res = E2bError::new(status, m).into_response();
            if let Some(r) = parts.headers.get(axum::http::header::RETRY_AFTER) {
                res.headers_mut()
                    .insert(axum::http::header::RETRY_AFTER, r.clone());
            }
            if let Some(w) = parts.headers.get(axum::http::header::WWW_AUTHENTICATE) {
                res.headers_mut()
                    .insert(axum::http::header::WWW_AUTHENTICATE, w.clone());
            }
            res
        }
        None => Response::from_parts(parts, Body::from(bytes)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(v: serde_json::Value) -> NetworkConfig {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn allow_out_becomes_the_requests_destinations() {
        assert!(destinations(None).unwrap().is_empty());
        let d = destinations(Some(&net(json!({
            "allowOut": ["api.example.com", "*.pypi.org", "10.1.2.3/32", "::1/128", "8.8.8.8"],
            "denyOut": ["0.0.0.0/0"],
            "allowPublicTraffic": false,
            "rules": {},
        }))))
        .unwrap();
        assert_eq!(
            d,
            [
                "api.example.com",
                "*.pypi.org",
                "10.1.2.3",
                "[::1]",
                "8.8.8.8"
            ]
        );
    }

    #[test]
    fn what_would_open_more_or_change_traffic_is_refused() {
        for bad in [
            json!({ "allowOut": ["0.0.0.0/0"] }),
            json!({ "allowOut": ["10.0.0.0/8"] }),
            json!({ "rules": { "api.example.com": [{ "transform": {} }] } }),
            json!({ "egressProxy": { "url": "http://proxy" } }),
            json!({ "allowOut": vec!["a.example.com"; MAX_ALLOW_OUT + 1] }),
        ] {
            assert!(destinations(Some(&net(bad.clone()))).is_err(), "{bad}");
        }
    }

    /// `allow_internet_access` alone opens nothing: older SDKs send `true` on every create.
    #[test]
    fn allow_internet_access_alone_opens_nothing() {
        let new: NewSandbox = serde_json::from_value(json!({
            "templateID": "code-interpreter-v1",
            "allow_internet_access": true,
            "secure": true,
        }))
        .unwrap();
        assert!(destinations(new.network.as_ref()).unwrap().is_empty());
    }
}
