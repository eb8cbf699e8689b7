//! Live output as MCP progress notifications. When a `tools/call` carries a progress token,
//! the program's stdout and stderr travel as `notifications/progress` while it runs:
//! `message` is the text, `progress` the number of output bytes sent so far (so it always
//! increases, as the spec requires), and `_meta["runcell/stream"]` says `stdout` or
//! `stderr`.
//!
//! The engine's supervisor calls the sink on its blocking thread and must never wait on a
//! slow client (it also enforces the timeout), so the sink only pushes into an unbounded
//! channel (bounded in practice by the run's output caps). An async task drains it, merging
//! what piled up, and sends at most one batch every [`MIN_INTERVAL`].

use std::time::Duration;

use rmcp::model::{NotificationMetaObject, ProgressNotificationParam, ProgressToken};
use rmcp::service::Peer;
use rmcp::RoleServer;
use runcell_core::stream::TextSink;
use runcell_core::Stream;
use serde_json::json;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// Notifications are rate-limited: what arrives in between is merged.
const MIN_INTERVAL: Duration = Duration::from_millis(50);
/// The most text one notification carries.
const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// The key of the stream name in a notification's `_meta`.
pub const STREAM_META_KEY: &str = "runcell/stream";

fn stream_name(s: Stream) -> &'static str {
    match s {
        Stream::Stdout => "stdout",
        Stream::Stderr => "stderr",
    }
}

/// The sink the executor writes to: text, never a split character, flushed when the run is
/// over (see [`TextSink`]).
pub type ProgressSink = TextSink<Box<dyn FnMut(Stream, String) + Send>>;

/// A sink and the receiving end for [`forward`].
pub fn channel() -> (ProgressSink, UnboundedReceiver<(Stream, String)>) {
    let (tx, rx) = unbounded_channel();
    let send: Box<dyn FnMut(Stream, String) + Send> = Box::new(move |stream, text| {
        // A closed channel means the call is over or cancelled; nothing to do.
        let _ = tx.send((stream, text));
    });
    (TextSink::new(send), rx)
}

/// Merge what is waiting in the channel into at most one message per stream switch, each at
/// most [`MAX_MESSAGE_BYTES`] (bigger chunks stay whole: splitting them gains nothing).
fn batch(
    first: (Stream, String),
    rx: &mut UnboundedReceiver<(Stream, String)>,
) -> Vec<(Stream, String)> {
    let mut out: Vec<(Stream, String)> = vec![first];
    let mut total = out[0].1.len();
    while total < MAX_MESSAGE_BYTES {
        let Ok((stream, text)) = rx.try_recv() else {
            break;
        };
        total += text.len();
        match out.last_mut() {
            Some((s, t)) if *s == stream && t.len() + text.len() <= MAX_MESSAGE_BYTES => {
                t.push_str(&text)
            }
            _ => out.push((stream, text)),
        }
    }
    out
}

/// Send the channel's text as progress notifications until the sink is dropped (and the
/// channel drained). Returns early if the client is gone.
pub async fn forward(
    mut rx: UnboundedReceiver<(Stream, String)>,
    peer: Peer<RoleServer>,
    token: ProgressToken,
) {
    let mut sent: u64 = 0;
    while let Some(first) = rx.recv().await {
        for (stream, text) in batch(first, &mut rx) {
            sent += text.len() as u64;
            let mut meta = NotificationMetaObject::new();
            meta.0
                 .0
                .insert(STREAM_META_KEY.into(), json!(stream_name(stream)));
            let mut param =
                ProgressNotificationParam::new(token.clone(), sent as f64).with_message(text);
            param.meta = Some(meta);
            if peer.notify_progress(param).await.is_err() {
                return;
            }
        }
        // Rate limit: whatever the program writes meanwhile goes into the next batch. Once
        // the run is over (the sink dropped) nothing is held back.
        if !rx.is_closed() {
            tokio::time::sleep(MIN_INTERVAL).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runcell_core::OutputSink;

    #[test]
    fn batches_merge_same_stream_chunks_and_keep_order() {
        let (mut sink, mut rx) = channel();
        sink.output(Stream::Stdout, b"a");
        sink.output(Stream::Stdout, b"b\xc3");
        sink.output(Stream::Stderr, b"E");
        sink.output(Stream::Stdout, b"\xa9");
        drop(sink);
        let first = rx.try_recv().unwrap();
        let b = batch(first, &mut rx);
        assert_eq!(
            b,
            vec![
                (Stream::Stdout, "ab".to_string()),
                (Stream::Stderr, "E".to_string()),
                (Stream::Stdout, "é".to_string()),
            ]
        );
    }

    #[test]
    fn held_back_bytes_are_flushed_on_drop() {
        let (mut sink, mut rx) = channel();
        sink.output(Stream::Stderr, b"x\xe2\x82");
        drop(sink);
        assert_eq!(rx.try_recv().unwrap(), (Stream::Stderr, "x".to_string()));
        assert_eq!(
            rx.try_recv().unwrap(),
            (Stream::Stderr, "\u{FFFD}".to_string())
        );
        assert!(rx.try_recv().is_err());
    }
}
