//! The runtime contract of kubernetes-sigs/agent-sandbox: what its Python SDK
//! (`k8s-agent-sandbox`) and its sandbox router expect of a sandbox image on port 8888, so that
//! a `SandboxTemplate` running `runcell serve --agent-sandbox-listen 0.0.0.0:8888` replaces
//! the reference `python-runtime` image without a change to the users' code.
//!
//! * `GET /`: `{"status": "ok", ...}` once the pod's session is live (the readiness probe);
//!   503 `{"status": "starting"}` while it is being made.
//! * `POST /execute {"command", "timeout_seconds"?}` → `{"stdout", "stderr", "exit_code",
//!   "timed_out"}`.
//! * `POST /upload` (multipart, field `file`, its file name the path) → `{"message"}`.
//! * `GET /download/{path}` (the bytes), `GET /list/{path}` (`[{"name", "size", "type",
//!   "mod_time"}]`), `GET /exists/{path}` (`{"path", "exists"}`).
//!
//! One pod is one sandbox: everything here goes to **one runcell session** (a Python session:
//! its sandbox has the interpreter and the data stack the reference image ships), made when
//! the listener starts and made again if it ends. Its files are the session's /workspace
//! (also named /app in the sandbox, the reference's base directory). A command runs with
//! bash (`bash -c COMMAND`, from /workspace), as its own program beside the session's
//! interpreter: shell syntax works, every command starts afresh from /workspace (as the
//! reference's do), its exit code is kept. The reference splits the command with `shlex` and
//! runs it without a shell; for every command without shell syntax the two agree, and the
//! SDK's other runtime (sandboxd) runs `/bin/sh -c COMMAND` too.
//!
//! The contract has **no authentication** (the router strips `Authorization`; the pod's
//! NetworkPolicy admits only the router): the listener is off unless the operator names an
//! address. What it does not have, it still bounds: every request takes a place in line
//! before its body is read, its body is read within a cap and the body budget, every command
//! and file operation goes through core's one intake and run service (admission, a slot, the
//! policy's limits, audit and metrics, as the `agent-sandbox` interface), and paths are
//! confined to the workspace (`..` out of it: 403, as the reference answers).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::header::{HeaderValue, CONTENT_DISPOSITION, CONTENT_TYPE, RETRY_AFTER};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use runcell_core::{intake, Call, Caller, RunError, Source, Target, TargetKind, Ticket, Verdict};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::state::AppState;

/// The interface the audit log and the metrics name these requests by.
pub const INTERFACE: &str = "agent-sandbox";

/// Entries one `/list` answers at most (the reference has no cap; a listing crosses the
/// session's stdout, which the policy caps).
pub const MAX_LISTED: usize = 2_500;

/// What an upload's multipart framing may add to the file it carries.
const MULTIPART_FRAMING: usize = 64 * 1024;

/// What an `/execute` body may add to its command (the JSON around it).
const EXECUTE_FRAMING: usize = 4 * 1024;

/// An error as the contract answers it: a status and `{"message"}` (the reference's shape).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContractError {
    pub status: StatusCode,
    pub message: String,
    pub retry_after: Option<u32>,
}

impl ContractError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ContractError {
        ContractError {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    /// What the reference answers for a path outside its base directory.
    pub fn denied() -> ContractError {
        ContractError::new(StatusCode::FORBIDDEN, "Access denied")
    }
}

impl From<RunError> for ContractError {
    fn from(e: RunError) -> ContractError {
        ContractError {
            status: StatusCode::from_u16(e.kind.status())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            message: e.message,
            retry_after: e.kind.retry_after(),
        }
    }
}

impl From<crate::error::ApiError> for ContractError {
    fn from(e: crate::error::ApiError) -> ContractError {
        ContractError {
            status: e.status,
            message: e.message,
            retry_after: e.retry_after,
        }
    }
}

impl IntoResponse for ContractError {
    fn into_response(self) -> Response {
        let mut res = (self.status, Json(json!({ "message": self.message }))).into_response();
        if let Some(s) = self.retry_after {
            res.headers_mut().insert(RETRY_AFTER, HeaderValue::from(s));
        }
        res
    }
}

/// A path of the contract, confined to the workspace as the reference confines it to its
/// base directory: leading slashes are dropped (an absolute path names a file below the base,
/// `/a` is `a`), `.` and empty segments are skipped, `..` goes up one, and a path that would
/// leave the base is refused. `""` is the base itself. (Symbolic links are never followed by
/// the session's file operations; the listing checks where they lead, as the reference does.)
pub fn confine(path: &str) -> Result<String, ContractError> {
    if path.contains('\0') {
        return Err(ContractError::new(
            StatusCode::BAD_REQUEST,
            "A path cannot hold a NUL byte.",
        ));
    }
    let mut parts: Vec<&str> = Vec::new();
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(ContractError::denied());
                }
            }
            s => parts.push(s),
        }
    }
    Ok(parts.join("/"))
}

/// `%XX` escapes decoded (once: the path of a request URI), as UTF-8.
pub fn percent_decode(s: &str) -> Result<String, ContractError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
            if let Some(v) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8(out)
        .map_err(|_| ContractError::new(StatusCode::BAD_REQUEST, "The path is not valid UTF-8."))
}

/// The path a `/download/`, `/list/` or `/exists/` request names: what follows `prefix` in
/// its URI, decoded (`""` for the route without a path).
fn named_path(parts: &Parts, prefix: &str) -> Result<String, ContractError> {
    let p = parts.uri.path();
    let rest = p
        .strip_prefix(prefix)
        .map(|r| r.strip_prefix('/').unwrap_or(r))
        .unwrap_or("");
    percent_decode(rest)
}

/// A word quoted for bash: inside single quotes nothing is special but the quote itself.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The program a command runs as: bash, from /workspace, running the command as `bash -c`
/// would (its own shell, so that nothing it does to its shell, `cd`, `exit`, variables,
/// outlives it). `python_bin`, the directory of the session's Python, comes first on `PATH`:
/// `python` and `python3` are then the session's (with runcell's data stack where it is set
/// up), as the reference image's `python` has its libraries.
pub fn command_script(command: &str, python_bin: Option<&str>) -> Result<String, ContractError> {
    if command.contains('\0') {
        return Err(ContractError::new(
            StatusCode::BAD_REQUEST,
            "The command holds a NUL byte.",
        ));
    }
    let mut script = format!("cd -- {} || exit 1\n", shell_quote(runcell_core::WORKSPACE));
    if let Some(bin) = python_bin {
        script.push_str(&format!("export PATH={}:\"$PATH\"\n", shell_quote(bin)));
    }
    script.push_str(&format!("exec bash -c {}\n", shell_quote(command)));
    Ok(script)
}

/// What the session is asked once made: the directory of its Python.
const PYTHON_BIN: &str = "import os, sys\nprint('\\n' + os.path.dirname(sys.executable))\n";

/// The directory [`PYTHON_BIN`] printed, if it is one (an absolute path on one line).
pub fn python_bin(v: &Verdict) -> Option<String> {
    let line = v.stdout.trim_end_matches('\n').rsplit('\n').next()?;
    (v.exit_code == Some(0) && line.starts_with('/') && !line.contains(':'))
        .then(|| line.to_string())
}

/// What `/list` and `/exists` ask the session: the reference's checks, made where the files
/// are (the session's own interpreter), so that a symbolic link is judged by where it leads.
/// The path comes as hex: nothing in it is read as code.
const PROBE: &str = r#"
def _runcell_agent_sandbox(rel, mode, limit):
    import os
    base = os.path.realpath('/workspace')
    full = os.path.realpath(os.path.join(base, rel))
    if os.path.commonpath([base, full]) != base:
        return {'denied': True}
    if mode == 'exists':
        return {'exists': os.path.exists(full)}
    if not os.path.isdir(full):
        return {'missing': True}
    entries, more = [], False
    with os.scandir(full) as it:
        for e in it:
            if len(entries) >= limit:
                more = True
                break
            try:
                e.name.encode('utf-8')
                st = e.stat()
                d = e.is_dir()
            except (OSError, UnicodeError):
                continue
            entries.append({'name': e.name, 'size': st.st_size,
                            'type': 'directory' if d else 'file', 'mod_time': st.st_mtime})
    return {'entries': entries, 'more': more}
print('\n' + __import__('json').dumps(_runcell_agent_sandbox(
    bytes.fromhex('@PATH@').decode('utf-8'), '@MODE@', @LIMIT@)))
del _runcell_agent_sandbox
"#;

/// What the probe found.
#[derive(Debug, Deserialize, PartialEq)]
pub struct Probe {
    #[serde(default)]
    pub denied: bool,
    #[serde(default)]
    pub missing: bool,
    pub exists: Option<bool>,
    pub entries: Option<Vec<Value>>,
    #[serde(default)]
    pub more: bool,
}

/// The probe's code for `rel` (`mode`: `list` or `exists`).
pub fn probe_code(rel: &str, mode: &str) -> String {
    let hex: String = rel.bytes().map(|b| format!("{b:02x}")).collect();
    PROBE
        .replace("@PATH@", &hex)
        .replace("@MODE@", mode)
        .replace("@LIMIT@", &MAX_LISTED.to_string())
}

/// The probe's answer in a verdict: its last line of stdout.
pub fn probe_answer(v: &Verdict) -> Result<Probe, ContractError> {
    let failed = |why: String| {
        ContractError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("The workspace could not be read: {why}"),
        )
    };
    if v.exit_code != Some(0) {
        return Err(failed(
            v.error
                .as_ref()
                .map(|e| e.message.clone())
                .unwrap_or_else(|| v.stderr.chars().take(500).collect()),
        ));
    }
    let line = v.stdout.trim_end().rsplit('\n').next().unwrap_or("");
    serde_json::from_str(line).map_err(|e| failed(e.to_string()))
}

/// The contract's `/execute` answer for a verdict: the command's output and exit code. What
/// runcell adds (a timeout, an output cap, a lost session) is said on stderr, after the
/// command's own, since the contract has nowhere else to say it.
pub fn execution_result(v: &Verdict) -> Value {
    let mut stderr = v.stderr.clone();
    let mut note = |s: &str| {
        if !stderr.is_empty() && !stderr.ends_with('\n') {
            stderr.push('\n');
        }
        stderr.push_str("runcell: ");
        stderr.push_str(s);
        stderr.push('\n');
    };
    if let Some(e) = &v.error {
        if e.category != runcell_core::verdict::ErrorCategory::RuntimeError {
            note(&e.message);
        }
    }
    if v.stdout_truncated {
        note("stdout was cut at the output limit.");
    }
    for w in &v.warnings {
        note(w);
    }
    let timed_out = v
        .error
        .as_ref()
        .is_some_and(|e| e.category == runcell_core::verdict::ErrorCategory::Timeout);
    json!({
        "stdout": v.stdout,
        "stderr": stderr,
        // No program ran (the sandbox failed): what the reference answers for a command it
        // could not start.
        "exit_code": v.exit_code.unwrap_or(1),
        // The SDK's `ExecutionResult.timed_out` (exit code 124 then, as sandboxd's).
        "timed_out": timed_out,
    })
}

/// The door: the server's state and the pod's one session.
#[derive(Clone)]
pub struct Door {
    state: AppState,
    inner: Arc<DoorInner>,
}

/// The pod's session.
#[derive(Debug, Clone)]
struct Current {
    id: String,
    /// The directory of its Python (see [`command_script`]).
    python_bin: Option<String>,
}

struct DoorInner {
    /// The session, once made. Locked while one is being looked at or made.
    session: tokio::sync::Mutex<Option<Current>>,
    /// The id of the session last made, for the health check (which must not wait, nor
    /// mistake a request that holds `session` for a moment for a session being made).
    made: std::sync::Mutex<Option<String>>,
    /// One operation on the session at a time (a session runs one call at a time; the SDK's
    /// callers are not told "busy", they wait their turn, holding their place in line).
    turn: tokio::sync::Mutex<()>,
    /// The making of the session by [`Door::start`]: one at a time, spaced after failures.
    starts: std::sync::Mutex<Starts>,
}

/// The longest wait before the session is tried again after failures to make it.
const MAX_START_BACKOFF: Duration = Duration::from_secs(60);

/// [`Door::start`]'s single flight and back-off: the unauthenticated health check asks for a
/// session on every request while there is none, and each attempt builds a sandbox.
#[derive(Debug, Default)]
struct Starts {
    /// An attempt is under way.
    making: bool,
    /// Attempts that failed in a row.
    failures: u32,
    /// No attempt before this (after a failure).
    not_before: Option<Instant>,
}

impl Starts {
    /// Whether an attempt may begin at `now` (it then counts as under way).
    fn begin(&mut self, now: Instant) -> bool {
        if self.making || self.not_before.is_some_and(|t| now < t) {
            return false;
        }
        self.making = true;
        true
    }

    /// The attempt begun ended at `now`: the next waits 1 s, 2 s, 4 s … (at most
    /// [`MAX_START_BACKOFF`]) after failures in a row.
    fn end(&mut self, ok: bool, now: Instant) {
        self.making = false;
        if ok {
            self.failures = 0;
            self.not_before = None;
        } else {
            let wait = Duration::from_secs(1u64 << self.failures.min(6)).min(MAX_START_BACKOFF);
            self.failures = self.failures.saturating_add(1);
            self.not_before = Some(now + wait);
        }
    }
}

impl Door {
    pub fn new(state: AppState) -> Door {
        Door {
            state,
            inner: Arc::new(DoorInner {
                session: tokio::sync::Mutex::new(None),
                made: std::sync::Mutex::new(None),
                turn: tokio::sync::Mutex::new(()),
                starts: std::sync::Mutex::new(Starts::default()),
            }),
        }
    }

    /// Make the session now (the listener's start), so that the pod is ready when it says so.
    /// Also asked for by the health check while there is no live session: one attempt at a
    /// time, none for a while after a failure ([`Starts`]).
    pub fn start(&self) {
        if !self.starts().begin(Instant::now()) {
            return;
        }
        let door = self.clone();
        tokio::spawn(async move {
            let result = door.session(&door.system_caller()).await;
            if let Err(e) = &result {
                tracing::warn!(error = %e.message, "the agent-sandbox session could not be made");
            }
            door.starts().end(result.is_ok(), Instant::now());
        });
    }

    fn starts(&self) -> std::sync::MutexGuard<'_, Starts> {
        self.inner.starts.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn made(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.inner.made.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The caller of what the door does by itself (making the session at start).
    fn system_caller(&self) -> Caller {
        Caller::local(INTERFACE)
    }

    /// The caller of a request: no key (the contract has none), this door's interface.
    fn caller(parts: &Parts) -> Caller {
        let mut c = crate::extract::caller_of(parts, INTERFACE);
        c.key_id = None;
        c
    }

    /// The pod's session: the live one, or a new one (the first, or one in place of a
    /// session that ended: expired, or lost with the server's state). Made in a task of its
    /// own, so that a caller that goes away does not leave the door without one.
    async fn session(&self, caller: &Caller) -> Result<Current, ContractError> {
        let door = self.clone();
        let caller = caller.clone();
        tokio::spawn(async move {
            let mut cur = door.inner.session.lock().await;
            if let Some(c) = cur.as_ref() {
                if door.state.service().session(&caller, &c.id).is_ok() {
                    return Ok(c.clone());
                }
                tracing::warn!(session = %c.id, "the agent-sandbox session ended; making a new one");
            }
            *cur = None;
            let id = door.create(&caller).await?;
            // The session is the door's from here on, whatever the question below meets (a
            // full line): it is never left behind unknown.
            *cur = Some(Current {
                id: id.clone(),
                python_bin: None,
            });
            *door.made() = Some(id.clone());
            let found = match door.state.service().reserve(&caller) {
                Ok(ticket) => door
                    .run(&caller, ticket, id.clone(), json!({ "code": PYTHON_BIN }), false)
                    .await
                    .map(|v| python_bin(&v)),
                Err(e) => Err(e.into()),
            };
            let python_bin = match found {
                Ok(Some(b)) => Some(b),
                Ok(None) | Err(_) => {
                    tracing::warn!(session = %id, "the session's Python was not found: commands get the system's");
                    None
                }
            };
            tracing::info!(session = %id, python = ?python_bin, "agent-sandbox session ready");
            let c = Current { id, python_bin };
            *cur = Some(c.clone());
            Ok(c)
        })
        .await
        .unwrap_or_else(|_| {
            Err(ContractError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "The session could not be made.",
            ))
        })
    }

    /// A new session, through the one intake, as the HTTP API would ask for it: Python (the
    /// reference image's language, and its sandbox has the data stack), with the longest
    /// idle time the policy allows (the pod is the session: it ends when its claim does).
    async fn create(&self, caller: &Caller) -> Result<String, ContractError> {
        let service = self.state.service();
        let ttl = self.state.sessions().policy().max_ttl.as_secs_f64();
        let request = intake::parse_value(
            json!({"language": "python", "ttl": ttl}),
            Source::Api,
            TargetKind::CreateSession,
            service.offers(),
        )?;
        let ticket = service.reserve(caller)?;
        let call = Call::new(caller.clone(), Source::Api, Target::CreateSession, request);
        let info = service.admit(ticket, call).await?.create().await?;
        Ok(info.id)
    }

    /// A place in line for a request, kept until its answer is delivered.
    fn reserve(&self, parts: &Parts, caller: &Caller) -> Result<Ticket, ContractError> {
        let ticket = self.state.service().reserve(caller).inspect_err(|e| {
            self.state.metrics().rejected(e.category());
        })?;
        if let Some(hold) = parts.extensions.get::<runcell_core::Hold>() {
            hold.keep(&ticket);
        }
        Ok(ticket)
    }

    /// Run `fields` (code, limits) as a call in the session (`bash`: as its own program beside
    /// the interpreter; otherwise a cell of the session's Python), with the place `ticket`.
    async fn run(
        &self,
        caller: &Caller,
        ticket: Ticket,
        session: String,
        mut fields: Value,
        bash: bool,
    ) -> Result<Verdict, ContractError> {
        let service = self.state.service();
        // The contract returns no files: none is collected.
        fields["output_files"] = json!(0);
        let mut request =
            intake::parse_value(fields, Source::Api, TargetKind::Session, service.offers())?;
        if bash {
            request.language = Some("bash".into());
        }
        let call = Call::new(
            caller.clone(),
            Source::Api,
            Target::Session(session),
            request,
        );
        Ok(service
            .admit(ticket, call)
            .await?
            .run(Box::new(runcell_core::NoSink))
            .await?)
    }
}

/// `GET /`: the readiness check. `ok` once the session is live; while it is being made (at
/// start, or again after it ended), 503 `starting`, and a session is made.
async fn health(State(door): State<Door>) -> Response {
    let made = door.made().clone();
    let live = made.is_some_and(|id| {
        door.state
            .service()
            .session(&door.system_caller(), &id)
            .is_ok()
    });
    if live {
        return Json(json!({
            "status": "ok",
            "message": "runcell's agent-sandbox runtime is active.",
        }))
        .into_response();
    }
    door.start();
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({
            "status": "starting",
            "message": "The sandbox's session is being made.",
        })),
    )
        .into_response()
}

/// `{"command": "...", "timeout_seconds": N}` (other keys are ignored, as the reference's
/// model ignores them). `timeout_seconds` (the SDK's `command_timeout`) is the command's
/// timeout, within the policy's maximum (above it the intake refuses it, 400, as it refuses
/// any request it cannot honour); without it the policy's default applies.
#[derive(Debug, Deserialize)]
struct ExecuteRequest {
    command: String,
    #[serde(default)]
    timeout_seconds: Option<f64>,
}

/// `POST /execute`.
async fn execute(State(door): State<Door>, req: Request) -> Result<Response, ContractError> {
    let (parts, body) = req.into_parts();
    let caller = Door::caller(&parts);
    let ticket = door.reserve(&parts, &caller)?;
    let policy = door.state.engine().policy();
    let limit = usize::try_from(policy.max_code_bytes)
        .unwrap_or(usize::MAX)
        .saturating_add(EXECUTE_FRAMING);
    let bytes = read(&door, body, &parts, limit, &ticket).await?;
    ticket.take_parse_bytes(&bytes)?;
    let asked: ExecuteRequest = serde_json::from_slice(&bytes).map_err(|e| {
        ContractError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("The body must be JSON {{\"command\": \"...\"}}: {e}."),
        )
    })?;
    drop(bytes);
    let _turn = door.inner.turn.lock().await;
    let session = door.session(&caller).await?;
    let script = command_script(&asked.command, session.python_bin.as_deref())?;
    let mut fields = json!({ "code": script });
    if let Some(t) = asked.timeout_seconds {
        fields["timeout"] = json!(t);
    }
    let v = door.run(&caller, ticket, session.id, fields, true).await?;
    Ok(Json(execution_result(&v)).into_response())
}

async fn read(
    door: &Door,
    body: Body,
    parts: &Parts,
    limit: usize,
    ticket: &Ticket,
) -> Result<Bytes, ContractError> {
    crate::extract::read_body(body, &parts.headers, limit, ticket)
        .await
        .inspect_err(|e| door.state.metrics().rejected(e.category))
        .map_err(ContractError::from)
}

/// `POST /upload`: a multipart body whose `file` part's file name is the path (below the
/// workspace; parent directories are made). A path out of the workspace: 403.
async fn upload(State(door): State<Door>, req: Request) -> Result<Response, ContractError> {
    let (parts, body) = req.into_parts();
    let caller = Door::caller(&parts);
    let content_type = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let Some(boundary) = crate::e2b::envd::boundary(content_type) else {
        return Err(ContractError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "An upload is multipart/form-data with a `file` part.",
        ));
    };
    let ticket = door.reserve(&parts, &caller)?;
    let limit = usize::try_from(door.state.engine().policy().max_input_file_bytes)
        .unwrap_or(usize::MAX)
        .saturating_add(MULTIPART_FRAMING);
    let bytes = read(&door, body, &parts, limit, &ticket).await?;
    let parts_of = crate::e2b::envd::multipart(&bytes, &boundary)
        .map_err(|e| ContractError::new(StatusCode::BAD_REQUEST, format!("{e}.")))?;
    let Some(file) = parts_of.iter().find(|p| p.name.as_deref() == Some("file")) else {
        return Err(ContractError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "The upload has no `file` part.",
        ));
    };
    let Some(filename) = file.filename.clone() else {
        return Err(ContractError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "The `file` part has no file name (its path).",
        ));
    };
    let rel = confine(&filename)?;
    if rel.is_empty() {
        return Err(ContractError::new(
            StatusCode::BAD_REQUEST,
            "The file name names the workspace itself, not a file in it.",
        ));
    }
    // The file's bytes in place in the body's buffer: taken over (no copy when the body
    // came in one buffer), then cut to the part.
    let start = file.data.as_ptr() as usize - bytes.as_ptr() as usize;
    let end = start + file.data.len();
    drop(parts_of);
    let mut data = Vec::from(bytes);
    data.truncate(end);
    data.drain(..start);
    let _turn = door.inner.turn.lock().await;
    let session = door.session(&caller).await?;
    door.state
        .service()
        .write_file(&ticket, &caller, session.id, rel, data)
        .await?;
    Ok(Json(json!({
        "message": format!("File '{filename}' uploaded successfully."),
    }))
    .into_response())
}

/// `GET /download/{path}`: the file's bytes (`application/octet-stream`), or 404. A symbolic
/// link is not followed (404).
async fn download(State(door): State<Door>, req: Request) -> Result<Response, ContractError> {
    let (parts, _) = req.into_parts();
    let caller = Door::caller(&parts);
    let asked = named_path(&parts, "/download")?;
    let rel = confine(&asked)?;
    let not_found = || ContractError::new(StatusCode::NOT_FOUND, "File not found");
    if rel.is_empty() {
        return Err(not_found());
    }
    let ticket = door.reserve(&parts, &caller)?;
    let _turn = door.inner.turn.lock().await;
    let session = door.session(&caller).await?;
    let data = door
        .state
        .service()
        .read_file(&ticket, &caller, session.id, rel.clone())
        .await?
        .ok_or_else(not_found)?;
    let name = rel.rsplit('/').next().unwrap_or(&rel);
    let encoded: String = name
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    let mut res = Bytes::from(data).into_response();
    res.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename*=utf-8''{encoded}")) {
        res.headers_mut().insert(CONTENT_DISPOSITION, v);
    }
    Ok(res)
}

/// Ask the session where `asked` leads (`mode`: `list` or `exists`).
async fn probe(
    door: &Door,
    parts: &Parts,
    asked: &str,
    mode: &str,
) -> Result<Probe, ContractError> {
    let caller = Door::caller(parts);
    let rel = confine(asked)?;
    let ticket = door.reserve(parts, &caller)?;
    let _turn = door.inner.turn.lock().await;
    let session = door.session(&caller).await?;
    let v = door
        .run(
            &caller,
            ticket,
            session.id,
            json!({ "code": probe_code(&rel, mode) }),
            false,
        )
        .await?;
    let p = probe_answer(&v)?;
    if p.denied {
        return Err(ContractError::denied());
    }
    Ok(p)
}

/// `GET /list/{path}`: the directory's entries, `[{"name", "size", "type", "mod_time"}]`
/// (at most [`MAX_LISTED`]); 404 when it is not a directory.
async fn list(State(door): State<Door>, req: Request) -> Result<Response, ContractError> {
    let (parts, _) = req.into_parts();
    let asked = named_path(&parts, "/list")?;
    let p = probe(&door, &parts, &asked, "list").await?;
    if p.missing {
        return Err(ContractError::new(
            StatusCode::NOT_FOUND,
            "Path is not a directory",
        ));
    }
    if p.more {
        tracing::info!("an agent-sandbox listing was cut at {MAX_LISTED} entries");
    }
    Ok(Json(p.entries.unwrap_or_default()).into_response())
}

/// `GET /exists/{path}`: `{"path": <the path asked>, "exists": bool}`.
async fn exists(State(door): State<Door>, req: Request) -> Result<Response, ContractError> {
    let (parts, _) = req.into_parts();
    let asked = named_path(&parts, "/exists")?;
    let p = probe(&door, &parts, &asked, "exists").await?;
    Ok(Json(json!({"path": asked, "exists": p.exists.unwrap_or(false)})).into_response())
}

/// Every request on this listener is as good as authenticated (the contract has no
/// credential: the network policy is the gate), so its connection may stay open like a
/// keyed one.
async fn trusted(req: Request, next: axum::middleware::Next) -> Response {
    if let Some(a) = req.extensions().get::<crate::connections::Authenticated>() {
        a.mark();
    }
    next.run(req).await
}

/// The contract's routes: each path, its methods and their handlers. The router is built
/// from this table, and the generated reference (`runcell __reference names`) lists it.
fn contract_routes() -> [(
    &'static str,
    &'static str,
    axum::routing::MethodRouter<Door>,
); 12] {
    [
        ("/", "GET", get(health)),
        ("/execute", "POST", post(execute)),
        ("/upload", "POST", post(upload)),
        ("/download", "GET", get(download)),
        ("/download/", "GET", get(download)),
        ("/download/{*path}", "GET", get(download)),
        ("/list", "GET", get(list)),
        ("/list/", "GET", get(list)),
        ("/list/{*path}", "GET", get(list)),
        ("/exists", "GET", get(exists)),
        ("/exists/", "GET", get(exists)),
        ("/exists/{*path}", "GET", get(exists)),
    ]
}

/// Every route of the contract (on its own address), with its method.
pub fn routes() -> Vec<(&'static str, &'static str)> {
    contract_routes()
        .into_iter()
        .map(|(path, method, _)| (path, method))
        .collect()
}

/// The contract's routes, over the server's state, for a listener of their own.
pub fn router(door: Door) -> Router {
    contract_routes()
        .into_iter()
        .fold(Router::new(), |r, (path, _, handler)| {
            r.route(path, handler)
        })
        .with_state(door)
        .layer(axum::middleware::from_fn(trusted))
        .layer(axum::middleware::from_fn(crate::middleware::request_meta))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            crate::error::panic_response,
        ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_is_made_once_at_a_time_and_not_again_right_after_a_failure() {
        let t0 = Instant::now();
        let mut s = Starts::default();
        assert!(s.begin(t0));
        // Health checks while it is being made start nothing.
        assert!(!s.begin(t0));
        assert!(!s.begin(t0 + Duration::from_secs(3600)));
        s.end(false, t0);
        // After a failure: not before 1 s, then 2 s, 4 s … at most a minute.
        assert!(!s.begin(t0));
        assert!(!s.begin(t0 + Duration::from_millis(999)));
        let t1 = t0 + Duration::from_secs(1);
        assert!(s.begin(t1));
        s.end(false, t1);
        assert!(!s.begin(t1 + Duration::from_millis(1999)));
        let mut t = t1 + Duration::from_secs(2);
        assert!(s.begin(t));
        for _ in 0..40 {
            s.end(false, t);
            t += MAX_START_BACKOFF;
            assert!(s.begin(t));
        }
        s.end(false, t);
        assert!(!s.begin(t + MAX_START_BACKOFF - Duration::from_millis(1)));
        t += MAX_START_BACKOFF;
        assert!(s.begin(t));
        // A success clears the back-off.
        s.end(true, t);
        assert!(s.begin(t));
    }

    #[test]
    fn paths_are_confined_as_the_reference_confines_them() {
        assert_eq!(confine("").unwrap(), "");
        assert_eq!(confine(".").unwrap(), "");
        assert_eq!(confine("a.txt").unwrap(), "a.txt");
        assert_eq!(
            confine("/a.txt").unwrap(),
            "a.txt",
            "re-rooted, not refused"
        );
        assert_eq!(confine("//d/./b.txt").unwrap(), "d/b.txt");
        assert_eq!(confine("d/../b.txt").unwrap(), "b.txt");
        for bad in [
            "..",
            "../x",
            "../../etc/passwd",
            "/../etc/passwd",
            "a/../../b",
        ] {
            assert_eq!(confine(bad), Err(ContractError::denied()), "{bad}");
        }
        assert_eq!(confine("a\0b").unwrap_err().status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn uri_paths_are_decoded_once() {
        assert_eq!(
            percent_decode("..%2F..%2Fetc%2Fpasswd").unwrap(),
            "../../etc/passwd"
        );
        assert_eq!(percent_decode("a%2520b").unwrap(), "a%20b");
        assert_eq!(percent_decode("caf%C3%A9").unwrap(), "café");
        assert_eq!(percent_decode("100%").unwrap(), "100%");
        assert_eq!(percent_decode("%zz%4").unwrap(), "%zz%4");
        assert!(percent_decode("%FF").is_err());
    }

    #[test]
    fn commands_run_as_bash_c_from_the_workspace() {
        let s = command_script("echo 'hello world'; exit 3", None).unwrap();
        assert_eq!(
            s,
            "cd -- '/workspace' || exit 1\nexec bash -c 'echo '\\''hello world'\\''; exit 3'\n"
        );
        let p = command_script("python -V", Some("/var/lib/runcell/python/x/bin")).unwrap();
        assert_eq!(
            p.lines().nth(1).unwrap(),
            "export PATH='/var/lib/runcell/python/x/bin':\"$PATH\""
        );
        // What the program does, run by bash here (its `cd` aside).
        let body = s.lines().nth(1).unwrap().trim_start_matches("exec ");
        let out = std::process::Command::new("bash")
            .args(["-c", body])
            .output()
            .unwrap();
        assert_eq!(out.stdout, b"hello world\n");
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(
            command_script("a\0b", None).unwrap_err().status,
            StatusCode::BAD_REQUEST
        );
    }

    #[test]
    fn the_sessions_python_is_read_from_its_answer() {
        let mut v = Verdict::failed(runcell_core::verdict::ErrorCategory::RuntimeError, "x");
        v.exit_code = Some(0);
        v.stdout = "\n/var/lib/runcell/python/cp311-x/bin\n".into();
        assert_eq!(
            python_bin(&v).as_deref(),
            Some("/var/lib/runcell/python/cp311-x/bin")
        );
        v.stdout = "\nrelative/bin\n".into();
        assert_eq!(python_bin(&v), None);
        v.stdout = "\n/a:/b\n".into();
        assert_eq!(python_bin(&v), None, "not a PATH of its own");
        v.stdout = "\n/usr/bin\n".into();
        v.exit_code = Some(1);
        assert_eq!(python_bin(&v), None);
    }

    #[test]
    fn the_probe_carries_its_path_as_hex() {
        let c = probe_code("a'/\n", "list");
        assert!(c.contains("bytes.fromhex('61272f0a')"), "{c}");
        assert!(c.contains("'list', 2500"));
        let mut v = Verdict::failed(runcell_core::verdict::ErrorCategory::RuntimeError, "x");
        v.exit_code = Some(0);
        v.stdout = "noise\n{\"exists\": true}\n".into();
        assert_eq!(probe_answer(&v).unwrap().exists, Some(true));
        v.stdout = "{\"denied\": true}".into();
        assert!(probe_answer(&v).unwrap().denied);
        v.exit_code = Some(1);
        assert_eq!(
            probe_answer(&v).unwrap_err().status,
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }

    #[test]
    fn results_keep_the_exit_code_and_say_what_runcell_did() {
        let mut v = Verdict::failed(
            runcell_core::verdict::ErrorCategory::Timeout,
            "The program ran past its timeout of 30 s.",
        );
        v.exit_code = Some(124);
        v.stderr = "partial".into();
        let r = execution_result(&v);
        assert_eq!(r["exit_code"], 124);
        assert_eq!(r["timed_out"], true);
        assert_eq!(
            r["stderr"],
            "partial\nruncell: The program ran past its timeout of 30 s.\n"
        );
        let mut ok = Verdict::failed(runcell_core::verdict::ErrorCategory::RuntimeError, "exit 2");
        ok.exit_code = Some(2);
        ok.stdout = "out\n".into();
        let r = execution_result(&ok);
        assert_eq!(r["exit_code"], 2);
        assert_eq!(r["timed_out"], false);
        assert_eq!(r["stderr"], "", "a command's own failure is its exit code");
        assert_eq!(r["stdout"], "out\n");
        let none = Verdict::failed(runcell_core::verdict::ErrorCategory::SandboxFailure, "no");
        assert_eq!(execution_result(&none)["exit_code"], 1);
    }
}
