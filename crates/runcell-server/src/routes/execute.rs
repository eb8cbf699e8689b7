//! `POST /v1/execute`: run code, answer the verdict as JSON or as server-sent events.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::header::{HeaderValue, ACCEPT, CONTENT_LENGTH};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::future::BoxFuture;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use runcell_core::stream::TextSink;
use runcell_core::{ExecRequest, NoSink, Stream, Verdict};
use serde_json::json;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tracing::Instrument;

use crate::deliver::Hold;
use crate::error::{ApiError, ErrorBody};
use crate::middleware::caller_of;
use crate::state::AppState;

/// What the run sends to the response stream.
#[derive(Debug)]
enum Message {
    Output(Stream, String),
    Done(Box<Result<Verdict, ApiError>>),
}

pub(crate) fn wants_events(headers: &HeaderMap) -> bool {
    headers
        .get_all(ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| {
            t.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .eq_ignore_ascii_case("text/event-stream")
        })
}

/// How long a request body may take to arrive.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Read a request body: 413 beyond `limit` (from `Content-Length` at once, otherwise once the
/// cap is crossed), 408 if it takes longer than [`BODY_READ_TIMEOUT`]. With a `budget`, the
/// bytes received take permits from it while the body is read; 429 when it is exhausted (many
/// large bodies arriving at once, or trickling in).
pub(crate) async fn read_body(
    body: Body,
    headers: &HeaderMap,
    limit: usize,
    budget: Option<&Arc<Semaphore>>,
) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    let collect = async {
        let mut body = Limited::new(body, limit);
        let mut buf = Vec::new();
        let mut held: Option<OwnedSemaphorePermit> = None;
        while let Some(frame) = body.frame().await {
            let frame = match frame {
                Ok(f) => f,
                Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
                    return Err(ApiError::too_large(limit))
                }
                Err(e) => {
                    return Err(ApiError::invalid(format!(
                        "The request body could not be read: {e}."
                    )))
                }
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            if let Some(budget) = budget {
                let n = u32::try_from(data.len()).unwrap_or(u32::MAX);
                let permit = budget.clone().try_acquire_many_owned(n).map_err(|_| {
                    ApiError::rate_limited(
                        "The server is receiving too many request bodies at once. Retry shortly.",
                    )
                })?;
                match &mut held {
                    Some(h) => h.merge(permit),
                    None => held = Some(permit),
                }
            }
            buf.extend_from_slice(&data);
        }
        Ok(Bytes::from(buf))
    };
    // A body trickled in slowly would hold its place in line: it gets a deadline.
    match tokio::time::timeout(BODY_READ_TIMEOUT, collect).await {
        Ok(r) => r,
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            format!(
                "The request body did not arrive within {} s.",
                BODY_READ_TIMEOUT.as_secs()
            ),
        )),
    }
}

pub(crate) fn parse_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| {
        use serde_json::error::Category;
        match e.classify() {
            Category::Data => ApiError::invalid(format!("Invalid request: {e}.")),
            _ => ApiError::invalid(format!("The request body is not valid JSON: {e}.")),
        }
    })
}

/// Aborts the run's task (which kills its sandbox) when the event stream is dropped.
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Run code and answer its verdict. A failing program is still a 200 with the failure in
/// `error`; only a request the server refuses is an error status. With
/// `Accept: text/event-stream` the answer is a stream of server-sent events: `stdout` and
/// `stderr` (`{"text": ...}`) as the program writes, then one `result` carrying the verdict
/// (or `error` carrying an error body).
#[utoipa::path(post, path = "/v1/execute", tag = "execute", request_body = ExecRequest,
    responses(
        (status = 200, description = "The verdict (JSON), or with `Accept: text/event-stream` \
            events `stdout`/`stderr` (`{\"text\": \"...\"}`) then `result` (the verdict)",
            content(
                (Verdict = "application/json"),
                (String = "text/event-stream"),
            )),
        (status = 400, description = "Invalid request: malformed JSON, a wrong type, an unknown \
            language, a limit above the operator's maximum (`limit` names it)", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 408, description = "The body did not arrive within 30 s", body = ErrorBody),
        (status = 413, description = "The body is larger than the server's cap", body = ErrorBody),
        (status = 429, description = "At capacity: all sandboxes busy and the queue full; see \
            `Retry-After`", body = ErrorBody),
        (status = 503, description = "Shutting down", body = ErrorBody),
    ))]
pub(crate) async fn execute(
    State(state): State<AppState>,
    req: Request,
) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let reservation = state.reserve()?;
    let parsed = match read_body(body, &parts.headers, state.inner.max_body_bytes, None).await {
        Ok(bytes) => parse_body::<ExecRequest>(&bytes),
        Err(e) => Err(e),
    };
    let req = parsed.inspect_err(|e| state.inner.metrics.rejected(e.category))?;
    let admitted = reservation.admit(req, caller_of(&parts, "http")).await?;
    if let Some(hold) = parts.extensions.get::<Hold>() {
        admitted.hold_until_delivered(hold);
    }

    if !wants_events(&parts.headers) {
        return Ok(Json(admitted.run(Box::new(NoSink)).await?).into_response());
    }
    Ok(event_stream(&state, move |sink| {
        Box::pin(async move { admitted.run(sink).await })
    }))
}

/// A run answered as server-sent events: `stdout` and `stderr` (`{"text": ...}`) as the
/// program writes, then `result` (the verdict) or `error` (an error body). `run` gets the sink
/// for the output; dropping the stream (a client that went away) aborts it.
pub(crate) fn event_stream<F>(state: &AppState, run: F) -> Response
where
    F: FnOnce(
            Box<dyn runcell_core::OutputSink + Send>,
        ) -> BoxFuture<'static, Result<Verdict, ApiError>>
        + Send
        + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    let done = tx.clone();
    let task = tokio::spawn(
        async move {
            let sink = TextSink::new(move |stream, text| {
                // A closed channel means the client is gone; the kill switch handles that.
                let _ = tx.send(Message::Output(stream, text));
            });
            let result = run(Box::new(sink)).await;
            let _ = done.send(Message::Done(Box::new(result)));
        }
        // The run outlives the handler: it keeps the request's span (its id) all the same.
        .in_current_span(),
    );
    let abort = AbortOnDrop(task.abort_handle());
    let events = futures_util::stream::unfold((rx, Some(abort)), |(mut rx, abort)| async move {
        // Once the result is out (the abort guard gone), the stream ends.
        abort.as_ref()?;
        let (event, abort) = match rx.recv().await {
            Some(Message::Output(stream, text)) => (
                Event::default()
                    .event(match stream {
                        Stream::Stdout => "stdout",
                        Stream::Stderr => "stderr",
                    })
                    .data(json!({ "text": text }).to_string()),
                abort,
            ),
            Some(Message::Done(result)) => {
                let event = match *result {
                    Ok(v) => Event::default()
                        .event("result")
                        .data(serde_json::to_string(&v).unwrap_or_default()),
                    Err(e) => Event::default().event("error").data(e.body().to_string()),
                };
                // The run is over: dropping the guard aborts nothing.
                (event, None)
            }
            None => (
                Event::default().event("error").data(
                    ApiError::internal("The execution failed unexpectedly.")
                        .body()
                        .to_string(),
                ),
                None,
            ),
        };
        Some((Ok::<_, Infallible>(event), (rx, abort)))
    });
    let mut res = Sse::new(events)
        .keep_alive(KeepAlive::new().interval(state.inner.keep_alive))
        .into_response();
    res.headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    res
}
