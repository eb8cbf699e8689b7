//! Listening: our own accept loop (header read timeout, write stall), signals, and the
//! graceful shutdown of `runcell serve`.

use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request};
use axum::Router;

use crate::audit::{AuditLog, AuditTarget};
use crate::connections::{
    Authenticated, ConnectionLimits, Refused, UNAUTHENTICATED_DRAIN, UNAUTHENTICATED_GRACE,
};
use crate::state::AppState;
use crate::{app, ServerConfig, ServerError};

/// "timeout 30 s, compile_timeout 60 s, memory 256 MiB, ..." for the start-up log.
fn limits_summary(l: &runcell_core::Limits) -> String {
    runcell_core::Limit::ALL
        .iter()
        .map(|&limit| format!("{limit} {}", limit.kind().describe(l.get(limit))))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Counts SIGTERM/SIGINT: the first starts a graceful shutdown, a second ends the grace.
fn signals() -> std::io::Result<tokio::sync::watch::Receiver<u32>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let (tx, rx) = tokio::sync::watch::channel(0u32);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tx.send_modify(|n| *n += 1);
        }
    });
    Ok(rx)
}

async fn signalled(mut rx: tokio::sync::watch::Receiver<u32>, times: u32) {
    if rx.wait_for(|n| *n >= times).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// How long a client may take to send the head of a request, and how long a kept-alive
/// connection may sit idle before its next one.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Serve `router` on the connections `listener` accepts until `stop` completes; then stop
/// accepting and return once the requests in flight are answered. A connection that does not
/// send a complete request head within [`HEADER_READ_TIMEOUT`] is closed: without that, idle
/// or trickling connections (no key needed to open them) would pile up until the process runs
/// out of file descriptors. So is one whose writes make no progress for [`WRITE_STALL`].
///
/// Connections are counted against `limits` (beyond them a new one is closed at once and
/// `refused` is told why), and one that has not carried an authenticated request within
/// [`UNAUTHENTICATED_GRACE`] is shut down gracefully (a request in flight is still answered).
pub async fn serve_connections(
    listener: tokio::net::TcpListener,
    router: Router,
    stop: impl std::future::Future<Output = ()>,
    limits: ConnectionLimits,
    refused: impl Fn(Refused),
) {
    let tracker = tokio_util::task::TaskTracker::new();
    let (closing_tx, closing) = tokio::sync::watch::channel(false);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    tokio::pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    use std::io::ErrorKind::*;
                    if !matches!(e.kind(), ConnectionRefused | ConnectionAborted | ConnectionReset) {
                        // Out of file descriptors, most likely: do not spin.
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        let guard = match limits.admit(peer.ip()) {
            Ok(g) => g,
            Err(why) => {
                // Closed at once: it holds no descriptor and no task.
                drop(stream);
                refused(why);
                continue;
            }
        };
        let router = router.clone();
        let authenticated = Authenticated::default();
        let marker = authenticated.clone();
        let service = hyper::service::service_fn(move |mut req: Request<hyper::body::Incoming>| {
            req.extensions_mut().insert(ConnectInfo(peer));
            req.extensions_mut().insert(marker.clone());
            tower::ServiceExt::oneshot(router.clone(), req)
        });
        let io = hyper_util::rt::TokioIo::new(WriteStall::new(stream));
        let conn = http.serve_connection(io, service);
        let mut closing = closing.clone();
        tracker.spawn(async move {
            let _guard = guard;
            tokio::pin!(conn);
            let grace = tokio::time::sleep(UNAUTHENTICATED_GRACE);
            tokio::pin!(grace);
            let (mut shutting_down, mut grace_over) = (false, false);
            loop {
                tokio::select! {
                    _ = conn.as_mut() => return,
                    // (A branch's condition is read when `select!` starts waiting: whether
                    // the connection has authenticated since is checked when it fires.)
                    _ = &mut grace, if !shutting_down && !grace_over => {
                        grace_over = true;
                        if authenticated.get() {
                            continue;
                        }
                        // A graceful shutdown still waits for a half-sent request head (up
                        // to the header deadline): what is in flight on a connection that
                        // never authenticated is at most a public or a 401 answer, so it
                        // gets a moment, and then the connection is closed.
                        conn.as_mut().graceful_shutdown();
                        let _ = tokio::time::timeout(UNAUTHENTICATED_DRAIN, conn.as_mut()).await;
                        return;
                    }
                    // The only change is to "closing" (or the sender gone): shut down.
                    _ = closing.changed(), if !shutting_down => {
                        shutting_down = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
        });
    }
    drop(listener);
    // Every connection: finish what is in flight, take no new request, close.
    let _ = closing_tx.send(true);
    tracker.close();
    tracker.wait().await;
}

/// How long a write to a client may make no progress at all before the connection is closed.
pub const WRITE_STALL: Duration = Duration::from_secs(60);

/// A connection whose writes fail once they have made no progress for [`WRITE_STALL`]: a
/// client that stops reading would otherwise keep its connection, and what is buffered for
/// it, for as long as it likes.
struct WriteStall<T> {
    io: T,
    stalled: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl<T> WriteStall<T> {
    fn new(io: T) -> Self {
        WriteStall { io, stalled: None }
    }

    fn progress<R>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        r: std::task::Poll<std::io::Result<R>>,
    ) -> std::task::Poll<std::io::Result<R>> {
        use std::future::Future;
        use std::task::Poll;
        if r.is_ready() {
            self.stalled = None;
            return r;
        }
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(WRITE_STALL)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client stopped reading",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for WriteStall<T> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for WriteStall<T> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = std::pin::Pin::new(&mut this.io).poll_write(cx, buf);
        this.progress(cx, r)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = std::pin::Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.progress(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let r = std::pin::Pin::new(&mut this.io).poll_flush(cx);
        this.progress(cx, r)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let r = std::pin::Pin::new(&mut this.io).poll_shutdown(cx);
        this.progress(cx, r)
    }
}

/// Listen and serve until SIGTERM or SIGINT; then stop accepting, let running executions
/// finish within the grace period, kill the rest and return once their sandboxes are gone.
pub async fn serve(config: ServerConfig) -> Result<(), ServerError> {
    if config.max_concurrent == 0 {
        return Err(ServerError::Config(
            "max_concurrent must be at least 1".into(),
        ));
    }
    let audit = AuditLog::open(&config.audit).map_err(|source| ServerError::AuditLog {
        target: format!("{:?}", config.audit),
        source,
    })?;
    let state = AppState::new(&config, audit);
    if !state.auth_enabled() && !config.listen.ip().is_loopback() {
        return Err(ServerError::NoKeyOnPublicAddress(config.listen));
    }
    let signals = signals().map_err(ServerError::Signals)?;
    let bind_error = |source| ServerError::Bind {
        addr: config.listen,
        source,
    };
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(bind_error)?;
    let addr = listener.local_addr().map_err(bind_error)?;
    if !state.auth_enabled() {
        tracing::warn!(
            "WARNING: NO API KEY IS SET. Anyone who can reach {addr} can run code on this host. \
             This is only allowed on loopback; set RUNCELL_API_KEY for any other use."
        );
    }
    tracing::info!(
        "listening on http://{addr} ({} at once, {} queued, bodies up to {}, {})",
        config.max_concurrent,
        config.max_queue,
        runcell_core::units::format_size(config.max_body_bytes as u64),
        if state.auth_enabled() {
            "API key required"
        } else {
            "no API key"
        }
    );
    if state.auth_enabled() {
        let ids: Vec<&str> = config.api_keys.iter().map(|k| k.id.as_str()).collect();
        tracing::info!("API keys: {}", ids.join(", "));
    }
    let p = &config.engine.policy;
    tracing::info!(
        "limits: default {}; maximum {}; audit log: {}{}",
        limits_summary(&p.defaults),
        limits_summary(&p.max),
        match &config.audit {
            AuditTarget::Stderr => "stderr".to_string(),
            AuditTarget::Off => "off".to_string(),
            AuditTarget::File(f) => f.display().to_string(),
        },
        if config.engine.strict { "; strict" } else { "" }
    );
    let limits = connection_limits(&config);
    tracing::info!(
        "connections: at most {} at once, {} from one address; without an authenticated \
         request, closed after {:?}",
        limits.max_total(),
        limits.max_per_peer(),
        UNAUTHENTICATED_GRACE
    );
    let runs = state.runs().clone();
    let service = state.service().clone();
    let shutdown = state.shutdown_token();
    let metrics_state = state.clone();
    let refused = move |why: Refused| {
        metrics_state.metrics().rejected(why.reason());
    };
    // agent-sandbox's runtime contract on an address of its own, when asked for: the same
    // state (run service, admission, metrics, audit), its own connection caps.
    let contract = match config.agent_sandbox_listen {
        Some(at) => {
            let l = tokio::net::TcpListener::bind(at)
                .await
                .map_err(|source| ServerError::Bind { addr: at, source })?;
            let bound = l
                .local_addr()
                .map_err(|source| ServerError::Bind { addr: at, source })?;
            tracing::warn!(
                "serving agent-sandbox's runtime contract on http://{bound} WITHOUT \
                 authentication (the contract has none): only the sandbox router may reach it"
            );
            let door = crate::agent_sandbox::Door::new(state.clone());
            door.start();
            let contract_state = state.clone();
            let refused = move |why: Refused| {
                contract_state.metrics().rejected(why.reason());
            };
            Some(serve_connections(
                l,
                crate::agent_sandbox::router(door),
                signalled(signals.clone(), 1),
                // The same caps as the API's, counted together: the descriptors they were
                // derived from are the process's, whichever listener holds them.
                limits.clone(),
                refused,
            ))
        }
        None => None,
    };
    let grace = config.shutdown_grace;
    let clustered = config.cluster.is_some();
    if let Some(c) = &config.cluster {
        tracing::info!(
            "cluster: this server is {}; session ids name it, and requests for other \
             servers' sessions are forwarded to them",
            c.pod
        );
    }
    // On the first signal the server drains: /readyz answers 503 and no new session is
    // taken. A single server then stops accepting connections; one of a cluster goes on
    // serving its live sessions (the load balancer stops sending new work once readiness
    // fails) until none is left and nothing runs, or the grace period ends.
    let drain_state = state.clone();
    let stop = {
        let signals = signals.clone();
        async move {
            signalled(signals.clone(), 1).await;
            crate::cluster::drain(&drain_state);
            if clustered {
                tracing::info!(
                    "draining: no new sessions; {} session(s) and {} running execution(s) get \
                     {:?} to finish",
                    drain_state.sessions().stats().live,
                    drain_state.runs().active(),
                    grace
                );
                tokio::select! {
                    _ = crate::cluster::idle(&drain_state) => {}
                    _ = tokio::time::sleep(grace) => {}
                    _ = signalled(signals.clone(), 2) => {}
                }
            }
        }
    };
    let main = serve_connections(listener, app(state), stop, limits, refused);
    let server = async move {
        match contract {
            Some(c) => {
                tokio::join!(main, c);
            }
            None => main.await,
        }
    };
    tokio::pin!(server);
    let grace_over = async {
        signalled(signals.clone(), 1).await;
        tracing::info!(
            "shutting down: {}; {} running execution(s) get {:?} to finish",
            if clustered {
                "draining"
            } else {
                "no new connections"
            },
            runs.active(),
            grace
        );
        tokio::select! {
            _ = tokio::time::sleep(grace) => {}
            _ = signalled(signals.clone(), 2) => {}
        }
    };
    tokio::select! {
        _ = &mut server => {}
        _ = grace_over => {
            let n = runs.kill_all();
            shutdown.cancel();
            tracing::warn!("grace period over: killing {n} execution(s)");
            if tokio::time::timeout(CLOSE_AFTER_KILL, &mut server).await.is_err() {
                tracing::warn!("connections still open; closing them");
            }
        }
    }
    // Handlers wait for their runs, but a run whose client left is still being torn down.
    runs.kill_all();
    shutdown.cancel();
    // No request waits for a slot any more, and sessions end with the server: their
    // sandboxes are torn down before it exits.
    let _ = tokio::task::spawn_blocking(move || service.shutdown()).await;
    let deadline = Instant::now() + TEARDOWN_WAIT;
    while runs.active() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// The caps on client connections: the configured ones, else derived from the open-files
/// limit, which is first raised as far as the hard limit allows.
fn connection_limits(config: &ServerConfig) -> ConnectionLimits {
    let open_files = match runcell_core::raise_open_files_limit(1 << 20) {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the open-files limit");
            1024
        }
    };
    let (total, per_peer) =
        ConnectionLimits::for_fd_limit(open_files, config.max_concurrent, config.max_queue);
    let total = config.max_connections.unwrap_or(total);
    let per_peer = config
        .max_connections_per_peer
        .unwrap_or(per_peer)
        .min(total);
    tracing::info!("open files: soft limit {open_files}");
    ConnectionLimits::new(total, per_peer)
}

/// After the grace period, how long connections get to deliver the verdicts of the killed
/// runs (a killed sandbox is torn down in well under a second; the rest is slow clients).
const CLOSE_AFTER_KILL: Duration = Duration::from_secs(15);

/// How long `serve` waits for killed sandboxes to be torn down before it returns: their
/// blocking threads remove cgroups and mounts, which must not be cut off by the exit.
const TEARDOWN_WAIT: Duration = Duration::from_secs(15);
