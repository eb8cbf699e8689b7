//! Every error the API answers with: a status code and `{"error": {"category", "message"}}`.

use axum::http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::json;
use utoipa::ToSchema;

impl From<runcell_core::ValidationError> for ApiError {
    fn from(e: runcell_core::ValidationError) -> Self {
        ApiError::validation(&e)
    }
}

/// The run service's typed error, rendered: its kind gives the status, the category and the
/// retry hint (one table, in runcell-core), its limit the `limit` field.
impl From<runcell_core::RunError> for ApiError {
    fn from(e: runcell_core::RunError) -> Self {
        let k = e.kind;
        ApiError {
            status: StatusCode::from_u16(k.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            category: k.category(),
            message: e.message,
            limit: e.limit.map(runcell_core::Limit::name),
            retry_after: k.retry_after(),
        }
    }
}

/// An error answered to the client. Never carries an API key.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    /// Machine-readable: invalid_request, unauthorized, forbidden, not_found,
    /// method_not_allowed, request_timeout, payload_too_large, rate_limited, unavailable,
    /// internal.
    pub category: &'static str,
    pub message: String,
    /// The limit (as named in the request body) an invalid_request is about.
    pub limit: Option<&'static str>,
    /// Seconds for `Retry-After`.
    pub retry_after: Option<u32>,
}

/// The categories of the server's own errors, beside the run service's
/// ([`runcell_core::ErrorKind`]) and the agent loop's ([`runcell_agent::AgentError`]).
pub const SERVER_CATEGORIES: &[&str] = &[
    "unauthorized",
    "forbidden",
    "method_not_allowed",
    "not_acceptable",
    "unsupported_media_type",
    "agent_unconfigured",
];

/// Every category an error body of the API may carry, sorted: the run service's, the agent
/// loop's and the server's own.
pub fn categories() -> Vec<&'static str> {
    let mut all: Vec<&'static str> = runcell_core::ErrorKind::ALL
        .iter()
        .map(|k| k.category())
        .chain(runcell_agent::AgentError::CATEGORIES.iter().copied())
        .chain(SERVER_CATEGORIES.iter().copied())
        .collect();
    all.sort_unstable();
    all.dedup();
    all
}

impl ApiError {
    pub fn new(status: StatusCode, category: &'static str, message: impl Into<String>) -> Self {
        // A category is one of the listed ones, so that the generated reference and the
        // docs know it (a test that meets an unlisted one fails here).
        debug_assert!(
            categories().contains(&category),
            "the API error category {category:?} is not listed: add it to SERVER_CATEGORIES"
        );
        ApiError {
            status,
            category,
            message: message.into(),
            limit: None,
            retry_after: None,
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    /// A request the engine's validation refused: the message is built from the typed error,
    /// and `limit` names the limit it is about.
    pub fn validation(e: &runcell_core::ValidationError) -> Self {
        ApiError {
            limit: e.limit().map(runcell_core::Limit::name),
            ..ApiError::invalid(e.to_string())
        }
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    pub fn too_large(limit_bytes: usize) -> Self {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!(
                "The request body is larger than the limit of {}. Send smaller input files.",
                runcell_core::units::format_size(limit_bytes as u64)
            ),
        )
    }

    pub fn rate_limited(message: impl Into<String>) -> Self {
        ApiError {
            retry_after: Some(1),
            ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limited", message)
        }
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError {
            retry_after: Some(1),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::to_value(ErrorBody {
            error: ErrorDetail {
                category: self.category.to_string(),
                message: self.message.clone(),
                limit: self.limit.map(str::to_string),
            },
        })
        .unwrap_or_else(|_| json!({"error": {"category": "internal", "message": ""}}))
    }
}

/// Every error response: `{"error": {"category", "message"}}`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(example = json!({"error": {"category": "invalid_request", "limit": "memory",
    "message": "Invalid limit: memory is 64 GiB, above the maximum of 8 GiB."}}))]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// invalid_request, unauthorized, forbidden, not_found, method_not_allowed,
    /// request_timeout, payload_too_large, rate_limited, unavailable, draining,
    /// peer_unavailable, session_lost (410: the session's server restarted) or internal.
    pub category: String,
    /// What went wrong and what to do about it.
    pub message: String,
    /// For an invalid limit: its name, as in the request body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.body().to_string();
        let mut res = (self.status, body).into_response();
        let h = res.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(secs) = self.retry_after {
            h.insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            h.insert(
                WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"runcell\""),
            );
        }
        res
    }
}

fn is_json(res: &Response) -> bool {
    res.headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"))
}

/// The last line behind the handlers: any error response that is not already our JSON (axum's
/// plain-text rejections, its empty 404 and 405) becomes one.
pub async fn json_errors(res: Response) -> Response {
    let status = res.status();
    if !(status.is_client_error() || status.is_server_error()) || is_json(&res) {
        return res;
    }
    let err = match status {
        StatusCode::NOT_FOUND => ApiError::new(
            status,
            "not_found",
            "No such endpoint. The API has POST /v1/execute, GET /v1/runtimes, /v1/sessions, \
             POST /v1/agents, /v1/approvals, GET /v1/admin/overview, GET /healthz, \
             GET /readyz, GET /metrics, GET /openapi.json, /mcp (see /openapi.json) and the \
             operator's console, GET /console.",
        ),
        StatusCode::METHOD_NOT_ALLOWED => ApiError::new(
            status,
            "method_not_allowed",
            "This endpoint does not accept this method.",
        ),
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
            status,
            "payload_too_large",
            "The request body is too large.",
        ),
        StatusCode::UNAUTHORIZED => ApiError::unauthorized("An API key is required."),
        StatusCode::TOO_MANY_REQUESTS => ApiError::rate_limited("Too many requests."),
        s if s.is_client_error() => ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "The request is not valid.",
        ),
        _ => ApiError::internal("The server failed to handle the request."),
    };
    let allow = res.headers().get(axum::http::header::ALLOW).cloned();
    let mut out = err.into_response();
    if let Some(allow) = allow {
        out.headers_mut().insert(axum::http::header::ALLOW, allow);
    }
    out
}

/// For `tower_http::catch_panic`: a panic in a handler is a JSON 500, never a dropped
/// connection. The panic's payload is not echoed to the client.
pub fn panic_response(_: Box<dyn std::any::Any + Send + 'static>) -> Response {
    tracing::error!("a request handler panicked");
    ApiError::internal("The server failed to handle the request.").into_response()
}
