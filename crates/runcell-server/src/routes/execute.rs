//! `POST /v1/execute`: run code, answer the verdict as JSON or as server-sent events.

use std::convert::Infallible;

use axum::extract::State;
use axum::http::header::{HeaderValue, ACCEPT};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::future::BoxFuture;
use runcell_core::intake;
use runcell_core::stream::TextSink;
use runcell_core::{Call, ExecRequest, NoSink, Source, Stream, Target, TargetKind, Verdict};
use serde_json::json;
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::error::{ApiError, ErrorBody};
use crate::extract::Reserved;
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

/// Parse a body as the one request, as the HTTP API sends it to `target`.
pub(crate) fn parse_request(
    state: &AppState,
    bytes: &[u8],
    target: TargetKind,
) -> Result<ExecRequest, ApiError> {
    intake::parse_json(bytes, Source::Api, target, state.service().offers()).map_err(|e| {
        state.inner.metrics.rejected(e.category());
        ApiError::from(e)
    })
}

/// A small JSON body that is not a request (an approval's decision).
pub(crate) fn parse_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::from(intake::json_error(e)))
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
#[utoipa::path(post, path = "/v1/execute", tag = "execute", request_body = crate::openapi::ExecRequest,
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
    mut req: Reserved,
) -> Result<Response, ApiError> {
    let bytes = req.read_json(None).await?;
    let request = parse_request(&state, &bytes, TargetKind::OneShot)?;
    drop(bytes);
    let call = Call::new(req.caller.clone(), Source::Api, Target::OneShot, request);
    let admitted = state.service().admit(req.ticket.clone(), call).await?;
    answer(&state, &req.headers, admitted).await
}

/// Answer an admitted run: its verdict as JSON, or as server-sent events when the client
/// asked for them.
pub(crate) async fn answer(
    state: &AppState,
    headers: &HeaderMap,
    admitted: runcell_core::Admitted,
) -> Result<Response, ApiError> {
    if !wants_events(headers) {
        return Ok(Json(admitted.run(Box::new(NoSink)).await?).into_response());
    }
    Ok(event_stream(state, move |sink| {
        Box::pin(async move { admitted.run(sink).await.map_err(ApiError::from) })
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
