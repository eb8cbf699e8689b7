//! Live output for server-sent events: an `OutputSink` that sends UTF-8 text chunks into a
//! channel, never splitting a character across two events (`runcell_core::stream::Utf8Chunker`).

pub use runcell_core::stream::Utf8Chunker;
use runcell_core::Verdict;
use runcell_jail::{OutputSink, Stream};
use tokio::sync::mpsc::UnboundedSender;

/// What the run sends to the response stream.
#[derive(Debug)]
pub enum Message {
    Output(Stream, String),
    Done(Box<Result<Verdict, crate::ApiError>>),
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
}

/// Held-back bytes are flushed when the run is over and the sink dropped, before the verdict
/// is sent.
impl Drop for ChannelSink {
    fn drop(&mut self) {
        let out = self.stdout.finish();
        self.send(Stream::Stdout, out);
        let err = self.stderr.finish();
        self.send(Stream::Stderr, err);
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
