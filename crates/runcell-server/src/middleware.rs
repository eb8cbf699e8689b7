//! The outermost middleware: a request id, the peer and a tracing span for every request, and
//! delivery guarding of the response.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Request};
use axum::http::header::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

use crate::deliver::{self, Hold};

/// A request's id and peer, set by the outermost middleware.
#[derive(Debug, Clone)]
pub struct RequestMeta {
    pub request_id: String,
    pub peer: Option<SocketAddr>,
}

pub(crate) async fn request_meta(mut req: Request, next: Next) -> Response {
    let request_id = uuid::Uuid::new_v4().simple().to_string();
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    req.extensions_mut().insert(RequestMeta {
        request_id: request_id.clone(),
        peer,
    });
    let hold = Hold::default();
    req.extensions_mut().insert(hold.clone());
    // Cancelled when the response is finished or dropped: an MCP call whose stream the
    // client closed is cancelled with it.
    let closed = tokio_util::sync::CancellationToken::new();
    req.extensions_mut()
        .insert(runcell_mcp::StreamClosed(closed.clone()));
    // Everything logged while this request is handled (the run on its blocking thread
    // included) carries its id, as the audit line and the X-Request-Id header do.
    let span = tracing::info_span!(
        "request",
        id = %request_id,
        method = %req.method(),
        path = %req.uri().path()
    );
    let mut res = next.run(req).instrument(span).await;
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        res.headers_mut().insert("x-request-id", v);
    }
    deliver::guard(res, hold, closed.drop_guard())
}
