//! Go's build cache, prepared ahead of time.
//!
//! Go compiles every standard-library package a program imports unless its build cache already
//! holds it. The distribution's precompiled packages (Go < 1.20) do not match runcell's
//! `CGO_ENABLED=0`, so without a cache a program importing `net/http` spends ~15 s compiling
//! the standard library on every run. `runcell setup` builds `std` once, with exactly the
//! environment the sandbox uses, into `<data dir>/go/<id>/cache`; each sandbox then sees it
//! through an overlay at its GOCACHE: reads come from the prepared cache, writes go to the
//! run's scratch space, and the prepared cache itself is never modified.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::setup::{make_world_readable, mkdir_world_readable, SetupError, SetupEvent};
use crate::{Language, Runtime};

/// The sandbox's GOCACHE.
pub const SANDBOX_GOCACHE: &str = "/tmp/.cache/go-build";
const MARKER: &str = ".runcell-complete";

/// A prepared cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoCache {
    /// The cache directory (the overlay's lower layer).
    pub dir: PathBuf,
}

/// The environment `go` gets in the sandbox (and when the cache is prepared: the cache keys
/// depend on it).
pub fn go_env(gocache: &str, gopath: &str) -> Vec<(String, String)> {
    [
        ("GOCACHE", gocache),
        ("GOPATH", gopath),
        ("GOENV", "off"),
        ("GOFLAGS", "-buildvcs=false"),
        ("GOPROXY", "off"),
        ("GOTOOLCHAIN", "local"),
        ("GOTELEMETRY", "off"),
        // No C toolchain in the sandbox: pure-Go builds of os/user and net.
        ("CGO_ENABLED", "0"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Where the cache for this Go executable lives.
fn cache_root(data_dir: &Path, executable: &Path) -> PathBuf {
    let id: String = executable
        .display()
        .to_string()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    data_dir.join("go").join(id)
}

/// Identifies the Go installation the cache was built with, without running it (that would
/// cost a process per run): the resolved executable's size, mtime and inode. A Go upgrade
/// changes it, and the stale cache is ignored until setup runs again.
fn fingerprint(executable: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(executable).ok()?;
    Some(format!(
        "{} {} {} {}",
        m.len(),
        m.mtime(),
        m.mtime_nsec(),
        m.ino()
    ))
}

/// The prepared cache for this runtime, if setup completed for this very Go.
pub fn find(data_dir: &Path, runtime: &Runtime) -> Option<GoCache> {
    let root = cache_root(data_dir, &runtime.executable);
    let recorded = fs::read_to_string(root.join(MARKER)).ok()?;
    (Some(recorded.trim()) == fingerprint(&runtime.executable).as_deref()).then(|| GoCache {
        dir: root.join("cache"),
    })
}

/// Build the standard library into a fresh cache (idempotent; atomic: built beside the final
/// directory and renamed into place only when complete).
pub fn prepare(
    data_dir: &Path,
    runtime: &Runtime,
    progress: &mut dyn FnMut(SetupEvent),
) -> Result<GoCache, SetupError> {
    assert_eq!(
        runtime.language,
        Language::Go,
        "prepare() takes the Go runtime"
    );
    let version = runtime.version().unwrap_or_else(|| "?".into());
    let fp = fingerprint(&runtime.executable).ok_or_else(|| SetupError::Io {
        step: "inspect the go executable".into(),
        path: runtime.executable.clone(),
        source: std::io::Error::from(std::io::ErrorKind::NotFound),
    })?;
    if let Some(c) = find(data_dir, runtime) {
        progress(SetupEvent::Done { reused: true });
        return Ok(c);
    }
    let root = cache_root(data_dir, &runtime.executable);
    let _ = fs::remove_dir_all(&root);
    let parent = root.parent().unwrap_or(data_dir).to_path_buf();
    mkdir_world_readable(&parent)?;
    let building = parent.join(format!(
        ".building-{}-{}",
        root.file_name().and_then(|n| n.to_str()).unwrap_or("go"),
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&building);
    let cache = building.join("cache");
    let gopath = building.join("gopath");
    for d in [&cache, &gopath] {
        fs::create_dir_all(d).map_err(|source| SetupError::Io {
            step: "create Go cache directory".into(),
            path: d.clone(),
            source,
        })?;
    }
    progress(SetupEvent::Step(format!(
        "building the Go {version} standard library into the prepared cache"
    )));
    let mut child = Command::new(&runtime.executable)
        .args(["build", "-v", "std"])
        .env_clear()
        .envs(go_env(&cache.to_string_lossy(), &gopath.to_string_lossy()))
        .env("HOME", &building)
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .current_dir(&building)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| SetupError::Io {
            step: "start go build std".into(),
            path: runtime.executable.clone(),
            source,
        })?;
    let mut tail = Vec::new();
    if let Some(err) = child.stderr.take() {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            progress(SetupEvent::Output(line.clone()));
            tail.push(line);
            if tail.len() > 20 {
                tail.remove(0);
            }
        }
    }
    let status = child.wait().map_err(|source| SetupError::Io {
        step: "wait for go build std".into(),
        path: runtime.executable.clone(),
        source,
    })?;
    if !status.success() {
        let _ = fs::remove_dir_all(&building);
        return Err(SetupError::Command {
            step: "go build std".into(),
            status,
            output_tail: tail.join("\n"),
        });
    }
    let _ = fs::remove_dir_all(&gopath);
    make_world_readable(&building)?;
    fs::write(building.join(MARKER), &fp).map_err(|source| SetupError::Io {
        step: "write marker".into(),
        path: building.join(MARKER),
        source,
    })?;
    if let Err(source) = fs::rename(&building, &root) {
        let _ = fs::remove_dir_all(&building);
        // Another setup won the race: use its result.
        if let Some(c) = find(data_dir, runtime) {
            progress(SetupEvent::Done { reused: true });
            return Ok(c);
        }
        return Err(SetupError::Io {
            step: "move the Go cache into place".into(),
            path: root,
            source,
        });
    }
    progress(SetupEvent::Done { reused: false });
    Ok(GoCache {
        dir: root.join("cache"),
    })
}

/// Size of a directory tree in bytes (for reports).
pub fn tree_size(path: &Path) -> u64 {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.len();
    }
    fs::read_dir(path)
        .map(|rd| rd.flatten().map(|e| tree_size(&e.path())).sum())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_location_depends_on_the_executable() {
        let d = Path::new("/var/lib/runcell");
        let a = cache_root(d, Path::new("/usr/bin/go"));
        assert_eq!(a, Path::new("/var/lib/runcell/go/_usr_bin_go"));
        assert_ne!(a, cache_root(d, Path::new("/usr/local/go/bin/go")));
    }

    #[test]
    fn find_needs_a_marker_matching_the_executable() {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir_all(d.path().join("bin")).unwrap();
        let exe = d.path().join("bin/go");
        fs::write(&exe, "v1").unwrap();
        let rt = Runtime::bare(Language::Go, exe.clone());
        let root = cache_root(d.path(), &exe);
        fs::create_dir_all(root.join("cache")).unwrap();
        assert_eq!(find(d.path(), &rt), None, "no marker: incomplete");
        fs::write(root.join(MARKER), fingerprint(&exe).unwrap()).unwrap();
        assert_eq!(find(d.path(), &rt).unwrap().dir, root.join("cache"));
        // An upgraded Go (different binary) makes the cache stale.
        fs::write(&exe, "version two").unwrap();
        assert_eq!(find(d.path(), &rt), None);
    }
}
