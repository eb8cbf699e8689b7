//! The package cache on disk, under `<data dir>/packages`:
//!
//! ```text
//! .lock                  flock: committing and evicting, one at a time (all servers)
//! keys/<key>             alias record: the content key the requirement key installed
//! layers/<content key>/  a layer: site/ (what runs see) and .runcell-layer (its size, JSON)
//! .tmp-<random>/         a layer being written (its .runcell-layer locked by the writer)
//! .trash-<random>/       a layer being removed
//! ```
//!
//! Who holds what:
//! * a run holds a shared `flock` on its layer's `.runcell-layer` from the look-up until it is
//!   over ([`Lease`]); taking it also sets the file's mtime, which is the layer's last use;
//! * eviction takes the exclusive lock without waiting, and skips the layer when it cannot:
//!   a layer in use is never removed. It renames the layer away (one step) before removing
//!   it, so a look-up sees a whole layer or none, and a look-up that locked a layer checks
//!   afterwards that it is still the one at its path;
//! * committing and evicting happen under `.lock` (short: renames and removals, never an
//!   install), so that the total stays within the quota when servers share the directory;
//!   looking up takes no lock but the layer's own.
//!
//! Locks are `flock`s on files: a crashed server's locks go with it, and its half-written
//! `.tmp-*` directories are swept by the next commit (their lock is free).

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rustix::fs::{flock, FlockOperation, Mode, OFlags};
use sha2::{Digest, Sha256};

use super::{is_key, key_of};
use crate::units::format_size;

const LOCK: &str = ".lock";
const KEYS: &str = "keys";
const LAYERS: &str = "layers";
/// A layer's record (its size, JSON) and the file its users and its evictor lock.
pub(super) const META: &str = ".runcell-layer";
const STAGING: &str = ".tmp-";
const TRASH: &str = ".trash-";
/// The marker of the layers of runcell before content layers (`packages/<key>/`): evicted
/// first, as they are never used again.
const LEGACY_COMPLETE: &str = ".runcell-complete";

/// What a file or directory costs on disk at least: a block.
const BLOCK: u64 = 4096;
/// What an alias record costs in the quota.
const ALIAS_BYTES: u64 = BLOCK;
/// A staging directory without its lock file this old is a writer's that died at once.
const STALE: Duration = Duration::from_secs(600);

/// Why a layer could not be kept.
#[derive(Debug, thiserror::Error)]
pub(super) enum CacheError {
    #[error(
        "they take {} installed, more than the whole package cache may hold ({})",
        format_size(*.bytes), format_size(*.max)
    )]
    TooLarge { bytes: u64, max: u64 },
    #[error(
        "the package cache ({}) is full of layers that runs are using now ({} of them); \
         retry when they are done",
        format_size(*.max), format_size(*.in_use)
    )]
    Full { max: u64, in_use: u64 },
    #[error("{step} {path}: {source}")]
    Io {
        step: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("writing the layer: {0}")]
    Write(String),
}

fn io<'a>(step: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> CacheError + 'a {
    move |source| CacheError::Io {
        step,
        path: path.to_path_buf(),
        source,
    }
}

/// The cache at `root`, with its quota.
#[derive(Debug, Clone)]
pub(super) struct Cache {
    root: PathBuf,
    max_bytes: u64,
}

/// A layer held for a run: it is not evicted while this lives.
#[derive(Debug)]
pub(super) struct Lease {
    /// The layer's record, locked shared.
    _meta: File,
    dir: PathBuf,
    content_key: String,
}

impl Lease {
    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    pub(super) fn content_key(&self) -> &str {
        &self.content_key
    }

    /// Hold the layer at `dir`, if it is whole and not being evicted; mark it used now.
    fn acquire(dir: &Path, content_key: &str) -> Option<Lease> {
        let path = dir.join(META);
        let meta = OpenOptions::new()
            .read(true)
            .custom_flags(libc_nofollow())
            .open(&path)
            .ok()?;
        flock(&meta, FlockOperation::NonBlockingLockShared).ok()?;
        // Evicted between the open and the lock? Then the path names another file or none.
        let held = meta.metadata().ok()?;
        let now = std::fs::symlink_metadata(&path).ok()?;
        if (held.dev(), held.ino()) != (now.dev(), now.ino()) {
            return None;
        }
        // The last use, for eviction (least recently used first).
        let _ = meta.set_modified(SystemTime::now());
        Some(Lease {
            _meta: meta,
            dir: dir.to_path_buf(),
            content_key: content_key.to_string(),
        })
    }
}

/// `O_NOFOLLOW` for `OpenOptions::custom_flags`.
fn libc_nofollow() -> i32 {
    OFlags::NOFOLLOW.bits() as i32
}

/// A layer being written: a new directory whose record the writer holds locked, so that a
/// sweep knows it is alive. Removed when dropped, unless committed.
pub(super) struct Staging {
    dir: PathBuf,
    top: OwnedFd,
    meta: File,
    created: HashSet<String>,
    hasher: Sha256,
    files: u64,
    bytes: u64,
    committed: bool,
}

impl std::fmt::Debug for Staging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staging")
            .field("dir", &self.dir)
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl Staging {
    /// Write one file at `rel` (files in path order: the content key depends on it). Hidden
    /// names are allowed here (a wheel may hold `pkg/.libs/`): the layer is runcell's own
    /// directory, which no host tool reads configuration from.
    pub(super) fn write(&mut self, rel: &str, content: &[u8]) -> Result<(), CacheError> {
        let dirs_before = self.created.len();
        let rel = crate::files::write_under(&self.top, &mut self.created, rel, content)
            .map_err(CacheError::Write)?;
        let new_dirs = (self.created.len() - dirs_before) as u64;
        self.bytes += new_dirs * BLOCK + blocks(content.len() as u64);
        self.files += 1;
        self.hasher.update(rel.as_bytes());
        self.hasher.update(b"\0");
        self.hasher.update(Sha256::digest(content));
        Ok(())
    }

    /// What it takes on disk so far, counted as the quota counts.
    pub(super) fn bytes(&self) -> u64 {
        self.bytes
    }

    fn content_key(&self) -> String {
        crate::to_hex(&self.hasher.clone().finalize())[..32].to_string()
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// What a layer whose files and directories take `bytes` costs: those, its own directory
/// and its record.
fn layer_cost(bytes: u64) -> u64 {
    bytes + 2 * BLOCK
}

/// `n` bytes as whole blocks.
pub(super) fn blocks(n: u64) -> u64 {
    n.div_ceil(BLOCK).max(1) * BLOCK
}

/// A layer found by a scan.
struct Found {
    dir: PathBuf,
    content_key: Option<String>,
    bytes: u64,
    used: SystemTime,
}

impl Cache {
    pub(super) fn new(root: PathBuf, max_bytes: u64) -> Cache {
        Cache { root, max_bytes }
    }

    pub(super) fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// The layer `key` installed, held, if it is in the cache.
    pub(super) fn lookup(&self, key: &str) -> Option<Lease> {
        let content_key = read_small(&self.root.join(KEYS).join(key))?;
        let content_key = content_key.trim();
        if !is_key(content_key) {
            return None;
        }
        Lease::acquire(&self.root.join(LAYERS).join(content_key), content_key)
    }

    /// A new layer to write.
    pub(super) fn stage(&self) -> Result<Staging, CacheError> {
        std::fs::create_dir_all(&self.root).map_err(io("creating", &self.root))?;
        let dir = self.root.join(format!("{STAGING}{}", random_name()));
        std::fs::create_dir(&dir).map_err(io("creating", &dir))?;
        let meta_path = dir.join(META);
        let meta = OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc_nofollow())
            .open(&meta_path)
            .map_err(io("creating", &meta_path))?;
        flock(&meta, FlockOperation::NonBlockingLockExclusive)
            .map_err(|e| io("locking", &meta_path)(e.into()))?;
        let top = rustix::fs::open(
            &dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io("opening", &dir)(e.into()))?;
        Ok(Staging {
            dir,
            top,
            meta,
            created: HashSet::new(),
            hasher: Sha256::new(),
            files: 0,
            bytes: 0,
            committed: false,
        })
    }

    /// Keep `staging` as the layer of `key`: under its content key, or, when a layer with the
    /// same files is there already, that one (and `staging` is removed). Makes room by
    /// evicting the least recently used layers no run holds. Returns the layer, held.
    pub(super) fn commit(
        &self,
        mut staging: Staging,
        key: &str,
        requirements: &[String],
    ) -> Result<Lease, CacheError> {
        let _one = self.lock()?;
        self.sweep();
        let layers = self.root.join(LAYERS);
        let keys = self.root.join(KEYS);
        std::fs::create_dir_all(&layers).map_err(io("creating", &layers))?;
        std::fs::create_dir_all(&keys).map_err(io("creating", &keys))?;
        let content_key = staging.content_key();
        let target = layers.join(&content_key);
        if let Some(lease) = Lease::acquire(&target, &content_key) {
            // The same files under another requirement key: one layer on disk.
            drop(staging);
            self.write_alias(key, &content_key)?;
            return Ok(lease);
        }
        // Not a whole layer (nothing else writes here under the lock): out of the way.
        if std::fs::symlink_metadata(&target).is_ok() {
            self.discard(&target);
        }
        let need = layer_cost(staging.bytes) + ALIAS_BYTES;
        if need > self.max_bytes {
            return Err(CacheError::TooLarge {
                bytes: need,
                max: self.max_bytes,
            });
        }
        self.make_room(need)?;
        let record = serde_json::json!({
            "bytes": staging.bytes,
            "files": staging.files,
            "requirements": requirements,
        });
        staging
            .meta
            .write_all(record.to_string().as_bytes())
            .map_err(io("writing", &staging.dir.join(META)))?;
        std::fs::rename(&staging.dir, &target).map_err(io("renaming", &staging.dir))?;
        staging.committed = true;
        // The writer's exclusive lock becomes the run's shared one (nobody else can take it
        // in between: eviction needs `.lock`, which this holds).
        let meta = staging.meta.try_clone().map_err(io("reopening", &target))?;
        flock(&meta, FlockOperation::LockShared)
            .map_err(|e| io("locking", &target.join(META))(e.into()))?;
        self.write_alias(key, &content_key)?;
        Ok(Lease {
            _meta: meta,
            dir: target,
            content_key,
        })
    }

    /// `.lock`, held exclusively until dropped.
    fn lock(&self) -> Result<File, CacheError> {
        let path = self.root.join(LOCK);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc_nofollow())
            .open(&path)
            .map_err(io("opening", &path))?;
        flock(&f, FlockOperation::LockExclusive).map_err(|e| io("locking", &path)(e.into()))?;
        Ok(f)
    }

    /// Write `keys/<key>` (whole or not at all: written aside, then renamed).
    fn write_alias(&self, key: &str, content_key: &str) -> Result<(), CacheError> {
        let keys = self.root.join(KEYS);
        let tmp = keys.join(format!("{STAGING}{}", random_name()));
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc_nofollow())
            .open(&tmp)
            .map_err(io("creating", &tmp))?;
        let written = f.write_all(format!("{content_key}\n").as_bytes());
        drop(f);
        let renamed = written.and_then(|()| std::fs::rename(&tmp, keys.join(key)));
        if let Err(e) = renamed {
            let _ = std::fs::remove_file(&tmp);
            return Err(io("writing", &tmp)(e));
        }
        Ok(())
    }

    /// Evict least recently used layers until `need` more bytes fit in the quota. The layers
    /// to go are locked first and removed only if together they make enough room: nothing is
    /// removed in vain.
    fn make_room(&self, need: u64) -> Result<(), CacheError> {
        let (mut found, aliases) = self.scan();
        let pointing = |f: &Found| {
            f.content_key
                .as_ref()
                .and_then(|k| aliases.get(k))
                .map(Vec::as_slice)
                .unwrap_or_default()
        };
        let total: u64 = found.iter().map(|f| f.bytes).sum::<u64>()
            + aliases
                .values()
                .map(|a| a.len() as u64 * ALIAS_BYTES)
                .sum::<u64>();
        if total + need <= self.max_bytes {
            return Ok(());
        }
        found.sort_by_key(|f| f.used);
        let mut going = Vec::new();
        let (mut freed, mut in_use) = (0, 0);
        for f in &found {
            if total - freed + need <= self.max_bytes {
                break;
            }
            match hold_for_eviction(f) {
                Some(lock) => {
                    freed += f.bytes + pointing(f).len() as u64 * ALIAS_BYTES;
                    going.push((f, lock));
                }
                None => in_use += f.bytes,
            }
        }
        if total - freed + need > self.max_bytes {
            return Err(CacheError::Full {
                max: self.max_bytes,
                in_use,
            });
        }
        for (f, _lock) in going {
            for a in pointing(f) {
                let _ = std::fs::remove_file(a);
            }
            self.discard(&f.dir);
            tracing::info!(layer = %f.dir.display(), bytes = f.bytes, "package layer evicted");
        }
        Ok(())
    }

    /// Rename `dir` out of the way (one step: a look-up sees it whole or not at all), then
    /// remove it.
    fn discard(&self, dir: &Path) {
        let trash = self.root.join(format!("{TRASH}{}", random_name()));
        match std::fs::rename(dir, &trash) {
            Ok(()) => {
                let _ = std::fs::remove_dir_all(&trash);
            }
            Err(_) => {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }

    /// The layers (content and legacy) with their sizes and last uses, and the alias records
    /// by the content key they name. Layers without a readable record and aliases naming no
    /// layer are removed on the way (under `.lock`: no writer is half-way).
    fn scan(&self) -> (Vec<Found>, HashMap<String, Vec<PathBuf>>) {
        let mut found = Vec::new();
        for dir in entries(&self.root.join(LAYERS)) {
            let Some(key) = key_of(&dir).map(str::to_string) else {
                continue;
            };
            let meta = dir.join(META);
            let record = read_small(&meta)
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                .and_then(|v| v["bytes"].as_u64());
            match (record, std::fs::symlink_metadata(&meta)) {
                (Some(bytes), Ok(m)) => found.push(Found {
                    dir,
                    content_key: Some(key),
                    bytes: layer_cost(bytes),
                    used: m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                }),
                _ => self.discard(&dir),
            }
        }
        for dir in entries(&self.root) {
            if key_of(&dir).is_some() && dir.join(LEGACY_COMPLETE).is_file() {
                found.push(Found {
                    bytes: disk_usage(&dir),
                    used: SystemTime::UNIX_EPOCH,
                    content_key: None,
                    dir,
                });
            }
        }
        let mut aliases: HashMap<String, Vec<PathBuf>> = HashMap::new();
        let present: HashSet<&str> = found
            .iter()
            .filter_map(|f| f.content_key.as_deref())
            .collect();
        for alias in entries(&self.root.join(KEYS)) {
            if key_of(&alias).is_none() {
                continue;
            }
            match read_small(&alias) {
                Some(k) if present.contains(k.trim()) => {
                    aliases.entry(k.trim().to_string()).or_default().push(alias)
                }
                _ => {
                    let _ = std::fs::remove_file(&alias);
                }
            }
        }
        (found, aliases)
    }

    /// Remove what dead writers and evictors left: `.tmp-*` whose record nobody holds (or
    /// that never got one and are old), `.trash-*`.
    fn sweep(&self) {
        let dirs = [self.root.clone(), self.root.join(KEYS)];
        for p in dirs.iter().flat_map(|d| entries(d)) {
            let Some(name) = p.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if name.starts_with(TRASH) {
                self.discard(&p);
                continue;
            }
            if !name.starts_with(STAGING) {
                continue;
            }
            let Ok(m) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            if m.is_file() {
                // An alias being written: the writer holds `.lock`, so it is a dead one's.
                let _ = std::fs::remove_file(&p);
                continue;
            }
            let abandoned = match OpenOptions::new()
                .read(true)
                .custom_flags(libc_nofollow())
                .open(p.join(META))
            {
                Ok(meta) => flock(&meta, FlockOperation::NonBlockingLockExclusive).is_ok(),
                Err(_) => m
                    .modified()
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age > STALE),
            };
            if abandoned {
                self.discard(&p);
            }
        }
    }
}

/// The exclusive lock of a layer that no run holds (`None`: in use). A legacy layer has no
/// users' locks (nothing uses it any more): it needs none.
fn hold_for_eviction(f: &Found) -> Option<Option<File>> {
    if f.content_key.is_none() {
        return Some(None);
    }
    let meta = OpenOptions::new()
        .read(true)
        .custom_flags(libc_nofollow())
        .open(f.dir.join(META))
        .ok()?;
    flock(&meta, FlockOperation::NonBlockingLockExclusive).ok()?;
    Some(Some(meta))
}

/// The entries of `dir` (none when it cannot be read).
fn entries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// A small regular file's text (a record or an alias), never through a symlink.
fn read_small(path: &Path) -> Option<String> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc_nofollow())
        .open(path)
        .ok()?;
    let mut s = String::new();
    f.take(64 << 10).read_to_string(&mut s).ok()?;
    Some(s)
}

/// What `dir` takes, counted as the quota counts (for layers of runcell before content
/// layers, which have no record).
fn disk_usage(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        total += BLOCK;
        for p in entries(&d) {
            match std::fs::symlink_metadata(&p) {
                Ok(m) if m.is_dir() => stack.push(p),
                Ok(m) => total += blocks(m.len()),
                Err(_) => {}
            }
        }
    }
    total
}

/// A name no other writer (of this or another server) picks: 128 random bits.
fn random_name() -> String {
    let mut b = [0u8; 16];
    if rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()) != Ok(16) {
        // Unique enough within a process and a moment; the directory is created exclusively
        // in any case.
        let t = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        b[..8].copy_from_slice(&t.as_nanos().to_le_bytes()[..8]);
        b[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    }
    crate::to_hex(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(max: u64) -> (tempfile::TempDir, Cache) {
        let d = tempfile::tempdir().unwrap();
        let c = Cache::new(d.path().join("packages"), max);
        (d, c)
    }

    fn layer(c: &Cache, key: &str, files: &[(&str, &[u8])]) -> Result<Lease, CacheError> {
        let mut s = c.stage()?;
        for (p, b) in files {
            s.write(p, b)?;
        }
        c.commit(s, key, &[key.to_string()])
    }

    fn k(n: u8) -> String {
        format!("{:032x}", n)
    }

    fn layers(c: &Cache) -> usize {
        entries(&c.root.join(LAYERS)).len()
    }

    #[test]
    fn sets_that_install_the_same_files_share_one_layer() {
        let (_d, c) = cache(1 << 20);
        let a = layer(&c, &k(1), &[("site/x/__init__.py", b"x = 1\n")]).unwrap();
        let b = layer(&c, &k(2), &[("site/x/__init__.py", b"x = 1\n")]).unwrap();
        assert_eq!(a.content_key(), b.content_key());
        assert_eq!(layers(&c), 1);
        let other = layer(&c, &k(3), &[("site/x/__init__.py", b"x = 2\n")]).unwrap();
        assert_ne!(other.content_key(), a.content_key());
        assert_eq!(layers(&c), 2);
        // Both keys find the one layer.
        assert_eq!(c.lookup(&k(2)).unwrap().dir(), a.dir());
        assert!(c.lookup(&k(9)).is_none());
        // Nothing is left beside the layers, aliases and the lock.
        let mut names: Vec<String> = entries(&c.root)
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, [".lock", "keys", "layers"]);
    }

    /// Set the last use of `lease`'s layer (file times are coarser than the steps of a test).
    fn used(lease: &Lease, secs: u64) {
        let f = File::open(lease.dir().join(META)).unwrap();
        f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + secs))
            .unwrap();
    }

    #[test]
    fn the_least_recently_used_layer_not_in_use_is_evicted_and_one_too_large_refused() {
        // Room for two layers of an 8 KiB file (with their directories, records and aliases:
        // 24 KiB each), not three.
        let (_d, c) = cache(50 << 10);
        let big = vec![7u8; 8 << 10];
        let a = layer(&c, &k(1), &[("site/a", &big)]).unwrap();
        let b = layer(&c, &k(2), &[("site/b", &big)]).unwrap();
        used(&a, 1);
        used(&b, 2);
        // `a` is in use (its lease lives): `b` goes, although `a` was used before it.
        drop(b);
        let c3 = layer(&c, &k(3), &[("site/c", &big)]).unwrap();
        assert!(
            !c.root.join(KEYS).join(k(2)).exists(),
            "evicted, with its alias"
        );
        assert!(c.lookup(&k(2)).is_none());
        assert!(c.lookup(&k(1)).is_some(), "in use: kept");
        // Both in use now: no room for a fourth, and nothing is removed for it.
        let e = layer(&c, &k(4), &[("site/d", &big)]).unwrap_err();
        assert!(matches!(e, CacheError::Full { .. }), "{e}");
        assert!(c.root.join(KEYS).join(k(1)).exists() && c.root.join(KEYS).join(k(3)).exists());
        // Free again: the least recently used goes.
        used(&a, 4);
        used(&c3, 3);
        drop((a, c3));
        let d = layer(&c, &k(4), &[("site/d", &big)]).unwrap();
        assert!(c.lookup(&k(3)).is_none());
        assert!(c.lookup(&k(1)).is_some());
        drop(d);
        // Larger than the whole cache: refused, nothing evicted, nothing left behind.
        let huge = vec![1u8; 64 << 10];
        let e = layer(&c, &k(5), &[("site/huge", &huge)]).unwrap_err();
        assert!(matches!(e, CacheError::TooLarge { .. }), "{e}");
        assert!(c.lookup(&k(1)).is_some() && c.lookup(&k(4)).is_some());
        assert!(entries(&c.root)
            .iter()
            .all(|p| !p.to_string_lossy().contains(STAGING)));
    }

    #[test]
    fn a_lease_taken_on_a_layer_being_evicted_is_refused() {
        let (_d, c) = cache(1 << 20);
        let a = layer(&c, &k(1), &[("site/a", b"a")]).unwrap();
        let dir = a.dir().to_path_buf();
        drop(a);
        // An evictor holds the layer.
        let meta = File::open(dir.join(META)).unwrap();
        flock(&meta, FlockOperation::NonBlockingLockExclusive).unwrap();
        assert!(c.lookup(&k(1)).is_none());
        drop(meta);
        assert!(c.lookup(&k(1)).is_some());
    }

    /// Two servers sharing a data dir: each writes its own staging directory (a pid can be
    /// the same in two containers), and a commit removes only those of dead writers.
    #[test]
    fn a_commit_sweeps_only_what_dead_writers_left() {
        let (_d, c) = cache(1 << 20);
        let mut alive = c.stage().unwrap();
        alive.write("site/a", b"a").unwrap();
        let dead = c.stage().unwrap();
        let dead_dir = dead.dir.clone();
        // A writer that died: its lock went with it, its directory did not.
        flock(&dead.meta, FlockOperation::Unlock).unwrap();
        std::mem::forget(dead);
        layer(&c, &k(1), &[("site/b", b"b")]).unwrap();
        assert!(
            alive.dir.join("site/a").is_file(),
            "a live writer's is kept"
        );
        assert!(!dead_dir.exists(), "a dead writer's is swept");
        c.commit(alive, &k(2), &[]).unwrap();
        assert!(c.lookup(&k(2)).is_some());
    }

    #[test]
    fn what_is_read_back_from_disk_must_be_a_key() {
        let (_d, c) = cache(1 << 20);
        layer(&c, &k(1), &[("site/a", b"a")]).unwrap();
        std::fs::write(c.root.join(KEYS).join(k(2)), "../../../etc\n").unwrap();
        assert!(c.lookup(&k(2)).is_none());
    }
}
