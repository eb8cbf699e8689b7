//! How much memory runcell may use: the machine's (`MemTotal`), or less when the cgroup it
//! runs in, or one of its ancestors, is limited (a container, a pod, a systemd unit with
//! `MemoryMax=`). Inside a 1 GiB container `/proc/meminfo` still shows the node's memory;
//! sizing from it let one request fill its tmpfs and the container's OOM killer take the
//! server. The cgroup's limit is what the kernel enforces, so it is what runcell sizes from.
//!
//! * **v1**: the memory hierarchy's `memory.limit_in_bytes` of the own group, and
//!   `hierarchical_memory_limit` of its `memory.stat`, which is the smallest limit on the
//!   path to the root, including ancestors a container's bind mount does not show.
//! * **v2**: `memory.max` and `memory.high` (above `high` the kernel throttles and reclaims
//!   hard, so sizing beyond it is sizing for a stall) of the own group and of every ancestor
//!   visible in the mount. In a cgroup namespace the mount's root is the container's group,
//!   whose limit is what matters.
//!
//! All kernel paths are parameters, so both versions are tested on fake trees.

use std::fmt;
use std::path::{Path, PathBuf};

use super::mountinfo::{self, MountEntry};
use crate::meminfo::MemInfo;

/// The memory runcell may use, and where that figure came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryCeiling {
    pub bytes: u64,
    pub source: MemorySource,
}

/// Where a [`MemoryCeiling`] came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemorySource {
    /// The machine's memory, `MemTotal` of the meminfo file: no lower cgroup limit.
    Host,
    /// A cgroup's limit: `group` is its path as `/proc/self/cgroup` names groups (relative to
    /// the reader's cgroup namespace), `file` the interface file that holds it.
    Cgroup { group: PathBuf, file: &'static str },
}

impl MemorySource {
    /// Whether the figure is a cgroup's limit (runcell is confined: a container, a unit).
    pub fn is_cgroup(&self) -> bool {
        matches!(self, MemorySource::Cgroup { .. })
    }
}

impl fmt::Display for MemorySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemorySource::Host => f.write_str("the machine's memory, MemTotal"),
            MemorySource::Cgroup { group, file } => {
                write!(f, "cgroup limit of {} ({file})", group.display())
            }
        }
    }
}

/// The memory runcell may use: min(`MemTotal` of `meminfo`, the memory limit of the cgroup
/// this process runs in and of its ancestors), found through `mountinfo` and `proc_self_cgroup`
/// (normally `/proc/meminfo`, `/proc/self/mountinfo`, `/proc/self/cgroup`). `None` when neither
/// is known.
pub fn memory_ceiling(
    meminfo: &Path,
    mountinfo: &Path,
    proc_self_cgroup: &Path,
) -> Option<MemoryCeiling> {
    let total = MemInfo::read(meminfo).ok().and_then(|m| m.total_bytes);
    let limit = std::fs::read(mountinfo)
        .ok()
        .and_then(|raw| mountinfo::parse_mountinfo(&raw).ok())
        .zip(std::fs::read(proc_self_cgroup).ok())
        .and_then(|(mounts, own)| cgroup_memory_limit(&mounts, &own));
    match (total, limit) {
        (Some(total), Some(limit)) if limit.bytes < total => Some(limit),
        (Some(total), _) => Some(MemoryCeiling {
            bytes: total,
            source: MemorySource::Host,
        }),
        (None, limit) => limit,
    }
}

/// The lowest memory limit on the path from the own group (`own`: the content of
/// `/proc/self/cgroup`) to the root of the hierarchy that carries the memory controller.
pub(crate) fn cgroup_memory_limit(mounts: &[MountEntry], own: &[u8]) -> Option<MemoryCeiling> {
    let v1 = mounts
        .iter()
        .filter(|m| m.fstype == "cgroup" && m.v1_controllers().iter().any(|c| c == "memory"))
        .find_map(|m| Some((m, mountinfo::own_v1_path(own, "memory")?)))
        .and_then(|(m, path)| v1_limit(m, &path));
    if v1.is_some() {
        return v1;
    }
    let own_v2 = mountinfo::own_v2_path(own)?;
    mounts
        .iter()
        .filter(|m| m.fstype == "cgroup2")
        .find_map(|m| v2_limit(m, &own_v2))
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn keyed(path: &Path, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The group path (as `/proc/self/cgroup` names it) of `dir`, a directory under `mount`.
fn group_of(mount: &MountEntry, dir: &Path) -> PathBuf {
    let rel = dir
        .strip_prefix(&mount.mount_point)
        .unwrap_or(Path::new(""));
    mount.root.join(rel)
}

/// The visible directories from `dir` up to the mount point, innermost first.
fn up_to_mount<'a>(mount: &'a MountEntry, dir: &'a Path) -> impl Iterator<Item = &'a Path> {
    dir.ancestors()
        .take_while(move |d| d.starts_with(&mount.mount_point))
}

fn lower(best: &mut Option<MemoryCeiling>, bytes: u64, group: PathBuf, file: &'static str) {
    if best.as_ref().is_none_or(|b| bytes < b.bytes) {
        *best = Some(MemoryCeiling {
            bytes,
            source: MemorySource::Cgroup { group, file },
        });
    }
}

fn v1_limit(mount: &MountEntry, own: &Path) -> Option<MemoryCeiling> {
    let dir = mountinfo::dir_in_mount(mount, own)?;
    let mut best = None;
    // The visible groups first, so that the figure names the group that sets it.
    for d in up_to_mount(mount, &dir) {
        if let Some(bytes) = read_u64(&d.join("memory.limit_in_bytes")) {
            lower(
                &mut best,
                bytes,
                group_of(mount, d),
                "memory.limit_in_bytes",
            );
        }
    }
    // Then ancestors the mount hides (a container's bind mount of its own group).
    if let Some(bytes) = keyed(&dir.join("memory.stat"), "hierarchical_memory_limit") {
        lower(
            &mut best,
            bytes,
            own.to_path_buf(),
            "memory.stat hierarchical_memory_limit",
        );
    }
    best
}

fn v2_limit(mount: &MountEntry, own: &Path) -> Option<MemoryCeiling> {
    let dir = mountinfo::dir_in_mount(mount, own)?;
    if !dir.join("cgroup.controllers").exists() {
        return None;
    }
    let mut best = None;
    for d in up_to_mount(mount, &dir) {
        for file in ["memory.max", "memory.high"] {
            // "max": no limit at this level.
            if let Some(bytes) = read_u64(&d.join(file)) {
                lower(&mut best, bytes, group_of(mount, d), file);
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    struct Tree {
        _dir: tempfile::TempDir,
        root: PathBuf,
        meminfo: PathBuf,
        mountinfo: PathBuf,
        cgroup: PathBuf,
    }

    /// A fake /proc and cgroup mount: `mounts` is mountinfo text with `@` for the tree root.
    fn tree(mounts: &str, own: &str) -> Tree {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let meminfo = root.join("proc/meminfo");
        let mountinfo = root.join("proc/mountinfo");
        let cgroup = root.join("proc/cgroup");
        write(&meminfo, "MemTotal:       25165824 kB\n");
        write(&mountinfo, &mounts.replace('@', root.to_str().unwrap()));
        write(&cgroup, own);
        Tree {
            _dir: dir,
            root,
            meminfo,
            mountinfo,
            cgroup,
        }
    }

    impl Tree {
        fn ceiling(&self) -> Option<MemoryCeiling> {
            memory_ceiling(&self.meminfo, &self.mountinfo, &self.cgroup)
        }
    }

    const V1_MOUNTS: &str = "35 31 0:32 / @/memory rw,relatime - cgroup cgroup rw,memory\n\
                             39 31 0:36 / @/pids rw,relatime - cgroup cgroup rw,pids\n";
    const V1_UNLIMITED: &str = "9223372036854771712";

    #[test]
    fn v1_a_limited_group_lowers_the_figure_and_names_the_group() {
        let t = tree(V1_MOUNTS, "4:memory:/ct/inner\n8:pids:/\n0::/\n");
        let mem = t.root.join("memory");
        write(&mem.join("memory.limit_in_bytes"), V1_UNLIMITED);
        write(&mem.join("ct/memory.limit_in_bytes"), &GIB.to_string());
        write(&mem.join("ct/inner/memory.limit_in_bytes"), V1_UNLIMITED);
        write(
            &mem.join("ct/inner/memory.stat"),
            &format!("cache 0\nhierarchical_memory_limit {GIB}\nhierarchical_memsw_limit 1\n"),
        );
        let c = t.ceiling().unwrap();
        assert_eq!(c.bytes, GIB);
        assert_eq!(
            c.source,
            MemorySource::Cgroup {
                group: "/ct".into(),
                file: "memory.limit_in_bytes"
            }
        );
        assert_eq!(
            c.source.to_string(),
            "cgroup limit of /ct (memory.limit_in_bytes)"
        );
    }

    #[test]
    fn v1_a_hidden_ancestor_is_seen_through_the_hierarchical_limit() {
        // A container's bind mount shows its own group as the mount's root.
        let t = tree(
            "35 31 0:32 /docker/abc @/memory rw - cgroup cgroup rw,memory\n",
            "4:memory:/docker/abc\n",
        );
        let mem = t.root.join("memory");
        write(&mem.join("memory.limit_in_bytes"), V1_UNLIMITED);
        write(
            &mem.join("memory.stat"),
            &format!("hierarchical_memory_limit {}\n", 512 << 20),
        );
        let c = t.ceiling().unwrap();
        assert_eq!(c.bytes, 512 << 20);
        assert!(c.source.to_string().contains("/docker/abc"), "{}", c.source);
        assert!(c.source.is_cgroup());
    }

    #[test]
    fn v1_without_a_limit_is_the_host() {
        let t = tree(V1_MOUNTS, "4:memory:/process_api/x\n");
        let mem = t.root.join("memory");
        write(&mem.join("memory.limit_in_bytes"), V1_UNLIMITED);
        write(
            &mem.join("process_api/x/memory.limit_in_bytes"),
            V1_UNLIMITED,
        );
        let c = t.ceiling().unwrap();
        assert_eq!(c.bytes, 24 * GIB);
        assert_eq!(c.source, MemorySource::Host);
        assert_eq!(c.source.to_string(), "the machine's memory, MemTotal");
    }

    const V2_MOUNT: &str = "27 22 0:25 / @/cg rw - cgroup2 cgroup2 rw,nsdelegate\n";

    #[test]
    fn v2_walks_up_to_the_mount_root_and_takes_high_if_lower() {
        let t = tree(V2_MOUNT, "0::/kubepods/pod1/ctr\n");
        let cg = t.root.join("cg");
        write(&cg.join("cgroup.controllers"), "memory pids");
        for d in ["kubepods", "kubepods/pod1", "kubepods/pod1/ctr"] {
            write(&cg.join(d).join("cgroup.controllers"), "memory pids");
            write(&cg.join(d).join("memory.max"), "max\n");
            write(&cg.join(d).join("memory.high"), "max\n");
        }
        write(&cg.join("kubepods/memory.max"), &(20 * GIB).to_string());
        write(&cg.join("kubepods/pod1/memory.max"), &(2 * GIB).to_string());
        let c = t.ceiling().unwrap();
        assert_eq!(c.bytes, 2 * GIB);
        assert_eq!(
            c.source.to_string(),
            "cgroup limit of /kubepods/pod1 (memory.max)"
        );
        // memory.high below: it is the figure.
        write(
            &cg.join("kubepods/pod1/ctr/memory.high"),
            &(GIB + 7).to_string(),
        );
        let c = t.ceiling().unwrap();
        assert_eq!(c.bytes, GIB + 7);
        assert_eq!(
            c.source,
            MemorySource::Cgroup {
                group: "/kubepods/pod1/ctr".into(),
                file: "memory.high"
            }
        );
    }

    #[test]
    fn v2_in_a_cgroup_namespace_reads_the_namespace_root() {
        let t = tree(V2_MOUNT, "0::/\n");
        let cg = t.root.join("cg");
        write(&cg.join("cgroup.controllers"), "memory");
        write(&cg.join("memory.max"), &GIB.to_string());
        let c = t.ceiling().unwrap();
        assert_eq!(c.bytes, GIB);
        assert_eq!(c.source.to_string(), "cgroup limit of / (memory.max)");
    }

    #[test]
    fn a_limit_above_the_memory_or_nothing_readable_is_the_host() {
        let t = tree(V2_MOUNT, "0::/big\n");
        let cg = t.root.join("cg");
        write(&cg.join("big/cgroup.controllers"), "memory");
        write(&cg.join("big/memory.max"), &(64 * GIB).to_string());
        assert_eq!(t.ceiling().unwrap().source, MemorySource::Host);
        // Own group outside the mount: nothing to read.
        let t = tree(
            "27 22 0:25 /other @/cg rw - cgroup2 cgroup2 rw\n",
            "0::/mine\n",
        );
        assert_eq!(t.ceiling().unwrap().bytes, 24 * GIB);
        // No meminfo: the cgroup's limit alone; neither: None.
        let t = tree(V2_MOUNT, "0::/\n");
        write(&t.root.join("cg/cgroup.controllers"), "memory");
        write(&t.root.join("cg/memory.max"), "1000\n");
        std::fs::remove_file(&t.meminfo).unwrap();
        assert_eq!(t.ceiling().unwrap().bytes, 1000);
        std::fs::remove_file(t.root.join("cg/memory.max")).unwrap();
        assert_eq!(t.ceiling(), None);
    }
}
