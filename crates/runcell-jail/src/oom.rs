//! The OOM killer's order: sandbox processes first, the server last.
//!
//! When the memory of the cgroup runcell runs in (a container's, a pod's) is exhausted, the
//! kernel kills the process with the highest badness: its memory plus `oom_score_adj`
//! (proc(5)). A run's tmpfs pages belong to no process, so without an adjustment the largest
//! process, often the server, is chosen, and with it every session goes. Every sandbox
//! process therefore starts with `oom_score_adj` 1000 (raising is always allowed, and
//! children inherit it), and the server lowers its own where it may (lowering needs
//! `CAP_SYS_RESOURCE`).

use std::io;
use std::path::Path;

/// Every sandbox process's `oom_score_adj`: chosen first.
pub const SANDBOX_OOM_SCORE_ADJ: i32 = 1000;

/// [`SANDBOX_OOM_SCORE_ADJ`] as the helper's pre-exec hook writes it (it may not allocate).
pub(crate) const SANDBOX_OOM_SCORE_ADJ_TEXT: &[u8] = b"1000";

/// Set the calling process's `oom_score_adj` to [`SANDBOX_OOM_SCORE_ADJ`], between fork and
/// exec: only async-signal-safe calls, no allocation.
///
/// # Safety
/// Callable in a forked child of a multi-threaded process (it uses open, write and close on a
/// static path).
pub(crate) unsafe fn raise_to_sandbox_score() -> io::Result<()> {
    // SAFETY: a static NUL-terminated path; open/write/close are async-signal-safe.
    unsafe {
        let fd = libc::open(
            c"/proc/self/oom_score_adj".as_ptr(),
            libc::O_WRONLY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let text = SANDBOX_OOM_SCORE_ADJ_TEXT;
        let written = libc::write(fd, text.as_ptr().cast(), text.len());
        let error = io::Error::last_os_error();
        libc::close(fd);
        if written != text.len() as isize {
            return Err(error);
        }
    }
    Ok(())
}

/// What the server asks for itself: last, but not never (-1000 would make a leak in the
/// server unkillable and take the whole container instead).
pub const SERVER_OOM_SCORE_ADJ: i32 = -900;

/// The `oom_score_adj` of a process, from its file (normally `/proc/self/oom_score_adj`).
pub fn read_oom_score_adj(path: &Path) -> io::Result<i32> {
    std::fs::read_to_string(path)?
        .trim()
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// What became of the server's request to be killed last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OomAdjust {
    /// Now at `wanted` (or already lower).
    Lowered(i32),
    /// Not permitted (no `CAP_SYS_RESOURCE`): it stays at `current`.
    Kept { current: i32, reason: String },
}

impl std::fmt::Display for OomAdjust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OomAdjust::Lowered(v) => write!(
                f,
                "server oom_score_adj {v}, sandbox processes {SANDBOX_OOM_SCORE_ADJ}: the OOM \
                 killer takes sandbox processes first"
            ),
            OomAdjust::Kept { current, reason } => write!(
                f,
                "server oom_score_adj stays {current} ({reason}); sandbox processes \
                 {SANDBOX_OOM_SCORE_ADJ} are still taken first"
            ),
        }
    }
}

/// Lower this process's `oom_score_adj` (the file `path`) to `wanted`, if it is higher.
pub fn lower_oom_score_adj(path: &Path, wanted: i32) -> io::Result<OomAdjust> {
    let current = read_oom_score_adj(path)?;
    if current <= wanted {
        return Ok(OomAdjust::Lowered(current));
    }
    match std::fs::write(path, wanted.to_string()) {
        Ok(()) => Ok(OomAdjust::Lowered(read_oom_score_adj(path)?)),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => {
            Ok(OomAdjust::Kept {
                current,
                reason: "lowering it needs CAP_SYS_RESOURCE".into(),
            })
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowering_writes_only_when_higher() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("oom_score_adj");
        std::fs::write(&p, "0\n").unwrap();
        assert_eq!(
            lower_oom_score_adj(&p, -900).unwrap(),
            OomAdjust::Lowered(-900)
        );
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "-900");
        std::fs::write(&p, "-1000\n").unwrap();
        assert_eq!(
            lower_oom_score_adj(&p, -900).unwrap(),
            OomAdjust::Lowered(-1000)
        );
        assert!(lower_oom_score_adj(&d.path().join("none"), -900).is_err());
        std::fs::write(&p, "lots\n").unwrap();
        assert!(read_oom_score_adj(&p).is_err());
        let kept = OomAdjust::Kept {
            current: 0,
            reason: "lowering it needs CAP_SYS_RESOURCE".into(),
        };
        assert!(kept.to_string().contains("stays 0"), "{kept}");
        assert!(OomAdjust::Lowered(-900)
            .to_string()
            .contains("sandbox processes 1000"));
    }

    /// In a forked child (it changes process state): the pre-exec hook raises its score to
    /// the sandbox's, as it does for every sandbox's first process.
    #[test]
    fn the_pre_exec_hook_raises_the_score() {
        assert_eq!(
            SANDBOX_OOM_SCORE_ADJ_TEXT,
            SANDBOX_OOM_SCORE_ADJ.to_string().as_bytes()
        );
        let me = Path::new("/proc/self/oom_score_adj");
        if !me.exists() {
            eprintln!("SKIP: no /proc/self/oom_score_adj");
            return;
        }
        // SAFETY: the child calls only the async-signal-safe hook, then _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: a forked child, as the hook requires.
            let ok = unsafe { raise_to_sandbox_score() }.is_ok();
            // SAFETY: ends the forked child without running the parent's destructors.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    }
}
