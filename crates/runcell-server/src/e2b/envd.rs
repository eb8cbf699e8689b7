//! The sandbox daemon's calls (E2B's "envd", port 49983): `/health`, the files of the
//! sandbox (`GET`/`POST /files`, `filesystem.Filesystem/*` in Connect JSON) and its processes
//! (`process.Process/*`). The files are the session's /workspace, named under `/home/user`;
//! every operation goes through the run service's file operations (a place in line, a slot,
//! the session's own checks).

use std::collections::BTreeMap;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use runcell_core::verdict::ErrorCategory;
use runcell_core::WorkspaceListing;
use runcell_core::{Stream, Verdict};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tracing::Instrument;

use super::access::SandboxRequest;
use super::connect::{Code, ConnectError};
use super::{home_path, workspace_path, E2bError, HOME};
use crate::state::AppState;

/// The sandbox path of the session's files (E2B's /home/user).
const WORKSPACE: &str = "/workspace";

/// The largest JSON a daemon call may send (its messages are a path or two).
pub const MAX_RPC_BODY: usize = 64 * 1024;

/// `GET /health`: 204 while the sandbox runs (its token checked: a sandbox that is gone
/// answers 502, which the SDKs read as "not running").
pub async fn health(_req: SandboxRequest) -> StatusCode {
    StatusCode::NO_CONTENT
}

/// `?path=...&username=...` of `/files`.
fn query_path(query: Option<&str>) -> Result<String, E2bError> {
    #[derive(Deserialize)]
    struct Q {
        path: Option<String>,
    }
    let q: Q = serde_urlencoded_like(query.unwrap_or(""))?;
    q.path
        .ok_or_else(|| E2bError::invalid("`path` is required."))
}

/// The query string as a struct, with axum's own query parser.
fn serde_urlencoded_like<T: serde::de::DeserializeOwned>(q: &str) -> Result<T, E2bError> {
    let uri: axum::http::Uri = format!("/?{q}")
        .parse()
        .map_err(|_| E2bError::invalid("The query string is not valid."))?;
    axum::extract::Query::<T>::try_from_uri(&uri)
        .map(|q| q.0)
        .map_err(|e| E2bError::invalid(format!("The query string is not valid: {e}.")))
}

fn rel_path(path: &str) -> Result<String, E2bError> {
    workspace_path(path).map_err(|e| E2bError::invalid(e.to_string()))
}

/// `GET /files?path=`: the file's bytes; 404 `{"code": 404, ...}` when there is none.
pub async fn read_file(
    State(state): State<AppState>,
    mut req: SandboxRequest,
) -> Result<Response, E2bError> {
    let rel = rel_path(&query_path(req.query.as_deref())?)?;
    let (ticket, _) = req.reserve_and_read(&state, 0, false).await?;
    let data = state
        .service()
        .read_file(
            &ticket,
            &req.caller,
            req.sandbox.session.clone(),
            rel.clone(),
        )
        .await?;
    let Some(data) = data else {
        return Err(E2bError::new(
            StatusCode::NOT_FOUND,
            format!("No file {:?}.", home_path(&rel)),
        ));
    };
    let mut res = axum::body::Bytes::from(data).into_response();
    res.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    Ok(res)
}

/// One part of a `multipart/form-data` body: its field name, file name and content.
#[derive(Debug, PartialEq, Eq)]
pub struct Part<'a> {
    pub name: Option<String>,
    pub filename: Option<String>,
    pub data: &'a [u8],
}

/// Why a multipart body could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MultipartError {
    #[error("the Content-Type is not multipart/form-data with a boundary")]
    NoBoundary,
    #[error("the body does not start with its boundary")]
    NoStart,
    #[error("a part has no end of headers")]
    NoHeaderEnd,
    #[error("a part has no closing boundary")]
    Unterminated,
    #[error("more than {0} parts")]
    TooManyParts(usize),
}

/// The most parts one upload may have.
pub const MAX_PARTS: usize = 64;

/// The boundary of a `multipart/form-data` content type (RFC 7578, at most 70 characters as
/// RFC 2046 says).
pub fn boundary(content_type: &str) -> Option<String> {
    let mut it = content_type.split(';');
    if !it
        .next()?
        .trim()
        .eq_ignore_ascii_case("multipart/form-data")
    {
        return None;
    }
    it.filter_map(|p| p.split_once('='))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("boundary"))
        .map(|(_, v)| v.trim().trim_matches('"').to_string())
        .filter(|b| !b.is_empty() && b.len() <= 70)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A parameter of a `Content-Disposition` header (`name`, `filename`), quoted or not.
fn disposition_param(header: &str, param: &str) -> Option<String> {
    header.split(';').skip(1).find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case(param)
            .then(|| v.trim().trim_matches('"').replace("\\\"", "\""))
    })
}

/// The parts of a `multipart/form-data` body, borrowed from it. Bounded: at most
/// [`MAX_PARTS`] parts; the body itself was read within the upload's cap.
pub fn multipart<'a>(body: &'a [u8], boundary: &str) -> Result<Vec<Part<'a>>, MultipartError> {
    let delim = format!("--{boundary}");
    let start = find(body, delim.as_bytes()).ok_or(MultipartError::NoStart)?;
    let mut rest = &body[start + delim.len()..];
    let next_delim = format!("\r\n--{boundary}");
    let mut parts = Vec::new();
    loop {
        if rest.starts_with(b"--") {
            return Ok(parts);
        }
        rest = rest
            .strip_prefix(b"\r\n")
            .ok_or(MultipartError::NoHeaderEnd)?;
        let h_end = find(rest, b"\r\n\r\n").ok_or(MultipartError::NoHeaderEnd)?;
        let headers = String::from_utf8_lossy(&rest[..h_end]);
        let content = &rest[h_end + 4..];
        let end = find(content, next_delim.as_bytes()).ok_or(MultipartError::Unterminated)?;
        if parts.len() >= MAX_PARTS {
            return Err(MultipartError::TooManyParts(MAX_PARTS));
        }
        let disposition = headers
            .split("\r\n")
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case("content-disposition")
                    .then(|| v.trim().to_string())
            })
            .unwrap_or_default();
        parts.push(Part {
            name: disposition_param(&disposition, "name"),
            filename: disposition_param(&disposition, "filename"),
            data: &content[..end],
        });
        rest = &content[end + next_delim.len()..];
    }
}

/// `POST /files?path=`: a multipart upload (field `file`; with several files each file name
/// is its path). Answers the written files, `[{"path", "name", "type": "file"}]`. Parent
/// directories are made; a file replaces what was at its path.
pub async fn write_file(
    State(state): State<AppState>,
    mut req: SandboxRequest,
) -> Result<Response, E2bError> {
    let asked = serde_urlencoded_like::<Value>(req.query.as_deref().unwrap_or(""))?;
    let asked = asked
        .get("path")
        .and_then(Value::as_str)
        .map(str::to_string);
    let ct = req
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let Some(b) = boundary(&ct) else {
        return Err(E2bError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Uploads are multipart/form-data here (this sandbox reports envd 0.4.0, so the \
             SDKs send them so).",
        ));
    };
    // The session must exist for the caller, and be free, before the body is read.
    state
        .service()
        .check_session_idle(&req.caller, &req.sandbox.session)?;
    let cap = usize::try_from(state.engine().policy().max_input_file_bytes)
        .unwrap_or(usize::MAX)
        // The multipart framing around the file.
        .saturating_add(64 * 1024);
    let (ticket, body) = req.reserve_and_read(&state, cap, false).await?;
    let parts = multipart(&body, &b).map_err(|e| E2bError::invalid(format!("{e}.")))?;
    let files: Vec<&Part> = parts
        .iter()
        .filter(|p| p.name.as_deref() == Some("file"))
        .collect();
    if files.is_empty() {
        return Err(E2bError::invalid("The upload has no `file` part."));
    }
    let mut written = Vec::new();
    for p in &files {
        // One file goes to `path`; several go to their file names.
        let path = match (&asked, files.len()) {
            (Some(a), 1) => a.clone(),
            _ => p
                .filename
                .clone()
                .ok_or_else(|| E2bError::invalid("A file part has no file name (its path)."))?,
        };
        let rel = rel_path(&path)?;
        if rel.is_empty() {
            return Err(E2bError::invalid(
                "A file cannot be written over /home/user itself.",
            ));
        }
        state
            .service()
            .write_file(
                &ticket,
                &req.caller,
                req.sandbox.session.clone(),
                rel.clone(),
                p.data.to_vec(),
            )
            .await?;
        let name = rel.rsplit('/').next().unwrap_or(&rel).to_string();
        written.push(json!({"path": home_path(&rel), "name": name, "type": "file"}));
    }
    Ok(Json(written).into_response())
}

/// A unary Connect error answer.
fn connect_error(e: &ConnectError) -> Response {
    (e.code.status(), Json(e.body())).into_response()
}

impl From<E2bError> for ConnectError {
    fn from(e: E2bError) -> ConnectError {
        let code = match e.status {
            StatusCode::NOT_FOUND => Code::NotFound,
            StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE => Code::InvalidArgument,
            StatusCode::UNAUTHORIZED => Code::Unauthenticated,
            StatusCode::TOO_MANY_REQUESTS => Code::ResourceExhausted,
            StatusCode::CONFLICT => Code::FailedPrecondition,
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::BAD_GATEWAY => Code::Unavailable,
            StatusCode::REQUEST_TIMEOUT => Code::DeadlineExceeded,
            _ => Code::Internal,
        };
        ConnectError::new(code, e.message)
    }
}

/// `{"path": ...}` and `{"path", "depth"}` (proto3 JSON: camelCase or snake_case).
#[derive(Debug, Deserialize)]
struct PathRequest {
    path: String,
    #[serde(default)]
    depth: Option<u32>,
}

/// An `EntryInfo` (proto3 JSON: int64 as a string, enums by name, defaults omitted).
fn entry(rel: &str, dir: bool, size: u64) -> Value {
    let name = rel.rsplit('/').next().unwrap_or(rel);
    let mut e = json!({
        "name": if rel.is_empty() { "user" } else { name },
        "type": if dir { "FILE_TYPE_DIRECTORY" } else { "FILE_TYPE_FILE" },
        "path": home_path(rel),
        "mode": if dir { 0o755 } else { 0o644 },
        "permissions": if dir { "drwxr-xr-x" } else { "-rw-r--r--" },
        "owner": "user",
        "group": "user",
    });
    if size > 0 {
        e["size"] = json!(size.to_string());
    }
    e
}

/// The entries below `dir` (a workspace path, `""` for the root) to `depth` levels, from a
/// listing of the workspace's files (directories are the ones files are in); `None` when
/// `dir` is not a directory.
pub fn list_dir(listing: &WorkspaceListing, dir: &str, depth: u32) -> Option<Vec<Value>> {
    let prefix = if dir.is_empty() {
        String::new()
    } else {
        format!("{dir}/")
    };
    let mut seen = std::collections::BTreeMap::<String, (bool, u64)>::new();
    let mut exists = dir.is_empty();
    for f in &listing.files {
        let Some(below) = f.path.strip_prefix(&prefix) else {
            continue;
        };
        exists = true;
        let segs: Vec<&str> = below.split('/').collect();
        for i in 0..segs.len().min(depth.max(1) as usize) {
            let path = format!("{prefix}{}", segs[..=i].join("/"));
            let is_dir = i + 1 < segs.len();
            seen.entry(path)
                .or_insert((is_dir, if is_dir { 0 } else { f.size }));
        }
    }
    exists.then(|| {
        seen.into_iter()
            .map(|(p, (d, s))| entry(&p, d, s))
            .collect()
    })
}

/// What a workspace path is: a file (its size), a directory, or nothing.
pub fn stat(listing: &WorkspaceListing, rel: &str) -> Option<Value> {
    if rel.is_empty() {
        return Some(entry("", true, 0));
    }
    let prefix = format!("{rel}/");
    for f in &listing.files {
        if f.path == rel {
            return Some(entry(rel, false, f.size));
        }
        if f.path.starts_with(&prefix) {
            return Some(entry(rel, true, 0));
        }
    }
    None
}

/// `POST /filesystem.Filesystem/{method}` (unary, JSON): `ListDir` and `Stat` from the
/// workspace's listing (directories are those that hold files); `MakeDir`, `Remove` and
/// `Move` as short shell programs in the sandbox, run like commands. Watching is not served
/// (`unimplemented`).
pub async fn filesystem(
    State(state): State<AppState>,
    Path(method): Path<String>,
    mut req: SandboxRequest,
) -> Response {
    let r = async {
        let (ticket, bytes) = req.reserve_and_read(&state, MAX_RPC_BODY, true).await?;
        let (caller, session) = (req.caller.clone(), req.sandbox.session.clone());
        let call = |what: &str| -> Result<PathRequest, ConnectError> {
            serde_json::from_slice(&bytes).map_err(|e| {
                ConnectError::new(
                    Code::InvalidArgument,
                    format!("Invalid {what} request: {e}."),
                )
            })
        };
        match method.as_str() {
            "ListDir" | "Stat" => {
                let p = call(&method)?;
                let rel = rel_path(&p.path)?;
                let listing = state
                    .service()
                    .list_files(&ticket, &req.caller, req.sandbox.session.clone())
                    .await
                    .map_err(E2bError::from)?;
                let not_found = || {
                    ConnectError::new(
                        Code::NotFound,
                        format!("No such path {:?}.", home_path(&rel)),
                    )
                };
                if method == "Stat" {
                    let e = stat(&listing, &rel).ok_or_else(not_found)?;
                    return Ok(json!({"entry": e}));
                }
                let entries =
                    list_dir(&listing, &rel, p.depth.unwrap_or(1)).ok_or_else(not_found)?;
                Ok(json!({"entries": entries}))
            }
            "MakeDir" | "Remove" => {
                let p = call(&method)?;
                let rel = rel_path(&p.path)?;
                if rel.is_empty() {
                    return Err(ConnectError::new(
                        Code::InvalidArgument,
                        format!("{HOME} itself cannot be made or removed."),
                    ));
                }
                let at = shell_quote(&format!("{WORKSPACE}/{rel}"));
                let script = if method == "MakeDir" {
                    format!("[ -e {at} ] || [ -L {at} ] && exit 17\nexec mkdir -p -- {at}\n")
                } else {
                    format!("[ -e {at} ] || [ -L {at} ] || exit 2\nexec rm -rf -- {at}\n")
                };
                match shell(&state, &caller, &session, ticket, script).await? {
                    0 => Ok(json!({})),
                    17 => Err(ConnectError::new(
                        Code::AlreadyExists,
                        format!("{:?} exists.", home_path(&rel)),
                    )),
                    2 => Err(ConnectError::new(
                        Code::NotFound,
                        format!("No such path {:?}.", home_path(&rel)),
                    )),
                    c => Err(ConnectError::new(
                        Code::Internal,
                        format!(
                            "{method} of {:?} failed (exit status {c}).",
                            home_path(&rel)
                        ),
                    )),
                }
            }
            "Move" => {
                #[derive(Deserialize)]
                struct MoveRequest {
                    source: String,
                    destination: String,
                }
                let m: MoveRequest = serde_json::from_slice(&bytes).map_err(|e| {
                    ConnectError::new(Code::InvalidArgument, format!("Invalid Move request: {e}."))
                })?;
                let (from, to) = (rel_path(&m.source)?, rel_path(&m.destination)?);
                if from.is_empty() || to.is_empty() {
                    return Err(ConnectError::new(
                        Code::InvalidArgument,
                        format!("{HOME} itself cannot be moved or replaced."),
                    ));
                }
                let (src, dst) = (
                    shell_quote(&format!("{WORKSPACE}/{from}")),
                    shell_quote(&format!("{WORKSPACE}/{to}")),
                );
                let script = format!(
                    "[ -e {src} ] || [ -L {src} ] || exit 2\nmkdir -p -- \"$(dirname -- {dst})\" \
                     && exec mv -T -- {src} {dst}\n"
                );
                match shell(&state, &caller, &session, ticket.clone(), script).await? {
                    0 => {}
                    2 => {
                        return Err(ConnectError::new(
                            Code::NotFound,
                            format!("No such path {:?}.", home_path(&from)),
                        ))
                    }
                    c => {
                        return Err(ConnectError::new(
                            Code::Internal,
                            format!("Move to {:?} failed (exit status {c}).", home_path(&to)),
                        ))
                    }
                }
                wait_free(&state, &caller, &session).await?;
                let listing = state
                    .service()
                    .list_files(&ticket, &caller, session.clone())
                    .await
                    .map_err(E2bError::from)?;
                let e = stat(&listing, &to).unwrap_or_else(|| entry(&to, true, 0));
                Ok(json!({ "entry": e }))
            }
            other => Err(ConnectError::new(
                Code::Unimplemented,
                format!(
                    "filesystem.Filesystem/{} is not served by runcell's E2B door.",
                    other.chars().take(64).collect::<String>()
                ),
            )),
        }
    }
    .await;
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => connect_error(&e),
    }
}

async fn wait_free(
    state: &AppState,
    caller: &runcell_core::Caller,
    session: &str,
) -> Result<(), ConnectError> {
    Ok(super::wait_until_free(state, caller, session).await?)
}

/// A shell program (`fields`: its code, and its timeout) as a call in the sandbox's session,
/// through the one intake: the door names the language, as a tool that knows it does, and
/// the shell runs as its own program beside the session's interpreter (see
/// `runcell_core::intake::merge_call`).
fn shell_call(
    state: &AppState,
    caller: &runcell_core::Caller,
    session: &str,
    fields: serde_json::Value,
) -> Result<runcell_core::Call, ConnectError> {
    let mut request = runcell_core::intake::parse_value(
        fields,
        runcell_core::Source::Api,
        runcell_core::TargetKind::Session,
        state.service().offers(),
    )
    .map_err(|e| ConnectError::from(E2bError::from(e)))?;
    request.language = Some("bash".into());
    Ok(runcell_core::Call::new(
        caller.clone(),
        runcell_core::Source::Api,
        runcell_core::Target::Session(session.to_string()),
        request,
    ))
}

/// Run a short shell program of the door's own (a directory operation) in the sandbox's
/// session, as a command is run (the one intake and run service, its place in line
/// `ticket`): its exit status.
async fn shell(
    state: &AppState,
    caller: &runcell_core::Caller,
    session: &str,
    ticket: runcell_core::Ticket,
    script: String,
) -> Result<i32, ConnectError> {
    let call = shell_call(state, caller, session, json!({ "code": script }))?;
    wait_free(state, caller, session).await?;
    let v = state
        .service()
        .admit(ticket, call)
        .await
        .map_err(|e| ConnectError::from(E2bError::from(e)))?
        .run(Box::new(runcell_core::NoSink))
        .await
        .map_err(|e| ConnectError::from(E2bError::from(e)))?;
    v.exit_code.ok_or_else(|| {
        ConnectError::new(
            Code::Internal,
            v.error
                .map(|e| e.message)
                .unwrap_or_else(|| "The operation did not finish.".into()),
        )
    })
}

/// `process.Process/Start`'s request (proto3 JSON).
#[derive(Debug, Deserialize)]
struct StartRequest {
    process: ProcessConfig,
    #[serde(default)]
    pty: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct ProcessConfig {
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
    #[serde(default)]
    cwd: Option<String>,
}

/// `{"process": {"pid": N}, "signal": ...}`.
#[derive(Debug, Deserialize)]
struct SignalRequest {
    process: Selector,
}

#[derive(Debug, Deserialize)]
struct Selector {
    pid: Option<u32>,
}

/// The most environment variables one command may set.
pub const MAX_COMMAND_ENVS: usize = 256;

/// A word quoted for bash: inside single quotes nothing is special but the quote itself.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The shell program that runs a command as E2B's daemon would: in its working directory
/// (under the sandbox's home, its /workspace), with its environment added, `exec`ing the
/// command's argv (E2B's SDKs send `/bin/bash -l -c <cmd>`).
pub fn command_script(
    cmd: &str,
    args: &[String],
    envs: &BTreeMap<String, String>,
    cwd: Option<&str>,
) -> Result<String, ConnectError> {
    let invalid = |m: String| ConnectError::new(Code::InvalidArgument, m);
    if envs.len() > MAX_COMMAND_ENVS {
        return Err(invalid(format!(
            "{} environment variables, above the maximum of {MAX_COMMAND_ENVS}.",
            envs.len()
        )));
    }
    let mut script = String::new();
    let dir = match cwd.filter(|c| !c.is_empty()) {
        Some(c) => workspace_path(c).map_err(|e| invalid(e.to_string()))?,
        None => String::new(),
    };
    // Through E2B's home, /home/user (a name of /workspace): the shell's working directory
    // is then /home/user as E2B's is (`pwd`, `$PWD`, and what the command's own shell says).
    let dir = if dir.is_empty() {
        super::HOME.to_string()
    } else {
        format!("{}/{dir}", super::HOME)
    };
    script.push_str(&format!("cd -- {} || exit 1\n", shell_quote(&dir)));
    for (k, v) in envs {
        let ok = !k.is_empty()
            && k.len() <= 256
            && k.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok || v.contains('\0') {
            return Err(invalid(format!(
                "Invalid environment variable {:?}: names are letters, digits and _, not \
                 starting with a digit; values have no NUL.",
                k.chars().take(64).collect::<String>()
            )));
        }
        script.push_str(&format!("export {k}={}\n", shell_quote(v)));
    }
    if cmd.is_empty() || cmd.contains('\0') || args.iter().any(|a| a.contains('\0')) {
        return Err(invalid("The command is empty or has a NUL byte.".into()));
    }
    script.push_str("exec");
    for w in std::iter::once(cmd).chain(args.iter().map(String::as_str)) {
        script.push(' ');
        script.push_str(&shell_quote(w));
    }
    script.push('\n');
    Ok(script)
}

/// A streamed answer: `application/connect+json` envelopes.
fn stream_response(body: Body) -> Response {
    let mut res = body.into_response();
    res.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static(super::connect::STREAM_JSON),
    );
    res
}

/// A stream that ends at once with an error.
fn stream_error(e: &ConnectError) -> Response {
    stream_response(Body::from(super::connect::end_stream(Some(e))))
}

/// Live output of a command, as raw bytes (the `data` events carry bytes, base64).
struct ChunkSink(mpsc::UnboundedSender<Event>);

impl runcell_core::OutputSink for ChunkSink {
    fn output(&mut self, stream: Stream, chunk: &[u8]) {
        let _ = self.0.send(Event::Output(stream, chunk.to_vec()));
    }
}

enum Event {
    Output(Stream, Vec<u8>),
    Done(Box<Result<Verdict, E2bError>>),
}

/// The `end` event of a command's verdict.
pub fn end_event(v: &Verdict) -> Value {
    let mut end = json!({"exited": true});
    let code = v.exit_code.unwrap_or(-1);
    if code != 0 {
        end["exitCode"] = json!(code);
    }
    end["status"] = json!(match v.exit_code {
        Some(c) => format!("exit status {c}"),
        None => "signal: killed".to_string(),
    });
    if let Some(e) = &v.error {
        if v.exit_code.is_none() || e.category != ErrorCategory::RuntimeError {
            end["error"] = json!(e.message);
        }
    }
    json!({"event": {"end": end}})
}

/// `process.Process/Start`: the command runs as its own program in the sandbox's session
/// (a call whose language is bash, through the one intake and run service: the session's
/// sandbox and environment, its /workspace), streamed: `start`, `data` as it writes, `end`,
/// then the end of the stream. `Connect-Timeout-Ms` is its timeout, within the policy.
async fn start(state: AppState, mut req: SandboxRequest) -> Response {
    let prepared = async {
        let (ticket, bytes) = req.reserve_and_read(&state, MAX_RPC_BODY, true).await?;
        let json = super::connect::read_request(&bytes, MAX_RPC_BODY)
            .map_err(|e| ConnectError::new(Code::InvalidArgument, format!("{e}.")))?;
        let start: StartRequest = serde_json::from_slice(json).map_err(|e| {
            ConnectError::new(
                Code::InvalidArgument,
                format!("Invalid Start request: {e}."),
            )
        })?;
        if start.pty.as_ref().is_some_and(|p| !p.is_null()) {
            return Err(ConnectError::new(
                Code::Unimplemented,
                "Terminals (pty) are not served by runcell's E2B door.",
            ));
        }
        let p = &start.process;
        let script = command_script(&p.cmd, &p.args, &p.envs, p.cwd.as_deref())?;
        let policy = state.engine().policy();
        let max_ms = policy.max.timeout.0;
        let mut fields = json!({ "code": script });
        if let Some(ms) = super::connect::timeout_ms(&req.headers).filter(|ms| *ms > 0) {
            fields["timeout"] = json!(ms.min(max_ms) as f64 / 1000.0);
        }
        let call = shell_call(&state, &req.caller, &req.sandbox.session, fields)?;
        super::wait_until_free(&state, &req.caller, &req.sandbox.session).await?;
        state
            .service()
            .admit(ticket, call)
            .await
            .map_err(|e| ConnectError::from(E2bError::from(e)))
    }
    .await;
    let admitted = match prepared {
        Ok(a) => a,
        Err(e) => return stream_error(&e),
    };
    let sandbox = req.sandbox.clone();
    let pid = sandbox
        .next_pid
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    lock(&sandbox.commands).insert(pid, admitted.kill_switch());
    // Gone from the table when the run ends, however it ends (an aborted stream too).
    let registered = Registered(sandbox.clone(), pid);
    let (tx, rx) = mpsc::unbounded_channel();
    let done = tx.clone();
    let task = tokio::spawn(
        async move {
            let r = admitted
                .run(Box::new(ChunkSink(tx)))
                .await
                .map_err(E2bError::from);
            drop(registered);
            let _ = done.send(Event::Done(Box::new(r)));
        }
        .in_current_span(),
    );
    let abort = crate::routes::execute::AbortOnDrop(task.abort_handle());
    let first = Bytes::from(super::connect::message(
        &json!({"event": {"start": {"pid": pid}}}),
    ));
    let frames = futures_util::stream::unfold(
        (rx, Some(abort), Some(first)),
        |(mut rx, abort, first)| async move {
            if let Some(f) = first {
                return Some((Ok::<_, std::convert::Infallible>(f), (rx, abort, None)));
            }
            abort.as_ref()?;
            let msg = match tokio::time::timeout(KEEPALIVE, rx.recv()).await {
                Err(_) => {
                    let k = super::connect::message(&json!({"event": {"keepalive": {}}}));
                    return Some((Ok(Bytes::from(k)), (rx, abort, None)));
                }
                Ok(m) => m,
            };
            let out = match msg {
                Some(Event::Output(stream, chunk)) => {
                    let key = match stream {
                        Stream::Stdout => "stdout",
                        Stream::Stderr => "stderr",
                    };
                    let data = base64::engine::general_purpose::STANDARD.encode(chunk);
                    let m = super::connect::message(&json!({"event": {"data": {key: data}}}));
                    return Some((Ok(Bytes::from(m)), (rx, abort, None)));
                }
                Some(Event::Done(r)) => match *r {
                    Ok(v) => {
                        let mut out = super::connect::message(&end_event(&v));
                        out.extend(super::connect::end_stream(None));
                        out
                    }
                    Err(e) => super::connect::end_stream(Some(&ConnectError::from(e))),
                },
                None => super::connect::end_stream(Some(&ConnectError::new(
                    Code::Internal,
                    "The command failed unexpectedly.",
                ))),
            };
            Some((Ok(Bytes::from(out)), (rx, None, None)))
        },
    );
    stream_response(Body::from_stream(frames))
}

/// A running command's entry in its sandbox's table, removed when dropped.
struct Registered(std::sync::Arc<super::Sandbox>, u32);

impl Drop for Registered {
    fn drop(&mut self) {
        lock(&self.0.commands).remove(&self.1);
    }
}

/// How long `SendSignal` waits for the command's run to end.
pub const KILL_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a stream may be silent before a keepalive event (which the SDKs ignore).
pub const KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(5);

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `POST /process.Process/{method}`: `Start` (streamed), `SendSignal` (any signal stops the
/// command: its run is killed), `List`. Terminals, stdin and reconnecting (`Connect`,
/// `SendInput`, `StreamInput`, `CloseStdin`, `Update`) are not served (`unimplemented`).
pub async fn process(
    State(state): State<AppState>,
    Path(method): Path<String>,
    mut req: SandboxRequest,
) -> Response {
    match method.as_str() {
        "Start" => return start(state, req).await,
        "SendSignal" | "List" => {}
        "Connect" => {
            return stream_error(&ConnectError::new(
                Code::Unimplemented,
                "Reconnecting to a command is not served by runcell's E2B door.",
            ))
        }
        other => {
            return connect_error(&ConnectError::new(
                Code::Unimplemented,
                format!(
                    "process.Process/{} is not served by runcell's E2B door.",
                    other.chars().take(64).collect::<String>()
                ),
            ))
        }
    }
    let r = async {
        let (_ticket, bytes) = req.reserve_and_read(&state, MAX_RPC_BODY, true).await?;
        if method == "List" {
            let pids: Vec<Value> = lock(&req.sandbox.commands)
                .keys()
                .map(|pid| json!({"pid": pid, "config": {"cmd": "/bin/bash"}}))
                .collect();
            return Ok(json!({ "processes": pids }));
        }
        let s: SignalRequest = serde_json::from_slice(&bytes).map_err(|e| {
            ConnectError::new(
                Code::InvalidArgument,
                format!("Invalid SendSignal request: {e}."),
            )
        })?;
        let found = s
            .process
            .pid
            .and_then(|pid| lock(&req.sandbox.commands).get(&pid).cloned());
        match found {
            Some(k) => {
                k.trigger();
                // Answered once the command's run is over (its entry goes when its verdict is
                // in): the SDK's next call then finds the session free. Bounded: a run that
                // takes longer to end is still ending when this answers.
                let pid = s.process.pid.unwrap_or_default();
                let deadline = tokio::time::Instant::now() + KILL_WAIT;
                while lock(&req.sandbox.commands).contains_key(&pid)
                    && tokio::time::Instant::now() < deadline
                {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                Ok(json!({}))
            }
            None => Err(ConnectError::new(Code::NotFound, "No such process.")),
        }
    }
    .await;
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => connect_error(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runcell_core::session::WorkspaceFile;

    #[test]
    fn multipart_bodies_are_read_and_hostile_ones_refused() {
        assert_eq!(
            boundary("multipart/form-data; boundary=\"abc\"").as_deref(),
            Some("abc")
        );
        assert_eq!(boundary("application/json"), None);
        assert_eq!(
            boundary(&format!("multipart/form-data; boundary={}", "x".repeat(71))),
            None
        );
        let body = b"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/home/user/a.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n\x00\x01\r\n\r\n--B--\r\n";
        let parts = multipart(body, "B").unwrap();
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].name.as_deref(), Some("file"));
        assert_eq!(parts[0].filename.as_deref(), Some("/home/user/a.bin"));
        assert_eq!(
            parts[0].data, b"\x00\x01\r\n",
            "a CRLF in the content is content"
        );
        assert_eq!(multipart(b"nothing", "B"), Err(MultipartError::NoStart));
        assert_eq!(
            multipart(
                b"--B\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nno end",
                "B"
            ),
            Err(MultipartError::Unterminated)
        );
        assert_eq!(
            multipart(b"--B\r\nno headers end", "B"),
            Err(MultipartError::NoHeaderEnd)
        );
        let mut many = Vec::new();
        for _ in 0..=MAX_PARTS {
            many.extend_from_slice(
                b"--B\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nx\r\n",
            );
        }
        many.extend_from_slice(b"--B--");
        assert_eq!(
            multipart(&many, "B"),
            Err(MultipartError::TooManyParts(MAX_PARTS))
        );
    }

    fn listing(files: &[(&str, u64)]) -> WorkspaceListing {
        WorkspaceListing {
            files: files
                .iter()
                .map(|(p, s)| WorkspaceFile {
                    path: p.to_string(),
                    size: *s,
                })
                .collect(),
            omitted: 0,
        }
    }

    #[test]
    fn commands_become_quoted_shell_programs() {
        let envs: BTreeMap<String, String> = [("A_1".to_string(), "it's $HOME".to_string())].into();
        let s = command_script(
            "/bin/bash",
            &["-l".into(), "-c".into(), "echo 'hi'; exit 3".into()],
            &envs,
            Some("/home/user/sub"),
        )
        .unwrap();
        assert_eq!(
            s,
            "cd -- '/home/user/sub' || exit 1\nexport A_1='it'\\''s $HOME'\nexec '/bin/bash' '-l' '-c' 'echo '\\''hi'\\''; exit 3'\n"
        );
        let out = std::process::Command::new("bash")
            .args(["-c", &format!("echo {}", shell_quote("a'b \"$x\" `c`"))])
            .output()
            .unwrap();
        assert_eq!(out.stdout, b"a'b \"$x\" `c`\n");
        let bad: BTreeMap<String, String> = [("1A; rm".to_string(), "x".to_string())].into();
        assert!(command_script("ls", &[], &bad, None).is_err());
        assert!(command_script("ls", &[], &BTreeMap::new(), Some("/etc")).is_err());
        assert!(command_script("", &[], &BTreeMap::new(), None).is_err());
    }

    #[test]
    fn directories_are_listed_from_the_files_in_them() {
        let l = listing(&[("a.txt", 10), ("d/b.txt", 3), ("d/e/c.txt", 1)]);
        let names = |v: Vec<Value>| {
            v.iter()
                .map(|e| {
                    format!(
                        "{} {}",
                        e["path"].as_str().unwrap(),
                        e["type"].as_str().unwrap()
                    )
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(list_dir(&l, "", 1).unwrap()),
            [
                "/home/user/a.txt FILE_TYPE_FILE",
                "/home/user/d FILE_TYPE_DIRECTORY"
            ]
        );
        assert_eq!(list_dir(&l, "", 3).unwrap().len(), 5);
        assert_eq!(
            names(list_dir(&l, "d", 1).unwrap()),
            [
                "/home/user/d/b.txt FILE_TYPE_FILE",
                "/home/user/d/e FILE_TYPE_DIRECTORY"
            ]
        );
        assert!(list_dir(&l, "nope", 1).is_none());
        assert_eq!(list_dir(&listing(&[]), "", 1).unwrap().len(), 0);
        assert_eq!(list_dir(&l, "", 1).unwrap()[0]["size"], "10");
        assert_eq!(stat(&l, "d").unwrap()["type"], "FILE_TYPE_DIRECTORY");
        assert_eq!(stat(&l, "a.txt").unwrap()["size"], "10");
        assert!(stat(&l, "a").is_none());
        assert_eq!(stat(&l, "").unwrap()["type"], "FILE_TYPE_DIRECTORY");
    }
}
