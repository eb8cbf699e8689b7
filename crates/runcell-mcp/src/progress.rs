//! Live output as MCP progress notifications. When a `tools/call` carries a progress token,
//! the program's stdout and stderr travel as `notifications/progress` while it runs:
//! `message` is the text, `progress` the number of output bytes sent so far (so it always
//! increases, as the spec requires), and `_meta["runcell/stream"]` says `stdout` or
//! `stderr`.
//!
//! The engine's supervisor calls the sink on its blocking thread and must never wait on a
//! slow client (it also enforces the timeout), so the sink only pushes into an unbounded
//! channel (bounded in practice by the run's output caps). An async task drains it, merging
//! what piled up, and sends at most one batch every [`MIN_INTERVAL`]. Batches break where
//! lines do: the end of a line still being written is held back until its newline arrives,
//! for at most one more interval (so a progress bar without newlines still shows).

use std::time::Duration;

use tokio::time::Instant;

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

/// The end of a partial line, held back for at most [`MIN_INTERVAL`] so that notifications
/// break on line boundaries whenever the line ends within that window.
#[derive(Default)]
struct LineHold {
    /// The held text, its stream, and when it was first held.
    held: Option<(Stream, String, Instant)>,
}

impl LineHold {
    /// When the held text must go out even if its line has not ended.
    fn deadline(&self) -> Option<Instant> {
        self.held
            .as_ref()
            .map(|(_, _, since)| *since + MIN_INTERVAL)
    }

    /// The held text, to send as it is.
    fn flush(&mut self) -> Option<(Stream, String)> {
        self.held.take().map(|(stream, text, _)| (stream, text))
    }

    /// What of `items` (a batch, in order) to send now: the held text goes in front, and
    /// the last item's partial line is held back unless the run is over (`more` false),
    /// the line has been held for a whole interval already, or it is too long to wait for.
    fn take(
        &mut self,
        mut items: Vec<(Stream, String)>,
        more: bool,
        now: Instant,
    ) -> Vec<(Stream, String)> {
        let mut since = None;
        if let Some((stream, text, at)) = self.held.take() {
            since = Some(at);
            match items.first_mut() {
                Some((s, t)) if *s == stream => t.insert_str(0, &text),
                _ => items.insert(0, (stream, text)),
            }
        }
        let alone = items.len() == 1;
        let Some((stream, text)) = items.last_mut() else {
            return items;
        };
        if !more || text.ends_with('\n') || text.len() >= MAX_MESSAGE_BYTES {
            return items;
        }
        let cut = text.rfind('\n').map_or(0, |i| i + 1);
        // A tail after a newline is new; one with no newline before it continues whatever
        // was held, and is held only until that text's deadline.
        let since = if cut > 0 || !alone {
            now
        } else {
            since.unwrap_or(now)
        };
        if now.saturating_duration_since(since) >= MIN_INTERVAL {
            return items;
        }
        let stream = *stream;
        let tail = text.split_off(cut);
        if text.is_empty() {
            items.pop();
        }
        self.held = Some((stream, tail, since));
        items
    }
}

/// Send one notification; false once the client is gone.
async fn send(
    peer: &Peer<RoleServer>,
    token: &ProgressToken,
    sent: &mut u64,
    (stream, text): (Stream, String),
) -> bool {
    *sent += text.len() as u64;
    let mut meta = NotificationMetaObject::new();
    meta.0
         .0
        .insert(STREAM_META_KEY.into(), json!(stream_name(stream)));
    let mut param = ProgressNotificationParam::new(token.clone(), *sent as f64).with_message(text);
    param.meta = Some(meta);
    peer.notify_progress(param).await.is_ok()
}

/// Send the channel's text as progress notifications until the sink is dropped (and the
/// channel drained). Returns early if the client is gone.
pub async fn forward(
    mut rx: UnboundedReceiver<(Stream, String)>,
    peer: Peer<RoleServer>,
    token: ProgressToken,
) {
    let mut sent: u64 = 0;
    let mut hold = LineHold::default();
    loop {
        let next = match hold.deadline() {
            Some(deadline) => match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(next) => next,
                // The held line did not end in time: send it as it is.
                Err(_) => {
                    if let Some(item) = hold.flush() {
                        if !send(&peer, &token, &mut sent, item).await {
                            return;
                        }
                    }
                    continue;
                }
            },
            None => rx.recv().await,
        };
        let Some(first) = next else { break };
        let items = hold.take(batch(first, &mut rx), !rx.is_closed(), Instant::now());
        for item in items {
            if !send(&peer, &token, &mut sent, item).await {
                return;
            }
        }
        // Rate limit: whatever the program writes meanwhile goes into the next batch. Once
        // the run is over (the sink dropped) nothing is held back.
        if !rx.is_closed() {
            tokio::time::sleep(MIN_INTERVAL).await;
        }
    }
    if let Some(item) = hold.flush() {
        send(&peer, &token, &mut sent, item).await;
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

    fn items(v: &[(Stream, &str)]) -> Vec<(Stream, String)> {
        v.iter().map(|(s, t)| (*s, t.to_string())).collect()
    }

    #[test]
    fn partial_lines_wait_for_their_newline_within_one_interval() {
        let t0 = Instant::now();
        let mut hold = LineHold::default();
        // "hel" of "hello\n" is held back; the complete line goes out.
        let out = hold.take(items(&[(Stream::Stdout, "a\nhel")]), true, t0);
        assert_eq!(out, items(&[(Stream::Stdout, "a\n")]));
        assert_eq!(hold.deadline(), Some(t0 + MIN_INTERVAL));
        // Its end arrives in time: one whole line, nothing held.
        let out = hold.take(
            items(&[(Stream::Stdout, "lo\n")]),
            true,
            t0 + MIN_INTERVAL / 2,
        );
        assert_eq!(out, items(&[(Stream::Stdout, "hello\n")]));
        assert_eq!(hold.deadline(), None);
        // A line that does not end within the interval goes out as it is.
        let out = hold.take(items(&[(Stream::Stdout, "50%")]), true, t0);
        assert!(out.is_empty());
        let out = hold.take(items(&[(Stream::Stdout, " 60%")]), true, t0 + MIN_INTERVAL);
        assert_eq!(out, items(&[(Stream::Stdout, "50% 60%")]));
        assert!(hold.flush().is_none());
        // Held stderr stays in front of later stdout; the last partial line is held again.
        hold.take(items(&[(Stream::Stderr, "warn")]), true, t0);
        let out = hold.take(items(&[(Stream::Stdout, "x\ny")]), true, t0);
        assert_eq!(
            out,
            items(&[(Stream::Stderr, "warn"), (Stream::Stdout, "x\n")])
        );
        assert_eq!(hold.flush(), Some((Stream::Stdout, "y".to_string())));
        // Once the run is over nothing is held.
        let out = hold.take(items(&[(Stream::Stdout, "end")]), false, t0);
        assert_eq!(out, items(&[(Stream::Stdout, "end")]));
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
