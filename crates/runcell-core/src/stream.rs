//! Live output as text: the engine hands an `OutputSink` raw byte chunks as the program writes
//! them, and a chunk may end in the middle of a UTF-8 character. The HTTP API's event stream
//! and MCP's progress notifications both carry text, so both turn chunks into text here.

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
    fn invalid_bytes_become_replacement_characters() {
        let mut c = Utf8Chunker::default();
        assert_eq!(c.push(b"a\xffb"), "a\u{FFFD}b");
        assert_eq!(c.push(b"x\xe2\x82"), "x");
        assert_eq!(c.finish(), "\u{FFFD}");
        assert_eq!(c.push(b"ok"), "ok");
    }
}
