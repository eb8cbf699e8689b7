//! The E2B-compatible door: the official E2B SDKs (`e2b`, `e2b-code-interpreter` on PyPI,
//! `e2b` and `@e2b/code-interpreter` on npm) work against `runcell serve` with
//! `E2B_API_URL=E2B_SANDBOX_URL=http://HOST:PORT/e2b` and `E2B_API_KEY=<a runcell key>`.
//!
//! An E2B sandbox is a runcell Python **session**, created and called through core's one
//! intake and run service like any other door's (no admission or request type of its own);
//! this door only translates the wire formats:
//!
//! * [`control`]: the control plane (`/sandboxes`, `/v2/sandboxes`), behind the server's API
//!   keys like `/v1`; a sandbox belongs to the key that created it.
//! * [`access`]: the data plane's routing and authentication: every sandbox request comes to
//!   the same URL, names its sandbox by `E2b-Sandbox-Id` and proves it by the per-sandbox
//!   token issued at creation (`X-Access-Token`, `E2B-Traffic-Access-Token`), not by the API
//!   key.
//! * [`connect`]: the JSON Connect subset the sandbox daemon (envd) speaks.
//! * [`envd`]: the daemon's calls: files (`/files`, `filesystem.Filesystem/*`), processes
//!   (`process.Process/*`), `/health`.
//! * [`interpreter`]: the code interpreter's `/execute` (NDJSON) and `/contexts`.
//!
//! The sandbox's files are its session's /workspace; the SDKs name them under `/home/user`
//! (E2B's working directory), and this door maps one onto the other ([`workspace_path`]).

pub mod access;
pub mod connect;
pub mod control;
pub mod envd;
pub mod interpreter;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::http::header::{HeaderValue, RETRY_AFTER};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde_json::json;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::state::AppState;

/// The daemon version sandboxes report. The SDKs parse it (PEP 440) and choose features by
/// it: 0.4.0 is the first without HTTP Basic users, and below 0.5.7, so uploads come as
/// multipart (this door takes no octet-stream or gzip uploads), below 0.6.2 (no file
/// metadata headers) and without the watch features of 0.6.3+.
pub const ENVD_VERSION: &str = "0.4.0";

/// E2B's home directory, where the SDKs put files by default; the session's /workspace.
pub const HOME: &str = "/home/user";

/// The templates a sandbox may be created from (both are runcell's Python session).
pub const TEMPLATES: &[&str] = &["code-interpreter-v1", "base"];

/// How many sandboxes the door keeps at most (the sessions' own caps are far lower; this
/// bounds the table even if sessions were configured without caps).
pub const MAX_SANDBOXES: usize = 4096;

/// One sandbox: its session, its owner and its tokens.
pub struct Sandbox {
    /// `^[a-z0-9]+$` (the session id's random part).
    pub id: String,
    pub session: String,
    pub owner: Option<String>,
    pub template: String,
    pub metadata: BTreeMap<String, String>,
    /// The tokens: handed out again on `connect` (as E2B does), compared in constant time,
    /// never logged.
    envd_token: String,
    traffic_token: String,
    /// The commands running in it (`process.Process/Start`), by the pid the door gave them,
    /// with their kill switches (`SendSignal`). A session runs one call at a time, so this
    /// holds at most one.
    pub(crate) commands: Mutex<HashMap<u32, runcell_core::KillSwitch>>,
    pub(crate) next_pid: std::sync::atomic::AtomicU32,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("id", &self.id)
            .field("session", &self.session)
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

fn digest(b: &[u8]) -> [u8; 32] {
    Sha256::digest(b).into()
}

fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    // getrandom(2) on Linux fails only on bad arguments; an all-zero token is still refused
    // below, so a failure cannot issue a guessable one.
    let _ = rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty());
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A token the door hands out: 256 random bits.
pub(crate) fn new_token() -> Option<String> {
    let t = random_hex(32);
    (t.bytes().any(|b| b != b'0')).then_some(t)
}

impl Sandbox {
    pub(crate) fn new(
        session: String,
        owner: Option<String>,
        template: String,
        metadata: BTreeMap<String, String>,
        envd_token: &str,
        traffic_token: &str,
    ) -> Sandbox {
        Sandbox {
            id: sandbox_id(&session),
            session,
            owner,
            template,
            metadata,
            envd_token: envd_token.to_string(),
            traffic_token: traffic_token.to_string(),
            commands: Mutex::new(HashMap::new()),
            next_pid: std::sync::atomic::AtomicU32::new(1000),
        }
    }

    pub(crate) fn envd_token(&self) -> &str {
        &self.envd_token
    }

    pub(crate) fn traffic_token(&self) -> &str {
        &self.traffic_token
    }

    /// Whether `token` is this sandbox's envd (`X-Access-Token`) token.
    pub fn envd_token_is(&self, token: &[u8]) -> bool {
        // Digests of both sides: equal lengths, so neither the content nor the length of
        // the token shows in the time taken.
        digest(self.envd_token.as_bytes())
            .ct_eq(&digest(token))
            .into()
    }

    /// Whether `token` is this sandbox's traffic (`E2B-Traffic-Access-Token`) token.
    pub fn traffic_token_is(&self, token: &[u8]) -> bool {
        digest(self.traffic_token.as_bytes())
            .ct_eq(&digest(token))
            .into()
    }
}

/// The sandbox id of a session: the session id itself, which is lowercase letters and digits
/// (E2B's alphabet), at most 57 characters (runcell_core::cluster), so that
/// `{port}-{sandboxID}` is one DNS label; and a request for a sandbox of another server is
/// forwarded like one for its session. (Anything else is filtered to those characters.)
pub fn sandbox_id(session: &str) -> String {
    session
        .chars()
        .filter(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        .collect()
}

/// What a sandbox that is not here answers: `session_lost` (410) when its id says it was
/// created by this server before a restart, else `otherwise`.
pub(crate) fn missing(state: &AppState, id: &str, otherwise: E2bError) -> E2bError {
    match state.sessions().ids().owner(id) {
        runcell_core::cluster::Owner::Restarted => runcell_core::RunError::session_lost(id).into(),
        _ => otherwise,
    }
}

/// The door's sandboxes. Each is its session: an entry whose session has ended (deleted,
/// expired, the server's own reaper) is dropped the next time the table is pruned, and
/// nothing else lives here (the session registry owns and bounds the sandboxes).
#[derive(Default)]
pub struct Registry(Mutex<HashMap<String, Arc<Sandbox>>>);

impl Registry {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Sandbox>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn insert(&self, sandbox: Sandbox) -> Result<Arc<Sandbox>, E2bError> {
        let mut t = self.lock();
        if t.len() >= MAX_SANDBOXES {
            return Err(E2bError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "Too many sandboxes: kill some first.",
            ));
        }
        let s = Arc::new(sandbox);
        t.insert(s.id.clone(), s.clone());
        Ok(s)
    }

    /// The sandbox `id`, if `owner` owns it (another key's sandbox does not exist).
    pub fn get(&self, owner: Option<&str>, id: &str) -> Option<Arc<Sandbox>> {
        self.lock()
            .get(id)
            .filter(|s| s.owner.as_deref() == owner)
            .cloned()
    }

    /// The sandbox `id` whoever owns it (the data plane, which then checks its token).
    pub fn find(&self, id: &str) -> Option<Arc<Sandbox>> {
        self.lock().get(id).cloned()
    }

    /// The sandbox whose envd or traffic token `token` is (clients that send no
    /// `E2b-Sandbox-Id`). Every sandbox is compared, whatever matched.
    pub fn by_token(&self, token: &[u8]) -> Option<Arc<Sandbox>> {
        let mut found = None;
        for s in self.lock().values() {
            let hit = s.envd_token_is(token) | s.traffic_token_is(token);
            if hit && found.is_none() {
                found = Some(s.clone());
            }
        }
        found
    }

    pub fn remove(&self, id: &str) -> Option<Arc<Sandbox>> {
        self.lock().remove(id)
    }

    /// `owner`'s sandboxes.
    pub fn of(&self, owner: Option<&str>) -> Vec<Arc<Sandbox>> {
        self.lock()
            .values()
            .filter(|s| s.owner.as_deref() == owner)
            .cloned()
            .collect()
    }

    /// Drop the sandboxes whose sessions `live` no longer has.
    pub fn prune(&self, live: impl Fn(&Sandbox) -> bool) {
        self.lock().retain(|_, s| live(s));
    }
}

/// How long a sandbox call waits for the call before it to end.
pub const BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Wait (at most [`BUSY_WAIT`]) until the sandbox's session runs no call. A session runs one
/// call at a time, and an E2B client does not expect "busy": a command it stopped waiting for
/// (its deadline passed, its stream dropped) is still being ended when its next call comes.
pub(crate) async fn wait_until_free(
    state: &AppState,
    caller: &runcell_core::Caller,
    session: &str,
) -> Result<(), E2bError> {
    let deadline = tokio::time::Instant::now() + BUSY_WAIT;
    while state.service().session(caller, session)?.busy && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    Ok(())
}

/// An error as the E2B API answers it: a status and `{"code": <status>, "message"}`.
#[derive(Debug, Clone)]
pub struct E2bError {
    pub status: StatusCode,
    pub message: String,
    pub retry_after: Option<u32>,
}

impl E2bError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> E2bError {
        E2bError {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn invalid(message: impl Into<String>) -> E2bError {
        E2bError::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn not_found(what: &str) -> E2bError {
        E2bError::new(
            StatusCode::NOT_FOUND,
            format!(
                "No sandbox {}: it does not exist, has ended, or belongs to another API key.",
                what.chars().take(64).collect::<String>()
            ),
        )
    }
}

impl From<runcell_core::RunError> for E2bError {
    fn from(e: runcell_core::RunError) -> E2bError {
        E2bError {
            status: StatusCode::from_u16(e.kind.status())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            message: e.message,
            retry_after: e.kind.retry_after(),
        }
    }
}

impl From<crate::error::ApiError> for E2bError {
    fn from(e: crate::error::ApiError) -> E2bError {
        E2bError {
            status: e.status,
            message: e.message,
            retry_after: e.retry_after,
        }
    }
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let mut res = (
            self.status,
            Json(json!({"code": self.status.as_u16(), "message": self.message})),
        )
            .into_response();
        if let Some(s) = self.retry_after {
            res.headers_mut().insert(RETRY_AFTER, HeaderValue::from(s));
        }
        res
    }
}

/// Why a path the SDK names is not in the sandbox's files.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error(
        "{0:?} is outside {HOME}: an E2B sandbox here has only its home directory (its session's \
         /workspace); name files under {HOME}"
    )]
    Outside(String),
    #[error("{0}")]
    Invalid(String),
}

/// The path below the session's /workspace that an SDK path names: `/home/user/a/b`, `a/b`
/// and `~/a/b` all name `a/b`; `/home/user` itself is `""`. Anything else (another root,
/// `..` out of it) is refused.
pub fn workspace_path(path: &str) -> Result<String, PathError> {
    let shown = || path.chars().take(200).collect::<String>();
    let rel = if let Some(rest) = path.strip_prefix(HOME) {
        if !(rest.is_empty() || rest.starts_with('/')) {
            return Err(PathError::Outside(shown()));
        }
        rest.trim_start_matches('/')
    } else if let Some(rest) = path.strip_prefix("~") {
        if !(rest.is_empty() || rest.starts_with('/')) {
            return Err(PathError::Outside(shown()));
        }
        rest.trim_start_matches('/')
    } else if path.starts_with('/') {
        return Err(PathError::Outside(shown()));
    } else {
        path
    };
    let rel = rel.trim_end_matches('/');
    if rel.is_empty() || rel == "." {
        return Ok(String::new());
    }
    runcell_core::request::workspace_path(rel).map_err(|e| PathError::Invalid(e.to_string()))
}

/// The SDK's name of a workspace path.
pub fn home_path(rel: &str) -> String {
    if rel.is_empty() {
        HOME.to_string()
    } else {
        format!("{HOME}/{rel}")
    }
}

/// A route of the door: its path (under `/e2b`), its methods, and their handlers.
type Route = (
    &'static str,
    &'static [&'static str],
    axum::routing::MethodRouter<AppState>,
);

/// The control plane (E2B's API), behind the API keys. The router is built from this table,
/// and the generated reference (`runcell __reference names`) lists it.
fn control_routes() -> [Route; 9] {
    [
        (
            "/sandboxes",
            &["GET", "POST"],
            post(control::create).get(control::list_v1),
        ),
        (
            "/v2/sandboxes",
            &["GET", "POST"],
            post(control::create).get(control::list),
        ),
        (
            "/sandboxes/{id}",
            &["DELETE", "GET"],
            get(control::info).delete(control::kill),
        ),
        ("/sandboxes/{id}/connect", &["POST"], post(control::connect)),
        (
            "/v2/sandboxes/{id}/connect",
            &["POST"],
            post(control::connect),
        ),
        (
            "/sandboxes/{id}/timeout",
            &["POST"],
            post(control::set_timeout),
        ),
        ("/sandboxes/{id}/pause", &["POST"], post(control::pause)),
        ("/sandboxes/{id}/resume", &["POST"], post(control::resume)),
        ("/sandboxes/{id}/fork", &["POST"], post(control::fork)),
    ]
}

/// The data plane (envd and the code interpreter), behind the sandboxes' tokens.
fn data_routes() -> [Route; 8] {
    [
        ("/health", &["GET"], get(envd::health)),
        (
            "/files",
            &["GET", "POST"],
            get(envd::read_file).post(envd::write_file),
        ),
        (
            "/filesystem.Filesystem/{method}",
            &["POST"],
            post(envd::filesystem),
        ),
        ("/process.Process/{method}", &["POST"], post(envd::process)),
        ("/execute", &["POST"], post(interpreter::execute)),
        (
            "/contexts",
            &["GET", "POST"],
            get(interpreter::list_contexts).post(interpreter::create_context),
        ),
        (
            "/contexts/{id}",
            &["DELETE"],
            delete(interpreter::delete_context),
        ),
        (
            "/contexts/{id}/restart",
            &["POST"],
            post(interpreter::restart_context),
        ),
    ]
}

/// Every route of the door, as `/e2b/...` paths with their methods.
pub fn routes() -> Vec<(String, Vec<&'static str>)> {
    control_routes()
        .into_iter()
        .chain(data_routes())
        .map(|(path, methods, _)| (format!("/e2b{path}"), methods.to_vec()))
        .collect()
}

/// The door's routes, mounted at `/e2b`: the control plane behind the API keys, the data
/// plane behind the sandboxes' tokens.
pub fn router(state: &AppState) -> Router<AppState> {
    let control = control_routes()
        .into_iter()
        .fold(Router::new(), |r, (path, _, handlers)| {
            r.route(path, handlers)
        })
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::auth::require_key,
        ))
        .layer(axum::middleware::map_response(control::e2b_errors));
    let data = data_routes()
        .into_iter()
        .fold(Router::new(), |r, (path, _, handlers)| {
            r.route(path, handlers)
        });
    Router::new().merge(control).merge(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sdk_paths_map_onto_the_workspace() {
        assert_eq!(workspace_path("/home/user/a.txt").unwrap(), "a.txt");
        assert_eq!(workspace_path("/home/user/d/b.bin").unwrap(), "d/b.bin");
        assert_eq!(workspace_path("/home/user").unwrap(), "");
        assert_eq!(workspace_path("/home/user/").unwrap(), "");
        assert_eq!(workspace_path("a.txt").unwrap(), "a.txt");
        assert_eq!(workspace_path("~/a.txt").unwrap(), "a.txt");
        assert_eq!(workspace_path(".").unwrap(), "");
        for bad in [
            "/etc/passwd",
            "/home/username/x",
            "/home/user/../x",
            "../x",
            "/",
            "~root",
        ] {
            assert!(workspace_path(bad).is_err(), "{bad}");
        }
        assert_eq!(home_path("a/b"), "/home/user/a/b");
        assert_eq!(home_path(""), "/home/user");
    }

    #[test]
    fn sandbox_ids_are_dns_label_characters() {
        assert_eq!(sandbox_id("ses0a1b"), "ses0a1b");
        assert!(sandbox_id("ses_Ab-_.9")
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()));
    }

    #[test]
    fn tokens_are_per_sandbox() {
        let r = Registry::default();
        let a = r
            .insert(Sandbox::new(
                "sesaa".into(),
                Some("k1".into()),
                "base".into(),
                BTreeMap::new(),
                "ta",
                "tta",
            ))
            .unwrap();
        r.insert(Sandbox::new(
            "sesbb".into(),
            Some("k2".into()),
            "base".into(),
            BTreeMap::new(),
            "tb",
            "ttb",
        ))
        .unwrap();
        assert!(a.envd_token_is(b"ta"));
        assert!(!a.envd_token_is(b"tb"));
        assert!(
            !a.envd_token_is(b"tta"),
            "the traffic token is not the envd token"
        );
        assert!(a.traffic_token_is(b"tta"));
        assert_eq!(r.by_token(b"tb").unwrap().id, "sesbb");
        assert_eq!(r.by_token(b"ttb").unwrap().id, "sesbb");
        assert!(r.by_token(b"nope").is_none());
        assert!(
            r.get(Some("k2"), "sesaa").is_none(),
            "another key's sandbox does not exist"
        );
        assert!(r.get(Some("k1"), "sesaa").is_some());
        r.prune(|s| s.id != "sesaa");
        assert!(r.find("sesaa").is_none());
        assert!(new_token().unwrap().len() == 64);
    }
}
