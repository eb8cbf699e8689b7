//! MCP over Streamable HTTP at `/mcp`: the same tools as `runcell mcp`, behind the same API
//! keys, and run through the same admission control (429 becomes an `isError` result that
//! says to retry), policy check, metrics and audit log as `POST /v1/execute`.

use axum::http::header::{ALLOW, CONTENT_TYPE};
use axum::http::StatusCode;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{any_service, MethodRouter};
use futures_util::future::BoxFuture;
use http_body_util::{BodyExt, Limited};
use runcell_core::{ExecRequest, Verdict};
use runcell_jail::OutputSink;
use runcell_mcp::{Executor, HttpEndpoint, HttpOptions, Rejection};

use crate::{caller_of, ApiError, AppState, Caller};

fn rejection(e: ApiError) -> Rejection {
    Rejection::new(e.category, e.message)
}

impl Executor for AppState {
    fn execute(
        &self,
        req: ExecRequest,
        caller: runcell_mcp::Caller,
        sink: Box<dyn OutputSink + Send>,
    ) -> BoxFuture<'static, Result<Verdict, Rejection>> {
        // The HTTP request that carried the call holds what the middleware found out: the
        // request id, the peer and the API key's id.
        let caller = match &caller.http {
            Some(parts) => caller_of(parts, caller.interface),
            None => Caller {
                interface: caller.interface,
                ..Caller::default()
            },
        };
        let admitted = self.admit(req, caller);
        Box::pin(async move {
            admitted
                .map_err(rejection)?
                .run(sink)
                .await
                .map_err(rejection)
        })
    }
}

/// The `/mcp` endpoint. Without API keys (loopback only) it accepts loopback `Host` names and
/// `Origin`s only, against DNS rebinding; with keys the key is the guard. Its tools are those
/// of this server's engine: its runtimes and its policy.
pub fn endpoint(state: &AppState) -> MethodRouter<AppState> {
    let max_body = state.inner.max_body_bytes;
    let options = if state.auth_enabled() {
        HttpOptions::keyed(max_body)
    } else {
        HttpOptions::loopback(max_body)
    };
    let mcp = HttpEndpoint::new(
        state.clone(),
        state.engine().config().clone(),
        options,
        state.shutdown_token(),
    );
    any_service(mcp).layer(middleware::map_response(json_error))
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
}
