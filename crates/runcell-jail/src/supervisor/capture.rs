//! Output capture: each of stdout and stderr is kept up to its cap, and passed on live to an
//! [`OutputSink`] as it arrives.

use std::os::fd::OwnedFd;
use std::time::Instant;

use rustix::event::{poll, PollFd, PollFlags};

use super::timespec;

/// Which output stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Receives output as the program writes it (for streaming). Chunks are what a read returned,
/// cut at the cap.
pub trait OutputSink {
    fn output(&mut self, stream: Stream, chunk: &[u8]);
}

/// Discards live output (the outcome still carries it).
pub struct NoSink;
impl OutputSink for NoSink {
    fn output(&mut self, _: Stream, _: &[u8]) {}
}

/// Bytes asked for per read: a pipe's default capacity, so one read usually empties it.
const READ_CHUNK: usize = 64 << 10;

/// Output of one stream, kept up to a cap. The cap is on the size the output has once it is
/// delivered as JSON text (a verdict, a server-sent event, an MCP result), not on its raw
/// bytes: a control byte becomes six (`\u0001`), a quote or a backslash two, and a byte that
/// is not valid UTF-8 becomes U+FFFD, three. A program that writes control bytes would
/// otherwise make the server hold six times the cap (see [`DeliveredSize`]).
pub(super) struct Capture {
    pub(super) data: Vec<u8>,
    cap: u64,
    size: DeliveredSize,
    /// The program wrote more than the cap (the rest was discarded).
    pub(super) over: bool,
}

impl Capture {
    pub(super) fn new(cap: u64) -> Self {
        Capture {
            data: Vec::new(),
            cap,
            size: DeliveredSize::default(),
            over: false,
        }
    }

    /// Keep what fits of one chunk read from the pipe, and pass it on.
    fn keep(&mut self, chunk: &[u8], stream: Stream, sink: &mut dyn OutputSink) {
        let mut keep = 0;
        for &b in chunk {
            if self.size.add(b) > self.cap {
                self.over = true;
                break;
            }
            keep += 1;
        }
        if keep > 0 {
            self.data.extend_from_slice(&chunk[..keep]);
            sink.output(stream, &chunk[..keep]);
        }
    }

    /// Read what is available. Returns true once the cap has been crossed.
    pub(super) fn read_from(
        &mut self,
        fd: &OwnedFd,
        stream: Stream,
        sink: &mut dyn OutputSink,
    ) -> bool {
        let mut buf = [0u8; READ_CHUNK];
        loop {
            match rustix::io::read(fd, &mut buf) {
                Ok(0) => return self.over,
                Ok(n) => {
                    self.keep(&buf[..n], stream, sink);
                    if self.over {
                        return true;
                    }
                }
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => return self.over,
            }
        }
    }

    /// Read until EOF, or until the pipe is empty once `until` has passed.
    pub(super) fn drain(
        &mut self,
        fd: &OwnedFd,
        stream: Stream,
        sink: &mut dyn OutputSink,
        until: Instant,
    ) {
        let mut buf = [0u8; READ_CHUNK];
        loop {
            if self.over {
                return;
            }
            match rustix::io::read(fd, &mut buf) {
                Ok(0) => return,
                Ok(n) => self.keep(&buf[..n], stream, sink),
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::AGAIN) => {
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return;
                    }
                    let mut fds = [PollFd::new(fd, PollFlags::IN)];
                    let _ = poll(&mut fds, Some(&timespec(left)));
                }
                Err(_) => return,
            }
        }
    }
}

/// An upper bound of the size of output bytes once they are text in a JSON string: what
/// `String::from_utf8_lossy` makes of them, escaped as serde_json escapes. A byte that cannot
/// be counted for sure yet (the start of a UTF-8 sequence) counts as invalid (3) until the
/// sequence is complete and valid.
#[derive(Debug, Default)]
pub(crate) struct DeliveredSize {
    /// The size of what is settled.
    settled: u64,
    /// An incomplete UTF-8 sequence.
    held: [u8; 4],
    held_len: usize,
    /// Its length once complete.
    want: usize,
}

impl DeliveredSize {
    /// Add one byte; returns the bound of the size so far.
    pub(crate) fn add(&mut self, b: u8) -> u64 {
        match b {
            0x80..=0xBF if self.held_len > 0 => {
                self.held[self.held_len] = b;
                self.held_len += 1;
                if self.held_len == self.want {
                    let seq = &self.held[..self.held_len];
                    let n = seq.len() as u64;
                    self.settled += if std::str::from_utf8(seq).is_ok() {
                        n
                    } else {
                        3 * n
                    };
                    self.held_len = 0;
                }
            }
            _ => {
                self.break_sequence();
                match b {
                    0xC2..=0xDF => self.start(b, 2),
                    0xE0..=0xEF => self.start(b, 3),
                    0xF0..=0xF4 => self.start(b, 4),
                    // A stray continuation or a byte that never starts a sequence.
                    0x80..=0xFF => self.settled += 3,
                    b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0C => self.settled += 2,
                    0x00..=0x1F => self.settled += 6,
                    _ => self.settled += 1,
                }
            }
        }
        self.settled + 3 * self.held_len as u64
    }

    fn start(&mut self, b: u8, want: usize) {
        self.held[0] = b;
        self.held_len = 1;
        self.want = want;
    }

    /// An incomplete sequence followed by something else: each of its bytes is invalid.
    fn break_sequence(&mut self) {
        self.settled += 3 * self.held_len as u64;
        self.held_len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bound is never below the real size, whatever the bytes, and equal to it for text.
    #[test]
    fn delivered_size_bounds_the_json_of_the_lossy_text() {
        let json_size = |bytes: &[u8]| {
            let text = String::from_utf8_lossy(bytes);
            serde_json::to_string(&text).unwrap().len() as u64 - 2
        };
        let bound = |bytes: &[u8]| {
            let mut d = DeliveredSize::default();
            let mut last = 0;
            for &b in bytes {
                last = d.add(b);
            }
            last
        };
        for text in ["plain", "é€😀 and 中文", "tab\tquote\"back\\slash\n"] {
            assert_eq!(bound(text.as_bytes()), json_size(text.as_bytes()), "{text}");
        }
        assert_eq!(bound(&[1u8; 100]), 600);
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        for len in [1usize, 2, 3, 7, 64, 1000] {
            for _ in 0..200 {
                let bytes: Vec<u8> = (0..len)
                    .map(|_| {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        rng as u8
                    })
                    .collect();
                assert!(bound(&bytes) >= json_size(&bytes), "{bytes:?}");
            }
        }
        // Invalid sequences: truncated, overlong, surrogate, stray continuation.
        for bytes in [
            &b"\xe2\x82"[..],
            b"\xc0\xaf",
            b"\xed\xa0\x80",
            b"\x80\x80x",
            b"\xf4\x90\x80\x80",
        ] {
            assert!(bound(bytes) >= json_size(bytes), "{bytes:?}");
        }
    }

    #[test]
    fn control_bytes_count_as_delivered() {
        let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::NONBLOCK).unwrap();
        let mut sink = Collect(Vec::new());
        let mut cap = Capture::new(60);
        rustix::io::write(&w, &[1u8; 100]).unwrap();
        assert!(cap.read_from(&r, Stream::Stdout, &mut sink));
        assert_eq!(cap.data, [1u8; 10], "ten control bytes are sixty in JSON");
    }

    struct Collect(Vec<(Stream, Vec<u8>)>);
    impl OutputSink for Collect {
        fn output(&mut self, stream: Stream, chunk: &[u8]) {
            self.0.push((stream, chunk.to_vec()));
        }
    }

    #[test]
    fn capture_keeps_up_to_the_cap_and_passes_on_what_it_keeps() {
        let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::NONBLOCK).unwrap();
        let mut sink = Collect(Vec::new());
        let mut cap = Capture::new(5);
        rustix::io::write(&w, b"abc").unwrap();
        assert!(!cap.read_from(&r, Stream::Stdout, &mut sink));
        rustix::io::write(&w, b"defg").unwrap();
        assert!(cap.read_from(&r, Stream::Stdout, &mut sink));
        assert_eq!(cap.data, b"abcde");
        assert!(cap.over);
        assert_eq!(
            sink.0,
            vec![
                (Stream::Stdout, b"abc".to_vec()),
                (Stream::Stdout, b"de".to_vec())
            ]
        );
        // A drain after EOF returns at once.
        drop(w);
        let mut cap = Capture::new(10);
        cap.drain(&r, Stream::Stderr, &mut sink, Instant::now());
        assert!(cap.data.is_empty() && !cap.over);
    }
}
