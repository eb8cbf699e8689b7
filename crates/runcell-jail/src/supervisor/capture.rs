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

/// Output of one stream, kept up to a cap.
pub(super) struct Capture {
    pub(super) data: Vec<u8>,
    cap: u64,
    /// The program wrote more than the cap (the rest was discarded).
    pub(super) over: bool,
}

impl Capture {
    pub(super) fn new(cap: u64) -> Self {
        Capture {
            data: Vec::new(),
            cap,
            over: false,
        }
    }

    /// Keep what fits of one chunk read from the pipe, and pass it on.
    fn keep(&mut self, chunk: &[u8], stream: Stream, sink: &mut dyn OutputSink) {
        let room = self.cap.saturating_sub(self.data.len() as u64) as usize;
        let keep = chunk.len().min(room);
        if keep > 0 {
            self.data.extend_from_slice(&chunk[..keep]);
            sink.output(stream, &chunk[..keep]);
        }
        if chunk.len() > room {
            self.over = true;
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

#[cfg(test)]
mod tests {
    use super::*;

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
