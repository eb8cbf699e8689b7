//! The subset of the Connect protocol (connectrpc.com/docs/protocol) that the E2B SDKs speak
//! to a sandbox's daemon: the JSON codec over HTTP/1.1, unary calls and server streams.
//!
//! * A unary call is a JSON body in and a JSON body out; an error is a non-2xx status with
//!   `{"code": "<connect code>", "message"}`.
//! * A server stream's request and every message of its answer are *envelopes*: one flags
//!   byte, a big-endian `u32` length, then that many bytes of JSON. The answer ends with an
//!   end-of-stream envelope (flags `0x02`) whose JSON is `{}` or `{"error": {...}}`: the JS
//!   SDK fails ("missing EndStreamResponse") without it.
//!
//! Everything read here is written by a client that may be hostile: lengths are checked
//! against a cap before anything is allocated, and compressed envelopes are refused (both
//! SDKs send `identity`).

use axum::http::StatusCode;
use serde_json::{json, Value};

/// The flags of a message envelope.
pub const FLAG_MESSAGE: u8 = 0x00;
/// The compressed bit: refused (the SDKs never compress).
pub const FLAG_COMPRESSED: u8 = 0x01;
/// The end-of-stream envelope.
pub const FLAG_END_STREAM: u8 = 0x02;

/// The content type of a streaming call with the JSON codec.
pub const STREAM_JSON: &str = "application/connect+json";

/// Connect's error codes, as the SDKs map them to exceptions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    InvalidArgument,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    Unauthenticated,
    ResourceExhausted,
    FailedPrecondition,
    Unimplemented,
    Unavailable,
    DeadlineExceeded,
    Internal,
}

impl Code {
    pub fn name(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::Unauthenticated => "unauthenticated",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unimplemented => "unimplemented",
            Code::Unavailable => "unavailable",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::Internal => "internal",
        }
    }

    /// The HTTP status a unary error is sent with (the Connect protocol's table).
    pub fn status(self) -> StatusCode {
        match self {
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// A Connect error: its code and a message for people.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", code.name())]
pub struct ConnectError {
    pub code: Code,
    pub message: String,
}

impl ConnectError {
    pub fn new(code: Code, message: impl Into<String>) -> ConnectError {
        ConnectError {
            code,
            message: message.into(),
        }
    }

    /// `{"code", "message"}`: a unary error's body, and the `error` of an end-of-stream.
    pub fn body(&self) -> Value {
        json!({"code": self.code.name(), "message": self.message})
    }
}

/// Why a request envelope could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("the request is shorter than an envelope's 5-byte header")]
    ShortHeader,
    #[error("the envelope declares {declared} bytes but {present} follow")]
    Truncated { declared: u64, present: usize },
    #[error("the envelope declares {declared} bytes, above the limit of {limit}")]
    TooLarge { declared: u64, limit: usize },
    #[error("compressed envelopes are not accepted (send Connect-Content-Encoding: identity)")]
    Compressed,
    #[error("unexpected envelope flags {0:#04x}")]
    Flags(u8),
    #[error("bytes follow the request's one envelope")]
    Trailing,
}

/// One envelope: flags, length, data.
pub fn envelope(flags: u8, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + data.len());
    out.push(flags);
    // A message longer than 4 GiB is never built here (every message is bounded far below).
    out.extend_from_slice(&u32::try_from(data.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(data);
    out
}

/// A message envelope of `value`.
pub fn message(value: &Value) -> Vec<u8> {
    envelope(FLAG_MESSAGE, value.to_string().as_bytes())
}

/// The end-of-stream envelope: `{}`, or `{"error": ...}`.
pub fn end_stream(error: Option<&ConnectError>) -> Vec<u8> {
    let body = match error {
        None => json!({}),
        Some(e) => json!({ "error": e.body() }),
    };
    envelope(FLAG_END_STREAM, body.to_string().as_bytes())
}

/// The JSON of a streaming request's one message envelope (a server-streaming call's
/// request is exactly one envelope), at most `limit` bytes.
pub fn read_request(body: &[u8], limit: usize) -> Result<&[u8], FrameError> {
    let (flags, len) = match body {
        [f, a, b, c, d, ..] => (*f, u32::from_be_bytes([*a, *b, *c, *d]) as u64),
        _ => return Err(FrameError::ShortHeader),
    };
    if flags & FLAG_COMPRESSED != 0 {
        return Err(FrameError::Compressed);
    }
    if flags != FLAG_MESSAGE {
        return Err(FrameError::Flags(flags));
    }
    if len > limit as u64 {
        return Err(FrameError::TooLarge {
            declared: len,
            limit,
        });
    }
    let rest = &body[5..];
    let len = len as usize;
    if rest.len() < len {
        return Err(FrameError::Truncated {
            declared: len as u64,
            present: rest.len(),
        });
    }
    if rest.len() > len {
        return Err(FrameError::Trailing);
    }
    Ok(&rest[..len])
}

/// `Connect-Timeout-Ms`: the call's deadline the client asks for (at most 10 digits, as the
/// protocol says), if any.
pub fn timeout_ms(headers: &axum::http::HeaderMap) -> Option<u64> {
    let v = headers.get("connect-timeout-ms")?.to_str().ok()?;
    if v.is_empty() || v.len() > 10 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_envelope_round_trips() {
        let e = message(&json!({"a": 1}));
        assert_eq!(e[0], 0);
        assert_eq!(u32::from_be_bytes([e[1], e[2], e[3], e[4]]), 7);
        assert_eq!(read_request(&e, 100).unwrap(), br#"{"a":1}"#);
    }

    #[test]
    fn the_end_of_stream_carries_its_error() {
        let e = end_stream(None);
        assert_eq!(e, [2, 0, 0, 0, 2, b'{', b'}']);
        let e = end_stream(Some(&ConnectError::new(Code::NotFound, "gone")));
        assert_eq!(e[0], FLAG_END_STREAM);
        let v: Value = serde_json::from_slice(&e[5..]).unwrap();
        assert_eq!(
            v,
            json!({"error": {"code": "not_found", "message": "gone"}})
        );
    }

    #[test]
    fn hostile_envelopes_are_refused_before_anything_is_allocated() {
        assert_eq!(read_request(b"", 10), Err(FrameError::ShortHeader));
        assert_eq!(read_request(&[0, 0, 0], 10), Err(FrameError::ShortHeader));
        // A length of 4 GiB with nothing behind it: refused by the cap, not by reading.
        assert_eq!(
            read_request(&[0, 0xff, 0xff, 0xff, 0xff], 1 << 20),
            Err(FrameError::TooLarge {
                declared: u32::MAX as u64,
                limit: 1 << 20
            })
        );
        assert_eq!(
            read_request(&[0, 0, 0, 0, 9, b'{', b'}'], 100),
            Err(FrameError::Truncated {
                declared: 9,
                present: 2
            })
        );
        let mut two = message(&json!({}));
        two.extend(message(&json!({})));
        assert_eq!(read_request(&two, 100), Err(FrameError::Trailing));
        assert_eq!(
            read_request(&envelope(1, b"{}"), 100),
            Err(FrameError::Compressed)
        );
        assert_eq!(
            read_request(&envelope(2, b"{}"), 100),
            Err(FrameError::Flags(2))
        );
        assert_eq!(read_request(&envelope(0, b""), 100).unwrap(), b"");
    }

    #[test]
    fn the_timeout_header_is_read_strictly() {
        let mut h = axum::http::HeaderMap::new();
        assert_eq!(timeout_ms(&h), None);
        h.insert("connect-timeout-ms", "60000".parse().unwrap());
        assert_eq!(timeout_ms(&h), Some(60000));
        for bad in ["", "-1", "1e3", "12345678901", " 5"] {
            h.insert("connect-timeout-ms", bad.parse().unwrap());
            assert_eq!(timeout_ms(&h), None, "{bad:?}");
        }
    }
}
