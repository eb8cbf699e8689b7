//! What can go wrong while creating or driving a sandbox.
//!
//! One rule for every error of this crate: `Display` names the step that failed (and the path
//! it worked on), never the underlying error, which is the `source()`. The edge that shows the
//! error to a person formats the whole chain; code that needs the errno asks
//! [`SandboxError::os_error`].

use std::error::Error as _;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use crate::cgroup::CgroupError;
use crate::errno::OsError;
use crate::protocol::ChildError;

/// Everything that can go wrong while creating or driving a sandbox.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("cannot start the sandbox helper {}", exe.display())]
    Spawn { exe: PathBuf, source: io::Error },
    /// A step of the supervisor itself (`step` says which) failed.
    #[error("{step}")]
    Io {
        step: &'static str,
        source: io::Error,
    },
    /// A process of the sandbox (the helper, pid 1, or the program's process before execve)
    /// reported a failed step; `source` carries its errno.
    #[error("sandbox setup failed at '{step}'{}", path.as_ref().map(|p| format!(" ({})", p.display())).unwrap_or_default())]
    Setup {
        step: String,
        path: Option<PathBuf>,
        source: ChildError,
    },
    #[error("the sandbox did not become ready within {0:?}")]
    SetupTimeout(Duration),
    #[error("the sandbox helper exited unexpectedly ({0})")]
    HelperDied(String),
    #[error("unexpected message from the sandbox: {0}")]
    Protocol(String),
    #[error("cgroup")]
    Cgroup(#[from] CgroupError),
    #[error("the sandbox is no longer running")]
    Dead,
    /// A cell was sent to a sandbox whose interpreter is gone (it died between cells).
    #[error("the sandbox's interpreter is no longer running")]
    NoInterpreter,
    #[error("the program's files and stdin do not fit in the memory limit")]
    InputExceedsMemory,
    /// An interpreter could not be forked from a template (the sandbox is as before).
    #[error("template: {0}")]
    Template(String),
}

impl SandboxError {
    /// The OS error behind this failure (EACCES, EBUSY, ...), wherever it happened: in the
    /// supervisor, in the cgroup layer, or in a process of the sandbox.
    pub fn os_error(&self) -> Option<OsError> {
        let mut cur: Option<&(dyn std::error::Error + 'static)> = self.source();
        while let Some(e) = cur {
            if let Some(io) = e.downcast_ref::<io::Error>() {
                if let Some(os) = OsError::from_io(io) {
                    return Some(os);
                }
            }
            if let Some(child) = e.downcast_ref::<ChildError>() {
                if let Some(errno) = child.errno {
                    return Some(OsError::new(errno));
                }
            }
            cur = e.source();
        }
        None
    }

    /// The step that failed, when the failure is one step's.
    pub fn step(&self) -> Option<&str> {
        match self {
            SandboxError::Spawn { .. } => Some("spawn helper"),
            SandboxError::Io { step, .. } => Some(step),
            SandboxError::Setup { step, .. } => Some(step),
            SandboxError::Cgroup(_) => Some("cgroup"),
            _ => None,
        }
    }
}

pub(super) fn io_err(step: &'static str) -> impl FnOnce(io::Error) -> SandboxError {
    move |source| SandboxError::Io { step, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_error_is_found_behind_every_kind_of_failure() {
        let e = SandboxError::Io {
            step: "poll",
            source: io::Error::from_raw_os_error(libc::EINTR),
        };
        assert_eq!(e.to_string(), "poll");
        assert_eq!(e.os_error().unwrap().name, Some("EINTR"));
        assert_eq!(e.step(), Some("poll"));

        let e = SandboxError::Setup {
            step: "mount proc".into(),
            path: Some("/tmp/proc".into()),
            source: ChildError {
                errno: Some(libc::EACCES),
                message: "Permission denied (os error 13)".into(),
            },
        };
        assert_eq!(
            e.to_string(),
            "sandbox setup failed at 'mount proc' (/tmp/proc)"
        );
        assert_eq!(
            e.source().unwrap().to_string(),
            "Permission denied (os error 13)"
        );
        assert_eq!(e.os_error(), Some(OsError::new(libc::EACCES)));

        let e = SandboxError::Cgroup(CgroupError::RemoveDir {
            path: "/sys/fs/cgroup/runcell/x".into(),
            source: io::Error::from_raw_os_error(libc::EBUSY),
        });
        assert_eq!(e.to_string(), "cgroup");
        assert_eq!(e.os_error().unwrap().name, Some("EBUSY"));
        assert_eq!(SandboxError::Dead.os_error(), None);
    }
}
