//! Live output for server-sent events: an `OutputSink` that sends UTF-8 text chunks into a
//! channel, never splitting a character across two events.

use runcell_core::Verdict;
use runcell_jail::{OutputSink, Stream};
use tokio::sync::mpsc::UnboundedSender;

/// What the run sends to the response stream.
#[derive(Debug)]
pub enum Message {
    Output(Stream, String),
    Done(Box<Verdict>),
}

/// Turns byte chunks into text, holding back an incomplete UTF-8 sequence at the end of a
/// chunk until the next one; invalid bytes become U+FFFD (as in the verdict).
#[derive(Debug, Default)]
pub struct Utf8Chunker {
    pending: Vec<u8>,
}

impl Utf8Chunker {
    pub fn push(&mut self, chunk: &[u8]) -> String {
        let mut buf = std::mem::take(&mut self.pending);
        buf.extend_from_slice(chunk);
        let mut out = String::with_capacity(buf.len());
        let mut rest: &[u8] = &buf;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    out.push_str(&String::from_utf8_lossy(valid));
                    match e.error_len() {
                        Some(n) => {
                            out.push('\u{FFFD}');
                            rest = &after[n..];
                        }
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        out
    }

    /// Whatever is held back, at the end of the stream.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

/// Sends output into the response stream. The channel is unbounded on purpose: the
/// supervisor's loop must never block on a slow client (it also enforces the timeout), and
/// what it can send is bounded by the run's output caps.
pub struct ChannelSink {
    tx: UnboundedSender<Message>,
    stdout: Utf8Chunker,
    stderr: Utf8Chunker,
}

impl ChannelSink {
    pub fn new(tx: UnboundedSender<Message>) -> Self {
        ChannelSink {
            tx,
            stdout: Utf8Chunker::default(),
            stderr: Utf8Chunker::default(),
        }
    }

    fn send(&self, stream: Stream, text: String) {
        if !text.is_empty() {
            // A closed channel means the client is gone; the kill switch handles that.
            let _ = self.tx.send(Message::Output(stream, text));
        }
    }

    /// Flush held-back bytes, then send the verdict.
    pub fn finish(mut self, verdict: Verdict) {
        let out = self.stdout.finish();
        self.send(Stream::Stdout, out);
        let err = self.stderr.finish();
        self.send(Stream::Stderr, err);
        let _ = self.tx.send(Message::Done(Box::new(verdict)));
    }
}

impl OutputSink for ChannelSink {
    fn output(&mut self, stream: Stream, chunk: &[u8]) {
        let text = match stream {
            Stream::Stdout => self.stdout.push(chunk),
            Stream::Stderr => self.stderr.push(chunk),
        };
        self.send(stream, text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn characters_are_never_split() {
        let mut c = Utf8Chunker::default();
        let bytes = "aé€😀".as_bytes();
        let mut out = String::new();
        for b in bytes {
            out.push_str(&c.push(&[*b]));
        }
        out.push_str(&c.finish());
        assert_eq!(out, "aé€😀");
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let mut c = Utf8Chunker::default();
        assert_eq!(c.push(b"a\xffb"), "a\u{FFFD}b");
        assert_eq!(c.push(b"x\xe2\x82"), "x");
        assert_eq!(c.finish(), "\u{FFFD}");
        assert_eq!(c.push(b"ok"), "ok");
    }
}
