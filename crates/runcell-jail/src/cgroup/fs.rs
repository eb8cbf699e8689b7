//! The narrow seam between the cgroup logic and the kernel.
//!
//! Every effect the manager has on the system goes through [`CgroupFs`]. The default
//! methods *are* the real implementation (plain syscalls on cgroupfs), so production code
//! uses [`RealFs`], which overrides nothing. Unit tests substitute a fake that works on a
//! temp dir but imitates what the kernel does as a side effect of some operations
//! (populating a new cgroup dir with interface files, refusing `rmdir` of a busy group,
//! "killing" fake pids without touching real processes).

use std::ffi::OsString;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

use rustix::fs::Access;
use rustix::process::{Pid, Signal};

pub(crate) trait CgroupFs: Send + Sync + fmt::Debug {
    /// Creating a directory in cgroupfs creates a cgroup.
    fn mkdir(&self, path: &Path) -> io::Result<()> {
        fs::create_dir(path)
    }

    /// Removing a cgroup is a plain `rmdir`: the interface files inside are virtual and
    /// vanish with it. The kernel refuses (EBUSY) while live tasks or child groups remain.
    fn rmdir(&self, path: &Path) -> io::Result<()> {
        fs::remove_dir(path)
    }

    fn read(&self, path: &Path) -> io::Result<String> {
        fs::read_to_string(path)
    }

    /// Writes `value` with a single `write(2)`; cgroupfs parses each write separately.
    /// No `O_CREAT`: interface files cannot be created, and a missing one means the
    /// controller or kernel feature is absent, which callers must be told about.
    fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        let mut file = OpenOptions::new().write(true).open(path)?;
        file.write_all(value.as_bytes())
    }

    /// Opens read-write and keeps the descriptor: some files (v2 `memory.peak`) have
    /// per-open-file state.
    fn open_rw(&self, path: &Path) -> io::Result<File> {
        OpenOptions::new().read(true).write(true).open(path)
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    /// Names of the sub-directories (child cgroups) of `path`.
    fn subdirs(&self, path: &Path) -> io::Result<Vec<OsString>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(path)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                names.push(entry.file_name());
            }
        }
        Ok(names)
    }

    /// access(2) with W_OK: delegation to an unprivileged user is expressed purely as file
    /// ownership, so "can I write it" is the question to ask.
    fn writable(&self, path: &Path) -> bool {
        rustix::fs::access(path, Access::WRITE_OK).is_ok()
    }

    /// SIGKILL one process. Pids that cannot name a single process (0, or values that do
    /// not fit a pid_t and would turn negative, i.e. a process group) are refused.
    fn kill(&self, pid: u32) -> io::Result<()> {
        let pid = i32::try_from(pid)
            .ok()
            .and_then(Pid::from_raw)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        rustix::process::kill_process(pid, Signal::KILL).map_err(io::Error::from)
    }
}

/// The real cgroupfs.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RealFs;

impl CgroupFs for RealFs {}
