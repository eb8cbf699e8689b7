//! The control channel between the supervisor and the sandbox's helper processes.
//!
//! One `AF_UNIX` stream socket pair. Each frame is a JSON message followed by zero or more binary
//! blobs (file contents, stdin), so that code and data never need escaping:
//!
//! ```text
//! u32 json_len | json | u32 blob_count | (u64 blob_len | blob)*
//! ```
//!
//! All integers are little-endian. Sizes are bounded on read: the sandbox side is our code, but
//! it runs next to untrusted code, so the supervisor never trusts a length it did not cap.

use std::io::{self, Read, Write};
use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::config::{ExecStep, JailConfig};

/// Largest JSON message accepted.
pub const MAX_JSON: u32 = 4 << 20;
/// Largest total of blobs accepted in one frame.
pub const MAX_BLOBS_TOTAL: u64 = 1 << 30;
pub const MAX_BLOB_COUNT: u32 = 100_000;

/// Supervisor -> sandbox.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// First message, read by the helper: the sandbox to build.
    Setup(JailConfig),
    /// Read by the sandbox's pid 1: run a program (blobs carry files and stdin).
    Exec(ExecStep),
    /// While a program runs: kill it and everything it started (timeout, output flood). The
    /// sandbox and its files stay; pid 1 answers with `Exited`.
    Stop,
    /// Between programs: return the files under /workspace that were created or changed since
    /// the last `Exec` that carried files (blobs carry the contents).
    Collect(CollectLimits),
    /// Start an interpreter that runs code in cells (a warm interpreter): pid 1 answers with
    /// `Started`, then `InterpreterReady` once the interpreter said so, or `Exited` if it
    /// ended first.
    Start(ExecStep),
    /// Run one cell in the interpreter: write the files (blobs), hand it stdin, tell it to run
    /// its source file; pid 1 answers with `Started` and `Exited` (the cell's exit code, after
    /// every process of the run was killed and reaped, as for `Exec`; with `keep`, every
    /// process but the interpreter). Without an interpreter: `Failed` at step `cell`.
    Cell(CellStep),
    /// While a program or cell runs: send SIGINT to its process group (Ctrl-C), so that an
    /// interpreter can abandon the running code and keep its state. pid 1 answers nothing of
    /// its own; the program's end comes as usual (or the supervisor follows up with `Stop`).
    Interrupt,
    /// Between programs: write files (blobs carry the contents) under /workspace or /tmp; pid
    /// 1 answers `Written` (or `Failed`).
    Put { files: Vec<crate::config::FileSpec> },
    /// Between programs: every file under /workspace (not only what changed), or the one at
    /// `path`; pid 1 answers `Files`.
    Browse(Browse),
    /// Adopt an interpreter forked from a template (`template`): like `Start`, but instead of
    /// forking the program pid 1 places the inputs, answers `GraftChannel` with the cell
    /// channel's other end, the program's stdin, stdout and stderr attached, and waits for the
    /// interpreter to say hello on the channel from a process that is pid 1's own child (its
    /// pid comes from the kernel, `SO_PASSCRED`). Then `Started` and `InterpreterReady` (or
    /// `Exited`), as for `Start`; a `Stop` while it waits gives up (`Failed`).
    Graft(ExecStep),
}

/// What a `Browse` returns.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Browse {
    pub limits: CollectLimits,
    /// Relative to the area's root: only this file (a missing or non-regular file gives an
    /// empty list).
    pub path: Option<String>,
    /// Where `path` is: /workspace (the default), or /tmp (one file only: a session
    /// interpreter's report of a cell's results, written outside the user's files).
    #[serde(default)]
    pub area: BrowseArea,
}

/// The directory a [`Browse`] reads beneath.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BrowseArea {
    #[default]
    Workspace,
    /// /tmp: only a single `path` may be read there, never a listing.
    Tmp,
}

/// One cell for a started interpreter.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CellStep {
    pub files: Vec<crate::config::FileSpec>,
    /// Blob index of the cell's stdin, if any (otherwise empty).
    pub stdin_blob: Option<usize>,
    /// A session's cell: the interpreter keeps its state and waits for the next cell (pid 1
    /// kills every other process of the run); otherwise it serves this one cell and ends.
    pub keep: bool,
    /// The cell's source file, for a session's cell (its interpreter reads it from there).
    pub source: Option<PathBuf>,
}

/// Caps for collecting output files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollectLimits {
    /// At most this many files are returned; the rest are counted in `omitted`.
    pub max_files: u64,
    /// Content is included for files up to this size...
    pub max_file_bytes: u64,
    /// ...as long as the contents returned so far stay under this total.
    pub max_total_bytes: u64,
    /// Directory entries visited at most (a hundred thousand tiny files must not stall us).
    pub max_entries: u64,
    /// Bytes read at most, over all files, to hash them (a sparse file can claim gigabytes it
    /// does not hold); files past it are listed without hash or content.
    pub max_read_bytes: u64,
    /// Wall-clock budget of the whole collection, in milliseconds.
    pub deadline_ms: u64,
}

/// One collected file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollectedFile {
    /// Relative to /workspace ('/'-separated), exactly the file's name: valid UTF-8, at most
    /// `MAX_PATH_BYTES` long (other files are left out and counted).
    pub path: String,
    pub size: u64,
    /// Hex sha256 of the whole content; `None` when reading it would exceed the read budget.
    pub sha256: Option<String>,
    /// Blob index of the content, when it is included.
    pub blob: Option<usize>,
}

/// How a program ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum ExitStatus {
    Code(i32),
    Signal(i32),
}

impl ExitStatus {
    /// Shell convention: a signal N becomes 128 + N.
    pub fn code(self) -> i32 {
        match self {
            ExitStatus::Code(c) => c,
            ExitStatus::Signal(s) => 128 + s,
        }
    }
}

/// What the Landlock layer achieved for a program, as reported by rust-landlock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LandlockStatus {
    Full,
    Partial,
    None,
}

impl LandlockStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            LandlockStatus::Full => "full",
            LandlockStatus::Partial => "partial",
            LandlockStatus::None => "none",
        }
    }
}

/// Sandbox -> supervisor.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Report {
    /// From the helper: the sandbox's pid 1 exists (host pid, for diagnostics).
    Spawned { pid: i32 },
    /// From pid 1: the filesystem and namespaces are set up; send programs.
    Ready,
    /// From pid 1: the interpreter of a `Start` is waiting for cells.
    InterpreterReady,
    /// From pid 1: the program is running (its pid inside the sandbox).
    Started { pid: i32, landlock: LandlockStatus },
    /// From pid 1: the program ended and every other process it left was killed and reaped.
    Exited {
        status: ExitStatus,
        wall_ns: u64,
        /// CPU time of the program and every reaped descendant (getrusage RUSAGE_CHILDREN delta).
        cpu_ns: u64,
        /// Largest resident set of any single process, in bytes.
        max_rss_bytes: u64,
        /// The scratch filesystem (/tmp, /workspace, /dev/shm) had no space or inodes left.
        disk_full: bool,
        /// A session's interpreter survived the cell and waits for the next one.
        #[serde(default)]
        interpreter: bool,
    },
    /// From pid 1: the files of a `Collect`, sorted by path.
    Files {
        files: Vec<CollectedFile>,
        /// Files left out because of `max_files` or `max_entries`, or because their names
        /// could not be returned faithfully.
        omitted: u64,
        /// Why files were left out, beyond the caps of the request (one sentence each).
        #[serde(default)]
        notes: Vec<String>,
    },
    /// From pid 1: the files of a `Put` are written.
    Written,
    /// From pid 1, answering `Graft`: four descriptors are attached (the channel's other end,
    /// stdin, stdout, stderr), for the template's fork.
    GraftChannel,
    /// From any helper: a setup step failed.
    Failed {
        step: String,
        path: Option<PathBuf>,
        error: ChildError,
    },
}

/// The error behind a step that failed in a process of the sandbox (the helper, pid 1, or the
/// program's process before execve), as it crosses the control socket: the errno when the OS
/// gave one, and the message. Its `Display` is the message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(deny_unknown_fields)]
#[error("{message}")]
pub struct ChildError {
    pub errno: Option<i32>,
    pub message: String,
}

/// A decoded frame.
pub struct Frame<T> {
    pub message: T,
    pub blobs: Vec<Vec<u8>>,
}

/// Write one frame. The whole frame is assembled first so that it goes out in as few writes as
/// possible (the peer reads it with blocking reads once the first byte is there).
pub fn send<T: Serialize>(mut w: impl Write, message: &T, blobs: &[&[u8]]) -> io::Result<()> {
    w.write_all(&encode(message, blobs)?)?;
    w.flush()
}

/// One frame's bytes (to send with a descriptor attached, see `sys::send_with_fd`).
pub fn encode<T: Serialize>(message: &T, blobs: &[&[u8]]) -> io::Result<Vec<u8>> {
    let json = serde_json::to_vec(message).map_err(io::Error::other)?;
    let blob_total: usize = blobs.iter().map(|b| b.len() + 8).sum();
    let mut buf = Vec::with_capacity(8 + json.len() + blob_total);
    buf.extend_from_slice(&(json.len() as u32).to_le_bytes());
    buf.extend_from_slice(&json);
    buf.extend_from_slice(&(blobs.len() as u32).to_le_bytes());
    for blob in blobs {
        buf.extend_from_slice(&(blob.len() as u64).to_le_bytes());
        buf.extend_from_slice(blob);
    }
    Ok(buf)
}

/// How much one frame may carry.
#[derive(Debug, Clone, Copy)]
pub struct FrameLimits {
    pub max_json: u32,
    pub max_blob_count: u32,
    pub max_blobs_total: u64,
}

impl FrameLimits {
    /// Requests (supervisor to sandbox): programs with their files and stdin.
    pub const REQUEST: FrameLimits = FrameLimits {
        max_json: MAX_JSON,
        max_blob_count: MAX_BLOB_COUNT,
        max_blobs_total: MAX_BLOBS_TOTAL,
    };
    /// Reports other than `Files`: small JSON, never a blob.
    pub const REPORT: FrameLimits = FrameLimits {
        max_json: 64 << 10,
        max_blob_count: 0,
        max_blobs_total: 0,
    };
}

/// Read one request frame. `Ok(None)` on a clean end of stream before the frame starts.
pub fn recv<T: DeserializeOwned>(r: impl Read) -> io::Result<Option<Frame<T>>> {
    recv_with(r, FrameLimits::REQUEST)
}

/// Read one frame within `limits`.
pub fn recv_with<T: DeserializeOwned>(
    mut r: impl Read,
    limits: FrameLimits,
) -> io::Result<Option<Frame<T>>> {
    let mut len = [0u8; 4];
    match r.read(&mut len[..1])? {
        0 => return Ok(None),
        _ => r.read_exact(&mut len[1..])?,
    }
    let json_len = u32::from_le_bytes(len);
    if json_len > limits.max_json {
        return Err(invalid(format!("message of {json_len} bytes is too large")));
    }
    let mut json = vec![0u8; json_len as usize];
    r.read_exact(&mut json)?;
    let message = serde_json::from_slice(&json).map_err(|e| invalid(e.to_string()))?;
    r.read_exact(&mut len)?;
    let count = u32::from_le_bytes(len);
    if count > limits.max_blob_count {
        return Err(invalid(format!("{count} blobs is too many")));
    }
    let mut blobs = Vec::with_capacity(count as usize);
    let mut total = 0u64;
    for _ in 0..count {
        let mut blen = [0u8; 8];
        r.read_exact(&mut blen)?;
        let blen = u64::from_le_bytes(blen);
        total = total.saturating_add(blen);
        if total > limits.max_blobs_total {
            return Err(invalid("blobs too large".to_string()));
        }
        let mut blob = vec![0u8; blen as usize];
        r.read_exact(&mut blob)?;
        blobs.push(blob);
    }
    Ok(Some(Frame { message, blobs }))
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_round_trip_with_blobs() {
        let mut buf = Vec::new();
        let msg = Report::Exited {
            status: ExitStatus::Signal(9),
            wall_ns: 5,
            cpu_ns: 3,
            max_rss_bytes: 1024,
            disk_full: false,
            interpreter: false,
        };
        send(&mut buf, &msg, &[b"abc", b"", &[0xff, 0x00]]).unwrap();
        send(&mut buf, &Report::Ready, &[]).unwrap();
        let mut r = &buf[..];
        let f: Frame<Report> = recv(&mut r).unwrap().unwrap();
        assert!(matches!(
            f.message,
            Report::Exited {
                status: ExitStatus::Signal(9),
                max_rss_bytes: 1024,
                ..
            }
        ));
        assert_eq!(f.blobs, vec![b"abc".to_vec(), vec![], vec![0xff, 0x00]]);
        let f: Frame<Report> = recv(&mut r).unwrap().unwrap();
        assert!(matches!(f.message, Report::Ready));
        assert!(recv::<Report>(&mut r).unwrap().is_none());
    }

    #[test]
    fn oversized_and_truncated_frames_are_rejected() {
        let mut r = &(MAX_JSON + 1).to_le_bytes()[..];
        assert!(recv::<Report>(&mut r).is_err());
        let mut buf = Vec::new();
        send(&mut buf, &Report::Ready, &[b"hello"]).unwrap();
        buf.truncate(buf.len() - 2);
        assert!(recv::<Report>(&mut &buf[..]).is_err());
    }

    #[test]
    fn report_limits_refuse_blobs_and_large_messages() {
        let mut buf = Vec::new();
        send(&mut buf, &Report::Ready, &[b"x"]).unwrap();
        assert!(recv_with::<Report>(&mut &buf[..], FrameLimits::REPORT).is_err());
        let mut buf = Vec::new();
        send(&mut buf, &Report::Ready, &[]).unwrap();
        assert!(recv_with::<Report>(&mut &buf[..], FrameLimits::REPORT)
            .unwrap()
            .is_some());
        let big = (FrameLimits::REPORT.max_json + 1).to_le_bytes();
        assert!(recv_with::<Report>(&mut &big[..], FrameLimits::REPORT).is_err());
    }

    #[test]
    fn failures_carry_their_errno_across_the_socket() {
        let mut buf = Vec::new();
        let failed = Report::Failed {
            step: "mount proc".into(),
            path: Some("/tmp/proc".into()),
            error: ChildError {
                errno: Some(13),
                message: "Permission denied (os error 13)".into(),
            },
        };
        send(&mut buf, &failed, &[]).unwrap();
        let f: Frame<Report> = recv_with(&mut &buf[..], FrameLimits::REPORT)
            .unwrap()
            .unwrap();
        match f.message {
            Report::Failed { step, path, error } => {
                assert_eq!(step, "mount proc");
                assert_eq!(path, Some(PathBuf::from("/tmp/proc")));
                assert_eq!(error.errno, Some(13));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn exit_status_uses_shell_convention() {
        assert_eq!(ExitStatus::Code(3).code(), 3);
        assert_eq!(ExitStatus::Signal(9).code(), 137);
    }
}

/// Property tests: whatever bytes come down the control socket, the reader neither panics nor
/// allocates past the frame's limits, and every frame the writer produces reads back equal,
/// up to and including the limits.
#[cfg(test)]
mod proptests {
    use super::*;
    use proptest::prelude::*;
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    /// The system allocator, noting the largest single allocation the current thread makes
    /// while it is watched: the reader's buffers are single allocations sized from the frame.
    struct Watch;

    thread_local! {
        static WATCHING: Cell<bool> = const { Cell::new(false) };
        static LARGEST: Cell<usize> = const { Cell::new(0) };
    }

    fn note(size: usize) {
        if WATCHING.try_with(Cell::get).unwrap_or(false) {
            let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
        }
    }

    // SAFETY: every call is forwarded unchanged to `System`; the bookkeeping touches only
    // const-initialised thread-locals, which never allocate.
    unsafe impl GlobalAlloc for Watch {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            note(layout.size());
            // SAFETY: the caller's contract for `alloc` is passed on as is.
            unsafe { System.alloc(layout) }
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            note(layout.size());
            // SAFETY: as for `alloc`.
            unsafe { System.alloc_zeroed(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: `ptr` was allocated by `System` with `layout` (every path above).
            unsafe { System.dealloc(ptr, layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            note(new_size);
            // SAFETY: as for `dealloc`, and `new_size` is the caller's.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    #[global_allocator]
    static ALLOC: Watch = Watch;

    /// Read one frame from `bytes`, returning the outcome and the largest allocation made.
    fn read_watched<T: DeserializeOwned>(
        bytes: &[u8],
        limits: FrameLimits,
    ) -> (io::Result<Option<Frame<T>>>, usize) {
        LARGEST.with(|l| l.set(0));
        WATCHING.with(|w| w.set(true));
        let r = recv_with::<T>(&mut &bytes[..], limits);
        WATCHING.with(|w| w.set(false));
        (r, LARGEST.with(Cell::get))
    }

    /// The most one frame within `limits` may make the reader hold in one allocation (plus
    /// the parser's and the error messages' own small ones).
    fn bound(limits: FrameLimits) -> usize {
        (limits.max_json as usize)
            .max(limits.max_blobs_total as usize)
            .max(limits.max_blob_count as usize * std::mem::size_of::<Vec<u8>>())
            .max(4096)
    }

    const SMALL: FrameLimits = FrameLimits {
        max_json: 256,
        max_blob_count: 8,
        max_blobs_total: 1024,
    };

    /// Streams that are nearly frames: a header with any length, JSON or not, blob counts and
    /// lengths of any size, cut anywhere; and plain noise.
    fn stream() -> impl Strategy<Value = Vec<u8>> {
        let framed = (
            prop_oneof![any::<u32>(), 0u32..300],
            prop_oneof![
                Just(br#"{"type":"ready"}"#.to_vec()),
                Just(br#"{"type":"spawned","pid":7}"#.to_vec()),
                prop::collection::vec(any::<u8>(), 0..64),
            ],
            prop_oneof![any::<u32>(), 0u32..10],
            prop::collection::vec(
                (
                    prop_oneof![any::<u64>(), 0u64..600],
                    prop::collection::vec(any::<u8>(), 0..64),
                ),
                0..4,
            ),
            any::<prop::sample::Index>(),
            any::<bool>(),
        )
            .prop_map(|(len, json, count, blobs, cut, exact)| {
                let mut b = Vec::new();
                let len = if exact { json.len() as u32 } else { len };
                b.extend_from_slice(&len.to_le_bytes());
                b.extend_from_slice(&json);
                b.extend_from_slice(&count.to_le_bytes());
                for (blen, data) in blobs {
                    b.extend_from_slice(&blen.to_le_bytes());
                    b.extend_from_slice(&data);
                }
                let keep = cut.index(b.len() + 1);
                b.truncate(keep.max(b.len() * usize::from(exact)));
                b
            });
        prop_oneof![framed, prop::collection::vec(any::<u8>(), 0..128)]
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof!["[a-z /]{0,12}", any::<String>()]
    }

    /// Every report the sandbox sends.
    fn report() -> impl Strategy<Value = Report> {
        let file = (
            text(),
            any::<u64>(),
            prop::option::of("[0-9a-f]{64}"),
            prop::option::of(0usize..8),
        )
            .prop_map(|(path, size, sha256, blob)| CollectedFile {
                path,
                size,
                sha256,
                blob,
            });
        prop_oneof![
            any::<i32>().prop_map(|pid| Report::Spawned { pid }),
            Just(()).prop_map(|()| Report::Ready),
            (
                any::<i32>(),
                prop::sample::select(vec![
                    LandlockStatus::Full,
                    LandlockStatus::Partial,
                    LandlockStatus::None
                ])
            )
                .prop_map(|(pid, landlock)| Report::Started { pid, landlock }),
            (
                any::<bool>(),
                any::<i32>(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                any::<bool>()
            )
                .prop_map(|(sig, n, wall_ns, cpu_ns, max_rss_bytes, disk_full)| {
                    Report::Exited {
                        status: if sig {
                            ExitStatus::Signal(n)
                        } else {
                            ExitStatus::Code(n)
                        },
                        wall_ns,
                        cpu_ns,
                        max_rss_bytes,
                        disk_full,
                        interpreter: disk_full && sig,
                    }
                }),
            (
                prop::collection::vec(file, 0..4),
                any::<u64>(),
                prop::collection::vec(text(), 0..3)
            )
                .prop_map(|(files, omitted, notes)| Report::Files {
                    files,
                    omitted,
                    notes
                }),
            (
                text(),
                prop::option::of(text()),
                prop::option::of(any::<i32>()),
                text()
            )
                .prop_map(|(step, path, errno, message)| Report::Failed {
                    step,
                    path: path.map(PathBuf::from),
                    error: ChildError { errno, message },
                }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        #[test]
        fn any_stream_is_read_or_refused_within_the_limits(bytes in stream()) {
            for limits in [SMALL, FrameLimits::REPORT] {
                let (r, largest) = read_watched::<serde_json::Value>(&bytes, limits);
                prop_assert!(largest <= bound(limits), "allocated {largest} for {limits:?}");
                if let Ok(Some(f)) = r {
                    prop_assert!(f.blobs.len() <= limits.max_blob_count as usize);
                    prop_assert!(f.blobs.iter().map(|b| b.len() as u64).sum::<u64>() <= limits.max_blobs_total);
                }
                let (_, largest) = read_watched::<Report>(&bytes, limits);
                prop_assert!(largest <= bound(limits), "allocated {largest} for {limits:?}");
            }
        }

        #[test]
        fn a_written_frame_reads_back_equal_up_to_the_limits(
            message in report(),
            blobs in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..200), 0..6),
        ) {
            let refs: Vec<&[u8]> = blobs.iter().map(Vec::as_slice).collect();
            let mut buf = Vec::new();
            send(&mut buf, &message, &refs).unwrap();
            let json_len = serde_json::to_vec(&message).unwrap().len() as u32;
            let total: u64 = blobs.iter().map(|b| b.len() as u64).sum();
            // Limits exactly at this frame's size: accepted, and equal.
            let exact = FrameLimits { max_json: json_len, max_blob_count: blobs.len() as u32, max_blobs_total: total };
            let mut r = &buf[..];
            let f: Frame<Report> = recv_with(&mut r, exact).unwrap().unwrap();
            prop_assert!(r.is_empty(), "the reader took the whole frame, no more");
            prop_assert_eq!(serde_json::to_value(&f.message).unwrap(), serde_json::to_value(&message).unwrap());
            prop_assert_eq!(&f.blobs, &blobs);
            prop_assert!(recv_with::<Report>(&mut r, exact).unwrap().is_none());
            // One byte or one blob less: refused.
            let tighter = [
                FrameLimits { max_json: json_len - 1, ..exact },
                FrameLimits { max_blob_count: exact.max_blob_count.wrapping_sub(1), ..exact },
                FrameLimits { max_blobs_total: total.wrapping_sub(1), ..exact },
            ];
            prop_assert!(recv_with::<Report>(&mut &buf[..], tighter[0]).is_err());
            if !blobs.is_empty() {
                prop_assert!(recv_with::<Report>(&mut &buf[..], tighter[1]).is_err());
            }
            if total > 0 {
                prop_assert!(recv_with::<Report>(&mut &buf[..], tighter[2]).is_err());
            }
        }
    }

    /// A request frame whose JSON is exactly `MAX_JSON` bytes is read back whole.
    #[test]
    fn a_frame_at_the_request_limit_reads_back() {
        let s = "x".repeat(MAX_JSON as usize - 2);
        let message = serde_json::Value::String(s);
        let mut buf = Vec::new();
        send(&mut buf, &message, &[b"blob"]).unwrap();
        assert_eq!(u32::from_le_bytes(buf[..4].try_into().unwrap()), MAX_JSON);
        let f: Frame<serde_json::Value> = recv(&mut &buf[..]).unwrap().unwrap();
        assert_eq!(f.message, message);
        assert_eq!(f.blobs, [b"blob".to_vec()]);
        buf.splice(4..5, *b"xx");
        buf[..4].copy_from_slice(&(MAX_JSON + 1).to_le_bytes());
        assert!(recv::<serde_json::Value>(&mut &buf[..]).is_err());
    }
}
