//! Delivering responses to clients that may stop reading.
//!
//! A verdict can be large (up to the output caps of stdout and stderr, JSON-escaped, plus the
//! files), and an event stream holds what the program wrote until the client reads it. A
//! client that stops reading would keep all of that in the server's memory for as long as it
//! keeps its connection open, and opening more such connections would add up. So:
//!
//! * the response goes through a small channel fed by a task, [`STALL`] at most per chunk and
//!   at least [`MIN_RATE`] on average once there is a backlog; a client slower than that is cut
//!   off: its body is dropped (a stream's run killed) and its connection aborted;
//! * an execution keeps its place in line (see [`Hold`]) until its response is delivered, so
//!   responses waiting for slow clients count against `max_concurrent + max_queue` like runs
//!   do, and the memory they hold is bounded by the server's capacity.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::response::Response;
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::DropGuard;

/// How long a chunk may wait for a client that does not read.
pub const STALL: Duration = Duration::from_secs(30);
/// The slowest average reading rate accepted while data is waiting (bytes per second).
pub const MIN_RATE: u64 = 64 * 1024;
/// Responses are handed over in pieces of at most this size. Smaller complete responses fit
/// in the socket's buffers and are answered as they are.
pub const CHUNK: usize = 64 * 1024;

/// Places in line kept until the response of the request that carries this (in its
/// extensions) has been delivered or dropped: the run service's [`runcell_core::Hold`].
pub use runcell_core::Hold;

/// Wrap `res` so that a client that does not read it is cut off, keeping `hold` until the
/// response is delivered (or dropped), and `closed` (dropped, it cancels what waits on the
/// response's reader) as long as the response is being delivered.
pub fn guard(res: Response, hold: Hold, closed: DropGuard) -> Response {
    let (parts, body) = res.into_parts();
    let size = body.size_hint();
    if size.exact().is_some_and(|n| n <= CHUNK as u64) {
        // Complete already: nothing is left to be delivered later.
        drop(closed);
        return Response::from_parts(parts, body);
    }
    let (tx, rx) = mpsc::channel(1);
    let broken = Arc::new(AtomicBool::new(false));
    let task_broken = broken.clone();
    tokio::spawn(async move {
        forward(body, tx, task_broken, hold).await;
        drop(closed);
    });
    Response::from_parts(parts, Body::new(Delivered { rx, broken, size }))
}

async fn forward(mut body: Body, tx: mpsc::Sender<Bytes>, broken: Arc<AtomicBool>, hold: Hold) {
    let mut hold = Some(hold);
    // The client is on schedule as long as it has read each chunk by `paid + STALL`.
    let mut paid = Instant::now();
    loop {
        let next = tokio::select! {
            next = body.frame() => next,
            // The client is gone: dropping the body ends (and kills) what produces it.
            _ = tx.closed() => return,
        };
        let frame = match next {
            None => break,
            Some(Ok(frame)) => frame,
            Some(Err(_)) => {
                broken.store(true, Ordering::SeqCst);
                return;
            }
        };
        // Trailers are not used by this API.
        let Ok(mut data) = frame.into_data() else {
            continue;
        };
        let got = Instant::now();
        while !data.is_empty() {
            let chunk = data.split_to(data.len().min(CHUNK));
            if data.is_empty() && body.is_end_stream() {
                // The last piece: the place in line is free before the client sees the end.
                hold.take();
            }
            paid = paid.max(got) + Duration::from_secs_f64(chunk.len() as f64 / MIN_RATE as f64);
            match tokio::time::timeout_at(paid + STALL, tx.send(chunk)).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return,
                Err(_) => {
                    broken.store(true, Ordering::SeqCst);
                    return;
                }
            }
        }
    }
    drop(hold);
    drop(body);
    drop(tx);
}

/// The body the client gets: the chunks [`forward`] sends; an error (which aborts the
/// connection) if the client was cut off or the original body failed.
struct Delivered {
    rx: mpsc::Receiver<Bytes>,
    broken: Arc<AtomicBool>,
    size: http_body::SizeHint,
}

impl HttpBody for Delivered {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        let this = self.get_mut();
        match this.rx.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(data)) => Poll::Ready(Some(Ok(http_body::Frame::data(data)))),
            Poll::Ready(None) if this.broken.load(Ordering::SeqCst) => {
                Poll::Ready(Some(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the response was not delivered",
                ))))
            }
            Poll::Ready(None) => Poll::Ready(None),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.size
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runcell_core::service::{Admission, AdmissionPolicy};
    use tokio_util::sync::CancellationToken;

    /// A line of one place, held by `hold`.
    fn line_held_by(hold: &Hold) -> Admission {
        let line = Admission::new(AdmissionPolicy {
            max_concurrent: 1,
            max_queue: 0,
            max_body_bytes: 1,
            keys: 1,
        });
        hold.keep(&line.reserve(None).unwrap());
        line
    }

    fn unwatched() -> DropGuard {
        CancellationToken::new().drop_guard()
    }

    fn big(n: usize) -> Response {
        Response::new(Body::from(vec![b'x'; n]))
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_does_not_read_is_cut_off_and_frees_its_place() {
        let hold = Hold::default();
        let line = line_held_by(&hold);
        let res = guard(big(4 * CHUNK), hold, unwatched());
        assert_eq!(res.body().size_hint().exact(), Some(4 * CHUNK as u64));
        // Nobody reads: the place in line stays taken for a while ...
        tokio::time::sleep(STALL / 2).await;
        assert_eq!(line.stats().places, 1);
        // ... and is given back once the client has stalled for too long.
        tokio::time::sleep(STALL).await;
        assert_eq!(line.stats().places, 0);
        // What the client would still read ends in an error, never in a clean end.
        let mut body = res.into_body();
        let mut got = 0;
        let end = loop {
            match body.frame().await {
                Some(Ok(f)) => got += f.into_data().map_or(0, |d| d.len()),
                other => break other,
            }
        };
        assert!(matches!(end, Some(Err(_))), "{end:?}");
        assert!(got < 4 * CHUNK);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reading_client_gets_everything_and_the_place_is_freed() {
        let hold = Hold::default();
        let line = line_held_by(&hold);
        let closed = CancellationToken::new();
        let res = guard(big(3 * CHUNK + 5), hold, closed.clone().drop_guard());
        assert!(!closed.is_cancelled());
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(bytes.len(), 3 * CHUNK + 5);
        assert_eq!(line.stats().places, 0);
        // Delivered: whatever waited on its reader is released.
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(closed.is_cancelled());
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_response_frees_its_place_and_cancels_its_call() {
        let hold = Hold::default();
        let line = line_held_by(&hold);
        // A stream that never ends (an event stream of a run still going).
        let body =
            Body::from_stream(futures_util::stream::pending::<Result<Bytes, std::io::Error>>());
        let closed = CancellationToken::new();
        let res = guard(Response::new(body), hold, closed.clone().drop_guard());
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(line.stats().places, 1);
        assert!(!closed.is_cancelled(), "the stream is still open");
        drop(res);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(line.stats().places, 0);
        // The client closed the stream: what it carries (an MCP call) is cancelled.
        assert!(closed.is_cancelled());
    }

    #[tokio::test]
    async fn small_responses_are_left_alone() {
        let res = guard(big(100), Hold::default(), unwatched());
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(bytes.len(), 100);
    }
}
