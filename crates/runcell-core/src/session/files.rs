//! A session's /workspace seen from outside: listing it, reading a file, writing one. Each
//! goes through the sandbox's pid 1 (which writes and reads within /workspace only, never
//! through a link), while the interpreter waits.

use std::path::PathBuf;

use runcell_jail::CollectLimits;
use runcell_runtimes::WORKSPACE;

use super::info::{WorkspaceFile, WorkspaceListing};
use super::sandbox::{failure, Session};
use crate::engine::{sandbox_failure, Engine};
use crate::error::{ErrorKind, RunError};
use crate::request::workspace_path;

/// Files listed at most, and the entries walked to list them.
const LIST_MAX_FILES: u64 = 10_000;

impl Session {
    /// The files of /workspace (names and sizes).
    pub fn list_files(&mut self, engine: &Engine) -> Result<WorkspaceListing, RunError> {
        let limits = CollectLimits {
            max_files: LIST_MAX_FILES,
            max_file_bytes: 0,
            max_total_bytes: 0,
            max_entries: 100_000,
            max_read_bytes: 0,
            deadline_ms: 10_000,
        };
        let sandbox = self.ensure_sandbox(engine)?;
        let c = sandbox
            .browse(&limits, None)
            .map_err(|e| failure(sandbox_failure("could not list its files", &e)))?;
        Ok(WorkspaceListing {
            files: c
                .files
                .into_iter()
                .map(|f| WorkspaceFile {
                    path: f.path,
                    size: f.size,
                })
                .collect(),
            omitted: c.omitted,
        })
    }

    /// One file's bytes; `Ok(None)` when there is no regular file at `path`.
    pub fn read_file(&mut self, engine: &Engine, path: &str) -> Result<Option<Vec<u8>>, RunError> {
        let rel = workspace_path(path).map_err(|e| RunError::invalid(e.to_string()))?;
        // The file crosses pid 1 and the server's memory whole: it is bounded like an uploaded
        // file, not by the session's disk (a sparse file of that size costs the session
        // nothing).
        let cap = engine
            .policy()
            .max_input_file_bytes
            .min(self.limits().disk.0);
        let limits = CollectLimits {
            max_files: 1,
            max_file_bytes: cap,
            max_total_bytes: cap,
            max_entries: 1,
            max_read_bytes: cap,
            deadline_ms: 30_000,
        };
        let sandbox = self.ensure_sandbox(engine)?;
        let mut c = sandbox
            .browse(&limits, Some(&rel))
            .map_err(|e| failure(sandbox_failure("could not read the file", &e)))?;
        if let Some(f) = c.files.first().filter(|f| f.blob.is_none() && f.size > cap) {
            return Err(RunError::invalid(format!(
                "The file is {} bytes, more than the limit of {cap} bytes per download: \
                 read it in parts with a call, or return it in a call's output files.",
                f.size
            )));
        }
        Ok(match c.files.first().and_then(|f| f.blob) {
            Some(i) if i < c.blobs.len() => Some(c.blobs.swap_remove(i)),
            _ => None,
        })
    }

    /// Write one file into /workspace (replacing what is there).
    pub fn write_file(
        &mut self,
        engine: &Engine,
        path: &str,
        data: Vec<u8>,
    ) -> Result<(), RunError> {
        let rel = workspace_path(path).map_err(|e| RunError::invalid(e.to_string()))?;
        let cap = engine
            .policy()
            .max_input_file_bytes
            .min(self.limits().disk.0);
        if data.len() as u64 > cap {
            return Err(RunError::invalid(format!(
                "The file is {} bytes, more than the limit of {cap} bytes per file.",
                data.len()
            )));
        }
        let file = runcell_jail::InputFile {
            path: PathBuf::from(WORKSPACE).join(&rel),
            mode: 0o644,
            content: data,
        };
        // A sandbox that cannot be rebuilt is the host's failure, not the request's.
        let sandbox = self.ensure_sandbox(engine)?;
        sandbox.put_files(&[file]).map_err(|e| {
            let at = match &e {
                runcell_jail::SandboxError::Setup { path: Some(p), .. } => Some(p.clone()),
                _ => None,
            };
            write_error(&rel, &crate::error::chain(&e), at.as_deref())
        })
    }
}

/// A write into /workspace that pid 1 refused, as what the caller can act on: a full disk
/// and something in the way are the request's; anything else is the host's. `at` is the path
/// pid 1 named, when it named one.
fn write_error(rel: &str, chain: &str, at: Option<&std::path::Path>) -> RunError {
    if chain.contains("No space") || chain.contains("Disk quota") {
        RunError::invalid("The file does not fit: the session's disk is full.")
    } else if chain.contains("symbolic link is in the way") {
        // Planted by the session's own code where a directory of the path should be: pid 1
        // never writes through one, and the link is the caller's to remove.
        let at = at.map_or_else(
            || rel.to_string(),
            |p| {
                p.strip_prefix(WORKSPACE)
                    .map_or_else(|_| p.display().to_string(), |p| p.display().to_string())
            },
        );
        RunError::new(
            ErrorKind::Conflict,
            format!("{rel}: a symbolic link is in the way at {at} (files are never written through one)."),
        )
    } else if chain.contains("directory is in the way") || chain.contains("Not a directory") {
        // The path is fine; what is in the workspace now is in the way.
        RunError::new(
            ErrorKind::Conflict,
            format!("{rel}: a directory is in the way (or a file where a directory should be)."),
        )
    } else {
        RunError::new(
            ErrorKind::SandboxFailure,
            format!("The file could not be written: {chain}."),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_refusals_are_the_requests_and_failures_the_hosts() {
        let e = write_error(
            "a",
            "writing /workspace/a: No space left on device (os error 28)",
            None,
        );
        assert_eq!(e.kind, ErrorKind::InvalidRequest);
        let e = write_error(
            "a/b",
            "creating /workspace/a: a directory is in the way",
            None,
        );
        assert_eq!(e.kind, ErrorKind::Conflict);
        assert!(e.message.starts_with("a/b:"), "{e}");
        let e = write_error("a", "Not a directory (os error 20)", None);
        assert_eq!(e.kind, ErrorKind::Conflict);
        let link = std::path::Path::new("/workspace/d");
        let e = write_error("d/x", "a symbolic link is in the way", Some(link));
        assert_eq!(e.kind, ErrorKind::Conflict);
        assert!(
            e.message.contains("symbolic link is in the way at d"),
            "{e}"
        );
        let e = write_error("a", "the control socket closed", None);
        assert_eq!(e.kind, ErrorKind::SandboxFailure);
    }
}
