//! Sessions: a sandbox that outlives its calls, with an interpreter that keeps its state.
//!
//! A [`Session`] is one sandbox built once with the session's limits (memory, processes and
//! disk are the whole session's), in which every call runs: as a cell of the language's session
//! interpreter (Python, Node, Ruby, bash keep their variables and definitions; see
//! `runcell-runtimes/runners/`), or for Go as a program compiled and run in the same sandbox
//! (the workspace's files persist). Wall time is per call. A call that runs out of time (or
//! output, or is cancelled) is interrupted first (SIGINT: Python's KeyboardInterrupt), so that
//! the interpreter keeps its state where it survives; where it does not (a memory kill, a
//! crash, an exit), the interpreter is restarted and the verdict says that the state was lost
//! (`state_lost`, and a warning). A session never dies silently.
//!
//! [`Sessions`] keeps the live sessions of a server: ids, owners (the API key that created a
//! session; another key gets `NotFound`), caps per owner and in total, an idle TTL and a
//! maximum lifetime, and a reaper that ends expired sessions with nothing left behind.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use runcell_jail::{CollectLimits, KillSwitch, OutputSink, Sandbox};
use runcell_runtimes::{Invocation, Language, Runtime, WORKSPACE};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::engine::{
    sandbox_failure, sandbox_files, sandbox_spec, Engine, RunIn, ValidRequest,
    INTERPRETER_START_TIMEOUT, NO_INTERPRETER,
};
use crate::limits::{Limit, LimitOverrides, Limits, Millis};
use crate::request::{workspace_path, ExecRequest, InputFile};
use crate::verdict::{ErrorCategory, Verdict};

/// What a server allows of sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionPolicy {
    /// Idle time after which a session ends, unless the request asks for another.
    pub default_ttl: Duration,
    /// The longest idle TTL a request may ask for.
    pub max_ttl: Duration,
    /// A session ends this long after it was created, however busy.
    pub max_lifetime: Duration,
    /// Live sessions at most, in total and per API key (429 beyond).
    pub max_total: usize,
    pub max_per_owner: usize,
}

impl Default for SessionPolicy {
    fn default() -> Self {
        SessionPolicy {
            default_ttl: Duration::from_secs(600),
            max_ttl: Duration::from_secs(3600),
            max_lifetime: Duration::from_secs(4 * 3600),
            max_total: 32,
            max_per_owner: 8,
        }
    }
}

/// `POST /v1/sessions`: a language, files for /workspace, an idle TTL in seconds, and limits
/// under their usual names (`timeout` is the default of each call; `memory`, `pids`, `disk`,
/// ... are the whole session's).
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRequest {
    /// The session as a request without code: its language, files and limits.
    pub exec: ExecRequest,
    /// Idle seconds before the session ends.
    pub ttl: Option<f64>,
}

impl<'de> serde::Deserialize<'de> for SessionRequest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut map = Map::<String, Value>::deserialize(d)?;
        let ttl = match map.remove("ttl") {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) => n.as_f64(),
            Some(other) => {
                return Err(D::Error::custom(format!(
                    "ttl must be a number of seconds, not {other}"
                )))
            }
        };
        for refused in ["code", "stdin"] {
            if map.contains_key(refused) {
                return Err(D::Error::custom(format!(
                    "a session is created without {refused}: send it to /v1/sessions/{{id}}/execute"
                )));
            }
        }
        map.insert("code".into(), Value::String(String::new()));
        let exec = serde_json::from_value(Value::Object(map)).map_err(D::Error::custom)?;
        Ok(SessionRequest { exec, ttl })
    }
}

impl SessionRequest {
    pub fn new(language: impl Into<String>) -> SessionRequest {
        SessionRequest {
            exec: ExecRequest::new(language, ""),
            ttl: None,
        }
    }

    /// The JSON Schema of the request: the execute request's without code and stdin, with ttl.
    pub fn schema() -> Value {
        let mut s = ExecRequest::schema();
        if let Some(props) = s["properties"].as_object_mut() {
            props.remove("code");
            props.remove("stdin");
            props.insert(
                "ttl".into(),
                serde_json::json!({"type": ["number", "null"], "exclusiveMinimum": 0,
                    "description": "Seconds the session may stay idle before it ends (default 600)."}),
            );
            if let Some(t) = props.get_mut("timeout") {
                t["description"] = Value::String(
                    "Wall-clock time of each call (default of the session's calls).".into(),
                );
            }
        }
        s["required"] = serde_json::json!(["language"]);
        s
    }
}

/// `POST /v1/sessions/{id}/execute`: code, stdin, files, and the call's own `timeout`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CellRequest {
    pub code: String,
    pub stdin: Option<String>,
    pub files: Vec<InputFile>,
    pub timeout: Option<Millis>,
}

impl<'de> serde::Deserialize<'de> for CellRequest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let map = Map::<String, Value>::deserialize(d)?;
        let mut cell = CellRequest::default();
        let mut code = None;
        for (k, v) in map {
            match k.as_str() {
                "code" => code = Some(String::deserialize(v).map_err(D::Error::custom)?),
                "stdin" => {
                    cell.stdin = Option::<String>::deserialize(v).map_err(D::Error::custom)?
                }
                "files" => {
                    cell.files = Vec::<InputFile>::deserialize(v).map_err(D::Error::custom)?
                }
                "timeout" => {
                    let mut probe = Map::new();
                    probe.insert("language".into(), Value::String(String::new()));
                    probe.insert("code".into(), Value::String(String::new()));
                    probe.insert("timeout".into(), v);
                    let r: ExecRequest =
                        serde_json::from_value(Value::Object(probe)).map_err(D::Error::custom)?;
                    cell.timeout = r.limits.timeout;
                }
                other => {
                    return Err(D::Error::unknown_field(
                        other,
                        &["code", "stdin", "files", "timeout"],
                    ))
                }
            }
        }
        cell.code = code.ok_or_else(|| D::Error::missing_field("code"))?;
        Ok(cell)
    }
}

impl CellRequest {
    pub fn new(code: impl Into<String>) -> CellRequest {
        CellRequest {
            code: code.into(),
            ..CellRequest::default()
        }
    }

    pub fn schema() -> Value {
        let e = ExecRequest::schema();
        let p = &e["properties"];
        serde_json::json!({
            "type": "object",
            "properties": {
                "code": p["code"],
                "stdin": {
                    "type": ["string", "null"],
                    "description": "Text fed to the call's standard input. Not in a node \
                        session (its interpreter cannot take a new standard input per call): \
                        pass such data as a file.",
                },
                "files": p["files"],
                "timeout": p["timeout"],
            },
            "required": ["code"],
            "additionalProperties": false,
        })
    }
}

/// The OpenAPI document's schemas of the two session requests (their files are `InputFile`
/// components, as in `ExecRequest`).
macro_rules! openapi_schema {
    ($ty:ty, $name:literal, $example:expr) => {
        impl utoipa::PartialSchema for $ty {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                let mut s = <$ty>::schema();
                s["examples"] = serde_json::json!([$example]);
                s["properties"]["files"]["items"] =
                    serde_json::json!({"$ref": "#/components/schemas/InputFile"});
                crate::schema::openapi(s)
            }
        }

        impl utoipa::ToSchema for $ty {
            fn name() -> std::borrow::Cow<'static, str> {
                $name.into()
            }

            fn schemas(
                schemas: &mut Vec<(
                    String,
                    utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
                )>,
            ) {
                use utoipa::PartialSchema;
                schemas.push((
                    "InputFile".into(),
                    <InputFile as PartialSchema>::schema(),
                ));
            }
        }
    };
}

openapi_schema!(
    SessionRequest,
    "SessionRequest",
    serde_json::json!({"language": "python", "ttl": 600, "memory": "512M"})
);
openapi_schema!(
    CellRequest,
    "CellRequest",
    serde_json::json!({"code": "x = 41\nprint(x + 1)", "timeout": 10})
);

/// Why a session operation was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SessionError {
    /// No such session for this caller (it never existed, ended, or belongs to another key).
    #[error("No session {0}: it does not exist, has ended, or belongs to another API key.")]
    NotFound(String),
    #[error("The session is running another call; wait for it to finish.")]
    Busy,
    /// What is in the session's workspace conflicts with the operation (a directory where a
    /// file is to be written).
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Invalid(String),
    /// Too many live sessions (for this key, or in total).
    #[error("{0}")]
    TooMany(String),
    /// The session could not be started or its sandbox failed: the verdict says why.
    #[error("{}", .0.error.as_ref().map(|e| e.message.as_str()).unwrap_or("the session failed"))]
    Failed(Box<Verdict>),
    #[error("The server is shutting down.")]
    ShuttingDown,
}

/// A session's description (`GET /v1/sessions/{id}`, and the answer to its creation).
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema, utoipa::ToSchema)]
pub struct SessionInfo {
    pub id: String,
    pub language: String,
    /// RFC 3339, UTC.
    pub created_at: String,
    /// When the session ends unless it is used before (RFC 3339, UTC): the idle TTL from its
    /// last use, and never later than its maximum lifetime.
    pub expires_at: String,
    /// Idle seconds before it ends.
    pub ttl: f64,
    /// Calls run so far.
    pub execution_count: u64,
    /// A call is running now.
    pub busy: bool,
    pub limits: Limits,
}

/// One file of a session's /workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema, utoipa::ToSchema)]
pub struct WorkspaceFile {
    /// Relative to /workspace.
    pub path: String,
    pub size: u64,
}

/// The files of a session's /workspace (`GET /v1/sessions/{id}/files`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema, utoipa::ToSchema)]
pub struct WorkspaceListing {
    pub files: Vec<WorkspaceFile>,
    /// Files left out (past the listing's caps, or names that cannot be returned faithfully).
    pub omitted: u64,
}

/// What a session lost in a call, for its verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Lost {
    /// The interpreter was restarted: variables, imports and definitions are gone.
    State,
    /// The sandbox was rebuilt: the files in /workspace are gone too.
    Everything,
}

/// Files listed at most, and the entries walked to list them.
const LIST_MAX_FILES: u64 = 10_000;

/// A sandbox that keeps its interpreter (or, for Go, its files) between calls.
pub struct Session {
    language: Language,
    runtime: Runtime,
    /// The session's limits as asked (the per-call `timeout` replaces their timeout).
    overrides: LimitOverrides,
    limits: Limits,
    /// The session's initial files.
    files: Vec<runcell_jail::InputFile>,
    sandbox: Option<Sandbox>,
    /// The session interpreter's command; `None` for Go (calls run as programs).
    interpreter: Option<Invocation>,
    /// How long the interpreter may live: its CPU rlimit covers that much time.
    lifetime: Duration,
    cells: u64,
    executions: u64,
    /// A loss that happened outside a call (a file operation had to rebuild the sandbox): the
    /// next call's verdict reports it.
    pending: Option<Lost>,
}

impl Engine {
    /// Check a session request against the policy (its limits, its files).
    pub fn validate_session(&self, req: &SessionRequest) -> Result<ValidRequest, SessionError> {
        offline_only(&req.exec).map_err(SessionError::Invalid)?;
        let v = self
            .validate(&req.exec)
            .map_err(|e| SessionError::Invalid(e.to_string()))?;
        Ok(v)
    }

    /// Build a session's sandbox and start its interpreter. `lifetime` bounds how long it
    /// may live.
    pub fn open_session(
        &self,
        v: &ValidRequest,
        overrides: LimitOverrides,
        lifetime: Duration,
    ) -> Result<Session, Box<Verdict>> {
        let runtime = self.locate(v.language()).map_err(|e| {
            Box::new(Verdict::failed(
                ErrorCategory::RuntimeUnavailable,
                e.to_string(),
            ))
        })?;
        let interpreter = runtime.interpreter(&[], true);
        let mut s = Session {
            language: v.language(),
            interpreter,
            runtime,
            overrides,
            limits: *v.limits(),
            files: v.files().to_vec(),
            sandbox: None,
            lifetime,
            cells: 0,
            executions: 0,
            pending: None,
        };
        s.start_sandbox(self)?;
        Ok(s)
    }
}

impl Session {
    pub fn language(&self) -> Language {
        self.language
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn execution_count(&self) -> u64 {
        self.executions
    }

    /// A new sandbox with the session's files (and the runtime's), its interpreter started.
    fn start_sandbox(&mut self, engine: &Engine) -> Result<(), Box<Verdict>> {
        self.sandbox = None;
        let spec = sandbox_spec(engine.config(), &self.limits, &self.runtime);
        let mut sandbox = Sandbox::create(&spec)
            .map_err(|e| Box::new(sandbox_failure("of the session could not be set up", &e)))?;
        if let Some(refused) = engine.strict_refusal(&sandbox) {
            return Err(Box::new(refused));
        }
        sandbox.set_persistent(true);
        let mut files = sandbox_files(&self.runtime);
        files.extend(self.files.iter().cloned());
        if self.interpreter.is_some() {
            self.sandbox = Some(sandbox);
            return self.start_interpreter(files);
        }
        sandbox
            .put_files(&files)
            .map_err(|e| Box::new(sandbox_failure("could not receive the session's files", &e)))?;
        self.sandbox = Some(sandbox);
        Ok(())
    }

    /// Start the session's interpreter in its sandbox (again, after it ended).
    fn start_interpreter(
        &mut self,
        files: Vec<runcell_jail::InputFile>,
    ) -> Result<(), Box<Verdict>> {
        let (Some(inv), Some(sandbox)) = (&self.interpreter, self.sandbox.as_mut()) else {
            return Ok(());
        };
        let enforcement = sandbox.enforcement().clone();
        let mut program = Engine::program(
            inv,
            &self.limits,
            self.lifetime,
            &self.runtime,
            &enforcement,
            files,
            None,
        );
        program.wall_timeout = INTERPRETER_START_TIMEOUT;
        match sandbox.start_interpreter(&program, &mut runcell_jail::NoSink) {
            Ok(None) => Ok(()),
            Ok(Some(outcome)) => {
                self.sandbox = None;
                // The session's own limits can be too small for its interpreter (a node with
                // one process, a memory limit below Python's): that is the request's to fix,
                // when the request set the limit it hit. A start that takes too long, or a
                // default too small, is the host's (the operator's) to fix.
                let (_, error) =
                    crate::verdict::classify(&outcome, &self.limits, crate::verdict::Phase::Run);
                let limit_hit = error.as_ref().and_then(|e| {
                    let limit = match e.category {
                        ErrorCategory::MemoryLimit => Limit::Memory,
                        ErrorCategory::ProcessLimit => Limit::Pids,
                        ErrorCategory::OutputLimit => Limit::Output,
                        ErrorCategory::DiskLimit => Limit::Disk,
                        _ => return None,
                    };
                    self.overrides.get(limit).is_some().then_some((e, limit))
                });
                let stderr = String::from_utf8_lossy(&outcome.stderr);
                let said = crate::request::prefix(stderr.trim(), 200);
                Err(Box::new(match limit_hit {
                    Some((e, limit)) => Verdict::failed(
                        ErrorCategory::InvalidRequest,
                        format!(
                            "The session's interpreter could not start within the session's \
                             limits: it hit its `{}` limit ({}){}. Create the session with a \
                             larger one, or without it for the default.",
                            limit.name(),
                            e.category.as_str(),
                            if said.is_empty() {
                                String::new()
                            } else {
                                format!("; it said: {said}")
                            }
                        ),
                    ),
                    None => Verdict::failed(
                        ErrorCategory::SandboxFailure,
                        format!(
                            "The session's interpreter ended while starting ({:?}): {}",
                            outcome.end,
                            stderr.trim_end()
                        ),
                    ),
                }))
            }
            Err(e) => {
                self.sandbox = None;
                Err(Box::new(sandbox_failure(
                    "could not start the session's interpreter",
                    &e,
                )))
            }
        }
    }

    /// The sandbox, rebuilt if it ended (its files are lost then).
    fn ensure_sandbox(&mut self, engine: &Engine) -> Result<&mut Sandbox, Box<Verdict>> {
        let alive = self.sandbox.as_mut().is_some_and(|s| s.is_ready());
        if !alive {
            self.start_sandbox(engine)?;
            self.pending = Some(Lost::Everything);
        }
        self.sandbox
            .as_mut()
            .ok_or_else(|| Box::new(Verdict::failed(ErrorCategory::SandboxFailure, "no sandbox")))
    }

    /// Validate one call against the session's limits (with its own timeout).
    pub fn validate(&self, engine: &Engine, cell: &CellRequest) -> Result<ValidRequest, String> {
        validate_call(engine, self.language, &self.overrides, cell)
    }

    /// Run one call. The verdict is a one-shot run's, plus `execution_count` and `state_lost`
    /// (the caller adds `session_id`).
    pub fn execute(
        &mut self,
        engine: &Engine,
        v: &ValidRequest,
        sink: &mut dyn OutputSink,
        cancel: Option<&KillSwitch>,
    ) -> Verdict {
        self.executions += 1;
        let mut lost = self.pending.take();
        let mut verdict = self.run_once(engine, v, sink, cancel, &mut lost);
        verdict.language = Some(self.language.name().into());
        verdict.limits = Some(*v.limits());
        verdict.execution_count = Some(self.executions);
        verdict.state_lost = Some(lost.is_some());
        match lost {
            Some(Lost::State) => verdict.warnings.push(
                "The session's state was lost: its interpreter ended (a memory kill, a crash, \
                 an exit, or an interruption it did not survive) and was restarted. Variables, \
                 imports and definitions from earlier calls are gone; the files in /workspace \
                 are kept. Run the setup code again."
                    .into(),
            ),
            Some(Lost::Everything) => verdict.warnings.push(
                "The session's state was lost: its sandbox ended and was rebuilt. Variables, \
                 imports, definitions and the files written to /workspace are gone (the \
                 session's initial files are back). Run the setup code again."
                    .into(),
            ),
            None => {}
        }
        verdict
    }

    fn run_once(
        &mut self,
        engine: &Engine,
        v: &ValidRequest,
        sink: &mut dyn OutputSink,
        cancel: Option<&KillSwitch>,
        lost: &mut Option<Lost>,
    ) -> Verdict {
        if let Err(v) = self.ensure_sandbox(engine) {
            return *v;
        }
        *lost = (*lost).max(self.pending.take());
        let has_interpreter = self.interpreter.is_some();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let how = if has_interpreter {
                self.cells += 1;
                RunIn::SessionCell(self.cells)
            } else {
                RunIn::SessionProgram
            };
            let Some(sandbox) = self.sandbox.as_mut() else {
                return Verdict::failed(ErrorCategory::SandboxFailure, "no sandbox");
            };
            let (mut verdict, outcome) =
                engine.run_in(sandbox, how, v, &self.runtime, sink, cancel);
            let no_interpreter = outcome.is_none()
                && verdict
                    .error
                    .as_ref()
                    .is_some_and(|e| e.message == NO_INTERPRETER);
            if no_interpreter && attempt == 1 {
                // It ended between calls: start it again, and run the call in the new one.
                *lost = (*lost).max(Some(Lost::State));
                if let Err(v) = self.start_interpreter(Vec::new()) {
                    return *v;
                }
                continue;
            }
            let sandbox_alive = self.sandbox.as_mut().is_some_and(|s| s.is_ready());
            if !sandbox_alive {
                // pid 1 itself was killed (a memory kill that took it, a cancellation that
                // could not be done gently): the next call gets a new sandbox.
                *lost = (*lost).max(Some(Lost::Everything));
                if let Err(v) = self.start_sandbox(engine) {
                    verdict.warnings.push(format!(
                        "The session could not be rebuilt: {}",
                        v.error.map(|e| e.message).unwrap_or_default()
                    ));
                }
            } else if has_interpreter && outcome.as_ref().is_some_and(|o| !o.interpreter_alive) {
                *lost = (*lost).max(Some(Lost::State));
                // Restarted now, so that the next call finds it ready.
                if let Err(v) = self.start_interpreter(Vec::new()) {
                    verdict.warnings.push(format!(
                        "The session's interpreter could not be restarted: {}",
                        v.error.map(|e| e.message).unwrap_or_default()
                    ));
                }
            } else if let (Some(o), Some(err)) = (&outcome, verdict.error.as_mut()) {
                if matches!(
                    o.end,
                    runcell_jail::End::TimedOut
                        | runcell_jail::End::OutputLimit(_)
                        | runcell_jail::End::Cancelled
                ) && has_interpreter
                {
                    if o.end == runcell_jail::End::Cancelled {
                        err.message = "The call was interrupted (Ctrl-C, a cancelled call, or \
                                       a client that went away)."
                            .into();
                    }
                    err.message.push_str(
                        " The call was interrupted (SIGINT); the session's interpreter survived \
                         and keeps its state.",
                    );
                }
            }
            return verdict;
        }
    }

    /// The files of /workspace (names and sizes).
    pub fn list_files(&mut self, engine: &Engine) -> Result<WorkspaceListing, Box<Verdict>> {
        let limits = CollectLimits {
            max_files: LIST_MAX_FILES,
            max_file_bytes: 0,
            max_total_bytes: 0,
            max_entries: 100_000,
            max_read_bytes: 0,
            deadline_ms: 10_000,
        };
        let sandbox = self.ensure_sandbox(engine)?;
        let c = sandbox
            .browse(&limits, None)
            .map_err(|e| Box::new(sandbox_failure("could not list its files", &e)))?;
        Ok(WorkspaceListing {
            files: c
                .files
                .into_iter()
                .map(|f| WorkspaceFile {
                    path: f.path,
                    size: f.size,
                })
                .collect(),
            omitted: c.omitted,
        })
    }

    /// One file's bytes; `Ok(None)` when there is no regular file at `path`.
    pub fn read_file(&mut self, engine: &Engine, path: &str) -> Result<Option<Vec<u8>>, String> {
        let rel = workspace_path(path).map_err(|e| e.to_string())?;
        // The file crosses pid 1 and the server's memory whole: it is bounded like an uploaded
        // file, not by the session's disk (a sparse file of that size costs the session
        // nothing).
        let cap = engine.policy().max_input_file_bytes.min(self.limits.disk.0);
        let limits = CollectLimits {
            max_files: 1,
            max_file_bytes: cap,
            max_total_bytes: cap,
            max_entries: 1,
            max_read_bytes: cap,
            deadline_ms: 30_000,
        };
        let sandbox = self.ensure_sandbox(engine).map_err(message)?;
        let mut c = sandbox
            .browse(&limits, Some(&rel))
            .map_err(|e| message(Box::new(sandbox_failure("could not read the file", &e))))?;
        if let Some(f) = c.files.first().filter(|f| f.blob.is_none() && f.size > cap) {
            return Err(format!(
                "The file is {} bytes, more than the limit of {cap} bytes per download: \
                 read it in parts with a call, or return it in a call's output files.",
                f.size
            ));
        }
        Ok(match c.files.first().and_then(|f| f.blob) {
            Some(i) if i < c.blobs.len() => Some(c.blobs.swap_remove(i)),
            _ => None,
        })
    }

    /// Write one file into /workspace (replacing what is there).
    pub fn write_file(
        &mut self,
        engine: &Engine,
        path: &str,
        data: &[u8],
    ) -> Result<(), SessionError> {
        let invalid = SessionError::Invalid;
        let rel = workspace_path(path).map_err(|e| invalid(e.to_string()))?;
        let p = &engine.policy();
        let cap = p.max_input_file_bytes.min(self.limits.disk.0);
        if data.len() as u64 > cap {
            return Err(invalid(format!(
                "The file is {} bytes, more than the limit of {cap} bytes per file.",
                data.len()
            )));
        }
        let file = runcell_jail::InputFile {
            path: PathBuf::from(WORKSPACE).join(&rel),
            mode: 0o644,
            content: data.to_vec(),
        };
        // A sandbox that cannot be rebuilt is the host's failure, not the request's.
        let sandbox = self.ensure_sandbox(engine).map_err(SessionError::Failed)?;
        sandbox.put_files(&[file]).map_err(|e| {
            let chain = crate::error::chain(&e);
            if chain.contains("No space") || chain.contains("Disk quota") {
                invalid("The file does not fit: the session's disk is full.".to_string())
            } else if chain.contains("symbolic link is in the way") {
                // Planted by the session's own code where a directory of the path should be:
                // pid 1 never writes through one, and the link is the caller's to remove.
                let at = match &e {
                    runcell_jail::SandboxError::Setup { path: Some(p), .. } => p
                        .strip_prefix(WORKSPACE)
                        .map_or_else(|_| p.display().to_string(), |p| p.display().to_string()),
                    _ => rel.clone(),
                };
                SessionError::Conflict(format!(
                    "{rel}: a symbolic link is in the way at {at} (files are never written \
                     through one)."
                ))
            } else if chain.contains("directory is in the way") || chain.contains("Not a directory")
            {
                // The path is fine; what is in the workspace now is in the way.
                SessionError::Conflict(format!(
                    "{rel}: a directory is in the way (or a file where a directory should be)."
                ))
            } else {
                SessionError::Failed(Box::new(Verdict::failed(
                    ErrorCategory::SandboxFailure,
                    format!("The file could not be written: {chain}."),
                )))
            }
        })
    }

    /// End the session: every process and the sandbox are gone when this returns.
    pub fn close(mut self) {
        if let Some(s) = self.sandbox.take() {
            if let Err(e) = s.destroy() {
                tracing::warn!(error = %crate::error::chain(&e), "session teardown failed");
            }
        }
    }
}

fn message(v: Box<Verdict>) -> String {
    v.error.map(|e| e.message).unwrap_or_default()
}

/// Where a front end that speaks in [`ExecRequest`]s (MCP) runs one: a new session, or an
/// existing one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionTarget {
    New,
    Id(String),
}

impl SessionTarget {
    /// `"new"` or a session id.
    pub fn parse(text: &str) -> SessionTarget {
        if text == "new" {
            SessionTarget::New
        } else {
            SessionTarget::Id(text.to_string())
        }
    }
}

/// A live session in the table.
/// A session's code runs offline with the pre-installed packages: a request that asks for
/// destinations or packages is refused, never dropped (code that expects them must learn it
/// has none). For a session's creation and for each of its calls.
pub fn offline_only(req: &ExecRequest) -> Result<(), String> {
    let asks_network = req.network.as_ref().is_some_and(|n| !n.allow.is_empty());
    if asks_network || !req.packages.is_empty() {
        return Err(
            "Invalid request: network by permission and package installs are for \
                    one-shot runs; a session's code runs offline with the pre-installed \
                    packages. Leave out \"network\" and \"packages\", or run this code \
                    without a session."
                .into(),
        );
    }
    Ok(())
}

/// Validate one call of a session of `language` created with `overrides` (the call's own
/// timeout replaces the session's).
fn validate_call(
    engine: &Engine,
    language: Language,
    overrides: &LimitOverrides,
    cell: &CellRequest,
) -> Result<ValidRequest, String> {
    if language == Language::Node && cell.stdin.is_some() {
        return Err(
            "stdin is not available in a node session (its interpreter cannot take a new \
             standard input per call): pass the data as a file in `files` and read it from \
             /workspace."
                .into(),
        );
    }
    let mut limits = *overrides;
    limits.timeout = cell.timeout.or(overrides.timeout);
    let req = ExecRequest {
        language: language.name().to_string(),
        code: cell.code.clone(),
        stdin: cell.stdin.clone(),
        files: cell.files.clone(),
        limits,
        network: None,
        packages: Vec::new(),
    };
    engine.validate(&req).map_err(|e| e.to_string())
}

struct Slot {
    id: String,
    /// The limits the session was created with (each call is validated against them).
    overrides: LimitOverrides,
    owner: Option<String>,
    language: Language,
    created: Instant,
    created_at: SystemTime,
    ttl: Duration,
    state: Mutex<SlotState>,
}

struct SlotState {
    /// `None` while a call runs (the call holds it), or before it is built.
    session: Option<Session>,
    last_used: Instant,
    /// The kill switch of the running call.
    running: Option<KillSwitch>,
    /// Ended (deleted, expired): the running call closes the session when it returns.
    closed: bool,
    executions: u64,
    limits: Limits,
}

#[derive(Default)]
struct Table {
    slots: HashMap<String, Arc<Slot>>,
    shutting_down: bool,
}

/// Figures for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionStats {
    pub live: usize,
    pub created: u64,
    pub expired: u64,
    pub deleted: u64,
}

/// The live sessions of a server.
pub struct Sessions {
    engine: Engine,
    policy: SessionPolicy,
    table: Arc<Mutex<Table>>,
    stats: Arc<Mutex<SessionStats>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How often the reaper looks for expired sessions.
const REAP_EVERY: Duration = Duration::from_millis(500);

impl Sessions {
    /// The session table, and its reaper thread (which ends with the table).
    pub fn new(engine: Engine, policy: SessionPolicy) -> Arc<Sessions> {
        let sessions = Arc::new(Sessions {
            engine,
            policy,
            table: Arc::new(Mutex::new(Table::default())),
            stats: Arc::new(Mutex::new(SessionStats::default())),
        });
        let weak = Arc::downgrade(&sessions);
        let _ = std::thread::Builder::new()
            .name("runcell-session-reaper".into())
            .spawn(move || reaper(weak));
        sessions
    }

    pub fn policy(&self) -> &SessionPolicy {
        &self.policy
    }

    pub fn stats(&self) -> SessionStats {
        let mut s = *lock(&self.stats);
        s.live = lock(&self.table).slots.len();
        s
    }

    /// Create a session for `owner`. Blocking (it builds a sandbox).
    pub fn create(
        &self,
        owner: Option<&str>,
        req: &SessionRequest,
    ) -> Result<SessionInfo, SessionError> {
        let ttl = match req.ttl {
            None => self.policy.default_ttl,
            Some(t) if t.is_finite() && t > 0.0 => {
                let ttl = Duration::from_secs_f64(t.min(1e9));
                if ttl > self.policy.max_ttl {
                    return Err(SessionError::Invalid(format!(
                        "ttl is {t} s, above the maximum of {} s.",
                        self.policy.max_ttl.as_secs()
                    )));
                }
                ttl
            }
            Some(t) => {
                return Err(SessionError::Invalid(format!(
                    "ttl must be a positive number of seconds, not {t}."
                )))
            }
        };
        let v = self.engine.validate_session(req)?;
        // A place in the table first (so that the caps hold under concurrent creations), the
        // sandbox after, outside the lock.
        let slot = {
            let mut t = lock(&self.table);
            if t.shutting_down {
                return Err(SessionError::ShuttingDown);
            }
            if t.slots.len() >= self.policy.max_total {
                return Err(SessionError::TooMany(format!(
                    "The server has {} live sessions, its maximum. Delete a session or retry \
                     once one has expired.",
                    self.policy.max_total
                )));
            }
            // Sessions hold their memory and their (in-memory) disk while idle: together they
            // stay within what all runs may use, or the kernel would have to find the room by
            // killing runs of other keys.
            if let Some(budget) = self.engine.config().all_runs_memory_bytes {
                let held: u64 = t
                    .slots
                    .values()
                    .map(|s| {
                        let l = lock(&s.state).limits;
                        l.memory.0.saturating_add(l.disk.0)
                    })
                    .sum();
                let wanted = v.limits().memory.0.saturating_add(v.limits().disk.0);
                if held.saturating_add(wanted) > budget {
                    return Err(SessionError::TooMany(format!(
                        "The live sessions hold {} of memory and disk, and this one would \
                         need {} more: beyond what the server gives all runs together ({}). \
                         Delete a session, ask for less memory or disk, or retry once one has \
                         expired.",
                        crate::units::format_size(held),
                        crate::units::format_size(wanted),
                        crate::units::format_size(budget)
                    )));
                }
            }
            let mine = t
                .slots
                .values()
                .filter(|s| s.owner.as_deref() == owner)
                .count();
            if mine >= self.policy.max_per_owner {
                return Err(SessionError::TooMany(format!(
                    "This API key has {mine} live sessions, its maximum. Delete one \
                     (DELETE /v1/sessions/{{id}}) or wait until one expires."
                )));
            }
            let slot = Arc::new(Slot {
                id: new_id(),
                overrides: req.exec.limits,
                owner: owner.map(str::to_string),
                language: v.language(),
                created: Instant::now(),
                created_at: SystemTime::now(),
                ttl,
                state: Mutex::new(SlotState {
                    session: None,
                    last_used: Instant::now(),
                    running: None,
                    closed: false,
                    executions: 0,
                    limits: *v.limits(),
                }),
            });
            t.slots.insert(slot.id.clone(), slot.clone());
            slot
        };
        // Busy while it is built: no call, file operation or reaper touches it meanwhile.
        lock(&slot.state).running = KillSwitch::new().ok();
        let opened = self
            .engine
            .open_session(&v, req.exec.limits, self.policy.max_lifetime);
        let mut st = lock(&slot.state);
        st.running = None;
        match opened {
            Ok(session) if !st.closed => {
                st.session = Some(session);
                st.last_used = Instant::now();
                drop(st);
                lock(&self.stats).created += 1;
                Ok(self.info(&slot))
            }
            Ok(session) => {
                drop(st);
                session.close();
                Err(SessionError::ShuttingDown)
            }
            Err(verdict) => {
                drop(st);
                lock(&self.table).slots.remove(&slot.id);
                Err(SessionError::Failed(verdict))
            }
        }
    }

    fn find(&self, owner: Option<&str>, id: &str) -> Result<Arc<Slot>, SessionError> {
        let t = lock(&self.table);
        match t.slots.get(id) {
            Some(s) if s.owner.as_deref() == owner => Ok(s.clone()),
            _ => Err(SessionError::NotFound(
                crate::request::prefix(id, 64).to_string(),
            )),
        }
    }

    /// Describe a session.
    pub fn get(&self, owner: Option<&str>, id: &str) -> Result<SessionInfo, SessionError> {
        let slot = self.find(owner, id)?;
        Ok(self.info(&slot))
    }

    /// The caller's live sessions.
    pub fn list(&self, owner: Option<&str>) -> Vec<SessionInfo> {
        let slots: Vec<Arc<Slot>> = lock(&self.table)
            .slots
            .values()
            .filter(|s| s.owner.as_deref() == owner)
            .cloned()
            .collect();
        let mut out: Vec<SessionInfo> = slots.iter().map(|s| self.info(s)).collect();
        out.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        out
    }

    fn info(&self, slot: &Slot) -> SessionInfo {
        let st = lock(&slot.state);
        let idle_end = st.last_used + slot.ttl;
        let life_end = slot.created + self.policy.max_lifetime;
        let end = idle_end.min(life_end);
        let expires = SystemTime::now() + end.saturating_duration_since(Instant::now());
        SessionInfo {
            id: slot.id.clone(),
            language: slot.language.name().to_string(),
            created_at: rfc3339(slot.created_at),
            expires_at: rfc3339(expires),
            ttl: slot.ttl.as_secs_f64(),
            execution_count: st.executions,
            busy: st.running.is_some(),
            limits: st.limits,
        }
    }

    /// Take the session out of its slot for an operation (`Busy` while another runs).
    fn checkout(
        &self,
        owner: Option<&str>,
        id: &str,
        cancel: Option<&KillSwitch>,
    ) -> Result<(Arc<Slot>, Session), SessionError> {
        let slot = self.find(owner, id)?;
        let mut st = lock(&slot.state);
        if st.closed {
            return Err(SessionError::NotFound(id.to_string()));
        }
        let Some(session) = st.session.take() else {
            return Err(SessionError::Busy);
        };
        st.running = Some(match cancel {
            Some(k) => k.clone(),
            None => KillSwitch::new().map_err(|_| SessionError::Busy)?,
        });
        drop(st);
        Ok((slot, session))
    }

    /// Put the session back after an operation (or close it, if it ended meanwhile).
    fn checkin(&self, slot: &Slot, session: Session) {
        let mut st = lock(&slot.state);
        st.running = None;
        st.last_used = Instant::now();
        st.executions = session.execution_count();
        if st.closed {
            drop(st);
            session.close();
        } else {
            st.session = Some(session);
        }
    }

    /// Check a call against its session before it waits for anything (a front end that
    /// streams answers 400 for an invalid call rather than an error event). Cheap: no sandbox
    /// is touched, and a busy session is checked too.
    pub fn check_call(
        &self,
        owner: Option<&str>,
        id: &str,
        cell: &CellRequest,
    ) -> Result<(), SessionError> {
        let slot = self.find(owner, id)?;
        validate_call(&self.engine, slot.language, &slot.overrides, cell)
            .map(drop)
            .map_err(SessionError::Invalid)
    }

    /// Run one call in a session. Blocking. The verdict carries `session_id`.
    pub fn execute(
        &self,
        owner: Option<&str>,
        id: &str,
        cell: &CellRequest,
        sink: &mut dyn OutputSink,
        cancel: Option<&KillSwitch>,
    ) -> Result<Verdict, SessionError> {
        let (slot, mut session) = self.checkout(owner, id, cancel)?;
        let valid = match session.validate(&self.engine, cell) {
            Ok(v) => v,
            Err(e) => {
                self.checkin(&slot, session);
                return Err(SessionError::Invalid(e));
            }
        };
        let mut verdict = session.execute(&self.engine, &valid, sink, cancel);
        verdict.session_id = Some(slot.id.clone());
        self.checkin(&slot, session);
        Ok(verdict)
    }

    /// Run a one-shot shaped request in a session: `New` creates one with the request's
    /// language and limits first. The request's files are written for this call. Blocking.
    pub fn run_request(
        &self,
        owner: Option<&str>,
        target: &SessionTarget,
        req: &ExecRequest,
        sink: &mut dyn OutputSink,
        cancel: Option<&KillSwitch>,
    ) -> Result<Verdict, SessionError> {
        let id = match target {
            SessionTarget::Id(id) => {
                let info = self.get(owner, id)?;
                let asked = Language::parse(&req.language).map(Language::name);
                if asked != Some(info.language.as_str()) {
                    return Err(SessionError::Invalid(format!(
                        "Session {id} is a {} session: run its code with the {} tool, or start                          a new session (session_id \"new\").",
                        info.language, info.language
                    )));
                }
                id.clone()
            }
            SessionTarget::New => {
                let mut exec = req.clone();
                exec.code = String::new();
                exec.stdin = None;
                exec.files = Vec::new();
                let created = self.create(owner, &SessionRequest { exec, ttl: None })?;
                created.id
            }
        };
        let cell = CellRequest {
            code: req.code.clone(),
            stdin: req.stdin.clone(),
            files: req.files.clone(),
            timeout: req.limits.timeout,
        };
        self.execute(owner, &id, &cell, sink, cancel)
    }

    /// [`Sessions::run_request`] on a blocking thread, from async code: `kill` fires when the
    /// returned future is dropped (a cancelled call interrupts the session's cell); `hold` is
    /// dropped once the call is over, and `finish` sees its result there.
    #[allow(clippy::too_many_arguments)] // (each is one thing the caller owns and hands over)
    pub async fn run_request_blocking<H, F>(
        self: &Arc<Self>,
        owner: Option<String>,
        target: SessionTarget,
        req: ExecRequest,
        mut sink: Box<dyn OutputSink + Send>,
        kill: KillSwitch,
        hold: H,
        finish: F,
    ) -> Result<Verdict, SessionError>
    where
        H: Send + 'static,
        F: FnOnce(&Result<Verdict, SessionError>) + Send + 'static,
    {
        let mut guard = kill.kill_on_drop();
        let sessions = self.clone();
        let span = tracing::Span::current();
        let r = tokio::task::spawn_blocking(move || {
            let _span = span.enter();
            let _hold = hold;
            let r = sessions.run_request(owner.as_deref(), &target, &req, &mut *sink, Some(&kill));
            drop(sink);
            finish(&r);
            r
        })
        .await
        .unwrap_or_else(|_| {
            Err(SessionError::Failed(Box::new(Verdict::failed(
                ErrorCategory::SandboxFailure,
                "The session call failed unexpectedly.",
            ))))
        });
        guard.disarm();
        r
    }

    /// The files of a session's /workspace.
    pub fn list_files(
        &self,
        owner: Option<&str>,
        id: &str,
    ) -> Result<WorkspaceListing, SessionError> {
        let (slot, mut session) = self.checkout(owner, id, None)?;
        let r = session.list_files(&self.engine);
        self.checkin(&slot, session);
        r.map_err(SessionError::Failed)
    }

    /// One file of a session's /workspace (`Ok(None)`: no such file).
    pub fn read_file(
        &self,
        owner: Option<&str>,
        id: &str,
        path: &str,
    ) -> Result<Option<Vec<u8>>, SessionError> {
        let (slot, mut session) = self.checkout(owner, id, None)?;
        let r = session.read_file(&self.engine, path);
        self.checkin(&slot, session);
        r.map_err(SessionError::Invalid)
    }

    /// Write one file into a session's /workspace.
    pub fn write_file(
        &self,
        owner: Option<&str>,
        id: &str,
        path: &str,
        data: &[u8],
    ) -> Result<(), SessionError> {
        let (slot, mut session) = self.checkout(owner, id, None)?;
        let r = session.write_file(&self.engine, path, data);
        self.checkin(&slot, session);
        r
    }

    /// End a session now (a running call is killed first). Blocking (the sandbox is torn down
    /// before this returns, unless a call still holds it: then when that call returns).
    pub fn delete(&self, owner: Option<&str>, id: &str) -> Result<(), SessionError> {
        let slot = self.find(owner, id)?;
        lock(&self.table).slots.remove(&slot.id);
        lock(&self.stats).deleted += 1;
        end(&slot);
        Ok(())
    }

    /// End every session (server shutdown); new ones are refused from now on.
    pub fn close_all(&self) {
        let slots: Vec<Arc<Slot>> = {
            let mut t = lock(&self.table);
            t.shutting_down = true;
            t.slots.drain().map(|(_, s)| s).collect()
        };
        for slot in slots {
            end(&slot);
        }
    }

    /// End the sessions that expired (idle past their TTL, or past the maximum lifetime).
    fn reap(&self) {
        let now = Instant::now();
        let expired: Vec<Arc<Slot>> = {
            let mut t = lock(&self.table);
            let ids: Vec<String> = t
                .slots
                .values()
                .filter(|s| {
                    let st = lock(&s.state);
                    let idle = st.running.is_none() && now >= st.last_used + s.ttl;
                    let old = now >= s.created + self.policy.max_lifetime;
                    idle || old
                })
                .map(|s| s.id.clone())
                .collect();
            ids.iter().filter_map(|id| t.slots.remove(id)).collect()
        };
        if expired.is_empty() {
            return;
        }
        lock(&self.stats).expired += expired.len() as u64;
        for slot in expired {
            tracing::info!(session = %slot.id, "session expired");
            end(&slot);
        }
    }
}

impl Drop for Sessions {
    fn drop(&mut self) {
        self.close_all();
    }
}

/// Close a slot's session, or have its running call close it when it returns.
fn end(slot: &Slot) {
    let mut st = lock(&slot.state);
    st.closed = true;
    if let Some(k) = &st.running {
        k.trigger();
    }
    let session = st.session.take();
    drop(st);
    if let Some(s) = session {
        s.close();
    }
}

fn reaper(sessions: Weak<Sessions>) {
    loop {
        std::thread::sleep(REAP_EVERY);
        let Some(s) = sessions.upgrade() else { return };
        s.reap();
    }
}

/// A new session id: `ses_` and 128 random bits in hex.
fn new_id() -> String {
    let mut b = [0u8; 16];
    let _ = rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty());
    format!("ses_{}", crate::to_hex(&b))
}

/// `t` as RFC 3339 in UTC, to the second.
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        assert_eq!(rfc3339(t), "2026-11-18T11:06:40Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn session_requests_parse() {
        let r: SessionRequest =
            serde_json::from_str(r#"{"language":"python","ttl":60,"memory":"512M","timeout":5}"#)
                .unwrap();
        assert_eq!(r.ttl, Some(60.0));
        assert_eq!(r.exec.limits.memory, Some(crate::limits::Bytes(512 << 20)));
        assert!(
            serde_json::from_str::<SessionRequest>(r#"{"language":"python","code":"x"}"#)
                .unwrap_err()
                .to_string()
                .contains("without code")
        );
        assert!(
            serde_json::from_str::<SessionRequest>(r#"{"language":"python","bogus":1}"#).is_err()
        );
        let c: CellRequest =
            serde_json::from_str(r#"{"code":"x = 1","timeout":"2s","stdin":"a"}"#).unwrap();
        assert_eq!(c.timeout, Some(Millis(2000)));
        assert_eq!(c.stdin.as_deref(), Some("a"));
        assert!(serde_json::from_str::<CellRequest>(r#"{"code":"x","memory":"1G"}"#).is_err());
        assert!(serde_json::from_str::<CellRequest>(r#"{"stdin":"x"}"#).is_err());
    }
}
