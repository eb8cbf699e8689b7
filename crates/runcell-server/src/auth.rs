//! API keys: `Authorization: Bearer KEY` or `X-API-Key: KEY`, compared in constant time.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::{Choice, ConstantTimeEq};

use crate::error::ApiError;
use crate::AppState;

/// The configured keys, kept only as sha256 digests: comparing digests in constant time hides
/// both the content and the length of the keys, and the keys themselves are not kept around
/// in the server's memory for a debug print to leak.
#[derive(Clone, Default)]
pub struct Keys(Arc<Vec<[u8; 32]>>);

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keys({} configured)", self.0.len())
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

impl Keys {
    /// Empty strings (a trailing comma in `RUNCELL_API_KEY`) are ignored.
    pub fn new<S: AsRef<str>>(keys: &[S]) -> Keys {
        Keys(Arc::new(
            keys.iter()
                .map(|k| k.as_ref().trim())
                .filter(|k| !k.is_empty())
                .map(|k| digest(k.as_bytes()))
                .collect(),
        ))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `candidate` is one of the keys. Every key is compared, whatever matched.
    pub fn check(&self, candidate: &[u8]) -> bool {
        let d = digest(candidate);
        let mut ok = Choice::from(0);
        for k in self.0.iter() {
            ok |= k.ct_eq(&d);
        }
        ok.into()
    }
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

/// Middleware for every route but /healthz. Without configured keys (loopback only, enforced
/// at start-up) everything is let through.
pub async fn require_key(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let keys = &state.inner.keys;
    if keys.is_empty() {
        return next.run(req).await;
    }
    match presented(req.headers()) {
        None => ApiError::unauthorized(
            "An API key is required: send it as `Authorization: Bearer KEY` or `X-API-Key: KEY`.",
        )
        .into_response(),
        Some(k) if keys.check(k) => next.run(req).await,
        Some(_) => ApiError::unauthorized("The API key is not valid.").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_exactly() {
        let keys = Keys::new(&["alpha", " beta ", ""]);
        assert!(keys.check(b"alpha"));
        assert!(keys.check(b"beta"));
        assert!(!keys.check(b""));
        assert!(!keys.check(b"alph"));
        assert!(!keys.check(b"alphaa"));
        assert!(!Keys::new::<&str>(&[]).check(b""));
        assert!(!format!("{keys:?}").contains("alpha"));
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
