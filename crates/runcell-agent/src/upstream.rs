//! The model behind an HTTP API: Anthropic Messages or OpenAI Chat Completions (and any server
//! that speaks it: vLLM, Ollama, LM Studio). 429 and 5xx answers, and connections that fail,
//! are retried with backoff a bounded number of times (honouring `Retry-After` within the
//! request's budget); anything else that is wrong is a [`ModelError`] with what happened. The
//! API key is sent to the upstream only: it is never in an error, a log line or a response.
//! What the upstream says about itself (an error body, a library's message about its answer)
//! enters a [`ModelError`] only through [`untrusted_text`]: one line, bounded.
//!
//! No redirect is followed. A 307 or 308 would resend the key and the conversation (the
//! user's data) to wherever the `Location` points, and reqwest drops only `Authorization`
//! (not Anthropic's `x-api-key`) when the host changes; a 301, 302 or 303 would turn the POST
//! into a GET that still carries the key header. Even a redirect within the origin says the
//! configured base URL is not where the API answers (the path after it is fixed), so every
//! 3xx is a refusal that names where it points, for the operator to configure.

use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use serde_json::Value;

use crate::conversation::{Conversation, ToolSpec, Turn};
use crate::run::{Model, ModelError};

/// Which wire format the upstream speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    Anthropic,
    OpenAi,
}

impl Wire {
    pub fn parse(name: &str) -> Option<Wire> {
        match name.trim().to_ascii_lowercase().as_str() {
            "anthropic" => Some(Wire::Anthropic),
            "openai" => Some(Wire::OpenAi),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Wire::Anthropic => "anthropic",
            Wire::OpenAi => "openai",
        }
    }

    /// The vendor's public base URL, in the convention of its official SDK.
    pub fn default_base_url(self) -> &'static str {
        match self {
            Wire::Anthropic => crate::anthropic::DEFAULT_BASE_URL,
            Wire::OpenAi => crate::openai::DEFAULT_BASE_URL,
        }
    }
}

/// An upstream as the operator configured it.
#[derive(Clone)]
pub struct Upstream {
    pub wire: Wire,
    /// Without a trailing slash.
    pub base_url: String,
    api_key: Option<String>,
    pub model: String,
    /// Output tokens per answer (Anthropic requires it).
    pub max_tokens: u32,
    /// Attempts per model call (1 + retries of 429, 5xx and connection failures).
    pub attempts: u32,
    /// A request's temperature and top_p (its max_tokens replaces `max_tokens`).
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    client: reqwest::Client,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("wire", &self.wire)
            .field("base_url", &self.shown_base_url())
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .finish()
    }
}

/// Output tokens per answer when a request names none.
const DEFAULT_MAX_TOKENS: u32 = 4096;
/// The first pause between attempts, doubled each time, and the longest `Retry-After` waited.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_RETRY_AFTER: Duration = Duration::from_secs(20);
/// The most of an upstream's answer read (a model's answer is far smaller); counted as it
/// arrives, so that an answer without end stops there, not at the deadline.
const MAX_ANSWER_BYTES: usize = 16 << 20;
/// The most of an error answer's body read: its start is all its message shows.
const MAX_ERROR_BODY_BYTES: usize = 8 << 10;
/// The most tool calls an answer may make. Models make a few at a time; the loop refuses or
/// runs each in turn, and every later request echoes each with its result, so an answer with
/// hundreds of thousands of them (they fit in the answer's cap) is refused as a whole.
const MAX_TOOL_CALLS_PER_ANSWER: usize = 128;

impl Upstream {
    pub fn new(
        wire: Wire,
        base_url: Option<&str>,
        api_key: Option<String>,
        model: String,
    ) -> Upstream {
        Upstream {
            wire,
            base_url: base_url
                .unwrap_or(wire.default_base_url())
                .trim_end_matches('/')
                .to_string(),
            api_key,
            model,
            max_tokens: DEFAULT_MAX_TOKENS,
            attempts: 3,
            temperature: None,
            top_p: None,
            client: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .redirect(reqwest::redirect::Policy::none())
                .build()
                // Only a TLS backend that cannot start fails here, and then `Client::default()`
                // (the fallback this replaced) panics too; a client built without this policy
                // would follow redirects.
                .expect("the HTTP client of the model's API"),
        }
    }

    /// The base URL as errors and `Debug` show it: without the user and password a URL may
    /// carry (`https://user:secret@host`, which reqwest sends as basic authentication: a
    /// credential like the API key).
    pub fn shown_base_url(&self) -> String {
        match reqwest::Url::parse(&self.base_url) {
            Ok(mut url) if !url.username().is_empty() || url.password().is_some() => {
                let _ = url.set_username("");
                let _ = url.set_password(None);
                url.to_string().trim_end_matches('/').to_string()
            }
            Ok(_) => self.base_url.clone(),
            Err(_) => "the configured base URL".to_string(),
        }
    }

    fn endpoint(&self) -> String {
        match self.wire {
            Wire::Anthropic => format!("{}/v1/messages", self.base_url),
            Wire::OpenAi => format!("{}/chat/completions", self.base_url),
        }
    }

    /// This upstream for one agent request: its model and sampling parameters.
    pub fn for_request(&self, model: &str, sampling: &crate::api::Sampling) -> Upstream {
        let mut up = self.clone();
        up.model = model.to_string();
        up.temperature = sampling.temperature;
        up.top_p = sampling.top_p;
        if let Some(n) = sampling.max_tokens {
            up.max_tokens = n;
        }
        up
    }

    fn body(&self, conv: &Conversation, tools: &[ToolSpec]) -> Value {
        let mut body = match self.wire {
            Wire::Anthropic => {
                crate::anthropic::request_body(&self.model, self.max_tokens, conv, tools)
            }
            Wire::OpenAi => {
                let mut b = crate::openai::request_body(&self.model, conv, tools);
                if self.max_tokens != DEFAULT_MAX_TOKENS {
                    // Only when asked: compatible servers differ on the name's support.
                    b["max_completion_tokens"] = self.max_tokens.into();
                }
                b
            }
        };
        if let Some(t) = self.temperature {
            body["temperature"] = t.into();
        }
        if let Some(p) = self.top_p {
            body["top_p"] = p.into();
        }
        body
    }

    fn parse(&self, v: &Value) -> Result<Turn, ModelError> {
        let turn = match self.wire {
            Wire::Anthropic => crate::anthropic::parse_response(v).map_err(|e| e.to_string()),
            Wire::OpenAi => crate::openai::parse_response(v).map_err(|e| e.to_string()),
        };
        let mut turn = turn.map_err(|e| ModelError::Malformed(untrusted_text(&e)))?;
        // The name the upstream gives its model goes into the audit log and the answer.
        turn.model = turn.model.map(|m| untrusted_text(&m));
        if turn.calls.len() > MAX_TOOL_CALLS_PER_ANSWER {
            return Err(ModelError::Malformed(format!(
                "an answer with {} tool calls (at most {MAX_TOOL_CALLS_PER_ANSWER} are taken)",
                turn.calls.len()
            )));
        }
        Ok(turn)
    }

    /// Where a redirect points, for the operator: its scheme, host, port and path, resolved
    /// against the endpoint (a query, a fragment or credentials in it are left out).
    fn redirect_target(&self, headers: &reqwest::header::HeaderMap) -> String {
        let Some(to) = headers.get(reqwest::header::LOCATION) else {
            return String::new();
        };
        let to = String::from_utf8_lossy(to.as_bytes());
        let shown = match reqwest::Url::parse(&self.endpoint()).and_then(|e| e.join(&to)) {
            Ok(mut url) => {
                url.set_query(None);
                url.set_fragment(None);
                let _ = url.set_username("");
                let _ = url.set_password(None);
                url.to_string()
            }
            Err(_) => to.split(['?', '#']).next().unwrap_or_default().to_string(),
        };
        format!(" to {}", untrusted_text(&shown))
    }

    async fn attempt(
        &self,
        body: &Value,
        within: Duration,
    ) -> Result<Value, (ModelError, Option<Duration>)> {
        let mut req = self.client.post(self.endpoint()).timeout(within).json(body);
        req = match (self.wire, &self.api_key) {
            (Wire::Anthropic, key) => {
                let r = req.header("anthropic-version", crate::anthropic::API_VERSION);
                match key {
                    Some(k) => r.header("x-api-key", k),
                    None => r,
                }
            }
            (Wire::OpenAi, Some(k)) => req.bearer_auth(k),
            (Wire::OpenAi, None) => req,
        };
        let res = req.send().await.map_err(|e| {
            let what = if e.is_timeout() {
                ModelError::Timeout(format!("no answer within {} s", within.as_secs()))
            } else {
                ModelError::Unavailable(format!(
                    "cannot reach {}: {}",
                    self.shown_base_url(),
                    without_url(&e)
                ))
            };
            (what, None)
        })?;
        let status = res.status();
        let retry_after = res
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(|s| Duration::from_secs_f64(s.min(MAX_RETRY_AFTER.as_secs_f64())));
        if status.is_redirection() {
            return Err((
                ModelError::Refused(format!(
                    "HTTP {}: a redirect{}, which is not followed: the API key and the \
                     conversation go to the configured base URL only; configure the URL the \
                     API answers at",
                    status.as_u16(),
                    self.redirect_target(res.headers())
                )),
                None,
            ));
        }
        let too_big = || {
            (
                ModelError::Malformed(format!("an answer of more than {MAX_ANSWER_BYTES} bytes")),
                None,
            )
        };
        let limit = if status.is_success() {
            if res.content_length().unwrap_or(0) > MAX_ANSWER_BYTES as u64 {
                return Err(too_big());
            }
            MAX_ANSWER_BYTES
        } else {
            MAX_ERROR_BODY_BYTES
        };
        let (bytes, whole) = read_body(res, limit, within).await.map_err(|e| (e, None))?;
        if status.is_success() && !whole {
            return Err(too_big());
        }
        let detail = || {
            format!(
                "HTTP {}: {}",
                status.as_u16(),
                untrusted_text(&String::from_utf8_lossy(&bytes))
            )
        };
        if status.as_u16() == 429 {
            return Err((ModelError::RateLimited(detail()), retry_after));
        }
        if status.is_server_error() {
            return Err((ModelError::Unavailable(detail()), retry_after));
        }
        if !status.is_success() {
            return Err((ModelError::Refused(detail()), None));
        }
        serde_json::from_slice(&bytes).map_err(|e| {
            let e = untrusted_text(&e.to_string());
            (ModelError::Malformed(format!("not JSON: {e}")), None)
        })
    }
}

/// An answer's body, read up to `limit` bytes as it arrives: the bytes, and whether the body
/// ended within them. The request's timeout (`within`) covers the body too (reqwest's total
/// timeout), so an answer that drips ends there, as a timeout.
async fn read_body(
    mut res: reqwest::Response,
    limit: usize,
    within: Duration,
) -> Result<(Vec<u8>, bool), ModelError> {
    let mut body = Vec::new();
    loop {
        match res.chunk().await {
            Ok(Some(chunk)) => {
                let room = limit - body.len();
                if chunk.len() > room {
                    body.extend_from_slice(&chunk[..room]);
                    return Ok((body, false));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok((body, true)),
            Err(e) if e.is_timeout() => {
                return Err(ModelError::Timeout(format!(
                    "the answer did not end within {} s",
                    within.as_secs()
                )))
            }
            Err(e) => {
                return Err(ModelError::Unavailable(format!(
                    "the answer broke off: {}",
                    without_url(&e)
                )))
            }
        }
    }
}

/// A reqwest error's text without the URL (which is the operator's, not the client's), made
/// safe like any text about the upstream's answer.
fn without_url(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    if let Some(url) = e.url() {
        s = s.replace(url.as_str(), "the upstream");
    }
    untrusted_text(&s)
}

/// The most characters [`untrusted_text`] keeps (an ellipsis says it cut).
pub const UNTRUSTED_TEXT_CHARS: usize = 300;

/// Text that the upstream chose (an error body, a header, a message about its answer), made
/// fit for an error, a log line or a response, once, where it enters a [`ModelError`]: one
/// line, no terminal control, bounded. Whitespace at either end is dropped; `\n`, `\r` and
/// `\t` are written as those escapes, every other control character (C0, DEL, C1, which
/// includes NEL), the line and paragraph separators (U+2028, U+2029) and the bidirectional
/// controls (U+061C, U+200E, U+200F, U+202A-U+202E, U+2066-U+2069: "Trojan Source",
/// CVE-2021-42574) as `\u{..}`; past [`UNTRUSTED_TEXT_CHARS`] characters (escapes counted as
/// written, never cut in two) it ends with `…`. A newline in a model API's error text would
/// otherwise forge a line in the server's text log, and an escape sequence drive the terminal
/// of whoever reads it.
pub fn untrusted_text(s: &str) -> String {
    let mut out = String::new();
    let mut used = 0;
    for c in s.trim().chars() {
        let escaped = match c {
            '\n' => Some("\\n".to_string()),
            '\r' => Some("\\r".to_string()),
            '\t' => Some("\\t".to_string()),
            c if c.is_control()
                || matches!(
                    c,
                    '\u{2028}'
                        | '\u{2029}'
                        | '\u{061c}'
                        | '\u{200e}'
                        | '\u{200f}'
                        | '\u{202a}'..='\u{202e}'
                        | '\u{2066}'..='\u{2069}'
                ) =>
            {
                Some(format!("\\u{{{:x}}}", c as u32))
            }
            _ => None,
        };
        let width = escaped.as_ref().map_or(1, |e| e.len());
        if used + width > UNTRUSTED_TEXT_CHARS {
            out.push('…');
            break;
        }
        used += width;
        match escaped {
            Some(e) => out.push_str(&e),
            None => out.push(c),
        }
    }
    out
}

impl Model for Upstream {
    fn complete<'a>(
        &'a self,
        conv: &'a Conversation,
        tools: &'a [ToolSpec],
        within: Duration,
    ) -> BoxFuture<'a, Result<Turn, ModelError>> {
        Box::pin(async move {
            let deadline = Instant::now() + within;
            let body = self.body(conv, tools);
            let mut backoff = FIRST_BACKOFF;
            let mut attempt = 0;
            loop {
                attempt += 1;
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(ModelError::Timeout("the request's budget ran out".into()));
                }
                match self.attempt(&body, left).await {
                    Ok(v) => return self.parse(&v),
                    Err((e, retry_after)) => {
                        let retryable =
                            matches!(e, ModelError::RateLimited(_) | ModelError::Unavailable(_));
                        if !retryable || attempt >= self.attempts {
                            return Err(e);
                        }
                        let pause = retry_after.unwrap_or(backoff);
                        if Instant::now() + pause >= deadline {
                            return Err(e);
                        }
                        tracing::info!(attempt, error = %e, pause_ms = pause.as_millis() as u64, "retrying the model call");
                        tokio::time::sleep(pause).await;
                        backoff *= 2;
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::Item;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A scripted HTTP server: answers each connection with the next canned response (status,
    /// extra headers, body), records the requests.
    async fn scripted(
        answers: Vec<(u16, String, String)>,
    ) -> (String, tokio::task::JoinHandle<Vec<String>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let mut seen = Vec::new();
            for (status, headers, body) in answers {
                let (mut sock, _) = listener.accept().await.unwrap();
                let mut buf = vec![0u8; 1 << 16];
                let mut got = Vec::new();
                loop {
                    let n = sock.read(&mut buf).await.unwrap();
                    got.extend_from_slice(&buf[..n]);
                    if request_complete(&got) || n == 0 {
                        break;
                    }
                }
                seen.push(String::from_utf8_lossy(&got).to_string());
                if status == 0 {
                    // Hang: never answer.
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                let res = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n{headers}\r\n{body}",
                    body.len()
                );
                sock.write_all(res.as_bytes()).await.unwrap();
            }
            seen
        });
        (base, task)
    }

    /// Another origin (another port), served from a plain thread: counts every connection it
    /// accepts, records what it is sent, and answers a turn that both wires parse, so that a
    /// client that follows a redirect there gets an answer (and the test sees the leak).
    fn other_origin() -> (String, Arc<AtomicUsize>, Arc<Mutex<Vec<String>>>) {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (a, s) = (accepted.clone(), seen.clone());
        std::thread::spawn(move || {
            for sock in listener.incoming() {
                let Ok(mut sock) = sock else { continue };
                a.fetch_add(1, Ordering::SeqCst);
                let mut got = Vec::new();
                let mut buf = [0u8; 1 << 14];
                loop {
                    let n = sock.read(&mut buf).unwrap_or(0);
                    got.extend_from_slice(&buf[..n]);
                    if request_complete(&got) || n == 0 {
                        break;
                    }
                }
                s.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&got).to_string());
                let body = r#"{"content":[{"type":"text","text":"leaked"}],"choices":[{"message":{"content":"leaked"}}]}"#;
                let _ = sock.write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                );
            }
        });
        (base, accepted, seen)
    }

    /// Whether `got` holds a whole request: its head and the body its content-length says.
    fn request_complete(got: &[u8]) -> bool {
        let text = String::from_utf8_lossy(got);
        text.find("\r\n\r\n").is_some_and(|i| {
            let len = text[..i]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .and_then(|v| v.trim().parse::<usize>().ok())
                })
                .unwrap_or(0);
            got.len() >= i + 4 + len
        })
    }

    fn conv() -> Conversation {
        Conversation {
            system: None,
            items: vec![Item::User("hi".into())],
        }
    }

    const OPENAI_OK: &str = r#"{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"hello"}}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;

    #[tokio::test]
    async fn a_429_is_retried_and_the_key_goes_only_upstream() {
        let (base, task) = scripted(vec![
            (
                429,
                "retry-after: 0\r\n".into(),
                r#"{"error":"slow down"}"#.into(),
            ),
            (200, String::new(), OPENAI_OK.into()),
        ])
        .await;
        let up = Upstream::new(
            Wire::OpenAi,
            Some(&base),
            Some("sk-secret-key".into()),
            "m".into(),
        );
        let t = up
            .complete(&conv(), &[], Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(t.text.as_deref(), Some("hello"));
        let seen = task.await.unwrap();
        assert_eq!(seen.len(), 2);
        assert!(seen[1].starts_with("POST /chat/completions"), "{}", seen[1]);
        assert!(seen[1]
            .to_ascii_lowercase()
            .contains("authorization: bearer sk-secret-key"));
        assert!(!format!("{up:?}").contains("sk-secret"));
    }

    #[tokio::test]
    async fn a_5xx_every_time_garbage_a_refusal_and_a_hang_are_errors() {
        let five = (500, String::new(), "oops".to_string());
        let (base, _t) = scripted(vec![five.clone(), five.clone(), five]).await;
        let mut up = Upstream::new(Wire::Anthropic, Some(&base), Some("k".into()), "m".into());
        up.attempts = 3;
        let e = up
            .complete(&conv(), &[], Duration::from_secs(20))
            .await
            .unwrap_err();
        assert!(
            matches!(e, ModelError::Unavailable(ref m) if m.contains("HTTP 500")),
            "{e}"
        );

        let (base, _t) = scripted(vec![(200, String::new(), r#"{"content": 5}"#.into())]).await;
        let up = Upstream::new(Wire::Anthropic, Some(&base), None, "m".into());
        assert!(matches!(
            up.complete(&conv(), &[], Duration::from_secs(5)).await,
            Err(ModelError::Malformed(_))
        ));

        let (base, _t) =
            scripted(vec![(401, String::new(), r#"{"error":"bad key"}"#.into())]).await;
        let up = Upstream::new(Wire::OpenAi, Some(&base), Some("k".into()), "m".into());
        assert!(matches!(
            up.complete(&conv(), &[], Duration::from_secs(5)).await,
            Err(ModelError::Refused(_))
        ));

        let (base, _t) = scripted(vec![(0, String::new(), String::new())]).await;
        let up = Upstream::new(Wire::OpenAi, Some(&base), None, "m".into());
        let started = Instant::now();
        let e = up
            .complete(&conv(), &[], Duration::from_millis(500))
            .await
            .unwrap_err();
        assert!(matches!(e, ModelError::Timeout(_)), "{e}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    /// Regression: the Anthropic client followed redirects with `x-api-key` and the
    /// conversation, and the OpenAI one (which reqwest strips `Authorization` for) still sent
    /// the conversation to the new origin. No redirect is followed, to another origin or not.
    #[tokio::test]
    async fn a_redirect_moves_neither_the_key_nor_the_conversation_to_another_origin() {
        let (elsewhere, accepted, seen_elsewhere) = other_origin();
        for wire in [Wire::Anthropic, Wire::OpenAi] {
            for status in [301u16, 302, 303, 307, 308] {
                let path = match wire {
                    Wire::Anthropic => "/v1/messages",
                    Wire::OpenAi => "/chat/completions",
                };
                let (base, task) = scripted(vec![(
                    status,
                    format!("location: {elsewhere}{path}?token=t\r\n"),
                    String::new(),
                )])
                .await;
                let up = Upstream::new(wire, Some(&base), Some("sk-secret-key".into()), "m".into());
                let conv = Conversation {
                    system: None,
                    items: vec![Item::User("the user's private data".into())],
                };
                let r = up.complete(&conv, &[], Duration::from_secs(10)).await;
                let what = format!("{wire:?} {status}");
                // The configured origin got the one request; the other origin nothing at all.
                assert_eq!(
                    accepted.load(Ordering::SeqCst),
                    0,
                    "{what}: {:?}",
                    seen_elsewhere.lock().unwrap()
                );
                let seen = task.await.unwrap();
                assert_eq!(seen.len(), 1, "{what}");
                assert!(
                    seen[0].contains("the user's private data")
                        && seen[0].contains("sk-secret-key"),
                    "{what}"
                );
                let e = r.expect_err(&what);
                assert!(matches!(e, ModelError::Refused(_)), "{what}: {e}");
                let m = e.to_string();
                assert!(
                    m.contains(&format!("HTTP {status}"))
                        && m.contains("not followed")
                        && m.contains(&format!("{elsewhere}{path}"))
                        && !m.contains("token="),
                    "{what}: {m}"
                );
            }
        }
        // A redirect within the origin is not followed either: the endpoint is fixed, so a
        // redirect says the base URL is wrong, and the operator is told to fix it.
        let (base, task) = scripted(vec![(
            308,
            "location: /v1/messages/\r\n".into(),
            String::new(),
        )])
        .await;
        let up = Upstream::new(Wire::Anthropic, Some(&base), Some("k".into()), "m".into());
        let e = up
            .complete(&conv(), &[], Duration::from_secs(10))
            .await
            .unwrap_err();
        assert!(
            e.to_string().contains(&format!("{base}/v1/messages/")),
            "{e}"
        );
        assert_eq!(task.await.unwrap().len(), 1);
    }

    /// A server for one connection that reads the request and then lets `answer` write what
    /// it likes (and hang, or drip) on the socket.
    async fn raw<F, Fut>(answer: F) -> String
    where
        F: FnOnce(tokio::net::TcpStream) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            let mut buf = vec![0u8; 1 << 16];
            loop {
                let n = sock.read(&mut buf).await.unwrap_or(0);
                got.extend_from_slice(&buf[..n]);
                if request_complete(&got) || n == 0 {
                    break;
                }
            }
            answer(sock).await;
        });
        base
    }

    #[test]
    fn untrusted_text_is_one_line_without_controls() {
        let t = untrusted_text("\nERROR forged line\r\n\x1b[2J\u{2028}next\u{202e}\u{85}\u{7f}\t");
        assert_eq!(
            t,
            r"ERROR forged line\r\n\u{1b}[2J\u{2028}next\u{202e}\u{85}\u{7f}"
        );
        assert_eq!(t.lines().count(), 1);
        assert!(!t.chars().any(char::is_control));
        // Text that is fine stays as it is, backslashes and all.
        assert_eq!(
            untrusted_text(r#"{"error": "bad key", "path": "C:\x"}"#),
            r#"{"error": "bad key", "path": "C:\x"}"#
        );
        assert_eq!(untrusted_text("  "), "");
    }

    #[test]
    fn untrusted_text_is_cut_on_a_character_and_an_escape() {
        let t = untrusted_text(&"é".repeat(10_000));
        assert_eq!(t.chars().count(), UNTRUSTED_TEXT_CHARS + 1);
        assert!(t.ends_with("é…"));
        let exact = "x".repeat(UNTRUSTED_TEXT_CHARS);
        assert_eq!(untrusted_text(&exact), exact);
        // An escape that does not fit is left out whole.
        let t = untrusted_text(&format!("{}\x1b", "x".repeat(UNTRUSTED_TEXT_CHARS - 3)));
        assert!(t.ends_with("xxx…"), "{t}");
        let t = untrusted_text(&"\x1b".repeat(10_000));
        assert!(t.chars().count() <= UNTRUSTED_TEXT_CHARS + 1);
        assert!(t.ends_with("\\u{1b}…"), "{t}");
    }

    /// Regression: the model API's error text went raw into the ModelError, so into the
    /// server's text log and the 502 body, where a newline forges a log line and an escape
    /// sequence drives the operator's terminal.
    #[tokio::test]
    async fn an_upstreams_error_text_cannot_forge_a_log_line() {
        let body = format!(
            "{{\"error\":\"bad\"}}\nERROR forged line\r\n\x1b[2J\u{2028}\u{202e}\u{85}{}",
            "x".repeat(10_000)
        );
        let (base, _t) = scripted(vec![(400, String::new(), body)]).await;
        let up = Upstream::new(Wire::OpenAi, Some(&base), Some("k".into()), "m".into());
        let e = up
            .complete(&conv(), &[], Duration::from_secs(10))
            .await
            .unwrap_err();
        let m = e.to_string();
        assert!(matches!(e, ModelError::Refused(_)), "{m}");
        assert!(m.contains("ERROR forged line"), "{m}");
        assert!(
            !m.chars().any(|c| c.is_control()
                || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}')),
            "{m:?}"
        );
        assert_eq!(m.lines().count(), 1, "{m:?}");
        assert!(m.chars().count() < 500, "{} chars", m.chars().count());
    }

    /// Regression: an answer was read whole before its size was checked, so an upstream (or a
    /// man in the middle of a plain-http base URL) that streams without end grew memory until
    /// the deadline. Each of these ends at once, long before the call's budget.
    #[tokio::test]
    async fn an_answer_is_capped_while_it_is_read() {
        async fn hang(mut sock: tokio::net::TcpStream) {
            let _ = sock.flush().await;
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        // Chunked, more than the cap, and no end.
        let over = raw(|mut sock| async move {
            let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
            if sock.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let chunk = format!("{:x}\r\n{}\r\n", 1 << 16, " ".repeat(1 << 16));
            for _ in 0..(MAX_ANSWER_BYTES >> 16) + 2 {
                if sock.write_all(chunk.as_bytes()).await.is_err() {
                    return;
                }
            }
            hang(sock).await
        })
        .await;
        // A length past the cap, announced and never sent.
        let announced = raw(|mut sock| async move {
            let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1099511627776\r\n\r\n{";
            let _ = sock.write_all(head.as_bytes()).await;
            hang(sock).await
        })
        .await;
        for (base, says) in [(over, "more than"), (announced, "more than")] {
            let up = Upstream::new(Wire::Anthropic, Some(&base), None, "m".into());
            let e = up
                .complete(&conv(), &[], Duration::from_secs(20))
                .await
                .unwrap_err();
            assert!(
                matches!(e, ModelError::Malformed(ref m) if m.contains(says)),
                "{e}"
            );
        }
        // An error's body is read only as far as the error message needs.
        let endless_error = raw(|mut sock| async move {
            let head = "HTTP/1.1 400 Bad Request\r\ntransfer-encoding: chunked\r\n\r\n";
            let text = "no ".repeat(1 << 14);
            let chunk = format!("{:x}\r\n{text}\r\n", text.len());
            if sock.write_all(head.as_bytes()).await.is_err()
                || sock.write_all(chunk.as_bytes()).await.is_err()
            {
                return;
            }
            hang(sock).await
        })
        .await;
        let up = Upstream::new(Wire::OpenAi, Some(&endless_error), None, "m".into());
        let e = up
            .complete(&conv(), &[], Duration::from_secs(20))
            .await
            .unwrap_err();
        assert!(
            matches!(e, ModelError::Refused(ref m) if m.contains("HTTP 400: no no")),
            "{e}"
        );
    }

    /// Regression: an answer that drips (headers, then a byte now and then) ran into the
    /// call's deadline as "the answer broke off", an unavailable upstream (502), where it is a
    /// timeout (504) like an answer that never starts.
    #[tokio::test]
    async fn a_dripping_answer_ends_at_the_deadline_as_a_timeout() {
        let base = raw(|mut sock| async move {
            let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n";
            if sock.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            loop {
                if sock.write_all(b" ").await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        let up = Upstream::new(Wire::OpenAi, Some(&base), None, "m".into());
        let started = Instant::now();
        let e = up
            .complete(&conv(), &[], Duration::from_millis(800))
            .await
            .unwrap_err();
        assert!(matches!(e, ModelError::Timeout(_)), "{e}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    /// Regression: an answer could carry any number of tool calls (hundreds of thousands fit
    /// in the answer cap), each refused or run in turn and echoed, with its result, in every
    /// later request of the loop.
    #[tokio::test]
    async fn an_answer_with_too_many_tool_calls_is_malformed() {
        let call = r#"{"type":"tool_use","id":"t","name":"code_exec_python","input":{"code":"1"}}"#;
        let calls = vec![call; MAX_TOOL_CALLS_PER_ANSWER + 1].join(",");
        let body = format!(r#"{{"content":[{calls}],"stop_reason":"tool_use"}}"#);
        let (base, _t) = scripted(vec![(200, String::new(), body)]).await;
        let up = Upstream::new(Wire::Anthropic, Some(&base), None, "m".into());
        let r = up.complete(&conv(), &[], Duration::from_secs(10)).await;
        assert!(
            matches!(r, Err(ModelError::Malformed(ref m)) if m.contains("tool calls")),
            "{:?}",
            r.map(|t| t.calls.len())
        );
        // As many as the cap are taken.
        let calls = vec![call; MAX_TOOL_CALLS_PER_ANSWER].join(",");
        let body = format!(r#"{{"content":[{calls}],"stop_reason":"tool_use"}}"#);
        let (base, _t) = scripted(vec![(200, String::new(), body)]).await;
        let up = Upstream::new(Wire::Anthropic, Some(&base), None, "m".into());
        let t = up
            .complete(&conv(), &[], Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(t.calls.len(), MAX_TOOL_CALLS_PER_ANSWER);
    }

    /// JSON nested past serde_json's recursion limit (128) is an answer that is not JSON, not
    /// a stack overflow, for both wires (OpenAI's arguments are a second JSON text).
    #[tokio::test]
    async fn deeply_nested_json_is_malformed_not_a_crash() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let (base, _t) = scripted(vec![(200, String::new(), deep.clone())]).await;
        let up = Upstream::new(Wire::Anthropic, Some(&base), None, "m".into());
        let e = up
            .complete(&conv(), &[], Duration::from_secs(10))
            .await
            .unwrap_err();
        assert!(matches!(e, ModelError::Malformed(_)), "{e}");
        let args = serde_json::to_string(&deep).unwrap();
        let body = format!(
            r#"{{"choices":[{{"message":{{"content":null,"tool_calls":[{{"id":"c","type":"function","function":{{"name":"code_exec_python","arguments":{args}}}}}]}}}}]}}"#
        );
        let (base, _t) = scripted(vec![(200, String::new(), body)]).await;
        let up = Upstream::new(Wire::OpenAi, Some(&base), None, "m".into());
        let t = up
            .complete(&conv(), &[], Duration::from_secs(10))
            .await
            .unwrap();
        // Kept as the string it is, for the loop to answer that the arguments are invalid.
        assert!(t.calls[0].arguments.is_string());
    }

    /// Regression: a base URL's user and password (a credential reqwest sends as basic
    /// authentication) were in the "cannot reach" error, so in the 502 body and the log.
    #[tokio::test]
    async fn a_base_urls_credentials_are_in_no_error() {
        // A port nothing listens on: bound, then closed.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let base = format!("http://user:s3cret@127.0.0.1:{port}/v1");
        let mut up = Upstream::new(Wire::OpenAi, Some(&base), None, "m".into());
        up.attempts = 1;
        let e = up
            .complete(&conv(), &[], Duration::from_secs(10))
            .await
            .unwrap_err();
        let m = e.to_string();
        assert!(matches!(e, ModelError::Unavailable(_)), "{m}");
        assert!(
            m.contains(&format!("cannot reach http://127.0.0.1:{port}/v1"))
                && !m.contains("s3cret"),
            "{m}"
        );
        assert!(!format!("{up:?}").contains("s3cret"));
        assert_eq!(up.base_url, base);
    }

    /// Regression: the model's name, as the upstream gives it, went raw and unbounded into
    /// each audit line of a model call and into the answer's `model`.
    #[tokio::test]
    async fn the_upstreams_model_name_is_one_bounded_line() {
        let name = format!("m\nINFO forged\x1b[2J{}", "x".repeat(100_000));
        let body = serde_json::json!({
            "model": name,
            "choices": [{"message": {"role": "assistant", "content": "hi"}}],
        });
        let (base, _t) = scripted(vec![(200, String::new(), body.to_string())]).await;
        let up = Upstream::new(Wire::OpenAi, Some(&base), None, "m".into());
        let t = up
            .complete(&conv(), &[], Duration::from_secs(10))
            .await
            .unwrap();
        let m = t.model.unwrap();
        assert!(m.starts_with(r"m\nINFO forged\u{1b}[2J"), "{m}");
        assert!(!m.chars().any(char::is_control));
        assert!(m.chars().count() <= UNTRUSTED_TEXT_CHARS + 1);
    }
}
