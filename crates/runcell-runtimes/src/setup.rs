//! What `runcell setup` reports while it prepares runtimes, and how it fails.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

/// Progress of a setup step (the Python stack, the Go cache).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetupEvent {
    /// A step begins: "creating venv", "installing 17 packages", ...
    Step(String),
    /// A line of output from pip or another command of the current step.
    Output(String),
    /// Something the operator should fix, though setup goes on (e.g. a data directory the
    /// sandbox's unprivileged uid cannot reach).
    Warning(String),
    /// Finished; `reused` when the stack was already installed.
    Done { reused: bool },
}

/// Why a setup step failed. Each variant names the step and carries the cause.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("Python is not installed at {path}; the operator can install it with: apt-get install python3")]
    PythonMissing { path: PathBuf },
    #[error("the Python stack is locked for {wanted}, but {path} is {found}; regenerate crates/runcell-runtimes/python/requirements.lock for it")]
    PythonUnsupported {
        path: PathBuf,
        found: String,
        wanted: String,
    },
    #[error("{python} cannot create a virtual environment ({detail}); the operator can install the venv module with: {hint}")]
    VenvUnavailable {
        python: PathBuf,
        detail: String,
        hint: &'static str,
    },
    #[error(
        "pip is not usable with {python} ({detail}); the operator can install it with: {hint}"
    )]
    PipUnavailable {
        python: PathBuf,
        detail: String,
        hint: &'static str,
    },
    #[error("{step} failed ({status}):\n{output_tail}")]
    Command {
        step: String,
        status: ExitStatus,
        output_tail: String,
    },
    #[error("{step}: {}", path.display())]
    Io {
        step: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{step}: {detail}")]
    Unexpected { step: String, detail: String },
}

/// Create a directory (and parents) that the sandbox's unprivileged host uid can traverse.
pub fn mkdir_world_readable(dir: &Path) -> Result<(), SetupError> {
    fs::create_dir_all(dir).map_err(|source| SetupError::Io {
        step: "create directory".into(),
        path: dir.to_path_buf(),
        source,
    })?;
    // Each runcell-owned level must be traversable; stop at the first existing level we do not
    // own (e.g. /var/lib) and leave it alone.
    let mut p = Some(dir);
    while let Some(d) = p {
        let Ok(meta) = fs::metadata(d) else { break };
        if meta.permissions().mode() & 0o005 == 0o005 {
            break;
        }
        fs::set_permissions(
            d,
            fs::Permissions::from_mode(meta.permissions().mode() | 0o755),
        )
        .map_err(|source| SetupError::Io {
            step: "make directory readable".into(),
            path: d.to_path_buf(),
            source,
        })?;
        p = d.parent();
    }
    Ok(())
}

/// `chmod -R a+rX`: the sandbox reads prepared files as an unprivileged host uid.
pub fn make_world_readable(root: &Path) -> Result<(), SetupError> {
    let meta = fs::symlink_metadata(root).map_err(|source| SetupError::Io {
        step: "read permissions".into(),
        path: root.to_path_buf(),
        source,
    })?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    let mode = meta.permissions().mode();
    let want = if meta.is_dir() || mode & 0o111 != 0 {
        mode | 0o555
    } else {
        mode | 0o444
    };
    if want != mode {
        fs::set_permissions(root, fs::Permissions::from_mode(want)).map_err(|source| {
            SetupError::Io {
                step: "make readable".into(),
                path: root.to_path_buf(),
                source,
            }
        })?;
    }
    if meta.is_dir() {
        let entries = fs::read_dir(root).map_err(|source| SetupError::Io {
            step: "list directory".into(),
            path: root.to_path_buf(),
            source,
        })?;
        for e in entries.flatten() {
            make_world_readable(&e.path())?;
        }
    }
    Ok(())
}

/// runcell's data directory (prepared runtimes): `RUNCELL_DATA_DIR` if set; as root
/// `/var/lib/runcell`; otherwise `$XDG_DATA_HOME/runcell` or `~/.local/share/runcell`.
pub fn default_data_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("RUNCELL_DATA_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if rustix_is_root() {
        return PathBuf::from("/var/lib/runcell");
    }
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(x).join("runcell");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/tmp".into());
    home.join(".local/share/runcell")
}

fn rustix_is_root() -> bool {
    // The effective uid, from /proc (this crate has no unsafe and no libc dependency).
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn world_readable_walks_the_tree() {
        let d = tempfile::tempdir().unwrap();
        let sub = d.path().join("a/b");
        fs::create_dir_all(&sub).unwrap();
        fs::write(sub.join("f"), "x").unwrap();
        fs::set_permissions(&sub, fs::Permissions::from_mode(0o700)).unwrap();
        fs::set_permissions(sub.join("f"), fs::Permissions::from_mode(0o600)).unwrap();
        make_world_readable(d.path()).unwrap();
        assert_eq!(
            fs::metadata(&sub).unwrap().permissions().mode() & 0o777,
            0o755
        );
        assert_eq!(
            fs::metadata(sub.join("f")).unwrap().permissions().mode() & 0o777,
            0o644
        );
    }

    #[test]
    fn data_dir_honours_the_override() {
        // Only the override branch is deterministic across users; the others depend on uid.
        std::env::set_var("RUNCELL_DATA_DIR", "/srv/rc");
        assert_eq!(default_data_dir(), PathBuf::from("/srv/rc"));
        std::env::remove_var("RUNCELL_DATA_DIR");
    }
}
