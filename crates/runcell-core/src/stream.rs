//! Live output as text: the engine hands an `OutputSink` raw byte chunks as the program writes
//! them, and a chunk may end in the middle of a UTF-8 character. The HTTP API's event stream
//! and MCP's progress notifications both carry text: both use [`TextSink`].

use runcell_jail::{OutputSink, Stream};

/// An [`OutputSink`] that hands text to a callback as the program writes it, never splitting
/// a character, and flushes what it held back when it is dropped (when the run is over).
///
/// The supervisor calls it on its blocking thread and must never wait on a slow client (it
/// also enforces the timeout): the callback should only push into a channel.
pub struct TextSink<F: FnMut(Stream, String)> {
    send: F,
    stdout: Utf8Chunker,
    stderr: Utf8Chunker,
}

impl<F: FnMut(Stream, String)> TextSink<F> {
    pub fn new(send: F) -> Self {
        TextSink {
            send,
            stdout: Utf8Chunker::default(),
            stderr: Utf8Chunker::default(),
        }
    }

    fn send(&mut self, stream: Stream, text: String) {
        if !text.is_empty() {
            (self.send)(stream, text);
        }
    }
}

impl<F: FnMut(Stream, String)> OutputSink for TextSink<F> {
    fn output(&mut self, stream: Stream, chunk: &[u8]) {
        let text = match stream {
            Stream::Stdout => self.stdout.push(chunk),
            Stream::Stderr => self.stderr.push(chunk),
        };
        self.send(stream, text);
    }
}

impl<F: FnMut(Stream, String)> Drop for TextSink<F> {
    fn drop(&mut self) {
        let out = self.stdout.finish();
        self.send(Stream::Stdout, out);
        let err = self.stderr.finish();
        self.send(Stream::Stderr, err);
    }
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
    fn text_sink_sends_whole_characters_and_flushes_on_drop() {
        let mut got = Vec::new();
        {
            let mut sink = TextSink::new(|s, t| got.push((s, t)));
            sink.output(Stream::Stdout, b"a\xc3");
            sink.output(Stream::Stderr, b"x\xe2\x82");
            sink.output(Stream::Stdout, b"\xa9");
        }
        assert_eq!(
            got,
            vec![
                (Stream::Stdout, "a".to_string()),
                (Stream::Stderr, "x".to_string()),
                (Stream::Stdout, "\u{e9}".to_string()),
                (Stream::Stderr, "\u{FFFD}".to_string()),
            ]
        );
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
