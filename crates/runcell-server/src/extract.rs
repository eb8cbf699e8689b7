//! The extractors every handler takes its caller and its body through, so that no handler can
//! read a body before the request's place in line is reserved.
//!
//! * [`Requester`] (from the request's parts): who is asking, as the run service and the
//!   audit log know them.
//! * [`Reserved`]: a place in line ([`Ticket`]), taken before anything of the body is read
//!   (429 when the server, or the caller's share of it, is full), and the body, which can only
//!   be read through [`Reserved::read`]: within the body cap (413), a deadline (408) and the
//!   ticket's share of the body budget (429). A handler may check what it can before reading
//!   (a file upload checks that its session exists).
//! * [`Unlined`]: the same for a request that is not a run (an approval's decision): its
//!   body is read within the body budget, without a place in line.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header::CONTENT_LENGTH;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use runcell_core::{Caller, Ticket};

use crate::error::ApiError;
use crate::state::AppState;

/// How long a request body may take to arrive.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Who is calling, from what the middleware put in the request's extensions (its id, the
/// peer, the API key's id).
pub fn caller_of(parts: &Parts, interface: &'static str) -> Caller {
    let meta = parts.extensions.get::<crate::middleware::RequestMeta>();
    Caller {
        request_id: meta.map(|m| m.request_id.clone()).unwrap_or_default(),
        key_id: parts
            .extensions
            .get::<crate::auth::KeyId>()
            .and_then(|k| k.0.clone()),
        interface,
        peer: meta.and_then(|m| m.peer),
        credential: crate::auth::credential(&parts.headers),
    }
}

/// The caller of a request that carries no body to reserve a place for.
pub struct Requester(pub Caller);

impl<S: Send + Sync> FromRequestParts<S> for Requester {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Requester, Self::Rejection> {
        Ok(Requester(caller_of(parts, "http")))
    }
}

/// A request with its place in line, and its body not yet read.
pub struct Reserved {
    pub caller: Caller,
    pub ticket: Ticket,
    pub headers: HeaderMap,
    body: Option<Body>,
    state: AppState,
}

impl FromRequest<AppState> for Reserved {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Reserved, ApiError> {
        let (parts, body) = req.into_parts();
        let caller = caller_of(&parts, "http");
        let ticket = state.service().reserve(&caller)?;
        // The place is kept until the response is delivered (a verdict waiting for a client
        // that reads slowly holds memory).
        if let Some(hold) = parts.extensions.get::<runcell_core::Hold>() {
            hold.keep(&ticket);
        }
        Ok(Reserved {
            caller,
            ticket,
            headers: parts.headers,
            body: Some(body),
            state: state.clone(),
        })
    }
}

impl Reserved {
    /// Read the body, at most `limit` bytes (the server's body cap when `None`), each byte
    /// taken from the ticket's share of the body budget while it is held.
    pub async fn read(&mut self, limit: Option<usize>) -> Result<Bytes, ApiError> {
        let limit = limit.unwrap_or(self.state.inner.max_body_bytes);
        let body = self.body.take().unwrap_or_default();
        read_body(body, &self.headers, limit, &self.ticket)
            .await
            .inspect_err(|e| self.state.inner.metrics.rejected(e.category))
    }

    /// Read a JSON body as [`Reserved::read`] does, and hold what parsing it will cost beyond
    /// its bytes (its values, however short their text) before the handler parses it.
    pub async fn read_json(&mut self, limit: Option<usize>) -> Result<Bytes, ApiError> {
        let bytes = self.read(limit).await?;
        self.ticket
            .take_parse_bytes(&bytes)
            .map_err(ApiError::from)
            .inspect_err(|e| self.state.inner.metrics.rejected(e.category))?;
        Ok(bytes)
    }
}

/// A request that is not a run (an approval's decision): its body, not yet read, is read
/// within the body budget but holds no place in line.
pub struct Unlined(pub Reserved);

impl FromRequest<AppState> for Unlined {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Unlined, ApiError> {
        let (parts, body) = req.into_parts();
        let caller = caller_of(&parts, "http");
        let ticket = state.service().reserve_bytes(&caller);
        Ok(Unlined(Reserved {
            caller,
            ticket,
            headers: parts.headers,
            body: Some(body),
            state: state.clone(),
        }))
    }
}

/// Read a request body: 413 beyond `limit` (from `Content-Length` at once, otherwise once the
/// cap is crossed), 408 if it takes longer than [`BODY_READ_TIMEOUT`], 429 when the body
/// budget (or the ticket's share of it) runs out while it arrives.
pub(crate) async fn read_body(
    body: Body,
    headers: &HeaderMap,
    limit: usize,
    ticket: &Ticket,
) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    let collect = async {
        let mut body = Limited::new(body, limit);
        let mut buf = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = match frame {
                Ok(f) => f,
                Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
                    return Err(ApiError::too_large(limit))
                }
                Err(e) => {
                    return Err(ApiError::invalid(format!(
                        "The request body could not be read: {e}."
                    )))
                }
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            ticket.take_bytes(data.len() as u64)?;
            buf.extend_from_slice(&data);
        }
        Ok(Bytes::from(buf))
    };
    // A body trickled in slowly would hold its place in line: it gets a deadline.
    match tokio::time::timeout(BODY_READ_TIMEOUT, collect).await {
        Ok(r) => r,
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            format!(
                "The request body did not arrive within {} s.",
                BODY_READ_TIMEOUT.as_secs()
            ),
        )),
    }
}
