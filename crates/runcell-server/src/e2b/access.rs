//! The data plane's routing and authentication. The SDKs send every sandbox request to one
//! base URL and name the sandbox by `E2b-Sandbox-Id`; they prove it with the per-sandbox
//! token issued at creation: `X-Access-Token` (envd and `/execute`) or
//! `E2B-Traffic-Access-Token` (the interpreter, including `/contexts`, which carries no
//! access token). These requests carry no API key: the token is the credential, and it is
//! the sandbox's own, so another sandbox's token never opens this one. A client that sends
//! no sandbox id (Python `e2b` before 2.25.1 after `connect`) is routed by its token.
//!
//! The caller of what such a request runs is the key that owns the sandbox: its runs are
//! admitted, counted and audited as that key's.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, StatusCode};
use runcell_core::Caller;

use super::{E2bError, Sandbox};
use crate::state::AppState;

/// The header that names the sandbox.
pub const SANDBOX_ID: &str = "e2b-sandbox-id";
/// The envd token's header.
pub const ACCESS_TOKEN: &str = "x-access-token";
/// The traffic token's header.
pub const TRAFFIC_TOKEN: &str = "e2b-traffic-access-token";

/// A data-plane request whose sandbox is found and whose token is that sandbox's.
pub struct SandboxRequest {
    pub sandbox: Arc<Sandbox>,
    /// The sandbox's owner, as the run service knows callers.
    pub caller: Caller,
    pub headers: HeaderMap,
    pub query: Option<String>,
    pub body: Body,
    /// Where the place in line is kept until the response is delivered.
    hold: Option<runcell_core::Hold>,
}

/// What a sandbox that is not (or no longer) here answers: E2B's proxy answers 502 for a
/// sandbox that is not running, which the SDKs read as "not running" (`is_running()` is
/// false).
fn gone() -> E2bError {
    E2bError::new(
        StatusCode::BAD_GATEWAY,
        "The sandbox is not running: it was killed, timed out, or never existed.",
    )
}

fn unauthenticated() -> E2bError {
    E2bError::new(
        StatusCode::UNAUTHORIZED,
        "This sandbox request needs the sandbox's access token (X-Access-Token, as issued \
         when the sandbox was created; the code interpreter's routes also take its \
         E2B-Traffic-Access-Token).",
    )
}

/// Whether `path` (within the E2B door) is the code interpreter's: `/execute` and
/// `/contexts...`, the only routes the traffic token opens.
pub fn interpreter_path(path: &str) -> bool {
    path.ends_with("/execute") || path.contains("/contexts")
}

/// Find and authenticate the sandbox a request is for. The traffic token opens only the code
/// interpreter's routes (`traffic_ok`), where the SDKs send it (`/contexts` carries nothing
/// else); files, the filesystem and processes need the sandbox's access token. On E2B the
/// traffic token is the one shared more widely (for traffic to the sandbox's ports): it must
/// not hand over the sandbox's files and commands.
pub fn authenticate(
    state: &AppState,
    headers: &HeaderMap,
    traffic_ok: bool,
) -> Result<Arc<Sandbox>, E2bError> {
    let registry = &state.inner.e2b;
    let access = headers.get(ACCESS_TOKEN).map(|v| v.as_bytes().trim_ascii());
    let traffic = headers
        .get(TRAFFIC_TOKEN)
        .map(|v| v.as_bytes().trim_ascii())
        .filter(|_| traffic_ok);
    let named = headers
        .get(SANDBOX_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    let sandbox = match named {
        Some(id) => registry
            .find(id)
            .ok_or_else(|| super::missing(state, id, gone()))?,
        None => access
            .or(traffic)
            .and_then(|t| registry.by_token(t))
            .ok_or_else(unauthenticated)?,
    };
    let ok = access.is_some_and(|t| sandbox.envd_token_is(t))
        | traffic.is_some_and(|t| sandbox.traffic_token_is(t));
    if !ok {
        return Err(unauthenticated());
    }
    Ok(sandbox)
}

/// The caller a sandbox's runs are counted and audited as.
pub fn caller_for(parts: &axum::http::request::Parts, sandbox: &Sandbox) -> Caller {
    let mut c = crate::extract::caller_of(parts, "e2b");
    c.key_id = sandbox.owner.clone();
    c
}

impl FromRequest<AppState> for SandboxRequest {
    type Rejection = E2bError;

    async fn from_request(req: Request, state: &AppState) -> Result<SandboxRequest, E2bError> {
        let (parts, body) = req.into_parts();
        let traffic_ok = interpreter_path(parts.uri.path());
        let sandbox = authenticate(state, &parts.headers, traffic_ok).inspect_err(|e| {
            state
                .inner
                .metrics
                .rejected(if e.status == StatusCode::UNAUTHORIZED {
                    "unauthorized"
                } else {
                    "not_found"
                })
        })?;
        // The connection carried a sandbox's token: it may stay open like a keyed one.
        if let Some(a) = parts.extensions.get::<crate::connections::Authenticated>() {
            a.mark();
        }
        let caller = caller_for(&parts, &sandbox);
        // A sandbox whose session ended (expired, killed by the server) is gone.
        if state.service().session(&caller, &sandbox.session).is_err() {
            state.inner.e2b.remove(&sandbox.id);
            return Err(gone());
        }
        Ok(SandboxRequest {
            sandbox,
            caller,
            hold: parts.extensions.get::<runcell_core::Hold>().cloned(),
            headers: parts.headers,
            query: parts.uri.query().map(str::to_string),
            body,
        })
    }
}

impl SandboxRequest {
    /// A place in line, then the body (at most `limit` bytes, within the body budget; a JSON
    /// body also holds what parsing it costs).
    pub async fn reserve_and_read(
        &mut self,
        state: &AppState,
        limit: usize,
        json: bool,
    ) -> Result<(runcell_core::Ticket, axum::body::Bytes), E2bError> {
        let ticket = state.service().reserve(&self.caller)?;
        // The place is kept until the response is delivered, as `Reserved` keeps it: a file
        // or a run's lines waiting for a client that reads slowly hold memory.
        if let Some(hold) = &self.hold {
            hold.keep(&ticket);
        }
        let body = std::mem::take(&mut self.body);
        let bytes = crate::extract::read_body(body, &self.headers, limit, &ticket).await?;
        if json {
            ticket.take_parse_bytes(&bytes)?;
        }
        Ok((ticket, bytes))
    }
}
