//! Mount helpers for building the sandbox's root filesystem inside its private mount namespace.
//!
//! Read-only binds use the new mount API (`open_tree` + `mount_setattr` + `move_mount`, Linux
//! 5.12): `mount_setattr(AT_RECURSIVE)` makes a whole bound subtree read-only, whereas the
//! classic `MS_REMOUNT|MS_BIND|MS_RDONLY` only changes the top mount and would leave any submount
//! of a bound directory writable.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use rustix::fs::CWD;
use rustix::mount::{mount, move_mount, open_tree, MountFlags, MoveMountFlags, OpenTreeFlags};

use crate::sys;

/// A failed setup step, with the path it was working on. Its `Display` names the step and
/// the path; the OS error is the `source` (and crosses to the supervisor with its errno, see
/// `Report::Failed`).
#[derive(Debug, thiserror::Error)]
#[error("{step}{}", path.as_deref().map(|p| format!(" {}", p.display())).unwrap_or_default())]
pub struct StepError {
    pub step: &'static str,
    pub path: Option<PathBuf>,
    #[source]
    pub source: io::Error,
}

/// Attach a step name (and path) to an I/O result.
pub trait Step<T> {
    fn step(self, step: &'static str) -> Result<T, StepError>;
    fn step_at(self, step: &'static str, path: &Path) -> Result<T, StepError>;
}

impl<T> Step<T> for io::Result<T> {
    fn step(self, step: &'static str) -> Result<T, StepError> {
        self.map_err(|source| StepError {
            step,
            path: None,
            source,
        })
    }
    fn step_at(self, step: &'static str, path: &Path) -> Result<T, StepError> {
        self.map_err(|source| StepError {
            step,
            path: Some(path.to_path_buf()),
            source,
        })
    }
}

impl<T> Step<T> for rustix::io::Result<T> {
    fn step(self, step: &'static str) -> Result<T, StepError> {
        self.map_err(io::Error::from).step(step)
    }
    fn step_at(self, step: &'static str, path: &Path) -> Result<T, StepError> {
        self.map_err(io::Error::from).step_at(step, path)
    }
}

/// `root` joined with an absolute sandbox path.
pub fn under(root: &Path, abs: &Path) -> PathBuf {
    let rel = abs.strip_prefix("/").unwrap_or(abs);
    root.join(rel)
}

/// Whether an absolute path is plain: absolute, no `..`, no `.`.
pub fn is_plain_absolute(p: &Path) -> bool {
    p.is_absolute()
        && p.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

/// `mkdir -p` with a mode (the parents get 0755).
pub fn mkdir_p(path: &Path, mode: u32) -> Result<(), StepError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
        .step_at("mkdir", path)?;
    // The umask may have trimmed the mode (1777 for /tmp needs the sticky bit as given).
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).step_at("chmod", path)
}

/// Mount a fresh tmpfs with a size and inode cap.
pub fn mount_tmpfs(target: &Path, bytes: u64, inodes: u64, mode: u32) -> Result<(), StepError> {
    let data = CString::new(format!("size={bytes},nr_inodes={inodes},mode={mode:o}"))
        .map_err(io::Error::other)
        .step("tmpfs options")?;
    mount(
        "tmpfs",
        target,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        Some(data.as_c_str()),
    )
    .step_at("mount tmpfs", target)
}

/// Bind `src` (a host path) at `dst` with the given `MOUNT_ATTR_*` bits, recursively.
fn bind_with_attrs(src: &Path, dst: &Path, attrs: u64, recursive: bool) -> Result<(), StepError> {
    let mut flags = OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC;
    if recursive {
        flags |= OpenTreeFlags::AT_RECURSIVE;
    }
    let tree = open_tree(CWD, src, flags).step_at("open_tree", src)?;
    sys::mount_setattr(rustix::fd::AsFd::as_fd(&tree), c"", recursive, attrs, true)
        .step_at("mount_setattr", src)?;
    move_mount(&tree, "", CWD, dst, MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH)
        .step_at("move_mount", dst)
}

/// Create the mount point for `src` at `dst` (a directory or an empty file).
fn mount_point(dst: &Path, dir: bool) -> Result<(), StepError> {
    if let Some(parent) = dst.parent() {
        mkdir_p(parent, 0o755)?;
    }
    if dir {
        mkdir_p(dst, 0o755)
    } else {
        fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(dst)
            .map(drop)
            .step_at("create mount point", dst)
    }
}

/// Bind a host path read-only, nosuid, nodev, recursively.
pub fn bind_readonly(src: &Path, dst: &Path, dir: bool) -> Result<(), StepError> {
    mount_point(dst, dir)?;
    bind_with_attrs(
        src,
        dst,
        sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
        true,
    )
}

/// Bind a host character device (e.g. /dev/null): usable, but nosuid and noexec.
pub fn bind_device(src: &Path, dst: &Path) -> Result<(), StepError> {
    mount_point(dst, false)?;
    bind_with_attrs(
        src,
        dst,
        sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NOEXEC,
        false,
    )
}

/// Re-bind an existing path of the new tree onto itself read-only (for /proc/sys and friends).
pub fn make_readonly_in_place(path: &Path) -> Result<(), StepError> {
    bind_with_attrs(
        path,
        path,
        sys::MOUNT_ATTR_RDONLY
            | sys::MOUNT_ATTR_NOSUID
            | sys::MOUNT_ATTR_NODEV
            | sys::MOUNT_ATTR_NOEXEC,
        true,
    )
}

/// Mount an overlay of the read-only `lower` with `upper`/`work` (on the scratch tmpfs) at
/// `target`. `userxattr` is what lets an overlay be mounted inside a user namespace (5.11+).
pub fn mount_overlay(
    lower: &Path,
    upper: &Path,
    work: &Path,
    target: &Path,
) -> Result<(), StepError> {
    let escape_ok = |p: &Path| {
        let s = p.as_os_str().as_encoded_bytes();
        !s.iter().any(|b| matches!(b, b',' | b':' | b'\\' | b'\n'))
    };
    if ![lower, upper, work].iter().all(|p| escape_ok(p)) {
        return Err(StepError {
            step: "overlay options",
            path: Some(lower.to_path_buf()),
            source: io::Error::new(io::ErrorKind::InvalidInput, "path has ',', ':' or '\\'"),
        });
    }
    let data = CString::new(format!(
        "lowerdir={},upperdir={},workdir={},userxattr",
        lower.display(),
        upper.display(),
        work.display()
    ))
    .map_err(io::Error::other)
    .step("overlay options")?;
    mount(
        "overlay",
        target,
        "overlay",
        MountFlags::NOSUID | MountFlags::NODEV,
        Some(data.as_c_str()),
    )
    .step_at("mount overlay", target)
}

/// Plain bind (same flags as the source), used to expose parts of the scratch tmpfs.
pub fn bind_plain(src: &Path, dst: &Path) -> Result<(), StepError> {
    rustix::mount::mount_bind(src, dst).step_at("bind", dst)
}

/// Files of /proc that leak host information or allow host actions; each is hidden behind an
/// empty bind of /dev/null (the list follows Docker's and runc's masked paths).
pub const PROC_MASKED_FILES: &[&str] = &[
    "kcore",
    "kmsg",
    "kallsyms",
    "keys",
    "key-users",
    "latency_stats",
    "timer_list",
    "timer_stats",
    "sched_debug",
    "sysrq-trigger",
    "kpagecount",
    "kpageflags",
    "kpagecgroup",
    "vmallocinfo",
    "slabinfo",
    "pagetypeinfo",
    "config.gz",
    // Counts every cgroup on the host per controller: a run would see others start and end.
    "cgroups",
];

/// Directories of /proc hidden behind an empty read-only tmpfs.
pub const PROC_MASKED_DIRS: &[&str] = &["acpi", "scsi", "asound", "driver", "firmware"];

/// Directories of /proc made read-only.
pub const PROC_READONLY_DIRS: &[&str] = &["sys", "irq", "bus", "fs"];

/// Mask and write-protect the dangerous parts of a freshly mounted /proc.
pub fn mask_proc(proc_dir: &Path, dev_null: &Path) -> Result<(), StepError> {
    for name in PROC_READONLY_DIRS {
        let p = proc_dir.join(name);
        if p.is_dir() {
            make_readonly_in_place(&p)?;
        }
    }
    for name in PROC_MASKED_FILES {
        let p = proc_dir.join(name);
        if p.exists() {
            bind_with_attrs(
                dev_null,
                &p,
                sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NOEXEC,
                false,
            )?;
        }
    }
    for name in PROC_MASKED_DIRS {
        let p = proc_dir.join(name);
        if p.is_dir() {
            mount(
                "tmpfs",
                &p,
                "tmpfs",
                MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
                Some(c"size=0,nr_inodes=1,mode=0555"),
            )
            .step_at("mask /proc dir", &p)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn under_joins_absolute_paths() {
        assert_eq!(
            under(Path::new("/tmp"), Path::new("/usr/lib")),
            PathBuf::from("/tmp/usr/lib")
        );
    }

    #[test]
    fn plain_absolute_rejects_dots_and_relative() {
        assert!(is_plain_absolute(Path::new("/workspace/a/b.txt")));
        assert!(!is_plain_absolute(Path::new("/workspace/../etc/passwd")));
        assert!(!is_plain_absolute(Path::new("workspace/x")));
    }
}
