//! Collecting the files a run produced under /workspace, safely.
//!
//! Runs in the sandbox's pid 1 after every other process of the sandbox is dead, so nothing can
//! change the tree while it is read. Even so it trusts nothing in it:
//! * every directory is opened relative to its parent's descriptor with `O_NOFOLLOW |
//!   O_DIRECTORY`, and every file with `O_NOFOLLOW | O_NONBLOCK`, then checked with `fstat` to
//!   be a regular file: a symlink is never followed and a fifo, socket or device never read;
//! * only what lies under /workspace's own descriptor can be reached, so no name (`..`, odd
//!   bytes, newlines) can lead elsewhere, and /workspace holds nothing but sandbox data (a hard
//!   link cannot cross into the read-only host binds: different mounts);
//! * the walk is bounded in entries visited, depth, files returned and bytes read;
//! * a name is returned only if it can be returned faithfully: a path that is not valid UTF-8
//!   (turned into a string lossily, two such names could collapse into one, and one file would
//!   overwrite the other wherever they are written) or longer than [`MAX_PATH_BYTES`] is left
//!   out, counted in `omitted` and explained in a note, and never makes the rest fail.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{fstat, openat, statat, AtFlags, Dir, FileType, Mode, OFlags};
use sha2::{Digest, Sha256};

use crate::protocol::{CollectLimits, CollectedFile};

/// Deepest directory nesting walked.
const MAX_DEPTH: usize = 64;

/// Longest output path returned, in bytes: the bound every path of a request (input files)
/// has too, so a returned path can be written back and sent again.
pub const MAX_PATH_BYTES: usize = 1024;

/// The file list of one `Files` report stays under this many bytes of JSON, so that however
/// many files a request may ask for (and however their names escape), the report fits the
/// frame the supervisor accepts; files past it are left out and counted.
const MAX_LIST_JSON: usize = crate::protocol::MAX_JSON as usize - (64 << 10);

/// What a collection found: the files (sorted by path), their contents as blobs, how many were
/// left out, and why (one sentence per reason other than the caps the caller set).
#[derive(Debug, Default)]
pub struct Collection {
    pub files: Vec<CollectedFile>,
    pub blobs: Vec<Vec<u8>>,
    pub omitted: u64,
    pub notes: Vec<String>,
}

/// What identifies a version of a file: a rewrite, append, truncate, chmod or rename changes
/// the inode's ctime (which a program cannot set), a new file has a new inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    ino: u64,
    ctime_sec: i64,
    ctime_nsec: i64,
    size: u64,
}

/// The files present before a program ran.
#[derive(Debug, Default, Clone)]
pub struct Baseline(HashMap<Vec<u8>, Stamp>);

/// A regular file found by the walk.
struct Found {
    rel: Vec<u8>,
    stamp: Stamp,
}

/// Walk `root`, calling `found` for every regular file; returns the number of entries skipped
/// because a bound was reached.
fn walk(root: &str, max_entries: u64, mut found: impl FnMut(Found)) -> rustix::io::Result<u64> {
    let top = rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut stack: Vec<(OwnedFd, Vec<u8>, usize)> = vec![(top, Vec::new(), 0)];
    let mut visited = 0u64;
    let mut skipped = 0u64;
    while let Some((dirfd, prefix, depth)) = stack.pop() {
        let mut dir = match Dir::read_from(&dirfd) {
            Ok(d) => d,
            Err(_) => continue,
        };
        for entry in dir.by_ref() {
            let Ok(entry) = entry else { break };
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            visited += 1;
            if visited > max_entries {
                skipped += 1;
                continue;
            }
            let Ok(st) = statat(&dirfd, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW) else {
                continue;
            };
            let mut rel = prefix.clone();
            if !rel.is_empty() {
                rel.push(b'/');
            }
            rel.extend_from_slice(name);
            match FileType::from_raw_mode(st.st_mode) {
                FileType::Directory if depth + 1 < MAX_DEPTH => {
                    if let Ok(fd) = openat(
                        &dirfd,
                        entry.file_name(),
                        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                        Mode::empty(),
                    ) {
                        stack.push((fd, rel, depth + 1));
                    }
                }
                FileType::RegularFile => found(Found {
                    rel,
                    stamp: Stamp {
                        ino: st.st_ino,
                        ctime_sec: st.st_ctime,
                        ctime_nsec: st.st_ctime_nsec as i64,
                        size: st.st_size as u64,
                    },
                }),
                // Symlinks, fifos, sockets, devices, too-deep directories: never read.
                _ => {}
            }
        }
    }
    Ok(skipped)
}

impl Baseline {
    /// Record the regular files under `root` as they are now.
    pub fn snapshot(root: &str, max_entries: u64) -> Baseline {
        let mut map = HashMap::new();
        let _ = walk(root, max_entries, |f| {
            map.insert(f.rel, f.stamp);
        });
        Baseline(map)
    }
}

/// Files created or changed under `root` since `baseline`, with their contents within the caps.
pub fn collect(root: &str, baseline: &Baseline, limits: &CollectLimits) -> Collection {
    let mut changed = Vec::new();
    let (mut not_utf8, mut too_long) = (0u64, 0u64);
    let skipped = walk(root, limits.max_entries, |f| {
        if baseline.0.get(&f.rel) == Some(&f.stamp) {
            return;
        }
        // Checked before the count cap, so that a skipped name never takes a returned one's
        // place.
        if std::str::from_utf8(&f.rel).is_err() {
            not_utf8 += 1;
        } else if f.rel.len() > MAX_PATH_BYTES {
            too_long += 1;
        } else {
            changed.push(f);
        }
    })
    .unwrap_or(0);
    changed.sort_by(|a, b| a.rel.cmp(&b.rel));
    let mut notes = Vec::new();
    if not_utf8 > 0 {
        notes.push(format!(
            "{not_utf8} output file(s) left out: their paths are not valid UTF-8"
        ));
    }
    if too_long > 0 {
        notes.push(format!(
            "{too_long} output file(s) left out: their paths are longer than {MAX_PATH_BYTES} bytes"
        ));
    }
    let mut omitted = skipped + not_utf8 + too_long;
    if changed.len() as u64 > limits.max_files {
        omitted += changed.len() as u64 - limits.max_files;
        changed.truncate(limits.max_files as usize);
    }
    let Ok(top) = rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return Collection {
            omitted: omitted + changed.len() as u64,
            notes,
            ..Collection::default()
        };
    };
    let mut files = Vec::new();
    let mut blobs = Vec::new();
    let mut total = 0u64;
    let mut list_json = 0usize;
    let mut over_list = 0u64;
    let mut read_budget = limits.max_read_bytes;
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(limits.deadline_ms);
    let count = changed.len();
    for (i, f) in changed.into_iter().enumerate() {
        if std::time::Instant::now() >= deadline {
            omitted += (count - i) as u64;
            break;
        }
        // Checked to be UTF-8 above: the path is the name, byte for byte.
        let Ok(path) = String::from_utf8(f.rel) else {
            continue;
        };
        // The entry's JSON at its largest (every byte escaped as \u00XX, a 64-char hash, the
        // numbers and keys).
        let entry_json = path.len() * 6 + 160;
        if list_json + entry_json > MAX_LIST_JSON {
            over_list += (count - i) as u64;
            break;
        }
        let Some((size, sha256, content)) = read_file(
            &top,
            path.as_bytes(),
            limits,
            total,
            &mut read_budget,
            deadline,
        ) else {
            continue;
        };
        if sha256.is_none() && std::time::Instant::now() >= deadline {
            notes.push(format!(
                "{path} is listed without its hash or content: reading it did not end within \
                 the collection's time bound"
            ));
        }
        list_json += entry_json;
        let blob = content.map(|c| {
            total += c.len() as u64;
            blobs.push(c);
            blobs.len() - 1
        });
        files.push(CollectedFile {
            path,
            size,
            sha256,
            blob,
        });
    }
    if over_list > 0 {
        omitted += over_list;
        notes.push(format!(
            "{over_list} output file(s) left out: the list of files reached its size bound"
        ));
    }
    Collection {
        files,
        blobs,
        omitted,
        notes,
    }
}

/// The one regular file at `rel` under `root` (a list of one, or none when there is no such
/// file or its name could not be returned), with its content within the caps.
pub fn collect_one(root: &str, rel: &str, limits: &CollectLimits) -> Collection {
    let mut c = Collection::default();
    if rel.is_empty() || rel.len() > MAX_PATH_BYTES {
        return c;
    }
    let Ok(top) = rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return c;
    };
    let mut budget = limits.max_read_bytes;
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(limits.deadline_ms);
    if let Some((size, sha256, content)) =
        read_file(&top, rel.as_bytes(), limits, 0, &mut budget, deadline)
    {
        let blob = content.map(|b| {
            c.blobs.push(b);
            0
        });
        c.files.push(CollectedFile {
            path: rel.to_string(),
            size,
            sha256,
            blob,
        });
    }
    c
}

/// Open `rel` beneath `top` one component at a time without following symlinks, check it is a
/// regular file, hash all of it and keep the content if it fits. A read still going at
/// `deadline` stops there: the file is listed without hash or content (one large file, a
/// sparse one as large as the disk limit, must not hold pid 1 past the bound its supervisor
/// waits for, which would cost the sandbox).
fn read_file(
    top: &OwnedFd,
    rel: &[u8],
    limits: &CollectLimits,
    total_so_far: u64,
    read_budget: &mut u64,
    deadline: std::time::Instant,
) -> Option<(u64, Option<String>, Option<Vec<u8>>)> {
    let parts: Vec<&[u8]> = rel.split(|&b| b == b'/').collect();
    let (name, dirs) = parts.split_last()?;
    let mut dir: Option<OwnedFd> = None;
    for d in dirs {
        let base = dir.as_ref().unwrap_or(top);
        let next = openat(
            base,
            OsStr::from_bytes(d),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        dir = Some(next);
    }
    let fd = openat(
        dir.as_ref().unwrap_or(top),
        OsStr::from_bytes(name),
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let st = fstat(&fd).ok()?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return None;
    }
    let size = st.st_size as u64;
    if size > *read_budget {
        // Listed, but neither hashed nor returned: reading it would exceed the budget.
        return Some((size, None, None));
    }
    *read_budget -= size;
    let keep = size <= limits.max_file_bytes && total_so_far + size <= limits.max_total_bytes;
    let mut content = keep.then(|| Vec::with_capacity(size as usize));
    let mut hasher = Sha256::new();
    let mut file = std::fs::File::from(fd);
    let mut buf = vec![0u8; 1 << 16];
    let mut read = 0u64;
    // Never past the size seen by fstat: all writers are dead, so the file cannot grow, but
    // the read is bounded regardless.
    let mut file = Read::take(&mut file, size);
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return None,
        };
        read += n as u64;
        // (Checked every MiB: the clock costs less than hashing it.)
        if read % (1 << 20) < n as u64 && std::time::Instant::now() >= deadline {
            return Some((size, None, None));
        }
        hasher.update(&buf[..n]);
        if let Some(c) = content.as_mut() {
            // Never keep more than was promised, whatever the file does.
            if c.len() as u64 + n as u64 > limits.max_file_bytes {
                content = None;
            } else {
                c.extend_from_slice(&buf[..n]);
            }
        }
    }
    let sha256 = crate::hex::to_hex(&hasher.finalize());
    Some((read, Some(sha256), content))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    fn limits() -> CollectLimits {
        CollectLimits {
            max_files: 100,
            max_file_bytes: 1000,
            max_total_bytes: 1500,
            max_entries: 10_000,
            max_read_bytes: 1 << 30,
            deadline_ms: 10_000,
        }
    }

    /// Regression: one large file (a sparse one as large as the disk limit) was hashed whole
    /// whatever the deadline, so pid 1 could answer after its supervisor gave up, which cost
    /// a session its sandbox.
    #[test]
    fn reading_a_file_stops_at_the_deadline() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().to_str().unwrap();
        fs::File::create(d.path().join("sparse"))
            .unwrap()
            .set_len(64 << 20)
            .unwrap();
        let past = CollectLimits {
            deadline_ms: 0,
            ..limits()
        };
        let c = collect_one(root, "sparse", &past);
        assert_eq!(c.files.len(), 1);
        assert_eq!(c.files[0].size, 64 << 20);
        assert_eq!(c.files[0].sha256, None);
        assert_eq!(c.files[0].blob, None);
        // With time to read it, it is hashed.
        let c = collect_one(root, "sparse", &limits());
        assert!(c.files[0].sha256.is_some());
    }

    #[test]
    fn new_and_changed_files_are_collected_and_unchanged_ones_are_not() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().to_str().unwrap();
        fs::write(d.path().join("input.csv"), "a,b\n").unwrap();
        fs::write(d.path().join("touched.txt"), "old").unwrap();
        let base = Baseline::snapshot(root, 1000);
        fs::write(d.path().join("touched.txt"), "new").unwrap();
        fs::create_dir_all(d.path().join("out/deep")).unwrap();
        fs::write(d.path().join("out/deep/r.csv"), "x,y\n1,2\n").unwrap();
        let Collection {
            files,
            blobs,
            omitted,
            ..
        } = collect(root, &base, &limits());
        let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["out/deep/r.csv", "touched.txt"]);
        assert_eq!(omitted, 0);
        assert_eq!(blobs[files[0].blob.unwrap()], b"x,y\n1,2\n");
        assert_eq!(
            files[1].sha256.as_deref(),
            Some("11507a0e2f5e69d5dfa40a62a1bd7b6ee57e6bcd85c67c9b8431b36fff21c437")
        );
    }

    #[test]
    fn symlinks_fifos_and_oversized_files_are_handled() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().to_str().unwrap();
        let base = Baseline::default();
        symlink("/etc/passwd", d.path().join("link")).unwrap();
        symlink("/etc", d.path().join("dirlink")).unwrap();
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            d.path().join("fifo"),
            Mode::from_raw_mode(0o644),
        )
        .unwrap();
        fs::write(d.path().join("big.bin"), vec![7u8; 1200]).unwrap();
        fs::write(d.path().join("small.txt"), "hi").unwrap();
        let Collection { files, blobs, .. } = collect(root, &base, &limits());
        let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["big.bin", "small.txt"], "no symlink, no fifo");
        assert_eq!(files[0].size, 1200);
        assert_eq!(
            files[0].blob, None,
            "over the per-file cap: hashed, not returned"
        );
        assert_eq!(blobs.len(), 1);
    }

    #[test]
    fn the_total_cap_and_the_file_count_cap_hold() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().to_str().unwrap();
        for i in 0..5 {
            fs::write(d.path().join(format!("f{i}")), vec![b'x'; 600]).unwrap();
        }
        let mut l = limits();
        let Collection {
            files,
            blobs,
            omitted,
            ..
        } = collect(root, &Baseline::default(), &l);
        assert_eq!(files.len(), 5);
        assert_eq!(
            blobs.len(),
            2,
            "1500 byte total cap: two 600 byte files fit"
        );
        assert_eq!(omitted, 0);
        l.max_files = 3;
        let Collection { files, omitted, .. } = collect(root, &Baseline::default(), &l);
        assert_eq!((files.len(), omitted), (3, 2));
        l.max_entries = 2;
        let Collection { files, omitted, .. } = collect(root, &Baseline::default(), &l);
        assert_eq!((files.len(), omitted), (2, 3));
    }

    #[test]
    fn sparse_files_do_not_make_collection_read_without_bound() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().to_str().unwrap();
        let f = fs::File::create(d.path().join("sparse")).unwrap();
        f.set_len(1 << 40).unwrap();
        fs::write(d.path().join("small"), "abc").unwrap();
        let mut l = limits();
        l.max_read_bytes = 1 << 20;
        let started = std::time::Instant::now();
        let Collection { files, blobs, .. } = collect(root, &Baseline::default(), &l);
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        assert_eq!(files[0].path, "small");
        assert!(files[0].sha256.is_some());
        assert_eq!((files[1].path.as_str(), files[1].size), ("sparse", 1 << 40));
        assert_eq!((files[1].sha256.as_deref(), files[1].blob), (None, None));
        assert_eq!(blobs.len(), 1);
    }

    #[test]
    fn odd_names_stay_inside_the_root() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().to_str().unwrap();
        fs::write(d.path().join("new\nline"), "1").unwrap();
        fs::write(d.path().join("..."), "3").unwrap();
        fs::write(d.path().join("lit\u{fffd}eral"), "4").unwrap();
        let c = collect(root, &Baseline::default(), &limits());
        let paths: Vec<&str> = c.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["...", "lit\u{fffd}eral", "new\nline"]);
        assert_eq!(c.omitted, 0);
    }

    /// Issue 10: two names that differ only in invalid UTF-8 were both returned as the same
    /// lossy string, and one overwrote the other wherever they were written. Names that are not
    /// UTF-8 are now left out, counted and explained; no two files share a path.
    #[test]
    fn names_that_are_not_utf8_are_left_out_never_collapsed() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().to_str().unwrap();
        fs::write(d.path().join(OsStr::from_bytes(b"bad\xffutf8")), "A").unwrap();
        fs::write(d.path().join(OsStr::from_bytes(b"bad\xfeutf8")), "B").unwrap();
        fs::create_dir(d.path().join(OsStr::from_bytes(b"dir\xff"))).unwrap();
        fs::write(d.path().join(OsStr::from_bytes(b"dir\xff/in")), "C").unwrap();
        fs::write(d.path().join("bad\u{fffd}utf8"), "real").unwrap();
        let mut l = limits();
        l.max_files = 1;
        let c = collect(root, &Baseline::default(), &l);
        let paths: Vec<&str> = c.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["bad\u{fffd}utf8"], "the file really named so, only");
        assert_eq!(c.blobs, [b"real".to_vec()]);
        assert_eq!(c.omitted, 3);
        assert_eq!(
            c.notes,
            ["3 output file(s) left out: their paths are not valid UTF-8"]
        );
        let mut seen = std::collections::HashSet::new();
        assert!(c.files.iter().all(|f| seen.insert(&f.path)));
    }

    /// Issue 10: one over-long output path made the whole collection fail. It is left out and
    /// counted; the other files come back.
    #[test]
    fn an_over_long_path_is_left_out_and_the_rest_collected() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().to_str().unwrap();
        // Built one level at a time: the whole path is longer than PATH_MAX.
        let mut cur = fs::File::open(d.path()).unwrap();
        for _ in 0..30 {
            let name = "d".repeat(200);
            rustix::fs::mkdirat(&cur, name.as_str(), Mode::from_raw_mode(0o755)).unwrap();
            cur = fs::File::from(
                openat(
                    &cur,
                    name.as_str(),
                    OFlags::RDONLY | OFlags::DIRECTORY,
                    Mode::empty(),
                )
                .unwrap(),
            );
        }
        let fd = openat(
            &cur,
            "long.txt",
            OFlags::WRONLY | OFlags::CREATE,
            Mode::from_raw_mode(0o644),
        )
        .unwrap();
        rustix::io::write(&fd, b"L").unwrap();
        // Exactly at the bound: returned.
        let dirs = vec!["e".repeat(200); 4].join("/");
        fs::create_dir_all(d.path().join(&dirs)).unwrap();
        let exact = format!("{dirs}/{}", "f".repeat(MAX_PATH_BYTES - dirs.len() - 1));
        assert_eq!(exact.len(), MAX_PATH_BYTES);
        fs::write(d.path().join(&exact), "E").unwrap();
        fs::write(d.path().join("a.txt"), "A").unwrap();
        fs::write(d.path().join("z.txt"), "Z").unwrap();
        let c = collect(root, &Baseline::default(), &limits());
        let paths: Vec<&str> = c.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["a.txt", exact.as_str(), "z.txt"]);
        assert_eq!(c.omitted, 1);
        assert_eq!(
            c.notes,
            ["1 output file(s) left out: their paths are longer than 1024 bytes"]
        );
    }

    #[test]
    fn the_file_list_stays_within_the_frame_however_many_files_are_asked_for() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().to_str().unwrap();
        // 1000 files with names of 1000 escaped bytes each: about 6 MB of JSON, over a frame.
        for i in 0..1000 {
            let name = format!("{i:04}{}", "\u{1}".repeat(250));
            fs::write(d.path().join(name), "").unwrap();
        }
        let mut l = limits();
        l.max_files = 10_000;
        let c = collect(root, &Baseline::default(), &l);
        assert!(!c.files.is_empty());
        assert_eq!(c.files.len() as u64 + c.omitted, 1000);
        let report = crate::protocol::Report::Files {
            files: c.files,
            omitted: c.omitted,
            notes: c.notes,
        };
        assert!(serde_json::to_vec(&report).unwrap().len() < crate::protocol::MAX_JSON as usize);
    }
}

/// Property tests: a program names its files with whatever bytes it likes; collection never
/// panics, returns each name faithfully (valid UTF-8, within the length bound, the file's own
/// name) and never returns two files under one path.
#[cfg(test)]
mod proptests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{HashMap, HashSet};
    use std::fs;

    /// One path component: any bytes but '/' and NUL, never "." or "..", often multi-byte or
    /// invalid UTF-8, sometimes long.
    fn component() -> impl Strategy<Value = Vec<u8>> {
        let byte = prop_oneof![
            3 => b'a'..=b'e',
            1 => Just(b'.'),
            1 => 0x80u8..=0xff,
            1 => 1u8..=0x7f,
        ]
        .prop_filter("no '/'", |b| *b != b'/');
        prop_oneof![
            4 => prop::collection::vec(byte.clone(), 1..12),
            1 => prop::collection::vec(byte, 200..=255),
            1 => "[a-zé\u{1f600}]{1,60}".prop_map(String::into_bytes),
        ]
        .prop_filter("not . or ..", |c| c != b"." && c != b"..")
    }

    fn tree() -> impl Strategy<Value = Vec<Vec<Vec<u8>>>> {
        prop::collection::vec(prop::collection::vec(component(), 1..6), 0..8)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        #[test]
        fn names_come_back_faithfully_or_are_counted_out(tree in tree()) {
            let d = tempfile::tempdir().unwrap();
            let root = d.path().to_str().unwrap();
            // What was really created: rel path -> content (its own path).
            let mut made: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
            for parts in tree {
                let rel = parts.join(&b'/');
                let path = d.path().join(OsStr::from_bytes(&rel));
                let parent = path.parent().unwrap();
                if fs::create_dir_all(parent).is_ok() && !path.exists() && fs::write(&path, &rel).is_ok() {
                    made.insert(rel.clone(), rel);
                }
            }
            let limits = CollectLimits {
                max_files: 1000,
                max_file_bytes: 1 << 20,
                max_total_bytes: 1 << 24,
                max_entries: 100_000,
                max_read_bytes: 1 << 30,
                deadline_ms: 60_000,
            };
            let c = collect(root, &Baseline::default(), &limits);
            let mut seen = HashSet::new();
            for f in &c.files {
                prop_assert!(seen.insert(f.path.clone()), "{:?} twice", f.path);
                prop_assert!(f.path.len() <= MAX_PATH_BYTES);
                let content = made.get(f.path.as_bytes());
                prop_assert!(content.is_some(), "{:?} is no file's name", f.path);
                let blob = f.blob.map(|i| &c.blobs[i]);
                prop_assert_eq!(blob, content);
            }
            let faithful = made
                .keys()
                .filter(|rel| std::str::from_utf8(rel).is_ok() && rel.len() <= MAX_PATH_BYTES)
                .count();
            prop_assert_eq!(c.files.len(), faithful);
            prop_assert_eq!(c.omitted as usize, made.len() - faithful);
        }
    }
}
