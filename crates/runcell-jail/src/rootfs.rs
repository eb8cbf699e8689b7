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

use rustix::fd::OwnedFd;

use rustix::fs::CWD;
use rustix::mount::{
    mount, move_mount, open_tree, unmount, MountFlags, MoveMountFlags, OpenTreeFlags, UnmountFlags,
};

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

/// The sandbox's own mounts (P9, P10, P11): a host directory shown below one of them would be
/// hidden by it.
pub const OWN_MOUNTS: &[&str] = &["/tmp", "/workspace", "/dev", "/proc"];

/// Where in `root` the host part shown at `abs` goes: refused (never hidden silently) when
/// `abs` lies below one of the sandbox's own mounts (a data directory under /tmp).
pub fn shown_under(root: &Path, abs: &Path) -> io::Result<PathBuf> {
    match OWN_MOUNTS.iter().find(|m| abs.starts_with(m)) {
        Some(m) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} cannot be shown in the sandbox: it lies below the sandbox's own {m}, which \
                 would hide it (move it elsewhere, e.g. the data directory out of {m})",
                abs.display()
            ),
        )),
        None => Ok(under(root, abs)),
    }
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
    // A mount point that exists already (a submount's, on a read-only overlay) is used as is.
    if fs::symlink_metadata(dst).is_ok_and(|m| m.is_dir() == dir) {
        return Ok(());
    }
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

/// An empty read-only tmpfs (one inode: nothing can ever appear in it).
pub fn mount_empty(target: &Path) -> Result<(), StepError> {
    mount(
        "tmpfs",
        target,
        "tmpfs",
        MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        Some(c"size=4k,nr_inodes=1,mode=0555"),
    )
    .step_at("mount empty layer", target)
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

/// Show a host directory read-only at `dst` through an overlay of its own, mounted on top of a
/// non-recursive bind at the staging point `layer` (then detached), with `empty` as the second
/// lower layer (a lower-only overlay needs two).
///
/// The overlay's inodes belong to this sandbox alone, so a `flock`, POSIX or OFD lock taken on
/// a shared file (the Python binary, a shared library) locks this overlay's inode, never the
/// host's: a run can neither block the host's own locks nor signal other runs through them
/// (inotify is refused by seccomp). Reads still come from the host's page cache. The overlay
/// is mounted from the staging point so that mountinfo names no host path and no host device.
///
/// Submounts of `src` are not part of an overlay's layer; the caller binds them on top
/// ([`submounts_under`]).
pub fn overlay_readonly(
    src: &Path,
    clone: Option<OwnedFd>,
    layer: &Path,
    empty: &Path,
    dst: &Path,
) -> Result<(), StepError> {
    mount_point(dst, true)?;
    mkdir_p(layer, 0o700)?;
    match clone {
        // Made by the helper in the host's namespace, where no mount is locked.
        Some(fd) => move_mount(&fd, "", CWD, layer, MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH)
            .step_at("move_mount", layer)?,
        None => bind_with_attrs(
            src,
            layer,
            sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
            false,
        )?,
    }
    let data = CString::new(format!(
        "lowerdir={}:{},redirect_dir=nofollow,metacopy=off,index=off",
        overlay_path(layer)?.display(),
        overlay_path(empty)?.display()
    ))
    .map_err(io::Error::other)
    .step("overlay options")?;
    mount(
        "overlay",
        dst,
        "overlay",
        MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
        Some(data.as_c_str()),
    )
    .step_at("mount overlay", dst)?;
    // The overlay keeps private clones of its layers: the staging bind can go.
    unmount(layer, UnmountFlags::DETACH).step_at("unmount layer", layer)?;
    fs::remove_dir(layer).step_at("rmdir layer", layer)
}

/// A non-recursive clone of a host directory's mount, read-only, nosuid and nodev, detached,
/// for [`overlay_readonly`]. Made by the helper as host root before the clone: in the
/// sandbox's own namespace every mount copied from the host is locked, and the kernel refuses
/// a non-recursive clone of a directory with locked mounts below it (and an overlay layer
/// with locked children), which any host with a mount under `/usr` has.
pub fn layer_clone(src: &Path) -> Result<OwnedFd, StepError> {
    let tree = open_tree(
        CWD,
        src,
        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
    )
    .step_at("open_tree", src)?;
    sys::mount_setattr(
        rustix::fd::AsFd::as_fd(&tree),
        c"",
        false,
        sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
        true,
    )
    .step_at("mount_setattr", src)?;
    Ok(tree)
}

/// Mount points strictly below `dir` in this mount namespace, outermost first, from the
/// mountinfo text `mountinfo` (read from `/proc/self/mountinfo`). A mount nested in another
/// listed one is left out: a recursive bind of the outer one brings it along. (A mount point
/// may be a file.)
pub fn submounts_under(mountinfo: &[u8], dir: &Path) -> Vec<PathBuf> {
    let Ok(mounts) = crate::cgroup::mountinfo::parse_mountinfo(mountinfo) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = mounts
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p != dir && p.starts_with(dir))
        .collect();
    found.sort_by_key(|p| p.components().count());
    let mut outer: Vec<PathBuf> = Vec::new();
    for p in found {
        if !outer.iter().any(|o| p.starts_with(o)) {
            outer.push(p);
        }
    }
    outer
}

/// Copy a small host file (e.g. `/etc/ld.so.cache`) into the sandbox's own root, so its inode
/// (and any lock on it) is the sandbox's. At most `max` bytes: a larger file is an error.
pub fn copy_host_file(src: &Path, dst: &Path, max: u64) -> Result<(), StepError> {
    use std::io::Read;
    mount_point(dst, false)?;
    let mut content = Vec::new();
    fs::File::open(src)
        .and_then(|f| f.take(max + 1).read_to_end(&mut content))
        .step_at("read", src)?;
    if content.len() as u64 > max {
        return Err(StepError {
            step: "copy host file",
            path: Some(src.to_path_buf()),
            source: io::Error::new(io::ErrorKind::FileTooLarge, format!("over {max} bytes")),
        });
    }
    fs::write(dst, content).step_at("write", dst)?;
    fs::set_permissions(dst, fs::Permissions::from_mode(0o644)).step_at("chmod", dst)
}

/// An overlay option value cannot carry `,` `:` `\` or a newline unescaped.
fn overlay_path(p: &Path) -> Result<&Path, StepError> {
    let s = p.as_os_str().as_encoded_bytes();
    if s.iter().any(|b| matches!(b, b',' | b':' | b'\\' | b'\n')) {
        return Err(StepError {
            step: "overlay options",
            path: Some(p.to_path_buf()),
            source: io::Error::new(io::ErrorKind::InvalidInput, "path has ',', ':' or '\\'"),
        });
    }
    Ok(p)
}

/// The harmless character devices of the sandbox's `/dev`: name, major, minor.
pub const DEVICES: &[(&str, u32, u32)] = &[
    ("null", 1, 3),
    ("zero", 1, 5),
    ("full", 1, 7),
    ("random", 1, 8),
    ("urandom", 1, 9),
];

/// The links of the sandbox's `/dev`.
pub const DEV_LINKS: &[(&str, &str)] = &[
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
];

/// A `/dev` of the sandbox's own, built by the helper as host root (H3a): a tiny tmpfs,
/// created with `fsopen`/`fsmount` and never attached to the host's tree, holding fresh
/// device nodes ([`DEVICES`]), the [`DEV_LINKS`] and the `shm` mount point; then made
/// read-only, nosuid and noexec. pid 1 moves it into place (P9).
///
/// Only root in the host's user namespace can make device nodes that open (a filesystem
/// mounted inside a user namespace never honours them): that is why the helper builds it.
/// Fresh nodes have inodes of their own, so locks on `/dev/null` are the run's alone, and
/// `statfs("/dev/null")` shows this tmpfs rather than the host's devtmpfs (whose size is
/// half the host's memory).
pub fn private_dev() -> Result<rustix::fd::OwnedFd, StepError> {
    use rustix::fs::{chmodat, makedev, mkdirat, mknodat, symlinkat, AtFlags, FileType, Mode};
    use rustix::mount::{
        fsconfig_create, fsconfig_set_string, fsmount, fsopen, FsMountFlags, FsOpenFlags,
        MountAttrFlags,
    };
    let fs = fsopen("tmpfs", FsOpenFlags::FSOPEN_CLOEXEC).step("fsopen /dev")?;
    for (key, value) in [
        ("source", "tmpfs"),
        ("size", "16k"),
        ("nr_inodes", "16"),
        ("mode", "755"),
    ] {
        fsconfig_set_string(&fs, key, value).step("configure /dev")?;
    }
    fsconfig_create(&fs).step("create /dev")?;
    let mnt = fsmount(
        &fs,
        FsMountFlags::FSMOUNT_CLOEXEC,
        MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NOEXEC,
    )
    .step("fsmount /dev")?;
    for &(name, major, minor) in DEVICES {
        let mode = Mode::from_raw_mode(0o666);
        mknodat(
            &mnt,
            name,
            FileType::CharacterDevice,
            mode,
            makedev(major, minor),
        )
        .step_at("mknod", Path::new(name))?;
        // The helper's umask trimmed the mode.
        chmodat(&mnt, name, mode, AtFlags::empty()).step_at("chmod", Path::new(name))?;
    }
    for &(name, target) in DEV_LINKS {
        symlinkat(target, &mnt, name).step_at("symlink", Path::new(name))?;
    }
    mkdirat(&mnt, "shm", Mode::from_raw_mode(0o755)).step("mkdir /dev/shm")?;
    sys::mount_setattr(
        rustix::fd::AsFd::as_fd(&mnt),
        c"",
        false,
        sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NOEXEC,
        false,
    )
    .step("make /dev read-only")?;
    Ok(mnt)
}

/// Move a detached mount (from [`private_dev`]) to `dst`.
pub fn attach(mnt: rustix::fd::OwnedFd, dst: &Path) -> Result<(), StepError> {
    mkdir_p(dst, 0o755)?;
    move_mount(&mnt, "", CWD, dst, MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH)
        .step_at("move_mount", dst)
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
    for p in [lower, upper, work] {
        overlay_path(p)?;
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
    fn submounts_are_the_outermost_mounts_strictly_below() {
        let info = b"\
1 0 8:1 / / rw - ext4 /dev/sda1 rw
2 1 8:2 / /usr rw - ext4 /dev/sda2 rw
3 2 8:3 / /usr/local rw - ext4 /dev/sda3 rw
4 3 0:9 / /usr/local/share rw - tmpfs tmpfs rw
5 1 8:4 / /usrx rw - ext4 /dev/sda4 rw
6 2 8:5 / /usr/lib/with\\040space rw - ext4 /dev/sda5 rw
";
        assert_eq!(
            submounts_under(info, Path::new("/usr")),
            vec![
                PathBuf::from("/usr/local"),
                PathBuf::from("/usr/lib/with space")
            ]
        );
        assert!(submounts_under(info, Path::new("/etc/fonts")).is_empty());
    }

    #[test]
    fn a_host_part_below_the_sandboxs_own_mounts_is_refused() {
        let root = Path::new("/r");
        assert_eq!(
            shown_under(root, Path::new("/var/lib/runcell/python")).unwrap(),
            PathBuf::from("/r/var/lib/runcell/python")
        );
        for hidden in [
            "/tmp/data/packages",
            "/workspace/x",
            "/dev/shm/y",
            "/proc/1",
        ] {
            let e = shown_under(root, Path::new(hidden)).unwrap_err();
            assert!(e.to_string().contains("below the sandbox's own"), "{e}");
        }
        // A prefix of a name is not a directory above it.
        assert!(shown_under(root, Path::new("/tmpdata/x")).is_ok());
    }

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
