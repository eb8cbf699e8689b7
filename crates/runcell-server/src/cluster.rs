//! Several servers behind one address: forwarding a session's requests to the server that
//! holds it, readiness, and draining.
//!
//! A session lives in one server process, named in its id ([`runcell_core::cluster`]). A
//! request that names a session of another server (in its path, in the E2B door's
//! `E2b-Sandbox-Id` header, or in MCP's `Mcp-Session-Id` on `/mcp`) is forwarded there once, as it came: the same method, path,
//! headers and a streamed body both ways (server-sent events included), with [`HOP_HEADER`]
//! added so that the owner never forwards it again. The owner authenticates the caller as
//! usual (the servers share their keys); this server only routes.
//!
//! The peer's address comes from the peer's name in an id whose HMAC tag is valid, through
//! the operator's settings (`cluster.peers`, else `cluster.peer_url`), never from the request
//! itself: a forged or tampered id is answered here as unknown, without contacting anyone.
//!
//! What a forward holds is bounded by the connection limits: HTTP/1 carries one request at a
//! time, so each forward in flight is one client connection (counted against
//! `max_connections` and `max_connections_per_peer`) and one connection to the owner, which
//! lives as long as the request. The owner's own admission then applies to what is run.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use runcell_core::cluster::{ClusterSettings, Owner};
use runcell_core::service::{RemoteFuture, RemoteSessions};
use runcell_core::{ErrorKind, RunError};

use crate::error::ApiError;
use crate::state::AppState;

/// Marks a forwarded request (its value: the forwarding server's name). A request that
/// carries it is served where it arrives, never forwarded again.
pub const HOP_HEADER: &str = "runcell-forwarded-by";

/// On the answer to a forwarded request ([`HOP_HEADER`]): the owner's key check let the
/// caller in. The forwarding server then treats the client's connection as authenticated
/// (a long call or a stream is not cut at the unauthenticated grace) and strips the header;
/// a copy a client sends is stripped on the way in and never believed.
pub const AUTHENTICATED_HEADER: &str = "runcell-authenticated";

/// On a call into a session passed on by another server ([`PeerSessions`]): the language
/// of the door's tool (an MCP tool's), which the HTTP API's body cannot carry for a session.
/// The session's server checks it against the session's, as for a local call (a bash call
/// runs beside any session's interpreter; another language is refused).
pub const CALL_LANGUAGE_HEADER: &str = "runcell-call-language";

/// How long connecting to a peer may take before the request is answered
/// `peer_unavailable`.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Headers that belong to one connection (RFC 9110, 7.6.1), not to the request, and the
/// framing of the message, which hyper sets again for the next hop.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
    "transfer-encoding",
    "content-length",
];

/// Remove the headers that belong to one hop: [`HOP_BY_HOP`] and those `Connection` names.
fn strip_hop_by_hop(headers: &mut axum::http::HeaderMap) {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .filter(|n| !n.is_empty())
        .collect();
    for n in &named {
        headers.remove(n.as_str());
    }
    for h in HOP_BY_HOP {
        headers.remove(*h);
    }
}

/// Whether the server takes traffic: it has built a sandbox, and it is not draining.
#[derive(Default)]
pub struct Readiness {
    /// The probe was started (by the first `/readyz`).
    started: AtomicBool,
    /// 0: the probe sandbox is not built yet; 1: built; 2: it failed (the probe logs why).
    probe: AtomicU8,
    draining: AtomicBool,
}

/// `/readyz`'s reason for a probe that failed. It needs no key, so the failure itself (host
/// paths, kernel errors) stays in the server's log.
pub const SANDBOX_FAILURE_REASON: &str =
    "a sandbox could not be built: see the server's log, or run `runcell doctor`";

impl Readiness {
    /// Whether this call is the first (which starts the probe).
    fn start(&self) -> bool {
        !self.started.swap(true, Ordering::SeqCst)
    }

    /// The probe's result (its failure is logged by the probe, not kept for `/readyz`).
    pub fn probed(&self, result: Result<(), String>) {
        let ok = result.is_ok();
        self.probe.store(if ok { 1 } else { 2 }, Ordering::SeqCst);
    }

    pub fn is_probed(&self) -> bool {
        self.probe.load(Ordering::SeqCst) == 1
    }

    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// `(ready, status, why)` for `/readyz`.
    pub fn state(&self) -> (bool, &'static str, String) {
        if self.draining() {
            return (
                false,
                "draining",
                "the server is stopping: it takes no new sessions".into(),
            );
        }
        match self.probe.load(Ordering::SeqCst) {
            1 => (true, "ready", "a sandbox was built and ran".into()),
            2 => (false, "sandbox_failure", SANDBOX_FAILURE_REASON.into()),
            _ => (
                false,
                "starting",
                "building the first sandbox (the probe)".into(),
            ),
        }
    }
}

/// The session a request names in its path or headers, if it names one.
fn named_session(req: &Request) -> Option<String> {
    let path = req.uri().path();
    let segment = |rest: &str| rest.split('/').next().map(str::to_string);
    if let Some(rest) = path.strip_prefix("/v1/sessions/") {
        return segment(rest);
    }
    for prefix in ["/e2b/sandboxes/", "/e2b/v2/sandboxes/"] {
        if let Some(rest) = path.strip_prefix(prefix) {
            return segment(rest);
        }
    }
    if path == "/mcp" {
        return req
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(|s| s.trim().to_string());
    }
    if path.starts_with("/e2b/") {
        return req
            .headers()
            .get(crate::e2b::access::SANDBOX_ID)
            .and_then(|v| v.to_str().ok())
            .map(|s| s.trim().to_string());
    }
    None
}

/// The middleware in front of every route: a request for another server's session is
/// forwarded there; every other request goes on here.
pub async fn route(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if req.uri().path() == "/mcp" {
        if let Some(id) = named_session(&req) {
            if state.sessions().ids().owner(&id) == Owner::Restarted {
                return mcp_session_lost();
            }
        }
    }
    let Some(cluster) = state.sessions().ids().cluster() else {
        return next.run(req).await;
    };
    if req.headers().contains_key(HOP_HEADER) {
        return next.run(req).await;
    }
    let Some(id) = named_session(&req) else {
        return next.run(req).await;
    };
    let Owner::Peer(pod) = state.sessions().ids().owner(&id) else {
        return next.run(req).await;
    };
    let e2b = req.uri().path().starts_with("/e2b/");
    let marker = req
        .extensions()
        .get::<crate::connections::Authenticated>()
        .cloned();
    match forward(cluster, &pod, req).await {
        Ok(mut resp) => {
            state.metrics().forwarded("ok");
            // The owner's key check let the caller in: the connection may stay open like a
            // keyed one (a long call or a stream is not cut at the unauthenticated grace).
            // Any other answer (an unmatched route, a refusal) does not vouch for the caller.
            if resp.headers_mut().remove(AUTHENTICATED_HEADER).is_some() {
                if let Some(a) = marker {
                    a.mark();
                }
            }
            resp
        }
        Err(e) => {
            state.metrics().forwarded("peer_unavailable");
            tracing::warn!(peer = %pod, error = %e, "forwarding to the session's server failed");
            let err = runcell_core::RunError::new(
                runcell_core::ErrorKind::PeerUnavailable,
                format!(
                    "The server holding session {id} ({pod}) cannot be reached; retry shortly. \
                     If it stays unreachable, its sessions are lost: create a new session."
                ),
            );
            if e2b {
                crate::e2b::E2bError::from(err).into_response()
            } else {
                ApiError::from(err).into_response()
            }
        }
    }
}

/// The answer to an MCP session id that this server handed out before it restarted. The
/// status stays 404, on which MCP clients start a new session with `initialize` (the
/// protocol's rule for an ended session); the body says why, in runcell's error shape.
fn mcp_session_lost() -> Response {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "session_lost",
        "The MCP session's server restarted since the session began; the session is gone, \
         with the runcell sessions it created. Start a new one with initialize.",
    )
    .into_response()
}

/// Why a forward failed.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("no address for peer {0}")]
    NoAddress(String),
    #[error("connecting to {addr} timed out")]
    ConnectTimeout { addr: String },
    #[error("connecting to {addr}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("talking to {addr}")]
    Http {
        addr: String,
        #[source]
        source: hyper::Error,
    },
    #[error("building the forwarded request")]
    Request(#[source] axum::http::Error),
}

/// TCP keepalive on a connection to a peer: a peer whose host vanished without closing the
/// connection (a node lost) is noticed within [`PEER_KEEPALIVE_IDLE`] and a few probes, and
/// the forward ends with an error instead of holding its client and connection forever. A
/// live owner that takes its time (a long run, a wait for an approval) answers the probes, so
/// no legitimate call is cut. Best effort: a socket that refuses an option keeps the default.
fn keep_alive(stream: &tokio::net::TcpStream) {
    use rustix::net::sockopt;
    let set = sockopt::set_socket_keepalive(stream, true)
        .and_then(|()| sockopt::set_tcp_keepidle(stream, PEER_KEEPALIVE_IDLE))
        .and_then(|()| sockopt::set_tcp_keepintvl(stream, PEER_KEEPALIVE_INTERVAL))
        .and_then(|()| sockopt::set_tcp_keepcnt(stream, PEER_KEEPALIVE_PROBES));
    if let Err(e) = set {
        tracing::debug!(error = %e, "TCP keepalive on a connection to a peer");
    }
}

/// A connection to a peer silent this long is probed.
const PEER_KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// The probes' interval, and how many go unanswered before the connection is given up.
const PEER_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const PEER_KEEPALIVE_PROBES: u32 = 3;

/// Send `req` to `pod` and stream its answer back.
async fn forward(
    cluster: &ClusterSettings,
    pod: &str,
    req: Request,
) -> Result<Response, ForwardError> {
    let base = cluster
        .peer_base(pod)
        .ok_or_else(|| ForwardError::NoAddress(pod.to_string()))?;
    // `peer_base` gives `http://authority` (validated with the settings).
    let authority = base.trim_start_matches("http://").to_string();
    let addr = if authority.contains(':') && !authority.ends_with(']') {
        authority.clone()
    } else {
        format!("{authority}:80")
    };
    let stream =
        match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(&addr)).await {
            Err(_) => return Err(ForwardError::ConnectTimeout { addr }),
            Ok(Err(source)) => return Err(ForwardError::Connect { addr, source }),
            Ok(Ok(s)) => s,
        };
    let _ = stream.set_nodelay(true);
    keep_alive(&stream);
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|source| ForwardError::Http {
                addr: addr.clone(),
                source,
            })?;
    // The connection lives as long as the exchange: it ends when the answer's body has been
    // read to its end or dropped (the client went away).
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let (mut parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    parts.uri = Uri::try_from(path).map_err(|e| ForwardError::Request(e.into()))?;
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(AUTHENTICATED_HEADER);
    parts.headers.insert(
        header::HOST,
        HeaderValue::from_str(&authority).map_err(|e| ForwardError::Request(e.into()))?,
    );
    let me = cluster.pod.clone();
    parts.headers.insert(
        HOP_HEADER,
        HeaderValue::from_str(&me).map_err(|e| ForwardError::Request(e.into()))?,
    );
    parts.extensions = Default::default();
    let out = hyper::Request::from_parts(parts, body);
    let resp = sender
        .send_request(out)
        .await
        .map_err(|source| ForwardError::Http { addr, source })?;
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// The most of a peer's answer held at once for a call carried out there: one event of its
/// stream (the verdict, with the files the run wrote, is the largest), or an error body.
pub const MAX_PEER_ANSWER: usize = 256 << 20;

/// The [`RemoteSessions`] port over HTTP. A call into another server's session, named where
/// the router cannot see it (in an MCP tool's arguments), goes to that server's
/// `POST /v1/sessions/{id}/execute` once, with the caller's own key and [`HOP_HEADER`] (so it
/// is never forwarded again), asking for server-sent events: the program's output comes back
/// as it is written, then the verdict or the owner's error, which the door renders as its
/// own. The peer's address comes from a verified id only, as for [`route`]'s forwards.
pub struct PeerSessions {
    cluster: ClusterSettings,
}

impl PeerSessions {
    pub fn new(cluster: ClusterSettings) -> PeerSessions {
        PeerSessions { cluster }
    }
}

fn unreachable(pod: &str, id: &str, why: &dyn std::fmt::Display) -> RunError {
    tracing::warn!(peer = %pod, error = %why, "a call into a session of another server failed");
    RunError::new(
        ErrorKind::PeerUnavailable,
        format!(
            "The server holding session {id} ({pod}) cannot be reached; retry shortly. If it \
             stays unreachable, its sessions are lost: create a new session."
        ),
    )
}

/// The owner's error body (`{"error": {"category", "message"}}`) as the error a local call
/// would have met.
fn owner_error(pod: &str, status: StatusCode, body: &[u8]) -> RunError {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let category = v["error"]["category"].as_str().unwrap_or_default();
    let message = v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    match ErrorKind::from_category(category) {
        Some(kind) if !message.is_empty() => RunError::new(kind, message),
        // 401/403 (the servers do not share their keys) or an answer that is not runcell's.
        _ => {
            tracing::warn!(peer = %pod, %status, %category, %message, "a peer refused a call");
            RunError::internal(format!(
                "The server holding the session ({pod}) refused the call ({status}{}). The \
                 servers of a cluster must share their API keys.",
                if message.is_empty() {
                    String::new()
                } else {
                    format!(": {message}")
                }
            ))
        }
    }
}

/// One server-sent event (its bytes without the blank line that ends it): its name and its
/// data lines. A single data line (what this server's own events are) is borrowed from the
/// event, not copied; several are joined with `\n`.
fn parse_event(raw: &[u8]) -> (&[u8], std::borrow::Cow<'_, [u8]>) {
    let mut name: &[u8] = b"message";
    let mut data: Option<std::borrow::Cow<'_, [u8]>> = None;
    for line in raw.split(|&c| c == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(v) = line.strip_prefix(b"event:") {
            name = v.strip_prefix(b" ").unwrap_or(v);
        } else if let Some(v) = line.strip_prefix(b"data:") {
            let v = v.strip_prefix(b" ").unwrap_or(v);
            data = Some(match data {
                None => std::borrow::Cow::Borrowed(v),
                Some(d) => {
                    let mut d = d.into_owned();
                    d.push(b'\n');
                    d.extend_from_slice(v);
                    std::borrow::Cow::Owned(d)
                }
            });
        }
    }
    (name, data.unwrap_or_default())
}

/// Where the first blank line (`\n\n`) of `buf` at or after `from` begins.
fn event_end(buf: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while i + 1 < buf.len() {
        match buf[i + 1..].iter().position(|&c| c == b'\n') {
            None => return None,
            Some(p) => {
                let nl = i + 1 + p;
                if buf[nl - 1] == b'\n' {
                    return Some(nl - 1);
                }
                i = nl;
            }
        }
    }
    None
}

/// What one complete event of the owner's stream means for the call.
enum Event {
    /// Output (or an event to skip): go on reading.
    More,
    /// The verdict's event: its data spans `start..end` of the buffer.
    Result(usize, usize),
    /// The verdict's event, in several data lines.
    ResultJoined(Vec<u8>),
    Error(Vec<u8>),
}

fn take_event(
    buf: &[u8],
    start: usize,
    end: usize,
    sink: &mut (dyn runcell_core::OutputSink + Send),
) -> Event {
    let (name, data) = parse_event(&buf[start..end]);
    let text = || -> Vec<u8> {
        #[derive(serde::Deserialize)]
        struct Output {
            text: String,
        }
        serde_json::from_slice::<Output>(&data)
            .map(|o| o.text.into_bytes())
            .unwrap_or_default()
    };
    match name {
        b"stdout" => sink.output(runcell_core::Stream::Stdout, &text()),
        b"stderr" => sink.output(runcell_core::Stream::Stderr, &text()),
        b"result" => {
            if let std::borrow::Cow::Borrowed(d) = data {
                // The data's place in `buf`, so the verdict is parsed from the buffer itself.
                let off = d.as_ptr() as usize - buf.as_ptr() as usize;
                return Event::Result(off, off + d.len());
            }
            return Event::ResultJoined(data.into_owned());
        }
        b"error" => return Event::Error(data.into_owned()),
        _ => {}
    }
    Event::More
}
/// Read the owner's answer: output events into `sink` as they come, then the verdict or the
/// error. At most [`MAX_PEER_ANSWER`] bytes of it are held at once; each byte that arrives
/// is looked at once when searching for the end of an event, and the verdict (the largest
/// event) is parsed from the buffer it arrived in, off the async workers.
async fn read_answer(
    pod: &str,
    id: &str,
    resp: Response,
    sink: &mut (dyn runcell_core::OutputSink + Send),
) -> Result<runcell_core::Verdict, RunError> {
    use http_body_util::BodyExt;
    let status = resp.status();
    let events = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let mut body = resp.into_body();
    if !events {
        let bytes = http_body_util::Limited::new(body, MAX_PEER_ANSWER)
            .collect()
            .await
            .map_err(|e| unreachable(pod, id, &e))?
            .to_bytes();
        if status.is_success() {
            return parse_verdict(bytes.to_vec(), 0, bytes.len())
                .await
                .map_err(|e| unreachable(pod, id, &e));
        }
        return Err(owner_error(pod, status, &bytes));
    }
    let mut buf: Vec<u8> = Vec::new();
    // Where the search for the end of the next event goes on: the bytes before it hold no
    // blank line (the last one of them may be its first `\n`).
    let mut scanned = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| unreachable(pod, id, &e))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if buf.len() + data.len() > MAX_PEER_ANSWER {
            return Err(RunError::internal(format!(
                "The answer of the server holding session {id} ({pod}) is larger than \
                 {MAX_PEER_ANSWER} bytes."
            )));
        }
        buf.extend_from_slice(&data);
        let mut start = 0;
        while let Some(end) = event_end(&buf, scanned.max(start)) {
            match take_event(&buf, start, end, sink) {
                Event::More => {}
                Event::Result(from, to) => {
                    return parse_verdict(buf, from, to)
                        .await
                        .map_err(|e| unreachable(pod, id, &e));
                }
                Event::ResultJoined(data) => {
                    let len = data.len();
                    return parse_verdict(data, 0, len)
                        .await
                        .map_err(|e| unreachable(pod, id, &e));
                }
                Event::Error(data) => return Err(owner_error(pod, status, &data)),
            }
            start = end + 2;
        }
        buf.drain(..start);
        scanned = buf.len().saturating_sub(1);
    }
    Err(unreachable(pod, id, &"the answer ended before the verdict"))
}

/// The verdict in `bytes[from..to]`, parsed on a blocking thread (it can be large).
async fn parse_verdict(
    bytes: Vec<u8>,
    from: usize,
    to: usize,
) -> Result<runcell_core::Verdict, String> {
    tokio::task::spawn_blocking(move || {
        serde_json::from_slice(&bytes[from..to]).map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| e.to_string())?
}

impl RemoteSessions for PeerSessions {
    fn execute<'a>(
        &'a self,
        pod: &'a str,
        id: &'a str,
        request: &'a runcell_core::ExecRequest,
        credential: Option<&'a runcell_core::Credential>,
        mut sink: Box<dyn runcell_core::OutputSink + Send>,
    ) -> RemoteFuture<'a> {
        Box::pin(async move {
            // The body as the HTTP API takes it for a session; the tool's language beside.
            let mut request = request.clone();
            let language = request.language.take();
            let body = serde_json::to_vec(&request)
                .map_err(|_| RunError::internal("The call could not be encoded."))?;
            drop(request);
            let mut b = axum::http::Request::builder()
                .method(axum::http::Method::POST)
                .uri(format!("/v1/sessions/{id}/execute"))
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::ACCEPT, "text/event-stream");
            if let Some(l) = language {
                b = b.header(CALL_LANGUAGE_HEADER, l);
            }
            if let Some(c) = credential {
                b = b.header(header::AUTHORIZATION, format!("Bearer {}", c.expose()));
            }
            let req = b
                .body(Body::from(body))
                .map_err(|e| unreachable(pod, id, &e))?;
            let resp = forward(&self.cluster, pod, req)
                .await
                .map_err(|e| unreachable(pod, id, &e))?;
            read_answer(pod, id, resp, &mut *sink).await
        })
    }
}

/// `GET /readyz`'s answer.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct Ready {
    /// `ready`, `starting` (the probe sandbox is not built yet), `sandbox_failure` (it could
    /// not be built: see `reason`), or `draining` (stopping).
    pub status: String,
    pub reason: String,
    /// This server's name when it is one of several (`cluster.pod`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
}

/// Readiness: 200 once a sandbox has been built and ran in this process, 503 before that and
/// while draining. Needs no key.
#[utoipa::path(get, path = "/readyz", tag = "operations", security(()),
    responses(
        (status = 200, description = "Ready for traffic", body = Ready),
        (status = 503, description = "Not ready: starting, the probe sandbox failed, or draining", body = Ready)))]
pub(crate) async fn readyz(State(state): State<AppState>) -> Response {
    // The probe starts with the first question: an orchestrator asks from the start, and a
    // server nobody asks builds no extra sandbox.
    if state.inner.readiness.start() {
        spawn_probe(state.clone());
    }
    let (ready, status, reason) = state.inner.readiness.state();
    let body = Ready {
        status: status.into(),
        reason,
        pod: state.sessions().ids().pod().map(str::to_string),
    };
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, axum::Json(body)).into_response()
}

/// Build and run one sandbox (bash `true`) until it works, then mark the server ready: a
/// pod whose security context does not allow sandboxes never receives traffic. It retries
/// (1 s, doubling to 30 s) while it fails, and ends once it has worked. It runs through
/// admission like any run (a place, a slot and its memory on the ledger, with no key): on a
/// full server it waits for its turn, and a refusal (429) is retried without changing the
/// answer.
fn spawn_probe(state: AppState) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut wait = Duration::from_secs(1);
        let probe = runcell_core::ExecRequest::new("bash", "true");
        loop {
            let result = match state.service().run_internal(&probe).await {
                Ok(v) if v.exit_code == Some(0) => Some(Ok(())),
                Ok(v) => Some(Err(v.error.map(|e| e.message).unwrap_or_else(|| {
                    format!("the probe exited with {:?}", v.exit_code)
                }))),
                Err(e) if e.kind == ErrorKind::RateLimited => {
                    tracing::info!("readiness probe: not admitted yet: {}", e.message);
                    None
                }
                Err(e) => Some(Err(e.message)),
            };
            if let Some(result) = result {
                let ok = result.is_ok();
                if let Err(why) = &result {
                    tracing::warn!("readiness probe: cannot build a sandbox: {why}");
                }
                state.inner.readiness.probed(result);
                if ok {
                    return;
                }
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(30));
        }
    })
}

/// Start draining: `/readyz` answers 503, and no new session is taken (`draining`), while
/// calls in flight and calls into the live sessions go on.
pub fn drain(state: &AppState) {
    state.inner.readiness.set_draining();
    state.sessions().drain();
    state.metrics().set_draining(true);
}

/// Wait until the server holds no session and runs nothing (a draining server may then
/// stop).
pub async fn idle(state: &AppState) {
    while state.sessions().stats().live > 0 || state.runs().active() > 0 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(path: &str, headers: &[(&str, &str)]) -> Request {
        let mut b = axum::http::Request::builder().uri(path);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(Body::empty()).unwrap()
    }

    #[test]
    fn sessions_are_found_in_paths_and_the_e2b_header() {
        assert_eq!(
            named_session(&req("/v1/sessions/abc/execute", &[])).as_deref(),
            Some("abc")
        );
        assert_eq!(
            named_session(&req("/v1/sessions/abc", &[])).as_deref(),
            Some("abc")
        );
        assert_eq!(
            named_session(&req("/e2b/sandboxes/x-1/timeout", &[])).as_deref(),
            Some("x-1")
        );
        assert_eq!(
            named_session(&req("/e2b/v2/sandboxes/x-2/connect", &[])).as_deref(),
            Some("x-2")
        );
        assert_eq!(
            named_session(&req("/e2b/files?path=a", &[("e2b-sandbox-id", "y-3")])).as_deref(),
            Some("y-3")
        );
        assert_eq!(
            named_session(&req("/mcp", &[("mcp-session-id", "z-4")])).as_deref(),
            Some("z-4")
        );
        assert_eq!(named_session(&req("/mcp", &[])), None);
        assert_eq!(named_session(&req("/v1/sessions", &[])), None);
        assert_eq!(named_session(&req("/v1/execute", &[])), None);
        // The E2B header means nothing outside the E2B door.
        assert_eq!(
            named_session(&req("/v1/execute", &[("e2b-sandbox-id", "y-3")])),
            None
        );
    }

    #[test]
    fn a_peers_errors_are_the_ones_a_local_call_meets() {
        let (name, data) = parse_event(b"event: stdout\ndata: {\"text\":\"a\"}");
        assert_eq!((name, &*data), (&b"stdout"[..], &b"{\"text\":\"a\"}"[..]));
        let (name, data) = parse_event(b"data: a\r\ndata: b");
        assert_eq!((name, &*data), (&b"message"[..], &b"a\nb"[..]));
        let e = owner_error(
            "runcell-0",
            StatusCode::GONE,
            br#"{"error":{"category":"session_lost","message":"gone"}}"#,
        );
        assert_eq!(
            (e.kind, e.message.as_str()),
            (ErrorKind::SessionLost, "gone")
        );
        // A category core has no kind for (the servers do not share their keys).
        let e = owner_error(
            "runcell-0",
            StatusCode::UNAUTHORIZED,
            br#"{"error":{"category":"unauthorized","message":"The API key is not valid."}}"#,
        );
        assert_eq!(e.kind, ErrorKind::Internal);
        assert!(e.message.contains("share their API keys"), "{}", e.message);
        let e = owner_error("runcell-0", StatusCode::BAD_GATEWAY, b"<html>");
        assert_eq!(e.kind, ErrorKind::Internal);
    }

    struct Collect(Vec<(runcell_core::Stream, String)>);

    impl runcell_core::OutputSink for Collect {
        fn output(&mut self, stream: runcell_core::Stream, chunk: &[u8]) {
            self.0
                .push((stream, String::from_utf8_lossy(chunk).into_owned()));
        }
    }

    fn events(body: &str) -> Response {
        Response::builder()
            .header(header::CONTENT_TYPE, "text/event-stream")
            .body(Body::from(body.to_string()))
            .unwrap()
    }

    #[tokio::test]
    async fn a_peers_stream_feeds_the_output_then_gives_its_verdict() {
        let verdict = runcell_core::Verdict::failed(runcell_core::ErrorCategory::Timeout, "slow");
        let body = format!(
            "event: stdout\ndata: {{\"text\":\"one\\n\"}}\n\n:\n\nevent: stderr\ndata: \
             {{\"text\":\"two\"}}\n\nevent: result\ndata: {}\n\n",
            serde_json::to_string(&verdict).unwrap()
        );
        let mut sink = Collect(Vec::new());
        let got = read_answer("runcell-0", "id", events(&body), &mut sink)
            .await
            .unwrap();
        assert_eq!(got, verdict);
        assert_eq!(
            sink.0,
            vec![
                (runcell_core::Stream::Stdout, "one\n".to_string()),
                (runcell_core::Stream::Stderr, "two".to_string())
            ]
        );
        // The owner's error event, and a stream cut before the verdict (the owner died).
        let body = "event: error\ndata: {\"error\":{\"category\":\"session_busy\",\
                    \"message\":\"busy\"}}\n\n";
        let e = read_answer("runcell-0", "id", events(body), &mut sink)
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::SessionBusy);
        let e = read_answer("runcell-0", "id", events("event: stdout\n"), &mut sink)
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::PeerUnavailable);
        // A JSON answer (an error before the stream began).
        let resp = Response::builder()
            .status(StatusCode::NOT_FOUND)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(
                r#"{"error":{"category":"not_found","message":"no such session"}}"#,
            ))
            .unwrap();
        let e = read_answer("runcell-0", "id", resp, &mut sink)
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound);
    }

    fn framed(body: &[u8], frame: usize) -> Response {
        let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
            body.chunks(frame).map(|c| Ok(c.to_vec())).collect();
        Response::builder()
            .header(header::CONTENT_TYPE, "text/event-stream")
            .body(Body::from_stream(futures_util::stream::iter(chunks)))
            .unwrap()
    }

    #[tokio::test]
    async fn a_large_event_split_in_many_frames_parses() {
        let mut verdict =
            runcell_core::Verdict::failed(runcell_core::ErrorCategory::Timeout, "slow");
        verdict.stdout = "x\n".repeat(1 << 20);
        let body = format!(
            "event: stdout\ndata: {{\"text\":\"one\"}}\n\nevent: stdout\ndata: \
             {{\"text\":\ndata: \"two\"}}\n\nevent: result\ndata: {}\n\n",
            serde_json::to_string(&verdict).unwrap()
        );
        // Frame sizes that cut the blank lines, the field names and the JSON anywhere.
        for frame in [1, 2, 3, 4093, 65536] {
            if frame < 4 {
                // A byte or a few a frame: the small events and a small verdict.
                let small_verdict =
                    runcell_core::Verdict::failed(runcell_core::ErrorCategory::Timeout, "slow");
                let small = format!(
                    "event: stdout\ndata: {{\"text\":\"one\"}}\n\n:\n\nevent: result\ndata: {}\n\n",
                    serde_json::to_string(&small_verdict).unwrap()
                );
                let mut sink = Collect(Vec::new());
                let got = read_answer(
                    "runcell-0",
                    "id",
                    framed(small.as_bytes(), frame),
                    &mut sink,
                )
                .await
                .unwrap();
                assert_eq!(got, small_verdict);
                assert_eq!(sink.0, vec![(runcell_core::Stream::Stdout, "one".into())]);
                continue;
            }
            let mut sink = Collect(Vec::new());
            let got = read_answer("runcell-0", "id", framed(body.as_bytes(), frame), &mut sink)
                .await
                .unwrap();
            assert_eq!(got, verdict, "frames of {frame}");
            assert_eq!(
                sink.0,
                vec![
                    (runcell_core::Stream::Stdout, "one".to_string()),
                    (runcell_core::Stream::Stdout, "two".to_string())
                ]
            );
        }
    }

    #[test]
    fn the_end_of_an_event_is_found_from_where_the_search_stopped() {
        assert_eq!(event_end(b"a\n\nb", 0), Some(1));
        assert_eq!(event_end(b"a\n\nb", 1), Some(1));
        assert_eq!(event_end(b"a\nb\n\n", 0), Some(3));
        assert_eq!(event_end(b"\n\n", 0), Some(0));
        assert_eq!(event_end(b"a\nb\n", 0), None);
        assert_eq!(event_end(b"a\n", 1), None);
        assert_eq!(event_end(b"", 0), None);
    }

    #[tokio::test]
    async fn connections_to_peers_are_kept_alive() {
        use rustix::net::sockopt;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = tokio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        assert!(!sockopt::socket_keepalive(&stream).unwrap());
        keep_alive(&stream);
        assert!(sockopt::socket_keepalive(&stream).unwrap());
        assert_eq!(sockopt::tcp_keepidle(&stream).unwrap(), PEER_KEEPALIVE_IDLE);
        assert_eq!(
            sockopt::tcp_keepintvl(&stream).unwrap(),
            PEER_KEEPALIVE_INTERVAL
        );
        assert_eq!(
            sockopt::tcp_keepcnt(&stream).unwrap(),
            PEER_KEEPALIVE_PROBES
        );
    }

    #[test]
    fn readiness_needs_a_sandbox_and_ends_with_draining() {
        let r = Readiness::default();
        assert_eq!(r.state().1, "starting");
        r.probed(Err("mount proc: EPERM".into()));
        assert_eq!(
            r.state(),
            (false, "sandbox_failure", SANDBOX_FAILURE_REASON.into())
        );
        r.probed(Ok(()));
        assert!(r.state().0);
        r.set_draining();
        assert_eq!(r.state().1, "draining");
        assert!(!r.state().0);
    }
}
