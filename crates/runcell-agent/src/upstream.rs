//! The model behind an HTTP API: Anthropic Messages or OpenAI Chat Completions (and any server
//! that speaks it: vLLM, Ollama, LM Studio). 429 and 5xx answers, and connections that fail,
//! are retried with backoff a bounded number of times (honouring `Retry-After` within the
//! request's budget); anything else that is wrong is a [`ModelError`] with what happened. The
//! API key is sent to the upstream only: it is never in an error, a log line or a response.

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
            .field("base_url", &self.base_url)
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
/// The most of an upstream's answer read (a model's answer is far smaller).
const MAX_ANSWER_BYTES: usize = 16 << 20;

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
                .build()
                .unwrap_or_default(),
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
        match self.wire {
            Wire::Anthropic => crate::anthropic::parse_response(v)
                .map_err(|e| ModelError::Malformed(e.to_string())),
            Wire::OpenAi => {
                crate::openai::parse_response(v).map_err(|e| ModelError::Malformed(e.to_string()))
            }
        }
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
                    self.base_url,
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
        let bytes = res.bytes().await.map_err(|e| {
            (
                ModelError::Unavailable(format!("the answer broke off: {}", without_url(&e))),
                None,
            )
        })?;
        if bytes.len() > MAX_ANSWER_BYTES {
            return Err((
                ModelError::Malformed(format!("an answer of {} bytes", bytes.len())),
                None,
            ));
        }
        let detail = || {
            let text = String::from_utf8_lossy(&bytes);
            let text: String = text.chars().take(300).collect();
            format!("HTTP {}: {}", status.as_u16(), text.trim())
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
        serde_json::from_slice(&bytes)
            .map_err(|e| (ModelError::Malformed(format!("not JSON: {e}")), None))
    }
}

/// A reqwest error's text without the URL (which is the operator's, not the client's).
fn without_url(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    if let Some(url) = e.url() {
        s = s.replace(url.as_str(), "the upstream");
    }
    s
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A scripted HTTP server: answers each connection with the next canned response (status,
    /// extra headers, body), records the requests.
    async fn scripted(
        answers: Vec<(u16, &'static str, String)>,
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
                    let text = String::from_utf8_lossy(&got).to_string();
                    if let Some(i) = text.find("\r\n\r\n") {
                        let len = text[..i]
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse::<usize>().unwrap())
                            })
                            .unwrap_or(0);
                        if got.len() >= i + 4 + len {
                            break;
                        }
                    }
                    if n == 0 {
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
            (429, "retry-after: 0\r\n", r#"{"error":"slow down"}"#.into()),
            (200, "", OPENAI_OK.into()),
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
        let five = (500, "", "oops".to_string());
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

        let (base, _t) = scripted(vec![(200, "", r#"{"content": 5}"#.into())]).await;
        let up = Upstream::new(Wire::Anthropic, Some(&base), None, "m".into());
        assert!(matches!(
            up.complete(&conv(), &[], Duration::from_secs(5)).await,
            Err(ModelError::Malformed(_))
        ));

        let (base, _t) = scripted(vec![(401, "", r#"{"error":"bad key"}"#.into())]).await;
        let up = Upstream::new(Wire::OpenAi, Some(&base), Some("k".into()), "m".into());
        assert!(matches!(
            up.complete(&conv(), &[], Duration::from_secs(5)).await,
            Err(ModelError::Refused(_))
        ));

        let (base, _t) = scripted(vec![(0, "", String::new())]).await;
        let up = Upstream::new(Wire::OpenAi, Some(&base), None, "m".into());
        let started = Instant::now();
        let e = up
            .complete(&conv(), &[], Duration::from_millis(500))
            .await
            .unwrap_err();
        assert!(matches!(e, ModelError::Timeout(_)), "{e}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
