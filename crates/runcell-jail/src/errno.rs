//! The OS error behind a failure, with the errno's symbolic name.
//!
//! A failure deep in the sandbox (a `mount` in pid 1, a write to `cgroup.procs` in the helper)
//! reaches the supervisor as a step name plus an errno; [`OsError`] is how a caller gets the
//! errno back without parsing a message, e.g. to tell `EACCES` (a host policy problem) from
//! `EBUSY` or `ENOSPC` (a transient one).

use std::fmt;

/// An error and its sources, `: `-separated: "creating the cgroup: writing memory.max:
/// Permission denied (os error 13)". The rule across the workspace: an error's `Display` says
/// what failed at its own level and never repeats its source; whoever shows an error to a
/// person or a model prints the whole chain with this.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        // A wrapper that still repeats its source adds nothing the second time.
        if !text.is_empty() && !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = s.source();
    }
    out
}

/// An errno, with its symbolic name when it is one of the common ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OsError {
    pub errno: i32,
    /// `"EACCES"`, `"EBUSY"`, ...; `None` for an errno outside [`errno_name`]'s table.
    pub name: Option<&'static str>,
}

impl OsError {
    pub fn new(errno: i32) -> OsError {
        OsError {
            errno,
            name: errno_name(errno),
        }
    }

    /// The errno behind an I/O error, if it came from the OS.
    pub fn from_io(e: &std::io::Error) -> Option<OsError> {
        e.raw_os_error().map(OsError::new)
    }
}

impl fmt::Display for OsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name {
            Some(name) => write!(f, "{name} (errno {})", self.errno),
            None => write!(f, "errno {}", self.errno),
        }
    }
}

/// The symbolic name of the errnos a sandbox failure is likely to carry (Linux numbering).
pub fn errno_name(errno: i32) -> Option<&'static str> {
    Some(match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::E2BIG => "E2BIG",
        libc::ENOEXEC => "ENOEXEC",
        libc::EBADF => "EBADF",
        libc::ECHILD => "ECHILD",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::EXDEV => "EXDEV",
        libc::ENODEV => "ENODEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::ENFILE => "ENFILE",
        libc::EMFILE => "EMFILE",
        libc::ETXTBSY => "ETXTBSY",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::ESPIPE => "ESPIPE",
        libc::EROFS => "EROFS",
        libc::EMLINK => "EMLINK",
        libc::EPIPE => "EPIPE",
        libc::ERANGE => "ERANGE",
        libc::EDEADLK => "EDEADLK",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOSYS => "ENOSYS",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ELOOP => "ELOOP",
        libc::EOVERFLOW => "EOVERFLOW",
        libc::EUSERS => "EUSERS",
        libc::ENOTSOCK => "ENOTSOCK",
        libc::EAFNOSUPPORT => "EAFNOSUPPORT",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EADDRINUSE => "EADDRINUSE",
        libc::ECONNRESET => "ECONNRESET",
        libc::ENOBUFS => "ENOBUFS",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::ESTALE => "ESTALE",
        libc::EDQUOT => "EDQUOT",
        libc::ECANCELED => "ECANCELED",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_errnos_have_names() {
        assert_eq!(OsError::new(libc::EACCES).name, Some("EACCES"));
        assert_eq!(OsError::new(libc::EBUSY).to_string(), "EBUSY (errno 16)");
        assert_eq!(OsError::new(4095).name, None);
        assert_eq!(OsError::new(4095).to_string(), "errno 4095");
        let io = std::io::Error::from_raw_os_error(libc::ENOSPC);
        assert_eq!(OsError::from_io(&io), Some(OsError::new(libc::ENOSPC)));
        assert_eq!(OsError::from_io(&std::io::Error::other("x")), None);
    }
}
