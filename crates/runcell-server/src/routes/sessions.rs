//! `/v1/sessions`: stateful sessions. A session is created with a language, limits, files and
//! an idle TTL; calls run in it with `POST /v1/sessions/{id}/execute` and keep the
//! interpreter's state; its /workspace can be listed, read and written; it ends on `DELETE`, on
//! expiry, or with the server. A session belongs to the API key that created it: any other key
//! gets 404.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use runcell_core::{
    CellRequest, ExecRequest, KillSwitch, NoSink, OutputSink, SessionError, SessionInfo,
    SessionRequest, SessionTarget, Verdict, WorkspaceListing,
};
use serde::Serialize;

use super::execute::{event_stream, parse_body, read_body, wants_events};
use crate::audit::{AuditRequest, Caller};
use crate::error::{ApiError, ErrorBody};
use crate::middleware::caller_of;
use crate::state::AppState;

impl From<SessionError> for ApiError {
    fn from(e: SessionError) -> Self {
        match e {
            SessionError::NotFound(_) => {
                ApiError::new(StatusCode::NOT_FOUND, "not_found", e.to_string())
            }
            SessionError::Busy => {
                ApiError::new(StatusCode::CONFLICT, "session_busy", e.to_string())
            }
            SessionError::Conflict(m) => ApiError::new(StatusCode::CONFLICT, "conflict", m),
            SessionError::Invalid(m) => ApiError::invalid(m),
            SessionError::TooMany(m) => ApiError::rate_limited(m),
            SessionError::ShuttingDown => ApiError::unavailable(e.to_string()),
            SessionError::Failed(v) => {
                let category = v.category().map_or("internal", |c| c.as_str());
                let message = v.error.map(|e| e.message).unwrap_or_default();
                match category {
                    "runtime_unavailable" | "invalid_request" => {
                        ApiError::new(StatusCode::BAD_REQUEST, category, message)
                    }
                    _ => ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "sandbox_failure",
                        message,
                    ),
                }
            }
        }
    }
}

/// The caller's key (the owner of its sessions); `None` without authentication.
fn owner(caller: &Caller) -> Option<String> {
    caller.key_id.clone()
}

/// Run blocking session work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, SessionError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|_| ApiError::internal("The session operation failed unexpectedly."))?
        .map_err(ApiError::from)
}

/// The caller's live sessions.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct SessionList {
    sessions: Vec<SessionInfo>,
}

/// Create a session: its sandbox is built and its interpreter started before this answers.
#[utoipa::path(post, path = "/v1/sessions", tag = "sessions", operation_id = "create_session",
    request_body(content = SessionRequest, description = "`language`, `files`, `ttl` (idle \
        seconds, default 600) and limits under their usual names: `timeout` is each call's \
        default, `memory`, `pids`, `disk`, `cpus` are the whole session's."),
    responses(
        (status = 201, description = "The session", body = SessionInfo),
        (status = 400, description = "Invalid request", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 429, description = "Too many live sessions for this key or in total", body = ErrorBody),
        (status = 500, description = "The sandbox could not be built", body = ErrorBody),
    ))]
pub(crate) async fn create(
    State(state): State<AppState>,
    req: Request,
) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let caller = caller_of(&parts, "http");
    let bytes = read_body(body, &parts.headers, state.inner.max_body_bytes, None).await?;
    let request: SessionRequest = parse_body(&bytes)?;
    let sessions = state.sessions().clone();
    let who = owner(&caller);
    let info = blocking(move || sessions.create(who.as_deref(), &request)).await?;
    Ok((StatusCode::CREATED, Json(info)).into_response())
}

/// The caller's live sessions.
#[utoipa::path(get, path = "/v1/sessions", tag = "sessions", operation_id = "list_sessions",
    responses(
        (status = 200, description = "The caller's sessions", body = SessionList),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
    ))]
pub(crate) async fn list(State(state): State<AppState>, req: Request) -> Json<SessionList> {
    let (parts, _) = req.into_parts();
    let who = owner(&caller_of(&parts, "http"));
    Json(SessionList {
        sessions: state.sessions().list(who.as_deref()),
    })
}

/// Describe a session.
#[utoipa::path(get, path = "/v1/sessions/{id}", tag = "sessions", operation_id = "get_session",
    params(("id" = String, Path, description = "The session's id")),
    responses(
        (status = 200, description = "The session", body = SessionInfo),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 404, description = "No such session for this key", body = ErrorBody),
    ))]
pub(crate) async fn get(
    State(state): State<AppState>,
    Path(id): Path<String>,
    req: Request,
) -> Result<Json<SessionInfo>, ApiError> {
    let (parts, _) = req.into_parts();
    let who = owner(&caller_of(&parts, "http"));
    Ok(Json(state.sessions().get(who.as_deref(), &id)?))
}

/// End a session: its processes and sandbox are gone (a running call is killed first).
#[utoipa::path(delete, path = "/v1/sessions/{id}", tag = "sessions",
    operation_id = "delete_session",
    params(("id" = String, Path, description = "The session's id")),
    responses(
        (status = 204, description = "Ended"),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 404, description = "No such session for this key", body = ErrorBody),
    ))]
pub(crate) async fn delete(
    State(state): State<AppState>,
    Path(id): Path<String>,
    req: Request,
) -> Result<StatusCode, ApiError> {
    let (parts, _) = req.into_parts();
    let who = owner(&caller_of(&parts, "http"));
    let sessions = state.sessions().clone();
    blocking(move || sessions.delete(who.as_deref(), &id)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Run code in a session: the verdict of `/v1/execute`, plus `session_id`,
/// `execution_count` and `state_lost`. With `Accept: text/event-stream`, events as for
/// `/v1/execute`.
#[utoipa::path(post, path = "/v1/sessions/{id}/execute", tag = "sessions",
    operation_id = "execute_in_session",
    params(("id" = String, Path, description = "The session's id")),
    request_body(content = CellRequest, description = "`code`, `stdin`, `files`, and the call's \
        own `timeout`."),
    responses(
        (status = 200, description = "The verdict (JSON), or events as for /v1/execute",
            content((Verdict = "application/json"), (String = "text/event-stream"))),
        (status = 400, description = "Invalid request", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 404, description = "No such session for this key", body = ErrorBody),
        (status = 409, description = "The session is running another call", body = ErrorBody),
        (status = 429, description = "At capacity", body = ErrorBody),
    ))]
pub(crate) async fn execute(
    State(state): State<AppState>,
    Path(id): Path<String>,
    req: Request,
) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let caller = caller_of(&parts, "http");
    let reservation = state.reserve()?;
    let bytes = read_body(body, &parts.headers, state.inner.max_body_bytes, None).await?;
    let cell: CellRequest =
        parse_body(&bytes).inspect_err(|e: &ApiError| state.inner.metrics.rejected(e.category))?;
    // The session must exist for this key before anything waits.
    let who = owner(&caller);
    let info = state.sessions().get(who.as_deref(), &id)?;
    let mut req = ExecRequest::new(info.language, cell.code);
    req.stdin = cell.stdin;
    req.files = cell.files;
    req.limits.timeout = cell.timeout;
    if wants_events(&parts.headers) {
        // A streamed answer could only say "invalid" in an event: the call is checked first
        // (off the async threads: it decodes the files), refused as `session_call` would.
        let cell = CellRequest {
            code: req.code.clone(),
            stdin: req.stdin.clone(),
            files: req.files.clone(),
            timeout: req.limits.timeout,
        };
        let sessions = state.sessions().clone();
        let id2 = id.clone();
        if let Err(e) = blocking(move || sessions.check_call(who.as_deref(), &id2, &cell)).await {
            state.inner.metrics.rejected(e.category);
            let mut audit = AuditRequest::from(&req);
            audit.session_id = Some(id);
            state
                .inner
                .audit
                .record(&caller, &audit, Err(e.category), 0.0);
            return Err(e);
        }
    }
    let target = SessionTarget::Id(id);
    if !wants_events(&parts.headers) {
        let v = session_call(state, reservation, caller, target, req, Box::new(NoSink)).await?;
        return Ok(Json(v).into_response());
    }
    Ok(event_stream(&state.clone(), move |sink| {
        Box::pin(session_call(state, reservation, caller, target, req, sink))
    }))
}

/// One call in a session (an HTTP call, or an MCP call with `session_id`), admitted like any
/// execution: it waits for a sandbox slot, runs on a blocking thread, is counted and audited
/// (with its session's id). Dropping the future interrupts the call; the session survives.
pub(crate) async fn session_call(
    state: AppState,
    reservation: crate::admission::Reservation,
    caller: Caller,
    target: SessionTarget,
    req: ExecRequest,
    sink: Box<dyn OutputSink + Send>,
) -> Result<Verdict, ApiError> {
    let s = &state.inner;
    if let Err(message) = runcell_core::session::offline_only(&req) {
        let e = ApiError::invalid(message);
        s.metrics.rejected(e.category);
        s.audit
            .record(&caller, &AuditRequest::from(&req), Err(e.category), 0.0);
        drop(reservation);
        return Err(e);
    }
    let started = Instant::now();
    let running = {
        let _queued = s.metrics.queued();
        s.running
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ApiError::unavailable("The server is shutting down."))?
    };
    let ks = KillSwitch::new()
        .map_err(|_| ApiError::unavailable("The server cannot start a run right now."))?;
    let entry = s.runs.register(ks.clone());
    let mut audit = AuditRequest::from(&req);
    if let SessionTarget::Id(id) = &target {
        audit.session_id = Some(id.clone());
    }
    let st = state.clone();
    let owner = owner(&caller);
    let finish = move |r: &Result<Verdict, SessionError>| {
        let seconds = started.elapsed().as_secs_f64();
        match r {
            Ok(v) => {
                audit.session_id = v.session_id.clone();
                st.inner.metrics.executed(caller.interface, v, seconds);
                st.inner.audit.record(&caller, &audit, Ok(v), seconds);
            }
            Err(e) => {
                let e = ApiError::from(e.clone());
                st.inner.metrics.rejected(e.category);
                st.inner
                    .audit
                    .record(&caller, &audit, Err(e.category), seconds);
            }
        }
    };
    s.sessions
        .run_request_blocking(
            owner,
            target,
            req,
            sink,
            ks,
            (reservation, running, entry),
            finish,
        )
        .await
        .map_err(ApiError::from)
}

/// The files of the session's /workspace (paths and sizes).
#[utoipa::path(get, path = "/v1/sessions/{id}/files", tag = "sessions",
    operation_id = "list_session_files",
    params(("id" = String, Path, description = "The session's id")),
    responses(
        (status = 200, description = "The files", body = WorkspaceListing),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 404, description = "No such session for this key", body = ErrorBody),
        (status = 409, description = "The session is running a call", body = ErrorBody),
    ))]
pub(crate) async fn list_files(
    State(state): State<AppState>,
    Path(id): Path<String>,
    req: Request,
) -> Result<Json<WorkspaceListing>, ApiError> {
    let (parts, _) = req.into_parts();
    let who = owner(&caller_of(&parts, "http"));
    let sessions = state.sessions().clone();
    Ok(Json(
        blocking(move || sessions.list_files(who.as_deref(), &id)).await?,
    ))
}

/// Download one file of the session's /workspace.
#[utoipa::path(get, path = "/v1/sessions/{id}/files/{path}", tag = "sessions",
    operation_id = "get_session_file",
    params(("id" = String, Path, description = "The session's id"),
        ("path" = String, Path, description = "The file's path relative to /workspace \
            (a path with directories may also be sent unescaped: a/b.csv)")),
    responses(
        (status = 200, description = "The file's bytes (Content-Type from its name)",
            content_type = "application/octet-stream", body = String),
        (status = 400, description = "Invalid path", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 404, description = "No such session for this key, or no such file", body = ErrorBody),
        (status = 409, description = "The session is running a call", body = ErrorBody),
    ))]
pub(crate) async fn get_file(
    State(state): State<AppState>,
    Path((id, path)): Path<(String, String)>,
    req: Request,
) -> Result<Response, ApiError> {
    let (parts, _) = req.into_parts();
    let who = owner(&caller_of(&parts, "http"));
    let sessions = state.sessions().clone();
    let p = path.clone();
    let data = blocking(move || sessions.read_file(who.as_deref(), &id, &p)).await?;
    let Some(data) = data else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!(
                "No file {:?} in the session's /workspace.",
                path.chars().take(200).collect::<String>()
            ),
        ));
    };
    let mime = runcell_core::files::mime_type(&path);
    let mut res = Bytes::from(data).into_response();
    if let Ok(v) = HeaderValue::from_str(&mime) {
        res.headers_mut().insert(CONTENT_TYPE, v);
    }
    Ok(res)
}

/// Upload one file into the session's /workspace (replacing what is at that path).
#[utoipa::path(put, path = "/v1/sessions/{id}/files/{path}", tag = "sessions",
    operation_id = "put_session_file",
    params(("id" = String, Path, description = "The session's id"),
        ("path" = String, Path, description = "The file's path relative to /workspace \
            (a path with directories may also be sent unescaped: a/b.csv)")),
    request_body(content = String, content_type = "application/octet-stream",
        description = "The file's bytes"),
    responses(
        (status = 204, description = "Written"),
        (status = 400, description = "Invalid path, too large, or no room", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 404, description = "No such session for this key", body = ErrorBody),
        (status = 409, description = "The session is running a call (`session_busy`), or a \
            directory is where the file would go (`conflict`)", body = ErrorBody),
        (status = 413, description = "Larger than a session file may be", body = ErrorBody),
    ))]
pub(crate) async fn put_file(
    State(state): State<AppState>,
    Path((id, path)): Path<(String, String)>,
    req: Request,
) -> Result<StatusCode, ApiError> {
    let (parts, body) = req.into_parts();
    let who = owner(&caller_of(&parts, "http"));
    let cap = state.engine().policy().max_input_file_bytes;
    let data = read_body(
        body,
        &parts.headers,
        usize::try_from(cap).unwrap_or(usize::MAX),
        None,
    )
    .await?;
    let sessions: Arc<runcell_core::Sessions> = state.sessions().clone();
    blocking(move || sessions.write_file(who.as_deref(), &id, &path, &data)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/sessions/{id}/files/{dir}/{rest...}`: a file below a directory (the documented
/// route takes one segment, or the path with its slashes escaped as `%2F`).
pub(crate) async fn get_nested_file(
    state: State<AppState>,
    Path((id, dir, rest)): Path<(String, String, String)>,
    req: Request,
) -> Result<Response, ApiError> {
    get_file(state, Path((id, format!("{dir}/{rest}"))), req).await
}

/// `PUT` of a file below a directory (see [`get_nested_file`]).
pub(crate) async fn put_nested_file(
    state: State<AppState>,
    Path((id, dir, rest)): Path<(String, String, String)>,
    req: Request,
) -> Result<StatusCode, ApiError> {
    put_file(state, Path((id, format!("{dir}/{rest}"))), req).await
}
