//! MCP over Streamable HTTP at `/mcp`: the same tools as `runcell mcp`, behind the same API
//! keys, and run through the same admission control (429 becomes an `isError` result that
//! says to retry), policy check, metrics and audit log as `POST /v1/execute`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{ALLOW, CONTENT_TYPE};
use axum::http::{Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any_service, MethodRouter};
use http_body_util::{BodyExt, Limited};
use runcell_mcp::{HttpEndpoint, HttpOptions};

use crate::extract::caller_of;
use crate::{ApiError, AppState};

/// The `/mcp` endpoint. Without API keys (loopback only) it accepts loopback `Host` names and
/// `Origin`s only, against DNS rebinding; with keys the key is the guard. Its tools are those
/// of this server's engine: its runtimes and its policy.
pub fn endpoint(state: &AppState) -> MethodRouter<AppState> {
    let max_body = state.inner.max_body_bytes;
    let mut options = if state.auth_enabled() {
        HttpOptions::keyed(max_body)
    } else {
        HttpOptions::loopback(max_body)
    };
    options.session_ids = state.sessions().ids().clone();
    let keys = state.inner.keys.len().max(1);
    let owners = SessionOwners::new(options.max_sessions, options.session_idle, keys);
    let mcp = HttpEndpoint::new(state.service().clone(), options, state.shutdown_token());
    any_service(mcp)
        .layer(middleware::map_response(json_error))
        .layer(middleware::from_fn_with_state(owners, owned_sessions))
        .layer(middleware::from_fn_with_state(state.clone(), buffered))
}

/// Session id → the id of the key that opened it (`None` without keys), and when it was last
/// used.
type Owners = HashMap<String, (Option<String>, Instant)>;

/// Which API key opened each MCP session (older protocol versions, which have sessions): a
/// session is its opener's. Another key that learns a session id can neither call in it nor
/// end it: its requests get the answer for an unknown session (404).
#[derive(Clone)]
struct SessionOwners {
    inner: Arc<Mutex<Owners>>,
    /// A bound on the entries: sessions beyond the cap are refused anyway.
    max: usize,
    /// An entry unused this long belongs to a session that has idled out.
    idle: Duration,
    /// Sessions the transport allows at once, and the keys that share them: one key opens at
    /// most its share (as of the line: half with two keys, all with one).
    sessions: usize,
    keys: usize,
    /// Numbers the placeholders of sessions being opened.
    opening: Arc<std::sync::atomic::AtomicU64>,
}

impl SessionOwners {
    fn new(max_sessions: usize, idle: Duration, keys: usize) -> SessionOwners {
        SessionOwners {
            inner: Arc::default(),
            max: max_sessions.saturating_mul(2).max(16),
            idle,
            sessions: max_sessions,
            keys,
            opening: Arc::default(),
        }
    }

    /// Whether `key` may open another session: within its share of the sessions. If so, a
    /// placeholder counts the session being opened until its answer (so that openings at
    /// once cannot pass the check together); its key is returned, to remove it then. (A
    /// session id comes from a header and cannot hold a newline: no id is a placeholder's.)
    fn may_open(&self, key: &Option<String>) -> Result<String, ApiError> {
        let mut map = self.lock();
        let live = |used: &Instant| used.elapsed() < self.idle;
        let mine = map
            .values()
            .filter(|(owner, used)| owner == key && live(used))
            .count();
        let others: std::collections::HashSet<&Option<String>> = map
            .values()
            .filter(|(owner, used)| owner != key && live(used))
            .map(|(owner, _)| owner)
            .collect();
        let share =
            runcell_core::session::owner_share(self.sessions as u64, self.keys, others.len());
        if mine as u64 >= share.max(1) {
            return Err(ApiError::rate_limited(format!(
                "This API key has {mine} MCP sessions open, its share of the server's {}; \
                 close one (DELETE /mcp) or let one idle out.",
                self.sessions
            )));
        }
        let n = self
            .opening
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let placeholder = format!("\nopening {n}");
        map.insert(placeholder.clone(), (key.clone(), Instant::now()));
        Ok(placeholder)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Owners> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A session being opened, counted by its placeholder until its answer, or until the
/// request is abandoned.
struct Opening {
    owners: SessionOwners,
    placeholder: String,
}

impl Drop for Opening {
    fn drop(&mut self) {
        self.owners.lock().remove(&self.placeholder);
    }
}

const SESSION_HEADER: &str = "mcp-session-id";

async fn owned_sessions(State(owners): State<SessionOwners>, req: Request, next: Next) -> Response {
    let key = req
        .extensions()
        .get::<crate::KeyId>()
        .and_then(|k| k.0.clone());
    let session = req
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let is_delete = req.method() == Method::DELETE;
    // An `initialize` without a session opens one (older protocol versions): within the
    // key's share of the sessions.
    let mut opening = None;
    if session.is_none() && req.extensions().get::<Initialize>().is_some() {
        match owners.may_open(&key) {
            Ok(placeholder) => {
                opening = Some(Opening {
                    owners: owners.clone(),
                    placeholder,
                })
            }
            Err(e) => return e.into_response(),
        }
    }
    if let Some(id) = &session {
        let mut map = owners.lock();
        match map.get_mut(id) {
            Some((owner, used)) if *owner == key => *used = Instant::now(),
            Some(_) => {
                drop(map);
                tracing::warn!("an MCP session was used with another key than its own");
                return ApiError::new(
                    StatusCode::NOT_FOUND,
                    "not_found",
                    "Session not found: start a new one with initialize.",
                )
                .into_response();
            }
            // Unknown here: rmcp answers for sessions it does not have either.
            None => {}
        }
    }
    let mut res = next.run(req).await;
    if is_delete && res.status() == StatusCode::ACCEPTED {
        // The session is ended: the official SDKs (Python, fastmcp) expect 200 or 204 and log
        // "Session termination failed: 202" for anything else.
        *res.status_mut() = StatusCode::NO_CONTENT;
    }
    drop(opening);
    let mut map = owners.lock();
    if let (Some(id), true) = (&session, is_delete) {
        if res.status().is_success() {
            map.remove(id);
        }
    }
    if let Some(id) = res
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
    {
        if session.is_none() {
            let idle = owners.idle;
            map.retain(|_, (_, used)| used.elapsed() < idle);
            if map.len() >= owners.max {
                // The oldest first: they are the likeliest to have ended.
                if let Some(oldest) = map
                    .iter()
                    .min_by_key(|(_, (_, used))| *used)
                    .map(|(k, _)| k.clone())
                {
                    map.remove(&oldest);
                }
            }
            map.insert(id.to_owned(), (key, Instant::now()));
        }
    }
    res
}

/// A JSON-RPC message is read here, not by rmcp: with the same deadline as a body of
/// `POST /v1/execute` (408), and within the server's budget for bodies being received (429),
/// so that bodies trickled in (or never finished) cannot pile up in memory. The caller (the
/// request id, the peer, the key's id) goes with the request to the MCP server, whose tool
/// calls the run service admits like any other run.
async fn buffered(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let (mut parts, body) = req.into_parts();
    let caller = caller_of(&parts, "mcp-http");
    parts.extensions.insert(caller.clone());
    if parts.method != Method::POST {
        return next.run(Request::from_parts(parts, body)).await;
    }
    let s = &state.inner;
    let ticket = state.service().reserve_bytes(&caller);
    let read = crate::extract::read_body(body, &parts.headers, s.max_body_bytes, &ticket)
        .await
        .and_then(|bytes| {
            // And what parsing it costs (rmcp parses a message, and a call's arguments, into
            // JSON values).
            ticket.take_parse_bytes(&bytes).map_err(ApiError::from)?;
            Ok(bytes)
        });
    match read {
        Ok(bytes) => {
            // The message is held (parsed, and a tool call's arguments) until its answer is
            // delivered, which for a call is an event stream that ends with the result: its
            // bytes stay counted until then.
            if let Some(hold) = parts.extensions.get::<runcell_core::Hold>() {
                hold.keep(&ticket);
            }
            if is_initialize(&bytes) {
                parts.extensions.insert(Initialize);
            }
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Err(e) => {
            s.metrics.rejected(e.category);
            e.into_response()
        }
    }
}

/// Marks a message that is an `initialize` request (it may open a session).
#[derive(Clone, Copy)]
struct Initialize;

/// Whether a JSON-RPC message is an `initialize` request: only its `method` is looked at.
fn is_initialize(bytes: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Peek {
        #[serde(default)]
        method: Option<String>,
    }
    serde_json::from_slice::<Peek>(bytes).is_ok_and(|p| p.method.as_deref() == Some("initialize"))
}

/// rmcp answers transport-level refusals (403 for a foreign `Host` or `Origin`, 406, 415,
/// 400 for a missing session, 404 for an expired one) in plain text. Give them the API's JSON
/// error shape here, keeping their status and their words, so that the server's catch-all
/// for non-JSON errors does not turn them into a generic 400.
async fn json_error(res: Response) -> Response {
    let status = res.status();
    let is_json = res
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return res;
    }
    let allow = res.headers().get(ALLOW).cloned();
    // These bodies are one line of text; anything longer is cut.
    let text = match Limited::new(res.into_body(), 4096).collect().await {
        Ok(c) => String::from_utf8_lossy(&c.to_bytes()).trim().to_string(),
        Err(_) => String::new(),
    };
    // The session cap (handshake-era clients) is a full server, not a failure: 429.
    if status.is_server_error() && text.contains(runcell_mcp::TOO_MANY_SESSIONS) {
        return ApiError::rate_limited(text).into_response();
    }
    // rmcp answers a body that is not JSON (or not JSON-RPC) with a 415; it is a 400.
    if status == StatusCode::UNSUPPORTED_MEDIA_TYPE && text.starts_with("fail to deserialize") {
        return ApiError::invalid(format!(
            "The request body is not a JSON-RPC message: {text}"
        ))
        .into_response();
    }
    let category = match status {
        StatusCode::BAD_REQUEST => "invalid_request",
        StatusCode::FORBIDDEN => "forbidden",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::NOT_ACCEPTABLE => "not_acceptable",
        StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        s if s.is_client_error() => "invalid_request",
        _ => "internal",
    };
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("Error").to_string()
    } else {
        text
    };
    let mut out = ApiError::new(status, category, message).into_response();
    if let Some(allow) = allow {
        out.headers_mut().insert(ALLOW, allow);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    #[test]
    fn a_key_opens_at_most_its_share_of_mcp_sessions() {
        let owners = SessionOwners::new(4, Duration::from_secs(600), 2);
        let a = Some("a".to_owned());
        let b = Some("b".to_owned());
        let open = |id: &str, key: &Option<String>| {
            owners
                .lock()
                .insert(id.to_owned(), (key.clone(), Instant::now()));
        };
        // Alone, a key may use what a second key's share leaves: 4 / min(2 keys, 0 + 2).
        open("a1", &a);
        let opening = owners.may_open(&a).unwrap();
        // A session being opened counts until its answer.
        assert!(owners.may_open(&a).is_err());
        owners.lock().remove(&opening);
        open("a2", &a);
        let refused = owners.may_open(&a).unwrap_err().into_response();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        // The other key still has its own share.
        let opening = owners.may_open(&b).unwrap();
        owners.lock().remove(&opening);
        open("b1", &b);
        open("b2", &b);
        assert!(owners.may_open(&b).is_err());
        // An idled-out session no longer counts.
        let Some(long_ago) = Instant::now().checked_sub(Duration::from_secs(601)) else {
            return; // a clock that young cannot express it
        };
        owners.lock().get_mut("a1").unwrap().1 = long_ago;
        assert!(owners.may_open(&a).is_ok());
    }

    #[tokio::test]
    async fn plain_text_refusals_become_json_with_their_status() {
        let res = (
            StatusCode::FORBIDDEN,
            "Forbidden: Host header is not allowed",
        )
            .into_response();
        let out = json_error(res).await;
        assert_eq!(out.status(), StatusCode::FORBIDDEN);
        let body = out.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["category"], "forbidden");
        assert_eq!(
            v["error"]["message"],
            "Forbidden: Host header is not allowed"
        );

        let ok = Response::new(Body::from("data: x\n\n"));
        assert_eq!(json_error(ok).await.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn malformed_json_rpc_is_400() {
        let res = (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "fail to deserialize request body recursion limit exceeded at line 1 column 128",
        )
            .into_response();
        let out = json_error(res).await;
        assert_eq!(out.status(), StatusCode::BAD_REQUEST);
        // A real 415 (a wrong Content-Type) stays one.
        let res = (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Unsupported Media Type: Content-Type must be application/json",
        )
            .into_response();
        assert_eq!(
            json_error(res).await.status(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE
        );
    }

    /// rmcp answers an `initialize` refused by the session cap as a 500; it is a full server.
    #[tokio::test]
    async fn the_session_cap_is_429_not_500() {
        let text = format!(
            "Encounter an error when create session: {}",
            runcell_mcp::transport::SessionError::TooMany(1024)
        );
        let res = (StatusCode::INTERNAL_SERVER_ERROR, text).into_response();
        let out = json_error(res).await;
        assert_eq!(out.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(out.headers()["retry-after"], "1");
        let body = out.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["category"], "rate_limited");
    }
}
