//! `/v1/sessions`: stateful sessions. A session is created with a language, limits, files and
//! an idle TTL; calls run in it with `POST /v1/sessions/{id}/execute` and keep the
//! interpreter's state; its /workspace can be listed, read and written; it ends on `DELETE`, on
//! expiry, or with the server. A session belongs to the API key that created it: any other key
//! gets 404. Every handler goes through the run service: a place in line before its body is
//! read, the intake's checks, a slot for anything that builds or runs a sandbox.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use runcell_core::{Call, SessionInfo, Source, Target, TargetKind, WorkspaceListing};
use serde::Serialize;

use super::execute::{answer, parse_request};
use crate::error::{ApiError, ErrorBody};
use crate::extract::{Requester, Reserved};
use crate::state::AppState;

/// The caller's live sessions.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct SessionList {
    sessions: Vec<SessionInfo>,
}

/// Create a session: its sandbox is built and its interpreter started before this answers.
#[utoipa::path(post, path = "/v1/sessions", tag = "sessions", operation_id = "create_session",
    request_body(content = crate::openapi::SessionRequest, description = "`language`, `files`, `ttl` (idle \
        seconds, default 600) and limits under their usual names: `timeout` is each call's \
        default (and the package install's), `memory`, `pids`, `disk`, `cpus` are the whole \
        session's; `network` and `packages`, within the server's policy, are the session's \
        for its whole life (its own egress proxy, its package layer installed now)."),
    responses(
        (status = 201, description = "The session", body = SessionInfo),
        (status = 400, description = "Invalid request", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 403, description = "An operator denied the session's network access", body = ErrorBody),
        (status = 429, description = "Too many live sessions for this key or in total", body = ErrorBody),
        (status = 500, description = "The sandbox could not be built", body = ErrorBody),
        (status = 504, description = "No operator approved the session's network access in time", body = ErrorBody),
    ))]
pub(crate) async fn create(
    State(state): State<AppState>,
    mut req: Reserved,
) -> Result<Response, ApiError> {
    let bytes = req.read_json(None).await?;
    let request = parse_request(&state, &bytes, TargetKind::CreateSession)?;
    drop(bytes);
    let call = Call::new(
        req.caller.clone(),
        Source::Api,
        Target::CreateSession,
        request,
    );
    let admitted = state.service().admit(req.ticket.clone(), call).await?;
    let info = admitted.create().await?;
    Ok((StatusCode::CREATED, Json(info)).into_response())
}

/// The caller's live sessions.
#[utoipa::path(get, path = "/v1/sessions", tag = "sessions", operation_id = "list_sessions",
    responses(
        (status = 200, description = "The caller's sessions", body = SessionList),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
    ))]
pub(crate) async fn list(
    State(state): State<AppState>,
    Requester(caller): Requester,
) -> Json<SessionList> {
    Json(SessionList {
        sessions: state.service().sessions_of(&caller),
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
    Requester(caller): Requester,
) -> Result<Json<SessionInfo>, ApiError> {
    Ok(Json(state.service().session(&caller, &id)?))
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
    Requester(caller): Requester,
) -> Result<StatusCode, ApiError> {
    state.service().delete_session(&caller, id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A fork's answer: the new session, as its creation answers, and what was copied.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct ForkedSession {
    #[serde(flatten)]
    session: SessionInfo,
    /// The session it was forked from.
    parent_id: String,
    /// What could not be copied: the names of globals (a generator, an open file, a lock, a
    /// thread...) and `/workspace/...` files past the caps. Never dropped silently.
    skipped: Vec<String>,
    /// The size of the interpreter state copied (pickled); 0 for a language whose state is
    /// not copied (every language but Python: its workspace only).
    state_bytes: u64,
    /// The workspace files copied.
    workspace_files: u64,
}

/// Fork a session: a new session of the same key and language, admitted like any new one
/// (the caps per key, the memory ledger), with a copy of the parent's /workspace and, for
/// Python, of its interpreter's globals (variables, functions, lambdas, closures, classes
/// and their instances, DataFrames; modules re-imported by name). Other languages' forks copy
/// the workspace only. The two sessions are independent from then on.
#[utoipa::path(post, path = "/v1/sessions/{id}/fork", tag = "sessions",
    operation_id = "fork_session",
    params(("id" = String, Path, description = "The session's id")),
    responses(
        (status = 201, description = "The new session, with `parent_id`, `skipped`, `state_bytes` and `workspace_files`", body = ForkedSession),
        (status = 400, description = "The copy is not a valid creation (its files past the input caps)", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 403, description = "An operator denied the copy's network access", body = ErrorBody),
        (status = 404, description = "No such session for this key", body = ErrorBody),
        (status = 409, description = "The session is running a call, its interpreter is gone, \
            its state cannot be copied, or the caps on sessions leave no room for the copy", body = ErrorBody),
        (status = 429, description = "At capacity", body = ErrorBody),
        (status = 500, description = "The new sandbox could not be built", body = ErrorBody),
        (status = 503, description = "The server is draining or shutting down", body = ErrorBody),
        (status = 504, description = "No operator approved the copy's network access in time", body = ErrorBody),
    ))]
pub(crate) async fn fork(
    State(state): State<AppState>,
    Path(id): Path<String>,
    req: Reserved,
) -> Result<Response, ApiError> {
    let (session, source) = state
        .service()
        .fork_session(req.ticket.clone(), &req.caller, id.clone())
        .await?;
    let answer = ForkedSession {
        session,
        parent_id: id,
        skipped: source.skipped,
        state_bytes: source.state_bytes,
        workspace_files: source.workspace_files,
    };
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

/// Pause a session: its processes are frozen (the cgroup freezer), its memory and files are
/// kept, and it uses no CPU. Any call or file operation on it, or `resume`, runs it again.
/// While paused, the server's `paused_ttl` replaces its idle TTL.
#[utoipa::path(post, path = "/v1/sessions/{id}/pause", tag = "sessions",
    operation_id = "pause_session",
    params(("id" = String, Path, description = "The session's id")),
    responses(
        (status = 200, description = "The paused session (`state`: `paused`)", body = SessionInfo),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 404, description = "No such session for this key", body = ErrorBody),
        (status = 409, description = "The session is paused already, is running a call, or \
            cannot be paused on this host (no cgroup freezer)", body = ErrorBody),
    ))]
pub(crate) async fn pause(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Requester(caller): Requester,
) -> Result<Json<SessionInfo>, ApiError> {
    Ok(Json(state.service().pause_session(&caller, id).await?))
}

/// Resume a paused session: its processes run again, and its idle TTL counts from now. A
/// session that is running already is answered as it is (200, nothing done).
#[utoipa::path(post, path = "/v1/sessions/{id}/resume", tag = "sessions",
    operation_id = "resume_session",
    params(("id" = String, Path, description = "The session's id")),
    responses(
        (status = 200, description = "The session (`state`: `running`)", body = SessionInfo),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 404, description = "No such session for this key", body = ErrorBody),
    ))]
pub(crate) async fn resume(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Requester(caller): Requester,
) -> Result<Json<SessionInfo>, ApiError> {
    let (info, _) = state.service().resume_session(&caller, id).await?;
    Ok(Json(info))
}

/// Run code in a session: the verdict of `/v1/execute`, plus `session_id`,
/// `execution_count` and `state_lost`, and the cell's displayed `results` and `exception`
/// (docs/results.md). With `Accept: text/event-stream`, events as for
/// `/v1/execute`.
#[utoipa::path(post, path = "/v1/sessions/{id}/execute", tag = "sessions",
    operation_id = "execute_in_session",
    params(("id" = String, Path, description = "The session's id")),
    request_body(content = crate::openapi::CellRequest, description = "`code`, `stdin`, `files`, and the call's \
        own `timeout` and `env` (for this call only)."),
    responses(
        (status = 200, description = "The verdict (JSON), or events as for /v1/execute",
            content((runcell_core::Verdict = "application/json"), (String = "text/event-stream"))),
        (status = 400, description = "Invalid request", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 404, description = "No such session for this key", body = ErrorBody),
        (status = 409, description = "The session is running another call", body = ErrorBody),
        (status = 429, description = "At capacity", body = ErrorBody),
    ))]
pub(crate) async fn execute(
    State(state): State<AppState>,
    Path(id): Path<String>,
    mut req: Reserved,
) -> Result<Response, ApiError> {
    let bytes = req.read_json(None).await?;
    let mut request = parse_request(&state, &bytes, TargetKind::Session)?;
    drop(bytes);
    // A call another server passed on from a door that knows its language (an MCP tool's):
    // checked against the session's as that door's local call would be.
    if let Some(language) = req
        .headers
        .get(crate::cluster::CALL_LANGUAGE_HEADER)
        .and_then(|v| v.to_str().ok())
    {
        request.language = Some(language.to_string());
    }
    let call = Call::new(
        req.caller.clone(),
        Source::Api,
        Target::Session(id),
        request,
    );
    // Checked (the session exists for this key, the call fits it) before anything waits or a
    // stream's 200 is sent.
    let admitted = state.service().admit(req.ticket.clone(), call).await?;
    answer(&state, &req.headers, admitted).await
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
    req: Reserved,
) -> Result<Json<WorkspaceListing>, ApiError> {
    Ok(Json(
        state
            .service()
            .list_files(&req.ticket, &req.caller, id)
            .await?,
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
    req: Reserved,
) -> Result<Response, ApiError> {
    let data = state
        .service()
        .read_file(&req.ticket, &req.caller, id, path.clone())
        .await?;
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
    mut req: Reserved,
) -> Result<StatusCode, ApiError> {
    // The session must exist for this key, and be free, before its body is read.
    state.service().check_session_idle(&req.caller, &id)?;
    let cap = state.engine().policy().max_input_file_bytes;
    let data = req
        .read(Some(usize::try_from(cap).unwrap_or(usize::MAX)))
        .await?;
    state
        .service()
        // (The body's own buffer, not a copy.)
        .write_file(&req.ticket, &req.caller, id, path, Vec::from(data))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/sessions/{id}/files/{dir}/{rest...}`: a file below a directory (the documented
/// route takes one segment, or the path with its slashes escaped as `%2F`).
pub(crate) async fn get_nested_file(
    state: State<AppState>,
    Path((id, dir, rest)): Path<(String, String, String)>,
    req: Reserved,
) -> Result<Response, ApiError> {
    get_file(state, Path((id, format!("{dir}/{rest}"))), req).await
}

/// `PUT` of a file below a directory (see [`get_nested_file`]).
pub(crate) async fn put_nested_file(
    state: State<AppState>,
    Path((id, dir, rest)): Path<(String, String, String)>,
    req: Reserved,
) -> Result<StatusCode, ApiError> {
    put_file(state, Path((id, format!("{dir}/{rest}"))), req).await
}
