//! Parsing `/proc/<pid>/mountinfo` and `/proc/<pid>/cgroup`.
//!
//! mountinfo is the only reliable way to find cgroup hierarchies: mount points differ
//! between distributions and containers, and on v1 the set of controllers attached to a
//! hierarchy is only visible in the superblock options (`rw,cpu,cpuacct`). A line reads
//!
//! ```text
//! 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
//! (1)(2)(3)   (4)   (5)      (6)      (7)   (8) (9)   (10)         (11)
//! ```
//!
//! with zero or more optional fields (7) terminated by a lone `-`. Paths are escaped by the
//! kernel as octal (`\040` for a space, `\011`, `\012`, `\134`) and are otherwise raw bytes,
//! so parsing works on bytes and produces `OsString`-backed paths.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// Every controller name a v1 superblock option can carry (kernel `cgroup_subsys` names).
const V1_CONTROLLERS: &[&str] = &[
    "cpuset",
    "cpu",
    "cpuacct",
    "io",
    "blkio",
    "memory",
    "devices",
    "freezer",
    "net_cls",
    "perf_event",
    "net_prio",
    "hugetlb",
    "pids",
    "rdma",
    "misc",
];

/// One mount from mountinfo, reduced to what cgroup discovery needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MountEntry {
    /// The directory of the mounted filesystem that appears at the mount point (field 4).
    /// For cgroupfs this is the cgroup that the mount exposes, e.g. `/` or a container's
    /// group when the hierarchy was bind-mounted.
    pub root: PathBuf,
    pub mount_point: PathBuf,
    /// Per-mount options (field 6), e.g. `rw,nosuid,relatime`.
    pub mount_options: String,
    pub fstype: String,
    /// Superblock options (last field). For v1 cgroupfs these name the controllers.
    pub super_options: String,
}

impl MountEntry {
    pub fn read_only(&self) -> bool {
        has_option(&self.mount_options, "ro") || has_option(&self.super_options, "ro")
    }

    /// Controllers of a v1 (`cgroup`) mount; named hierarchies like `name=systemd` and
    /// options such as `noprefix` are not controllers.
    pub fn v1_controllers(&self) -> Vec<String> {
        self.super_options
            .split(',')
            .filter(|opt| V1_CONTROLLERS.contains(opt))
            .map(str::to_owned)
            .collect()
    }
}

fn has_option(options: &str, wanted: &str) -> bool {
    options.split(',').any(|opt| opt == wanted)
}

/// Parses a whole mountinfo file. On a malformed line returns its 1-based number.
pub(crate) fn parse_mountinfo(content: &[u8]) -> Result<Vec<MountEntry>, usize> {
    let mut mounts = Vec::new();
    for (index, line) in content.split(|&b| b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        mounts.push(parse_line(line).ok_or(index + 1)?);
    }
    Ok(mounts)
}

fn parse_line(line: &[u8]) -> Option<MountEntry> {
    let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    // Six fixed fields, then optional fields up to the separator, then three more.
    let separator = fields.iter().skip(6).position(|f| *f == b"-")? + 6;
    if fields.len() < separator + 4 {
        return None;
    }
    let text = |field: &[u8]| String::from_utf8_lossy(field).into_owned();
    Some(MountEntry {
        root: unescape_path(fields[3]),
        mount_point: unescape_path(fields[4]),
        mount_options: text(fields[5]),
        fstype: text(fields[separator + 1]),
        super_options: text(fields[separator + 3]),
    })
}

/// Undoes the kernel's `\ooo` octal escaping of space, tab, newline and backslash.
fn unescape_path(field: &[u8]) -> PathBuf {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        if let (b'\\', Some(digits)) = (field[i], field.get(i + 1..i + 4)) {
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let value = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(byte) = u8::try_from(value) {
                    out.push(byte);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(field[i]);
        i += 1;
    }
    PathBuf::from(OsString::from_vec(out))
}

/// The v2 path of the process from a `/proc/<pid>/cgroup` file: the `0::/path` line.
/// The path is relative to the cgroup namespace root of the reader.
pub(crate) fn own_v2_path(content: &[u8]) -> Option<PathBuf> {
    content.split(|&b| b == b'\n').find_map(|line| {
        let path = line.strip_prefix(b"0::")?;
        path.starts_with(b"/")
            .then(|| PathBuf::from(OsString::from_vec(path.to_vec())))
    })
}

/// The v1 path of the process in the hierarchy that carries `controller`, from a
/// `/proc/<pid>/cgroup` file: the `N:ctrl,ctrl:/path` line that names it.
pub(crate) fn own_v1_path(content: &[u8], controller: &str) -> Option<PathBuf> {
    let text = std::str::from_utf8(content).ok()?;
    text.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        (controllers.split(',').any(|c| c == controller) && path.starts_with('/'))
            .then(|| PathBuf::from(path))
    })
}

/// Where the cgroup `own` (a path from `/proc/self/cgroup`) appears under `mount`, if the
/// mount exposes it at all.
pub(crate) fn dir_in_mount(mount: &MountEntry, own: &Path) -> Option<PathBuf> {
    let relative = own.strip_prefix(&mount.root).ok()?;
    if relative.as_os_str().is_empty() {
        Some(mount.mount_point.clone())
    } else {
        Some(mount.mount_point.join(relative))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Verbatim from the development machine: a hybrid host (v1 controllers, plus a
    /// cgroup2 mount at /sys/fs/cgroup/unified that only carries hugetlb).
    pub(crate) const HYBRID: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
23 27 0:22 / /sys rw,relatime - sysfs sysfs rw
24 27 0:6 / /dev rw,relatime - devtmpfs devtmpfs rw,size=12334524k,nr_inodes=3083631,mode=755
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard,resv_strict,resuid=65534,resgid=65534
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    /// A systemd host on pure cgroup v2 (Debian 12 / Fedora style).
    pub(crate) const PURE_V2: &str = "\
21 26 0:20 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
22 26 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:2 - sysfs sysfs rw
26 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro
27 22 0:25 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

    /// An older host co-mounting cpu and cpuacct (RHEL 7 / Ubuntu 18.04 style), with
    /// net_cls,net_prio and a systemd named hierarchy.
    pub(crate) const COMOUNTED_V1: &str = "\
25 18 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
27 25 0:24 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
30 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,cpu,cpuacct
31 25 0:28 / /sys/fs/cgroup/net_cls,net_prio rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,net_cls,net_prio
32 25 0:29 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,memory
33 25 0:30 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,pids
34 25 0:31 / /sys/fs/cgroup/freezer rw,nosuid,nodev,noexec,relatime shared:17 - cgroup cgroup rw,freezer
35 25 0:32 / /sys/fs/cgroup/cpuset rw,nosuid,nodev,noexec,relatime shared:18 - cgroup cgroup rw,cpuset
";

    #[test]
    fn parses_hybrid_host() {
        let mounts = parse_mountinfo(HYBRID.as_bytes()).expect("valid");
        assert_eq!(mounts.len(), 15);
        let memory = mounts
            .iter()
            .find(|m| m.mount_point == Path::new("/sys/fs/cgroup/memory"))
            .expect("memory mount");
        assert_eq!(memory.fstype, "cgroup");
        assert_eq!(memory.v1_controllers(), vec!["memory"]);
        assert_eq!(memory.root, Path::new("/"));
        assert!(!memory.read_only());
        let systemd = mounts
            .iter()
            .find(|m| m.mount_point == Path::new("/sys/fs/cgroup/systemd"))
            .expect("systemd mount");
        assert!(
            systemd.v1_controllers().is_empty(),
            "name=systemd is no controller"
        );
        let unified: Vec<_> = mounts.iter().filter(|m| m.fstype == "cgroup2").collect();
        assert_eq!(unified.len(), 1);
        assert_eq!(unified[0].mount_point, Path::new("/sys/fs/cgroup/unified"));
    }

    #[test]
    fn parses_pure_v2_host_with_optional_fields() {
        let mounts = parse_mountinfo(PURE_V2.as_bytes()).expect("valid");
        assert_eq!(mounts.len(), 4);
        let cg = &mounts[3];
        assert_eq!(cg.fstype, "cgroup2");
        assert_eq!(cg.mount_point, Path::new("/sys/fs/cgroup"));
        assert_eq!(cg.super_options, "rw,nsdelegate,memory_recursiveprot");
        assert_eq!(cg.mount_options, "rw,nosuid,nodev,noexec,relatime");
    }

    #[test]
    fn parses_comounted_cpu_cpuacct() {
        let mounts = parse_mountinfo(COMOUNTED_V1.as_bytes()).expect("valid");
        let cpu = mounts
            .iter()
            .find(|m| m.mount_point == Path::new("/sys/fs/cgroup/cpu,cpuacct"))
            .expect("cpu mount");
        assert_eq!(cpu.v1_controllers(), vec!["cpu", "cpuacct"]);
        let net = mounts
            .iter()
            .find(|m| m.super_options.contains("net_cls"))
            .expect("net mount");
        assert_eq!(net.v1_controllers(), vec!["net_cls", "net_prio"]);
        assert!(mounts[0].read_only(), "the tmpfs is mounted ro");
    }

    #[test]
    fn parses_multiple_optional_fields_and_escapes() {
        let line = b"40 31 0:37 /a\\040b /mnt/with\\040space\\011tab\\134slash rw,relatime shared:5 master:3 propagate_from:2 - cgroup2 none rw\n";
        let mounts = parse_mountinfo(line).expect("valid");
        assert_eq!(mounts.len(), 1);
        assert_eq!(
            mounts[0].mount_point,
            Path::new("/mnt/with space\ttab\\slash")
        );
        assert_eq!(mounts[0].root, Path::new("/a b"));
        assert_eq!(mounts[0].fstype, "cgroup2");
        assert_eq!(mounts[0].super_options, "rw");
    }

    #[test]
    fn unescape_leaves_non_escapes_alone() {
        assert_eq!(unescape_path(b"/a\\b"), Path::new("/a\\b"));
        assert_eq!(unescape_path(b"/a\\09"), Path::new("/a\\09"));
        assert_eq!(unescape_path(b"/end\\"), Path::new("/end\\"));
        assert_eq!(unescape_path(b"/x\\040"), Path::new("/x "));
        // \777 does not fit a byte: kept literally.
        assert_eq!(unescape_path(b"/x\\777"), Path::new("/x\\777"));
    }

    #[test]
    fn rejects_malformed_lines_with_line_number() {
        let text =
            b"22 27 0:21 / /proc rw,relatime - proc proc rw\n23 27 0:22 / /sys rw,relatime\n";
        assert_eq!(parse_mountinfo(text), Err(2));
        let no_super = b"22 27 0:21 / /proc rw,relatime - proc proc\n";
        assert_eq!(parse_mountinfo(no_super), Err(1));
    }

    #[test]
    fn read_only_detection() {
        let ro = b"26 25 0:23 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw\n";
        assert!(parse_mountinfo(ro).expect("valid")[0].read_only());
        let rw = b"26 25 0:23 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        assert!(!parse_mountinfo(rw).expect("valid")[0].read_only());
    }

    #[test]
    fn own_v1_path_from_proc_cgroup() {
        let content = b"9:name=systemd:/\n4:memory:/process_api/95\n2:cpu,cpuacct:/a\n0::/\n";
        assert_eq!(
            own_v1_path(content, "memory"),
            Some(PathBuf::from("/process_api/95"))
        );
        assert_eq!(own_v1_path(content, "cpuacct"), Some(PathBuf::from("/a")));
        assert_eq!(own_v1_path(content, "pids"), None);
        assert_eq!(own_v1_path(b"0::/x\n", "memory"), None);
    }

    #[test]
    fn own_v2_path_from_proc_cgroup() {
        let hybrid = b"9:name=systemd:/\n8:pids:/\n4:memory:/process_api/1201a\n0::/\n";
        assert_eq!(own_v2_path(hybrid), Some(PathBuf::from("/")));
        let pure = b"0::/user.slice/user-1000.slice/user@1000.service/app.slice/x.scope\n";
        assert_eq!(
            own_v2_path(pure),
            Some(PathBuf::from(
                "/user.slice/user-1000.slice/user@1000.service/app.slice/x.scope"
            ))
        );
        assert_eq!(own_v2_path(b"4:memory:/a\n"), None);
    }

    #[test]
    fn dir_in_mount_respects_mount_root() {
        let mut mount = parse_mountinfo(PURE_V2.as_bytes()).expect("valid")[3].clone();
        assert_eq!(
            dir_in_mount(&mount, Path::new("/user.slice/a.scope")),
            Some(PathBuf::from("/sys/fs/cgroup/user.slice/a.scope"))
        );
        assert_eq!(
            dir_in_mount(&mount, Path::new("/")),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        mount.root = PathBuf::from("/docker/abc");
        assert_eq!(
            dir_in_mount(&mount, Path::new("/docker/abc/inner")),
            Some(PathBuf::from("/sys/fs/cgroup/inner"))
        );
        assert_eq!(dir_in_mount(&mount, Path::new("/elsewhere")), None);
    }
}
