//! API keys: `Authorization: Bearer KEY` or `X-API-Key: KEY`, compared in constant time.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, HOST, ORIGIN};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::ApiError;
use crate::AppState;

/// A configured API key with its id (the policy's). `Debug` never shows the key.
pub use runcell_core::policy::ApiKey;

/// The id of the key a request was authenticated with (`None` when the server runs without
/// keys), as a request extension for handlers, the audit log and MCP.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyId(pub Option<String>);

/// The configured keys, kept only as sha256 digests: comparing digests in constant time hides
/// both the content and the length of the keys, and the keys themselves are not kept around
/// in the server's memory for a debug print to leak.
#[derive(Clone, Default)]
pub struct Keys(Arc<Vec<(String, [u8; 32])>>);

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keys({} configured)", self.0.len())
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

impl Keys {
    pub fn new(keys: &[ApiKey]) -> Keys {
        Keys(Arc::new(
            keys.iter()
                .map(|k| (k.id.clone(), digest(k.key().as_bytes())))
                .collect(),
        ))
    }

    /// How many keys there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The id of the key `candidate` is, if any. Every key is compared, whatever matched.
    pub fn check(&self, candidate: &[u8]) -> Option<&str> {
        let d = digest(candidate);
        let mut found = None;
        for (id, k) in self.0.iter() {
            if bool::from(k.ct_eq(&d)) && found.is_none() {
                found = Some(id.as_str());
            }
        }
        found
    }
}

/// The key a request carries, kept for a call that another server of the cluster carries
/// out with the caller's own credentials (an MCP tool call into its session).
pub(crate) fn credential(headers: &HeaderMap) -> Option<runcell_core::Credential> {
    let key = std::str::from_utf8(presented(headers)?).ok()?;
    Some(runcell_core::Credential::new(key))
}

/// The key a request carries, if any.
fn presented(headers: &HeaderMap) -> Option<&[u8]> {
    if let Some(v) = headers.get(AUTHORIZATION) {
        let v = v.as_bytes();
        if v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer ") {
            return Some(v[7..].trim_ascii());
        }
    }
    headers.get("x-api-key").map(|v| v.as_bytes().trim_ascii())
}

fn is_loopback_name(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Without keys the server listens on loopback only, but a web page the user visits can
/// still reach it: by DNS rebinding (its own name resolving to 127.0.0.1, so its requests
/// carry its own `Host`) or by a cross-origin "simple" request (a `text/plain` POST needs no
/// CORS preflight). Both are refused: the `Host` must be a loopback name and a browser's
/// `Origin`, when there is one, a loopback origin (`null`, from sandboxed frames and files,
/// is not).
pub fn loopback_request(headers: &HeaderMap, uri: &Uri) -> Result<(), ApiError> {
    let forbidden = |what: &str| {
        ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "This server has no API key and only answers local clients: the {what} must \
                 be localhost, 127.0.0.1 or [::1]."
            ),
        )
    };
    let host = match headers.get(HOST) {
        Some(v) => {
            let v = v.to_str().map_err(|_| forbidden("Host"))?;
            Some(
                v.parse::<axum::http::uri::Authority>()
                    .map_err(|_| forbidden("Host"))?
                    .host()
                    .to_string(),
            )
        }
        None => uri.authority().map(|a| a.host().to_string()),
    };
    // Browsers always send a Host; a request without one is not a browser's.
    if host.is_some_and(|h| !is_loopback_name(&h)) {
        return Err(forbidden("Host"));
    }
    if let Some(origin) = headers.get(ORIGIN) {
        let ok = origin
            .to_str()
            .ok()
            .and_then(|o| o.parse::<Uri>().ok())
            .is_some_and(|o| {
                matches!(o.scheme_str(), Some("http" | "https"))
                    && o.host().is_some_and(is_loopback_name)
            });
        if !ok {
            return Err(forbidden("Origin"));
        }
    }
    Ok(())
}

/// Middleware for every route but /healthz. Without configured keys (loopback only, enforced
/// at start-up) everything from a local client is let through.
pub async fn require_key(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let keys = &state.inner.keys;
    if keys.is_empty() {
        if let Err(e) = loopback_request(req.headers(), req.uri()) {
            state.inner.metrics.rejected(e.category);
            return e.into_response();
        }
        req.extensions_mut().insert(KeyId(None));
        return authenticated(req, next).await;
    }
    let error = match presented(req.headers()) {
        None => ApiError::unauthorized(
            "An API key is required: send it as `Authorization: Bearer KEY` or `X-API-Key: KEY`.",
        ),
        Some(k) => match keys.check(k) {
            Some(id) => {
                let id = KeyId(Some(id.to_string()));
                req.extensions_mut().insert(id);
                return authenticated(req, next).await;
            }
            None => ApiError::unauthorized("The API key is not valid."),
        },
    };
    state.inner.metrics.rejected(error.category);
    error.into_response()
}

/// Serve a request that passed the key check. The connection that carried it may stay open
/// past [`crate::connections::UNAUTHENTICATED_GRACE`]; a request forwarded by another server
/// of the cluster says so in its answer ([`crate::cluster::AUTHENTICATED_HEADER`]), for that
/// server to treat its client's connection the same.
async fn authenticated(req: Request, next: Next) -> Response {
    if let Some(a) = req.extensions().get::<crate::connections::Authenticated>() {
        a.mark();
    }
    let forwarded = req.headers().contains_key(crate::cluster::HOP_HEADER);
    let mut resp = next.run(req).await;
    if forwarded {
        resp.headers_mut().insert(
            crate::cluster::AUTHENTICATED_HEADER,
            axum::http::HeaderValue::from_static("1"),
        );
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_exactly() {
        let keys = Keys::new(&[ApiKey::new("a", "alpha"), ApiKey::new("b", "beta")]);
        assert_eq!(keys.check(b"alpha"), Some("a"));
        assert_eq!(keys.check(b"beta"), Some("b"));
        assert_eq!(keys.check(b""), None);
        assert_eq!(keys.check(b"alph"), None);
        assert_eq!(keys.check(b"alphaa"), None);
        assert_eq!(Keys::new(&[]).check(b""), None);
        assert!(!format!("{keys:?}").contains("alpha"));
        assert!(!format!("{:?}", ApiKey::new("a", "alpha")).contains("alpha"));
    }

    #[test]
    fn without_keys_only_local_hosts_and_origins_pass() {
        let check = |host: Option<&str>, origin: Option<&str>| {
            let mut h = HeaderMap::new();
            if let Some(v) = host {
                h.insert(HOST, v.parse().unwrap());
            }
            if let Some(v) = origin {
                h.insert(ORIGIN, v.parse().unwrap());
            }
            loopback_request(&h, &Uri::from_static("/v1/execute")).is_ok()
        };
        for host in [
            "127.0.0.1:8080",
            "localhost",
            "LOCALHOST:1",
            "[::1]:8080",
            "127.0.0.2",
        ] {
            assert!(check(Some(host), None), "{host}");
        }
        assert!(check(None, None), "no Host: not a browser");
        assert!(check(Some("localhost:8080"), Some("http://localhost:8080")));
        assert!(check(Some("127.0.0.1:8080"), Some("https://[::1]:3000")));
        for host in [
            "evil.example",
            "evil.example:8080",
            "127.0.0.1.evil.example",
            "0.0.0.0",
        ] {
            assert!(!check(Some(host), None), "{host}");
        }
        for origin in [
            "http://evil.example",
            "null",
            "file://",
            "http://127.0.0.1.evil.example",
        ] {
            assert!(!check(Some("127.0.0.1:8080"), Some(origin)), "{origin}");
        }
    }

    #[test]
    fn both_header_styles_are_read() {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, "bEaReR  k1 ".parse().unwrap());
        assert_eq!(presented(&h), Some(&b"k1"[..]));
        let mut h = HeaderMap::new();
        h.insert("x-api-key", "k2".parse().unwrap());
        assert_eq!(presented(&h), Some(&b"k2"[..]));
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(presented(&h), None);
    }
}
