//! A small hand-written cgroupfs manager for cgroup v1 and v2.
//!
//! # Kernel concepts, briefly
//!
//! A *cgroup* is a directory in a cgroup filesystem; processes are placed in it by
//! writing their pid to its `cgroup.procs` file, and *controllers* (memory, pids, cpu, ...)
//! enforce limits written to the group's interface files. Removing a group is `rmdir`,
//! which the kernel refuses while live processes or child groups remain. Children are
//! born into their parent's group, so once a sandbox's first process is inside, every
//! descendant it forks stays inside and is counted and limited.
//!
//! * **cgroup v1** has one *hierarchy* (one mounted tree) per controller or per group of
//!   co-mounted controllers (`/sys/fs/cgroup/memory`, `/sys/fs/cgroup/cpu,cpuacct`, ...).
//!   A sandbox therefore is one directory *per hierarchy*, and a process must be written
//!   into each of them. Controllers are chosen by mounting; there is no per-group switch.
//! * **cgroup v2** has a single *unified* tree. A controller is usable in a group only if
//!   the parent lists it in `cgroup.subtree_control`, which in turn needs it in the
//!   parent's `cgroup.controllers`, so controllers are enabled top-down along the path.
//!   The *no internal processes* rule forbids a non-root group from both holding
//!   processes and distributing controllers to children: processes live in leaves.
//! * **Delegation** (v2): a privileged manager (systemd with `Delegate=yes`) can chown a
//!   subtree to a user, who may then create groups and move processes inside it without
//!   privilege. That is the only way an unprivileged runcell gets cgroups, and because of
//!   the no-internal-processes rule it must first move itself, and whatever else is in its
//!   group (the shell that started it), into a leaf (`<own group>/supervisor`) before it
//!   can enable controllers for its sandboxes. The same holds for root at the root of a
//!   container's cgroup namespace.
//! * **Hybrid hosts** mount v1 controllers *and* a cgroup2 tree (often
//!   `/sys/fs/cgroup/unified`). A controller can be bound to only one version at a time,
//!   so such a v2 tree usually carries no useful controller and is ignored here.
//!
//! # Limits applied
//!
//! * memory, swap *included*: v1 `memory.limit_in_bytes`, then
//!   `memory.memsw.limit_in_bytes` (memory+swap; exists only with swap accounting, and
//!   must never be below the memory limit, hence the order). v2 `memory.max` plus
//!   `memory.swap.max = 0`. `memory.oom.group` stays 0 so both versions behave alike: the OOM
//!   killer takes the largest process, as on any Linux machine.
//! * pids: `pids.max` (both versions) bounds fork bombs.
//! * cpu: bandwidth quota per period (v1 `cpu.cfs_period_us`/`cpu.cfs_quota_us`, v2
//!   `cpu.max`). cpuset is never used: a new v1 cpuset group starts with no CPUs and would
//!   have to be configured before any process can join it.
//!
//! A write that fails for a controller that is present is an error: limits are never
//! silently weakened. A controller that is simply not available is reported through
//! [`Enforced`].
//!
//! # Killing
//!
//! v2 kernels ≥ 5.14 have `cgroup.kill`, which kills a whole group atomically (no fork
//! can escape it). Elsewhere the group is frozen first, if a freezer is available, so that
//! nothing can fork while the pids from `cgroup.procs` are being signalled; then it is
//! thawed so the pending SIGKILLs take effect, and the sweep repeats until it is empty.
//!
//! # Testing seam
//!
//! All kernel paths are parameters and every effect goes through the small
//! [`fs::CgroupFs`] trait, whose default methods are the real syscalls. Unit tests run the
//! same code against fake trees in temp dirs; `real_v1_tests` and `real_v2_tests` exercise a
//! real host (`scripts/cgroup-v2-guest.sh` runs the v2 ones in a VM when the host is v1).
//!
//! Error messages do not repeat their `source`; print the chain (e.g. `{:#}` with anyhow)
//! to see the underlying OS error.

mod fs;
mod memory;
pub(crate) mod mountinfo;
mod v1;
mod v2;
mod warm;

pub use memory::{memory_ceiling, MemoryCeiling, MemorySource};
pub use warm::warm_migrations;

#[cfg(test)]
mod fake;
#[cfg(test)]
mod real_support;
#[cfg(test)]
mod real_v1_tests;
#[cfg(test)]
mod real_v2_tests;

use std::collections::BTreeSet;
use std::fmt;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use self::fs::{CgroupFs, RealFs};
use self::mountinfo::MountEntry;

/// Which cgroup implementation a manager (and its groups) use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

impl fmt::Display for CgroupVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CgroupVersion::V1 => "v1",
            CgroupVersion::V2 => "v2",
        })
    }
}

/// Limits for one sandbox group: what a sandbox asks for and what the cgroup layer writes, in
/// both versions. `None` leaves the kernel default (unlimited).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupLimits {
    /// Hard limit on memory *including swap*.
    pub memory_bytes: Option<u64>,
    /// Maximum number of tasks (processes and threads) in the group: `pids.max`.
    pub pids_max: Option<u64>,
    /// CPU bandwidth in thousandths of a core (1000 = one full core).
    pub cpu_millis: Option<u64>,
    /// Reads and writes per second on the host's disk.
    pub io: Option<IoLimits>,
}

/// Throughput and operations per second on one block device (the disk the host's files the
/// sandbox sees are on): v1 `blkio.throttle.*`, v2 `io.max`. Without them a run that evicts
/// host files from the page cache and rereads them in a loop takes the disk from everyone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoLimits {
    /// The whole disk's `major:minor` (throttling applies to disks, not partitions).
    pub device: (u32, u32),
    pub read_bps: u64,
    pub write_bps: u64,
    pub read_iops: u64,
    pub write_iops: u64,
}

/// The CFS bandwidth period every group uses, in microseconds: the kernel's default (100 ms),
/// short enough that a throttled program does not stall visibly, long enough that the
/// accounting overhead stays negligible.
const CPU_PERIOD_US: u64 = 100_000;

impl CgroupLimits {
    /// The CPU limit as a bandwidth quota per period.
    fn cpu_quota(&self) -> Option<CpuQuota> {
        self.cpu_millis.map(|millis| CpuQuota {
            // millis / 1000 cores x the period.
            quota_us: millis.saturating_mul(CPU_PERIOD_US / 1000),
            period_us: CPU_PERIOD_US,
        })
    }
}

/// I/O limits for the fake-tree tests of both versions.
#[cfg(test)]
pub(crate) const TEST_IO: IoLimits = IoLimits {
    device: (254, 0),
    read_bps: 64 << 20,
    write_bps: 32 << 20,
    read_iops: 16384,
    write_iops: 8192,
};

/// The group may run `quota_us` of CPU time every `period_us` (so 2 CPUs' worth is
/// `quota_us = 2 * period_us`).
#[derive(Debug, Clone, Copy)]
struct CpuQuota {
    quota_us: u64,
    period_us: u64,
}

/// Which limits were really applied (for honest reporting).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Enforced {
    /// A memory limit was requested and written.
    pub memory: bool,
    /// The memory limit also covers swap (v1 memsw / v2 `memory.swap.max = 0`).
    pub memory_swap: bool,
    /// TCP socket buffers count against the memory limit (always on v2; on v1 only with
    /// `memory.kmem.tcp.limit_in_bytes`).
    pub socket_memory: bool,
    /// A pids limit was requested and written.
    pub pids: bool,
    /// A CPU quota was requested and written.
    pub cpu: bool,
    /// CPU usage can be read back ([`CgroupStats::cpu_usage_ns`]).
    pub cpu_accounting: bool,
    /// I/O limits were requested and written.
    pub io: bool,
}

/// Counters read back from a group. Missing files read as `None` / 0.
#[derive(Debug, Clone, Copy, Default)]
pub struct CgroupStats {
    /// Highest memory use since creation or the last [`Cgroup::reset_peak`]
    /// (v1: the larger of the memory and memory+swap watermarks).
    pub memory_peak_bytes: Option<u64>,
    /// Processes killed by the OOM killer because of this group's limit.
    pub oom_kills: u64,
    /// Forks refused because `pids.max` was reached.
    pub pids_limit_hits: u64,
    /// Total CPU time consumed by the group.
    pub cpu_usage_ns: Option<u64>,
}

/// Errors name the step that failed and carry the path involved.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("reading the mount table {}", .path.display())]
    ReadMountinfo {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("malformed line {line} in the mount table {}", .path.display())]
    MalformedMountinfo { path: PathBuf, line: usize },
    #[error("reading the process cgroup file {}", .path.display())]
    ReadProcCgroup {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("invalid cgroup name {name:?}: {reason}")]
    InvalidName { name: String, reason: &'static str },
    #[error("no cgroup hierarchy was configured")]
    NoHierarchy,
    #[error("creating cgroup directory {}", .path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("reading the available controllers from {}", .path.display())]
    ReadControllers {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("enabling controllers `{controllers}` in {}", .path.display())]
    EnableControllers {
        path: PathBuf,
        controllers: String,
        #[source]
        source: io::Error,
    },
    #[error("copying the parent's cpuset configuration into {}", .path.display())]
    CopyCpuset {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("setting {} to {value:?}", .path.display())]
    SetLimit {
        path: PathBuf,
        value: String,
        #[source]
        source: io::Error,
    },
    #[error("moving runcell (pid {pid}) into its delegated leaf group via {}", .path.display())]
    MoveSelf {
        path: PathBuf,
        pid: u32,
        #[source]
        source: io::Error,
    },
    #[error("reading the processes of {}", .path.display())]
    ReadProcs {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "moving pid {pid} out of {} (which must hold no processes to distribute controllers) via {}",
        .from.display(),
        .path.display()
    )]
    MoveProcess {
        from: PathBuf,
        path: PathBuf,
        pid: u32,
        #[source]
        source: io::Error,
    },
    #[error("adding pid {pid} to {}", .path.display())]
    AddProcess {
        path: PathBuf,
        pid: u32,
        #[source]
        source: io::Error,
    },
    #[error("killing the group through {}", .path.display())]
    WriteKill {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("sending SIGKILL to pid {pid} of the group {}", .path.display())]
    SignalProcess {
        path: PathBuf,
        pid: u32,
        #[source]
        source: io::Error,
    },
    #[error("removing cgroup directory {}", .path.display())]
    RemoveDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// One v1 hierarchy runcell uses: the controllers mounted together, and the directory
/// under which groups are created (`<mount point>/<base>`).
#[derive(Debug, Clone)]
struct V1Hierarchy {
    controllers: Vec<String>,
    base: PathBuf,
}

impl V1Hierarchy {
    fn has(&self, controller: &str) -> bool {
        self.controllers.iter().any(|c| c == controller)
    }
}

#[derive(Debug, Clone)]
enum Layout {
    /// `top` is the highest group whose `cgroup.subtree_control` runcell manages (the
    /// mount root, or its own delegated group); groups are made in `base`, which is `top`
    /// or below it.
    V2 {
        top: PathBuf,
        base: PathBuf,
    },
    V1 {
        hierarchies: Vec<V1Hierarchy>,
    },
}

/// Facts about the calling process that steer discovery.
#[derive(Debug, Clone, Copy)]
struct Host {
    is_root: bool,
    pid: u32,
}

/// Name of the leaf a supervisor moves itself (and the other processes of its group) into
/// when it must vacate its own group.
const SUPERVISOR_LEAF: &str = "supervisor";

/// A discovered hierarchy plus the base directory under which runcell makes its groups.
#[derive(Debug)]
pub struct CgroupManager {
    fs: Arc<dyn CgroupFs>,
    layout: Layout,
}

impl CgroupManager {
    /// Discover cgroups from a mountinfo file (normally `/proc/self/mountinfo`) and the
    /// process's cgroup file (normally `/proc/self/cgroup`). `base` is the relative name
    /// of runcell's parent group (normally `runcell`).
    ///
    /// Returns `Ok(None)` when no usable hierarchy exists (e.g. not root and nothing
    /// delegated). When unprivileged with a delegated v2 group, this moves the calling
    /// process into `<own group>/supervisor` (see the module docs).
    pub fn discover(
        mountinfo: &Path,
        proc_self_cgroup: &Path,
        base: &str,
    ) -> Result<Option<CgroupManager>, CgroupError> {
        let raw = std::fs::read(mountinfo).map_err(|source| CgroupError::ReadMountinfo {
            path: mountinfo.to_path_buf(),
            source,
        })?;
        let mounts =
            mountinfo::parse_mountinfo(&raw).map_err(|line| CgroupError::MalformedMountinfo {
                path: mountinfo.to_path_buf(),
                line,
            })?;
        let own =
            std::fs::read(proc_self_cgroup).map_err(|source| CgroupError::ReadProcCgroup {
                path: proc_self_cgroup.to_path_buf(),
                source,
            })?;
        let host = Host {
            // Root in a user namespace (a pod with `hostUsers: false`) owns nothing of the
            // hierarchy but what the runtime delegated to it (crun chowns the container's
            // group to the namespace's root): it takes the delegated-subtree path, as an
            // unprivileged user does, and v1 (which cannot be delegated) not at all.
            is_root: crate::identity::Identity::current() == crate::identity::Identity::HostRoot,
            pid: std::process::id(),
        };
        Self::discover_in(Arc::new(RealFs), &mounts, &own, base, host)
    }

    /// `own` is the content of `/proc/self/cgroup`.
    fn discover_in(
        fs: Arc<dyn CgroupFs>,
        mounts: &[MountEntry],
        own: &[u8],
        base: &str,
        host: Host,
    ) -> Result<Option<CgroupManager>, CgroupError> {
        validate_base(base)?;
        let own_v2 = mountinfo::own_v2_path(own);
        // Confined (a container without a cgroup namespace, a pod whose cgroup2 mount shows the
        // node's root, a unit with a memory limit, a test's limited group): runs' groups go
        // under the own group, inside the limits the operator put on runcell.
        let confined = own_group_is_limited(fs.as_ref(), mounts, own);
        let v2_mounts: Vec<&MountEntry> = mounts
            .iter()
            .filter(|m| m.fstype == "cgroup2" && !m.read_only())
            .collect();
        for mount in &v2_mounts {
            let placement = v2::Placement {
                own: own_v2.as_deref(),
                confined,
            };
            if let Some(layout) = v2::discover_layout(fs.as_ref(), mount, placement, base, host)? {
                return Ok(Some(CgroupManager { fs, layout }));
            }
        }
        if !host.is_root {
            // v1 has no safe delegation model.
            return Ok(None);
        }
        if let Some(hierarchies) = v1::discover_hierarchies(mounts, base, confined.then_some(own)) {
            let layout = Layout::V1 { hierarchies };
            return Ok(Some(CgroupManager { fs, layout }));
        }
        // Last resort: a unified tree without memory but with pids or cpu still beats
        // having no limits at all; Enforced reports what is missing.
        for mount in v2_mounts {
            let available = v2::controllers(fs.as_ref(), &mount.mount_point).unwrap_or_default();
            if v2::WANTED.iter().any(|c| available.iter().any(|a| a == c)) {
                let layout = Layout::V2 {
                    top: mount.mount_point.clone(),
                    base: mount.mount_point.join(base),
                };
                return Ok(Some(CgroupManager { fs, layout }));
            }
        }
        Ok(None)
    }

    /// A manager for a v2 tree on `fs`: `root_dir` is the dir under which groups are created
    /// (e.g. `/sys/fs/cgroup/runcell`). Controllers are enabled from the highest cgroup
    /// ancestor of `root_dir` (the mount root) downwards.
    #[cfg(test)]
    fn v2_with(fs: Arc<dyn CgroupFs>, root_dir: PathBuf) -> CgroupManager {
        let top = v2::find_top(fs.as_ref(), &root_dir);
        CgroupManager {
            fs,
            layout: Layout::V2 {
                top,
                base: root_dir,
            },
        }
    }

    /// Build directly for v1: `(controller, base dir)` pairs such as
    /// `("memory", "/sys/fs/cgroup/memory/runcell")`. Controllers sharing a directory
    /// (co-mounted `cpu,cpuacct`) may be given as two pairs or as `"cpu,cpuacct"`.
    #[cfg(test)]
    pub fn v1_at(controllers: Vec<(String, PathBuf)>) -> CgroupManager {
        Self::v1_with(Arc::new(RealFs), controllers)
    }

    #[cfg(test)]
    fn v1_with(fs: Arc<dyn CgroupFs>, controllers: Vec<(String, PathBuf)>) -> CgroupManager {
        let mut hierarchies: Vec<V1Hierarchy> = Vec::new();
        for (names, base) in controllers {
            let names = names
                .split(',')
                .filter(|n| !n.is_empty())
                .map(str::to_owned);
            match hierarchies.iter_mut().find(|h| h.base == base) {
                Some(h) => {
                    for name in names {
                        if !h.has(&name) {
                            h.controllers.push(name);
                        }
                    }
                }
                None => hierarchies.push(V1Hierarchy {
                    controllers: names.collect(),
                    base,
                }),
            }
        }
        CgroupManager {
            fs,
            layout: Layout::V1 { hierarchies },
        }
    }

    pub fn version(&self) -> CgroupVersion {
        match self.layout {
            Layout::V1 { .. } => CgroupVersion::V1,
            Layout::V2 { .. } => CgroupVersion::V2,
        }
    }

    /// The directories groups are created in (one per v1 hierarchy).
    #[cfg(test)]
    pub fn base_dirs(&self) -> Vec<PathBuf> {
        match &self.layout {
            Layout::V2 { base, .. } => vec![base.clone()],
            Layout::V1 { hierarchies } => hierarchies.iter().map(|h| h.base.clone()).collect(),
        }
    }

    /// Create a new group `name` (a single path component) with these limits. Creates
    /// the base dir(s) if missing and, on v2, enables `memory`, `pids` and `cpu` (those
    /// available) along the path. Use [`Cgroup::enforced`] to learn what was applied.
    ///
    /// On error nothing is left behind (a half-configured group is removed again).
    pub fn create(&self, name: &str, limits: &CgroupLimits) -> Result<Cgroup, CgroupError> {
        validate_name(name)?;
        match &self.layout {
            Layout::V2 { top, base } => v2::create(&self.fs, top, base, name, limits),
            Layout::V1 { hierarchies } => v1::create(&self.fs, hierarchies, name, limits),
        }
    }

    /// Limit the memory of every group runcell makes, together: the limit of the base group
    /// they are made in (`runcell`). Without it the host has no reserve: a run's tmpfs pages,
    /// which outlive the processes that wrote them, or many runs at once could push the host
    /// itself into OOM. Call it after [`CgroupManager::create`] made the base (and, on v2,
    /// enabled the memory controller for it). Returns whether the limit is in force.
    pub fn limit_all_groups(&self, memory_bytes: u64) -> Result<bool, CgroupError> {
        let fs = self.fs.as_ref();
        let value = memory_bytes.to_string();
        match &self.layout {
            Layout::V2 { base, .. } => {
                let max = base.join("memory.max");
                if !fs.exists(&max) {
                    return Ok(false);
                }
                set_limit(fs, max, value)?;
                Ok(true)
            }
            Layout::V1 { hierarchies } => {
                let Some(h) = hierarchies.iter().find(|h| h.has("memory")) else {
                    return Ok(false);
                };
                let limit = h.base.join("memory.limit_in_bytes");
                let memsw = h.base.join("memory.memsw.limit_in_bytes");
                if !fs.exists(&memsw) {
                    set_limit(fs, limit, value)?;
                    return Ok(true);
                }
                // memsw is never below the memory limit: lowering goes limit first, raising
                // memsw first. The current values decide which this is.
                let raising = read_u64(fs, &limit).is_some_and(|now| memory_bytes > now);
                if raising {
                    set_limit(fs, memsw, value.clone())?;
                    set_limit(fs, limit, value)?;
                } else {
                    set_limit(fs, limit, value.clone())?;
                    set_limit(fs, memsw, value)?;
                }
                Ok(true)
            }
        }
    }

    /// Remove leftover groups under the base for which `is_stale(name)` says their supervisor
    /// is gone (the caller owns the naming scheme), killing anything left in them first. Best
    /// effort; returns how many were removed.
    pub fn sweep_stale(&self, is_stale: &dyn Fn(&str) -> bool) -> usize {
        let (version, bases): (CgroupVersion, Vec<(PathBuf, Vec<String>)>) = match &self.layout {
            Layout::V2 { base, .. } => (CgroupVersion::V2, vec![(base.clone(), Vec::new())]),
            Layout::V1 { hierarchies } => (
                CgroupVersion::V1,
                hierarchies
                    .iter()
                    .map(|h| (h.base.clone(), h.controllers.clone()))
                    .collect(),
            ),
        };
        let mut stale = BTreeSet::new();
        for (base, _) in &bases {
            let Ok(names) = self.fs.subdirs(base) else {
                continue;
            };
            for name in names {
                let Some(name) = name.to_str() else { continue };
                if is_stale(name) {
                    stale.insert(name.to_owned());
                }
            }
        }
        let mut removed = 0;
        for name in stale {
            let dirs = bases
                .iter()
                .map(|(base, controllers)| GroupDir {
                    path: base.join(&name),
                    controllers: controllers.clone(),
                })
                .filter(|d| self.fs.exists(&d.path))
                .collect();
            let mut group = Cgroup::new(Arc::clone(&self.fs), version, dirs);
            if group.destroy().is_ok() {
                removed += 1;
            }
            // Best effort: do not retry (and wait again) in Drop.
            group.destroyed = true;
        }
        removed
    }
}

/// A limit at or above this is no limit: v1 shows "unlimited" as `PAGE_COUNTER_MAX` pages
/// (9223372036854771712 with 4 KiB pages).
const UNLIMITED_FLOOR: u64 = 1 << 60;

/// Whether the memory limit of the own group or of an ancestor below the hierarchy's root is
/// set: runcell runs confined, and its runs must be charged inside that limit (see
/// [`CgroupManager::discover`]). Read through `fs`, with `own` the content of
/// `/proc/self/cgroup`.
fn own_group_is_limited(fs: &dyn CgroupFs, mounts: &[MountEntry], own: &[u8]) -> bool {
    let limited = |path: PathBuf, key: Option<&str>| {
        let Ok(text) = fs.read(&path) else {
            return false;
        };
        let value = match key {
            Some(key) => keyed_value(&text, key),
            None => text.trim().parse().ok(),
        };
        value.is_some_and(|v| v < UNLIMITED_FLOOR)
    };
    // v1: the memory hierarchy; hierarchical_memory_limit covers the ancestors.
    let v1 = mounts
        .iter()
        .filter(|m| m.fstype == "cgroup" && m.v1_controllers().iter().any(|c| c == "memory"))
        .find_map(|m| mountinfo::dir_in_mount(m, &mountinfo::own_v1_path(own, "memory")?));
    if let Some(dir) = v1 {
        return limited(dir.join("memory.limit_in_bytes"), None)
            || limited(dir.join("memory.stat"), Some("hierarchical_memory_limit"));
    }
    // v2: memory.max or memory.high of the own group and its visible ancestors.
    let Some(own_v2) = mountinfo::own_v2_path(own) else {
        return false;
    };
    mounts
        .iter()
        .filter(|m| m.fstype == "cgroup2")
        .filter_map(|m| Some((m, mountinfo::dir_in_mount(m, &own_v2)?)))
        .any(|(m, dir)| {
            dir.ancestors()
                .take_while(|d| d.starts_with(&m.mount_point))
                .any(|d| {
                    limited(d.join("memory.max"), None) || limited(d.join("memory.high"), None)
                })
        })
}

/// Group names become a single directory component.
fn validate_name(name: &str) -> Result<(), CgroupError> {
    let reason = if name.is_empty() {
        Some("empty")
    } else if name == "." || name == ".." {
        Some("`.` and `..` are not group names")
    } else if name.contains('/') {
        Some("contains `/`")
    } else if name.contains('\0') {
        Some("contains NUL")
    } else if name.len() > 255 {
        Some("longer than NAME_MAX (255 bytes)")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(CgroupError::InvalidName {
            name: name.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

/// The base may be nested (`a/b`) but must stay inside the hierarchy.
fn validate_base(base: &str) -> Result<(), CgroupError> {
    if base.starts_with('/') {
        return Err(CgroupError::InvalidName {
            name: base.to_owned(),
            reason: "the base must be relative",
        });
    }
    base.split('/')
        .try_for_each(validate_name)
        .map_err(|_| CgroupError::InvalidName {
            name: base.to_owned(),
            reason: "the base must be one or more valid group names joined by `/`",
        })
}

/// Creates `dir` and any missing ancestors (like `mkdir -p`), tolerating a concurrent
/// creator. Returns the directories this call created, top-down.
fn ensure_dirs(fs: &dyn CgroupFs, dir: &Path) -> Result<Vec<PathBuf>, CgroupError> {
    let missing: Vec<&Path> = dir
        .ancestors()
        .take_while(|a| !a.as_os_str().is_empty() && !fs.exists(a))
        .collect();
    let mut created = Vec::new();
    for d in missing.into_iter().rev() {
        match fs.mkdir(d) {
            Ok(()) => created.push(d.to_path_buf()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(source) => {
                return Err(CgroupError::CreateDir {
                    path: d.to_path_buf(),
                    source,
                })
            }
        }
    }
    Ok(created)
}

/// The value of `key` in a flat-keyed file (`key value` per line, like `memory.events`).
fn keyed_value(content: &str, key: &str) -> Option<u64> {
    content.lines().find_map(|line| {
        let mut parts = line.split_whitespace();
        if parts.next()? != key {
            return None;
        }
        parts.next()?.parse().ok()
    })
}

fn read_keyed(fs: &dyn CgroupFs, path: &Path, key: &str) -> Option<u64> {
    keyed_value(&fs.read(path).ok()?, key)
}

fn read_u64(fs: &dyn CgroupFs, path: &Path) -> Option<u64> {
    fs.read(path).ok()?.trim().parse().ok()
}

/// Polls `done` every few milliseconds until it holds or `timeout` passes.
fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

fn set_limit(fs: &dyn CgroupFs, path: PathBuf, value: String) -> Result<(), CgroupError> {
    fs.write(&path, &value)
        .map_err(|source| CgroupError::SetLimit {
            path,
            value,
            source,
        })
}

/// One directory of a group: the v2 dir, or its dir in one v1 hierarchy.
#[derive(Debug, Clone)]
struct GroupDir {
    path: PathBuf,
    /// v1: the controllers of this hierarchy. v2: the controllers enabled for it.
    controllers: Vec<String>,
}

/// How long `destroy` waits for killed processes to leave the group.
const DESTROY_WAIT: Duration = Duration::from_secs(2);
/// How long `kill_all` keeps re-signalling processes that are still listed.
const KILL_SWEEP: Duration = Duration::from_secs(1);
/// How long to wait for a freezer to report the group frozen.
const FREEZE_WAIT: Duration = Duration::from_millis(500);

/// One sandbox's group (on v1: one dir per controller hierarchy). Dropping it destroys
/// the group (best effort) unless [`Cgroup::destroy`] already succeeded.
#[derive(Debug)]
pub struct Cgroup {
    fs: Arc<dyn CgroupFs>,
    version: CgroupVersion,
    dirs: Vec<GroupDir>,
    enforced: Enforced,
    /// v2 `memory.peak` descriptor after a reset: the reset is per open file.
    peak_fd: Mutex<Option<File>>,
    destroyed: bool,
}

impl Cgroup {
    fn new(fs: Arc<dyn CgroupFs>, version: CgroupVersion, dirs: Vec<GroupDir>) -> Cgroup {
        Cgroup {
            fs,
            version,
            dirs,
            enforced: Enforced::default(),
            peak_fd: Mutex::new(None),
            destroyed: false,
        }
    }

    /// The dir of the hierarchy carrying `controller` (v1).
    fn dir_with(&self, controller: &str) -> Option<&Path> {
        self.dirs
            .iter()
            .find(|d| d.controllers.iter().any(|c| c == controller))
            .map(|d| d.path.as_path())
    }

    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    pub fn enforced(&self) -> Enforced {
        self.enforced
    }

    /// The files a process's pid must be written to: every hierarchy's `cgroup.procs`.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs
            .iter()
            .map(|d| d.path.join("cgroup.procs"))
            .collect()
    }

    /// cgroup v2: the group's directory, in which a process can be created directly
    /// (`clone3(CLONE_INTO_CGROUP)`), so that it never runs outside the group and no
    /// `cgroup.procs` write (with its wait for an RCU grace period) is needed. `None` on v1,
    /// whose hierarchies the flag cannot name.
    pub fn clone_into_dir(&self) -> Option<PathBuf> {
        match (self.version, self.dirs.as_slice()) {
            (CgroupVersion::V2, [only]) => Some(only.path.clone()),
            _ => None,
        }
    }

    /// Moves `pid` (the whole process, all threads) into the group. (The sandbox's helper
    /// writes pid 1 into [`Cgroup::procs_files`] itself, from outside the supervisor; the
    /// supervisor places templates and their forks with this.)
    pub fn add_process(&self, pid: u32) -> Result<(), CgroupError> {
        for path in self.procs_files() {
            self.fs
                .write(&path, &pid.to_string())
                .map_err(|source| CgroupError::AddProcess { path, pid, source })?;
        }
        Ok(())
    }

    /// Pids in the group, union over hierarchies, sorted. Exited processes are not
    /// listed even before they are reaped.
    pub fn pids(&self) -> Vec<u32> {
        let mut pids = BTreeSet::new();
        for path in self.procs_files() {
            if let Ok(content) = self.fs.read(&path) {
                pids.extend(content.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
            }
        }
        pids.into_iter().collect()
    }

    pub fn is_empty(&self) -> bool {
        self.pids().is_empty()
    }

    /// Reads the counters; never fails (a missing file reads as `None` / 0).
    pub fn stats(&self) -> CgroupStats {
        match self.version {
            CgroupVersion::V1 => v1::stats(self),
            CgroupVersion::V2 => v2::stats(self),
        }
    }

    /// Resets the peak-memory watermark so a later phase can be measured alone. Best
    /// effort: v2 only supports it on kernels ≥ 6.12.
    pub fn reset_peak(&self) {
        match self.version {
            CgroupVersion::V1 => v1::reset_peak(self),
            CgroupVersion::V2 => v2::reset_peak(self),
        }
    }

    /// SIGKILLs every process in the group; does not wait for them to exit.
    pub fn kill_all(&self) -> Result<(), CgroupError> {
        if self.version == CgroupVersion::V2 {
            if let Some(dir) = self.dirs.first() {
                let path = dir.path.join("cgroup.kill");
                if self.fs.exists(&path) {
                    return self
                        .fs
                        .write(&path, "1")
                        .map_err(|source| CgroupError::WriteKill { path, source });
                }
            }
        }
        self.kill_by_signal()
    }

    fn kill_by_signal(&self) -> Result<(), CgroupError> {
        let frozen = self.freeze();
        let mut first_error = None;
        let mut signalled = BTreeSet::new();
        // While frozen nothing can fork or exit, so once a pass finds no pid it has not
        // signalled yet, every process has been hit. Unfrozen, this is one pass.
        while self.signal_new(&mut signalled, &mut first_error) && frozen {}
        if frozen {
            // Frozen tasks only act on the pending SIGKILL once thawed.
            self.thaw();
        }
        // Without a freezer a process may have forked between reading cgroup.procs and
        // the kill: keep sweeping until the group is empty (bounded). Pids already hit
        // are not signalled again: they are dying, and a pid that has gone could by now
        // name an unrelated process.
        wait_until(KILL_SWEEP, || {
            self.signal_new(&mut signalled, &mut first_error);
            self.is_empty()
        });
        first_error.map_or(Ok(()), Err)
    }

    /// SIGKILLs the listed pids not in `signalled` yet; false if there were none.
    fn signal_new(
        &self,
        signalled: &mut BTreeSet<u32>,
        first_error: &mut Option<CgroupError>,
    ) -> bool {
        let mut found = false;
        for pid in self.pids() {
            if signalled.insert(pid) {
                found = true;
                self.signal(pid, first_error);
            }
        }
        found
    }

    fn signal(&self, pid: u32, first_error: &mut Option<CgroupError>) {
        match self.fs.kill(pid) {
            Ok(()) => {}
            // Exited between listing and signalling.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            Err(source) => {
                if first_error.is_none() {
                    *first_error = Some(CgroupError::SignalProcess {
                        path: self.path().to_path_buf(),
                        pid,
                        source,
                    });
                }
            }
        }
    }

    /// Freezes the whole group (a paused session): its tasks stay in memory and get no CPU
    /// until [`Cgroup::thaw_group`]. False when no freezer is available (v1 without the
    /// `freezer` controller, v2 before 5.2), or the write failed.
    pub fn freeze_group(&self) -> bool {
        self.freeze()
    }

    /// Thaws a group frozen by [`Cgroup::freeze_group`].
    pub fn thaw_group(&self) {
        self.thaw()
    }

    /// Freezes the group if a freezer is available; true when it must be thawed later.
    fn freeze(&self) -> bool {
        match self.version {
            CgroupVersion::V1 => v1::freeze(self),
            CgroupVersion::V2 => v2::freeze(self),
        }
    }

    fn thaw(&self) {
        match self.version {
            CgroupVersion::V1 => v1::thaw(self),
            CgroupVersion::V2 => v2::thaw(self),
        }
    }

    /// [`kill_all`](Self::kill_all), wait (up to ~2 s) until the group is empty, then
    /// remove every directory of the group. Idempotent; a group whose directories are
    /// already gone counts as destroyed.
    pub fn destroy(&mut self) -> Result<(), CgroupError> {
        if self.destroyed {
            return Ok(());
        }
        if self.dirs.iter().all(|d| !self.fs.exists(&d.path)) {
            self.destroyed = true;
            return Ok(());
        }
        // A group whose sandbox already exited (the common case: the supervisor reaped
        // everything) has nothing to kill: skip the freezer round trip and the kill
        // sweeps, which cost a few writes and polls on every teardown. A process cannot
        // join an empty group on its own (only a writer of cgroup.procs can move one in,
        // and runcell is that writer), so nothing is missed.
        let mut first_error = if self.is_empty() {
            None
        } else {
            let killed = self.kill_all();
            wait_until(DESTROY_WAIT, || self.is_empty());
            killed.err()
        };
        for dir in &self.dirs {
            match self.fs.rmdir(&dir.path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(source) => {
                    first_error.get_or_insert(CgroupError::RemoveDir {
                        path: dir.path.clone(),
                        source,
                    });
                }
            }
        }
        match first_error {
            // A kill error is moot if the group is gone anyway.
            Some(_) if self.dirs.iter().all(|d| !self.fs.exists(&d.path)) => {
                self.destroyed = true;
                Ok(())
            }
            Some(error) => Err(error),
            None => {
                self.destroyed = true;
                Ok(())
            }
        }
    }

    /// The primary dir: the v2 dir, or the v1 memory dir, else the first.
    pub fn path(&self) -> &Path {
        self.dir_with("memory")
            .or_else(|| self.dirs.first().map(|d| d.path.as_path()))
            .unwrap_or_else(|| Path::new(""))
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        if !self.destroyed {
            let _ = self.destroy();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_millis_become_a_quota_per_100ms_period() {
        let q = CgroupLimits {
            cpu_millis: Some(1500),
            ..Default::default()
        }
        .cpu_quota()
        .unwrap();
        assert_eq!((q.quota_us, q.period_us), (150_000, 100_000));
        assert!(CgroupLimits::default().cpu_quota().is_none());
    }

    use super::fake::{FakeFs, V2Features};
    use super::mountinfo::tests::{COMOUNTED_V1, HYBRID, PURE_V2};
    use std::fs as stdfs;

    const ROOT: Host = Host {
        is_root: true,
        pid: 4321,
    };
    const USER: Host = Host {
        is_root: false,
        pid: 4321,
    };
    const ALL: &str = "cpuset cpu io memory hugetlb pids rdma misc";

    /// `sample` with /sys/fs/cgroup moved into `root`.
    fn mounts_for(sample: &str, root: &Path) -> Vec<MountEntry> {
        let text = sample.replace("/sys/fs/cgroup", &root.display().to_string());
        mountinfo::parse_mountinfo(text.as_bytes()).expect("valid sample")
    }

    fn discover(
        fake: &Arc<FakeFs>,
        mounts: &[MountEntry],
        own: &str,
        host: Host,
    ) -> Option<CgroupManager> {
        let own = format!("0::{own}\n");
        CgroupManager::discover_in(fake.clone(), mounts, own.as_bytes(), "runcell", host)
            .expect("discover")
    }

    /// Discovery from a whole `/proc/self/cgroup` text (v1 lines).
    fn discover_with(
        fake: &Arc<FakeFs>,
        mounts: &[MountEntry],
        proc_cgroup: &str,
    ) -> Option<CgroupManager> {
        CgroupManager::discover_in(
            fake.clone(),
            mounts,
            proc_cgroup.as_bytes(),
            "runcell",
            ROOT,
        )
        .expect("discover")
    }

    fn v2_layout(manager: &CgroupManager) -> (PathBuf, PathBuf) {
        match &manager.layout {
            Layout::V2 { top, base } => (top.clone(), base.clone()),
            Layout::V1 { .. } => panic!("expected v2, got {manager:?}"),
        }
    }

    fn v1_hierarchies(manager: &CgroupManager) -> Vec<(Vec<String>, PathBuf)> {
        match &manager.layout {
            Layout::V1 { hierarchies } => hierarchies
                .iter()
                .map(|h| (h.controllers.clone(), h.base.clone()))
                .collect(),
            Layout::V2 { .. } => panic!("expected v1, got {manager:?}"),
        }
    }

    /// Fake trees for the hybrid sample: v1 controllers plus a hugetlb-only cgroup2.
    fn hybrid_fake(root: &Path) -> Arc<FakeFs> {
        let mut fake = FakeFs::new();
        for c in [
            "cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids",
        ] {
            fake.add_v1_root(&root.join(c), &[c], true);
        }
        fake.add_v1_root(&root.join("systemd"), &[], false);
        fake.add_v2_root(&root.join("unified"), "hugetlb", V2Features::MODERN);
        Arc::new(fake)
    }

    #[test]
    fn hybrid_host_uses_v1_with_the_wanted_controllers() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        let fake = hybrid_fake(root);
        let mounts = mounts_for(HYBRID, root);
        let manager = discover(&fake, &mounts, "/", ROOT).expect("usable");
        assert_eq!(manager.version(), CgroupVersion::V1);
        let expected: Vec<(Vec<String>, PathBuf)> =
            ["cpu", "cpuacct", "memory", "freezer", "blkio", "pids"]
                .iter()
                .map(|c| (vec![(*c).to_owned()], root.join(c).join("runcell")))
                .collect();
        assert_eq!(v1_hierarchies(&manager), expected);

        let group = manager
            .create(
                "4321-ab",
                &CgroupLimits {
                    memory_bytes: Some(1 << 30),
                    pids_max: Some(64),
                    cpu_millis: None,
                    io: None,
                },
            )
            .expect("create");
        assert_eq!(group.path(), root.join("memory/runcell/4321-ab"));
        assert_eq!(group.procs_files().len(), 6);
        assert_eq!(
            group.clone_into_dir(),
            None,
            "CLONE_INTO_CGROUP cannot name v1 hierarchies: the helper writes cgroup.procs"
        );
        assert!(
            !root.join("cpuset/runcell").exists(),
            "cpuset is never used"
        );
        assert!(!root.join("unified/runcell").exists());
    }

    #[test]
    fn hybrid_host_unprivileged_has_nothing() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let fake = hybrid_fake(tmp.path());
        let mounts = mounts_for(HYBRID, tmp.path());
        assert!(discover(&fake, &mounts, "/", USER).is_none());
    }

    #[test]
    fn comounted_host_uses_one_cpu_cpuacct_hierarchy() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        let mut fake = FakeFs::new();
        fake.add_v2_root(&root.join("unified"), "", V2Features::MODERN);
        for mount in [
            "systemd",
            "cpu,cpuacct",
            "net_cls,net_prio",
            "memory",
            "pids",
            "freezer",
            "cpuset",
        ] {
            let controllers: Vec<&str> = if mount == "systemd" {
                Vec::new()
            } else {
                mount.split(',').collect()
            };
            fake.add_v1_root(&root.join(mount), &controllers, false);
        }
        let fake = Arc::new(fake);
        let mounts = mounts_for(COMOUNTED_V1, root);
        let manager = discover(&fake, &mounts, "/", ROOT).expect("usable");
        let hierarchies = v1_hierarchies(&manager);
        let names: Vec<Vec<String>> = hierarchies.iter().map(|h| h.0.clone()).collect();
        assert_eq!(
            names,
            vec![
                vec!["cpu".to_owned(), "cpuacct".to_owned()],
                vec!["memory".to_owned()],
                vec!["pids".to_owned()],
                vec!["freezer".to_owned()],
            ]
        );
        assert_eq!(hierarchies[0].1, root.join("cpu,cpuacct/runcell"));
        let group = manager
            .create(
                "1-x",
                &CgroupLimits {
                    cpu_millis: Some(100),
                    ..CgroupLimits::default()
                },
            )
            .expect("create");
        let e = group.enforced();
        assert!(e.cpu && e.cpu_accounting && !e.memory, "{e:?}");
        assert_eq!(group.procs_files().len(), 4);
    }

    #[test]
    fn pure_v2_host_as_root() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mp = tmp.path().to_path_buf();
        let mut fake = FakeFs::new();
        fake.add_v2_root(&mp, ALL, V2Features::MODERN);
        let fake = Arc::new(fake);
        let mounts = mounts_for(PURE_V2, &mp);
        let manager =
            discover(&fake, &mounts, "/user.slice/session-1.scope", ROOT).expect("usable");
        assert_eq!(manager.version(), CgroupVersion::V2);
        assert_eq!(v2_layout(&manager), (mp.clone(), mp.join("runcell")));
        assert!(
            !mp.join(SUPERVISOR_LEAF).exists(),
            "root on the host stays put"
        );
        let group = manager
            .create("4321-ab", &CgroupLimits::default())
            .expect("create");
        assert_eq!(group.path(), mp.join("runcell/4321-ab"));
        // pid 1 is created in the group itself (clone3 CLONE_INTO_CGROUP), not written to it.
        assert_eq!(group.clone_into_dir(), Some(mp.join("runcell/4321-ab")));
        assert_eq!(
            group.procs_files(),
            vec![mp.join("runcell/4321-ab/cgroup.procs")],
            "still the fallback where clone3 is refused"
        );
    }

    #[test]
    fn all_groups_together_get_a_memory_limit() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mp = tmp.path().to_path_buf();
        let mut fake = FakeFs::new();
        fake.add_v2_root(&mp, ALL, V2Features::MODERN);
        let fake = Arc::new(fake);
        let manager = discover(&fake, &mounts_for(PURE_V2, &mp), "/", ROOT).expect("usable");
        let _group = manager.create("1-a", &CgroupLimits::default()).unwrap();
        assert!(manager.limit_all_groups(8 << 30).unwrap());
        assert_eq!(
            std::fs::read_to_string(mp.join("runcell/memory.max")).unwrap(),
            (8u64 << 30).to_string()
        );

        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        let fake = hybrid_fake(root);
        let manager = CgroupManager::v1_with(
            fake.clone(),
            vec![("memory".into(), root.join("memory/runcell"))],
        );
        let _group = manager.create("1-b", &CgroupLimits::default()).unwrap();
        assert!(manager.limit_all_groups(4 << 30).unwrap());
        let limit = root.join("memory/runcell/memory.limit_in_bytes");
        let memsw = root.join("memory/runcell/memory.memsw.limit_in_bytes");
        assert_eq!(
            std::fs::read_to_string(&limit).unwrap(),
            (4u64 << 30).to_string()
        );
        assert_eq!(
            std::fs::read_to_string(&memsw).unwrap(),
            (4u64 << 30).to_string()
        );
        // Raising goes memsw first (memsw may never be below the limit), lowering limit first.
        assert!(manager.limit_all_groups(6 << 30).unwrap());
        assert!(manager.limit_all_groups(2 << 30).unwrap());
        let order: Vec<String> = fake
            .writes_to("memory.memsw.limit_in_bytes")
            .into_iter()
            .chain(fake.writes_to("memory.limit_in_bytes"))
            .filter(|(p, _)| p.parent() == Some(&root.join("memory/runcell")))
            .map(|(_, v)| v)
            .collect();
        assert!(order.contains(&(6u64 << 30).to_string()), "{order:?}");
        assert_eq!(
            std::fs::read_to_string(&limit).unwrap(),
            (2u64 << 30).to_string()
        );
        assert_eq!(
            std::fs::read_to_string(&memsw).unwrap(),
            (2u64 << 30).to_string()
        );
    }

    /// A privileged pod whose cgroup2 mount shows the node's root (no cgroup namespace): the
    /// container's group has a memory limit, so runs' groups go under it, never at the node's
    /// root, and the all-runs limit and the sweep work there.
    #[test]
    fn v2_root_confined_below_the_mount_root_uses_its_own_group() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mp = tmp.path().to_path_buf();
        let own = "kubepods.slice/pod1.slice/cri-ctr.scope";
        let mut fake = FakeFs::new();
        fake.add_v2_root(&mp, ALL, V2Features::MODERN);
        fake.add_v2_root(&mp.join(own), "memory pids cpu", V2Features::MODERN);
        let dir = mp.join(own);
        stdfs::write(dir.join("cgroup.type"), "domain\n").expect("write");
        stdfs::write(dir.join("memory.max"), "max\n").expect("write");
        stdfs::write(mp.join("kubepods.slice/memory.max"), "1073741824\n").expect("write");
        // The container's shell and runcell share the group.
        stdfs::write(dir.join("cgroup.procs"), "17\n4321\n").expect("write");
        let fake = Arc::new(fake);
        let mounts = mounts_for(PURE_V2, &mp);
        let manager = discover(&fake, &mounts, &format!("/{own}"), ROOT).expect("usable");
        assert_eq!(v2_layout(&manager), (dir.clone(), dir.join("runcell")));
        assert_eq!(
            stdfs::read_to_string(dir.join("supervisor/cgroup.procs"))
                .expect("read")
                .lines()
                .collect::<Vec<_>>(),
            ["4321", "17"]
        );
        let group = manager
            .create(
                "4321-ab",
                &CgroupLimits {
                    memory_bytes: Some(1 << 28),
                    ..CgroupLimits::default()
                },
            )
            .expect("create");
        assert_eq!(group.path(), dir.join("runcell/4321-ab"));
        assert!(group.enforced().memory);
        assert!(manager.limit_all_groups(896 << 20).unwrap());
        assert_eq!(
            stdfs::read_to_string(dir.join("runcell/memory.max")).unwrap(),
            (896u64 << 20).to_string()
        );
        assert!(!mp.join("runcell").exists(), "nothing at the node's root");
        assert!(
            fake.writes_to("cgroup.subtree_control")
                .iter()
                .all(|(p, _)| p.starts_with(&dir)),
            "nothing above the own group is changed"
        );
        drop(group);
        // A leftover of a dead supervisor in the new place is swept.
        fake.mkdir(&dir.join("runcell/99-dead")).expect("mkdir");
        assert_eq!(manager.sweep_stale(&|n: &str| n.starts_with("99-")), 1);
        assert!(!dir.join("runcell/99-dead").exists());
        // Discovering again from the supervisor leaf gives the same answer.
        let again = discover(&fake, &mounts, &format!("/{own}/supervisor"), ROOT).expect("usable");
        assert_eq!(v2_layout(&again), (dir.clone(), dir.join("runcell")));
    }

    /// A test (or an operator) put runcell in a limited v1 memory group: per hierarchy the
    /// groups go under runcell's own group there, the hierarchy's root where it is the root.
    #[test]
    fn v1_confined_uses_the_own_group_of_each_hierarchy() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        let fake = hybrid_fake(root);
        for c in ["memory", "pids"] {
            fake.mkdir(&root.join(c).join("ct")).expect("mkdir");
        }
        stdfs::write(root.join("memory/ct/memory.limit_in_bytes"), "1073741824\n").expect("write");
        let mounts = mounts_for(HYBRID, root);
        let own = "8:pids:/ct\n4:memory:/ct\n1:cpu:/\n0::/\n";
        let manager = discover_with(&fake, &mounts, own).expect("usable");
        let bases: Vec<PathBuf> = v1_hierarchies(&manager)
            .into_iter()
            .map(|(_, b)| b)
            .collect();
        assert!(bases.contains(&root.join("memory/ct/runcell")), "{bases:?}");
        assert!(bases.contains(&root.join("pids/ct/runcell")), "{bases:?}");
        assert!(bases.contains(&root.join("cpu/runcell")), "{bases:?}");
        let group = manager
            .create(
                "4321-cd",
                &CgroupLimits {
                    memory_bytes: Some(1 << 28),
                    pids_max: Some(16),
                    ..CgroupLimits::default()
                },
            )
            .expect("create");
        assert!(root.join("memory/ct/runcell/4321-cd").is_dir());
        assert!(manager.limit_all_groups(896 << 20).unwrap());
        assert_eq!(
            stdfs::read_to_string(root.join("memory/ct/runcell/memory.limit_in_bytes")).unwrap(),
            (896u64 << 20).to_string()
        );
        drop(group);
        for base in &bases {
            fake.mkdir(&base.join("99-dead")).expect("mkdir");
        }
        assert_eq!(manager.sweep_stale(&|n: &str| n.starts_with("99-")), 1);
        assert!(bases.iter().all(|b| !b.join("99-dead").exists()));

        // Not limited (an accounting group such as a login session's): today's layout.
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        let fake = hybrid_fake(root);
        fake.mkdir(&root.join("memory/ct")).expect("mkdir");
        let manager =
            discover_with(&fake, &mounts_for(HYBRID, root), "4:memory:/ct\n").expect("usable");
        assert!(v1_hierarchies(&manager)
            .iter()
            .any(|(_, b)| *b == root.join("memory/runcell")));
        // A limit inherited from a hidden ancestor counts too.
        stdfs::write(
            root.join("memory/ct/memory.stat"),
            "cache 0\nhierarchical_memory_limit 1073741824\n",
        )
        .expect("write");
        let manager =
            discover_with(&fake, &mounts_for(HYBRID, root), "4:memory:/ct\n").expect("usable");
        assert!(v1_hierarchies(&manager)
            .iter()
            .any(|(_, b)| *b == root.join("memory/ct/runcell")));
    }

    #[test]
    fn v2_without_memory_is_a_last_resort_only() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mp = tmp.path().to_path_buf();
        let mut fake = FakeFs::new();
        fake.add_v2_root(&mp, "cpu pids", V2Features::MODERN);
        let fake = Arc::new(fake);
        let mounts = mounts_for(PURE_V2, &mp);
        let manager = discover(&fake, &mounts, "/", ROOT).expect("usable");
        assert_eq!(v2_layout(&manager), (mp.clone(), mp.join("runcell")));
        // ... and nothing at all for hugetlb only.
        stdfs::write(mp.join("cgroup.controllers"), "hugetlb").expect("write");
        assert!(discover(&fake, &mounts, "/", ROOT).is_none());
    }

    #[test]
    fn read_only_v2_mount_is_not_used() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mp = tmp.path().to_path_buf();
        let mut fake = FakeFs::new();
        fake.add_v2_root(&mp, ALL, V2Features::MODERN);
        let fake = Arc::new(fake);
        let ro = PURE_V2.replace(
            "rw,nosuid,nodev,noexec,relatime shared:4",
            "ro,nosuid,nodev,noexec,relatime shared:4",
        );
        let mounts = mounts_for(&ro, &mp);
        assert!(mounts[3].read_only());
        assert!(discover(&fake, &mounts, "/", ROOT).is_none());
    }

    #[test]
    fn root_in_a_cgroup_namespace_vacates_the_namespace_root() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mp = tmp.path().to_path_buf();
        let mut fake = FakeFs::new();
        fake.add_v2_root(&mp, "cpu memory pids", V2Features::MODERN);
        // Only non-root groups have cgroup.type: this "root" is a container's group.
        stdfs::write(mp.join("cgroup.type"), "domain\n").expect("write");
        let fake = Arc::new(fake);
        let mounts = mounts_for(PURE_V2, &mp);
        let manager = discover(&fake, &mounts, "/", ROOT).expect("usable");
        assert_eq!(v2_layout(&manager), (mp.clone(), mp.join("runcell")));
        let leaf_procs = mp.join("supervisor/cgroup.procs");
        assert_eq!(
            stdfs::read_to_string(&leaf_procs).expect("read").trim(),
            "4321"
        );
        // Discovering again from inside the leaf gives the same answer.
        let again = discover(&fake, &mounts, "/supervisor", ROOT).expect("usable");
        assert_eq!(v2_layout(&again), (mp.clone(), mp.join("runcell")));
    }

    /// A systemd user service with `Delegate=yes`: the own group is writable.
    fn delegated_setup(root: &Path) -> (Arc<FakeFs>, Vec<MountEntry>, PathBuf) {
        let own = "user.slice/user-1000.slice/user@1000.service/app.slice/run.scope";
        let mut fake = FakeFs::new();
        fake.add_v2_root(root, ALL, V2Features::MODERN);
        fake.add_v2_root(&root.join(own), "memory pids cpu", V2Features::MODERN);
        // Not the hierarchy's root: the no-internal-processes rule binds it.
        stdfs::write(root.join(own).join("cgroup.type"), "domain\n").expect("write");
        (Arc::new(fake), mounts_for(PURE_V2, root), root.join(own))
    }

    /// Regression (found on a real v2 kernel by scripts/cgroup-v2-guest.sh): root started from
    /// a shell at the root of a container's cgroup namespace moved only itself out, the shell
    /// stayed, and enabling the controllers failed with EBUSY for every run.
    #[test]
    fn root_in_a_cgroup_namespace_moves_the_other_processes_out_too() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mp = tmp.path().to_path_buf();
        let mut fake = FakeFs::new();
        fake.add_v2_root(&mp, "cpu memory pids", V2Features::MODERN);
        stdfs::write(mp.join("cgroup.type"), "domain\n").expect("write");
        // The container's shell (17) and runcell (4321), both in the namespace root.
        stdfs::write(mp.join("cgroup.procs"), "17\n4321\n").expect("write");
        let fake = Arc::new(fake);
        let manager = discover(&fake, &mounts_for(PURE_V2, &mp), "/", ROOT).expect("usable");
        assert_eq!(
            stdfs::read_to_string(mp.join("cgroup.procs"))
                .expect("read")
                .trim(),
            "",
            "the namespace root is empty"
        );
        let leaf: Vec<String> = stdfs::read_to_string(mp.join("supervisor/cgroup.procs"))
            .expect("read")
            .lines()
            .map(str::to_owned)
            .collect();
        assert_eq!(leaf, ["4321", "17"], "runcell first, then the others");
        let group = manager
            .create(
                "4321-ab",
                &CgroupLimits {
                    memory_bytes: Some(1 << 28),
                    pids_max: Some(8),
                    ..CgroupLimits::default()
                },
            )
            .expect("create");
        assert!(group.enforced().memory && group.enforced().pids);
    }

    /// Root in a user-namespaced pod (`hostUsers: false`) counts as unprivileged here
    /// (identity::Identity::NamespacedRoot): where the runtime delegated the container's
    /// group to the namespace's root (crun, containerd `cgroup_writable`), its groups go in that
    /// group, the namespace root; where it did not, there is no cgroup and no error.
    #[test]
    fn root_in_a_user_namespace_uses_the_delegated_container_group_only() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mp = tmp.path().to_path_buf();
        let mut fake = FakeFs::new();
        fake.add_v2_root(&mp, "cpu memory pids", V2Features::MODERN);
        stdfs::write(mp.join("cgroup.type"), "domain\n").expect("write");
        // The pod's entrypoint shell (1) and runcell (4321), in the namespace root.
        stdfs::write(mp.join("cgroup.procs"), "1\n4321\n").expect("write");
        let fake = Arc::new(fake);
        let mounts = mounts_for(PURE_V2, &mp);
        let manager = discover(&fake, &mounts, "/", USER).expect("delegated");
        assert_eq!(v2_layout(&manager), (mp.clone(), mp.clone()));
        let group = manager
            .create(
                "4321-ab",
                &CgroupLimits {
                    memory_bytes: Some(1 << 28),
                    pids_max: Some(8),
                    ..CgroupLimits::default()
                },
            )
            .expect("create");
        assert_eq!(group.path(), mp.join("4321-ab"));
        assert!(group.enforced().memory && group.enforced().pids);

        // Not delegated (the container's group belongs to the host's root): nothing.
        let tmp = tempfile::tempdir().expect("tempdir");
        let mp = tmp.path().to_path_buf();
        let mut fake = FakeFs::new();
        fake.add_v2_root(&mp, "cpu memory pids", V2Features::MODERN);
        stdfs::write(mp.join("cgroup.type"), "domain\n").expect("write");
        fake.deny_write(&mp.join("cgroup.procs"));
        let fake = Arc::new(fake);
        assert!(discover(&fake, &mounts_for(PURE_V2, &mp), "/", USER).is_none());
        assert!(!mp.join("supervisor").exists(), "nothing moved");
    }

    /// The same for an unprivileged runcell started from the user's shell in its delegated
    /// group (`systemd-run --user --scope -p Delegate=yes bash`).
    #[test]
    fn unprivileged_delegated_v2_moves_the_shell_out_too() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (fake, mounts, own) = delegated_setup(tmp.path());
        stdfs::write(own.join("cgroup.procs"), "1000\n4321\n").expect("write");
        let manager = discover(&fake, &mounts, OWN, USER).expect("usable");
        assert_eq!(
            stdfs::read_to_string(own.join("cgroup.procs"))
                .expect("read")
                .trim(),
            ""
        );
        let group = manager
            .create(
                "4321-ab",
                &CgroupLimits {
                    memory_bytes: Some(1 << 28),
                    ..CgroupLimits::default()
                },
            )
            .expect("create");
        assert!(group.enforced().memory);
        assert_eq!(
            stdfs::read_to_string(own.join("supervisor/cgroup.procs")).expect("read"),
            "4321\n1000\n"
        );
    }

    /// A process that joined the top group after discovery (`docker exec` into the container)
    /// is moved out when enabling the controllers meets it, and the run goes on.
    #[test]
    fn a_process_that_joined_the_top_later_is_moved_out_at_create() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (fake, mounts, own) = delegated_setup(tmp.path());
        let manager = discover(&fake, &mounts, OWN, USER).expect("usable");
        stdfs::write(own.join("cgroup.procs"), "555\n").expect("write");
        let group = manager
            .create("4321-ab", &CgroupLimits::default())
            .expect("create");
        assert!(group.path().is_dir());
        assert_eq!(
            stdfs::read_to_string(own.join("cgroup.procs"))
                .expect("read")
                .trim(),
            ""
        );
        assert_eq!(
            stdfs::read_to_string(own.join("supervisor/cgroup.procs")).expect("read"),
            "4321\n555\n"
        );
    }

    /// Without the fix the fake refuses like the kernel: a group holding processes cannot
    /// enable controllers (so the tests above do test something).
    #[test]
    fn the_fake_enforces_no_internal_processes() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (fake, _, own) = delegated_setup(tmp.path());
        stdfs::write(own.join("cgroup.procs"), "1000\n").expect("write");
        let err = fake
            .write(&own.join("cgroup.subtree_control"), "+memory")
            .expect_err("EBUSY");
        assert_eq!(err.raw_os_error(), Some(libc::EBUSY));
        // The hierarchy's root is exempt.
        stdfs::write(tmp.path().join("cgroup.procs"), "1\n").expect("write");
        fake.write(&tmp.path().join("cgroup.subtree_control"), "+memory")
            .expect("the root may");
    }

    const OWN: &str = "/user.slice/user-1000.slice/user@1000.service/app.slice/run.scope";

    #[test]
    fn unprivileged_delegated_v2_moves_into_a_leaf_and_uses_its_own_group() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (fake, mounts, own) = delegated_setup(tmp.path());
        let manager = discover(&fake, &mounts, OWN, USER).expect("usable");
        assert_eq!(v2_layout(&manager), (own.clone(), own.clone()));
        let leaf_procs = own.join("supervisor/cgroup.procs");
        assert_eq!(
            stdfs::read_to_string(&leaf_procs).expect("read").trim(),
            "4321"
        );
        let group = manager
            .create(
                "4321-ab",
                &CgroupLimits {
                    memory_bytes: Some(1 << 28),
                    ..CgroupLimits::default()
                },
            )
            .expect("create");
        assert_eq!(group.path(), own.join("4321-ab"));
        assert!(group.enforced().memory);
        assert_eq!(
            stdfs::read_to_string(own.join("cgroup.subtree_control")).expect("read"),
            "memory pids cpu"
        );
        assert!(
            fake.writes_to("cgroup.subtree_control")
                .iter()
                .all(|(p, _)| p.starts_with(&own)),
            "nothing above the delegated group is touched"
        );
        // Later discoveries see us inside the leaf and keep the same layout.
        let own_leaf = format!("{OWN}/supervisor");
        let again = discover(&fake, &mounts, &own_leaf, USER).expect("usable");
        assert_eq!(v2_layout(&again), (own.clone(), own));
    }

    #[test]
    fn unprivileged_without_delegation_has_nothing() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (fake, mounts, own) = delegated_setup(tmp.path());
        fake.deny_write(&own.join("cgroup.subtree_control"));
        assert!(discover(&fake, &mounts, OWN, USER).is_none());
        assert!(!own.join("supervisor").exists(), "nothing moved");
        // A group outside the mount is not ours either.
        let tmp2 = tempfile::tempdir().expect("tempdir");
        let (fake2, mut mounts2, _) = delegated_setup(tmp2.path());
        mounts2[3].root = PathBuf::from("/other");
        assert!(discover(&fake2, &mounts2, OWN, USER).is_none());
    }

    #[test]
    fn unprivileged_delegation_without_memory_has_nothing() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        let mut fake = FakeFs::new();
        fake.add_v2_root(root, ALL, V2Features::MODERN);
        fake.add_v2_root(&root.join(&OWN[1..]), "pids", V2Features::MODERN);
        let fake = Arc::new(fake);
        let mounts = mounts_for(PURE_V2, root);
        assert!(discover(&fake, &mounts, OWN, USER).is_none());
    }

    #[test]
    fn discover_reports_unreadable_or_malformed_inputs() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mountinfo = tmp.path().join("mountinfo");
        let cgroup = tmp.path().join("cgroup");
        let missing = tmp.path().join("missing");
        stdfs::write(&cgroup, "0::/\n").expect("write");
        assert!(matches!(
            CgroupManager::discover(&missing, &cgroup, "runcell"),
            Err(CgroupError::ReadMountinfo { path, .. }) if path == missing
        ));
        stdfs::write(
            &mountinfo,
            "22 27 0:21 / /proc rw - proc proc rw\nbroken line\n",
        )
        .expect("write");
        assert!(matches!(
            CgroupManager::discover(&mountinfo, &cgroup, "runcell"),
            Err(CgroupError::MalformedMountinfo { line: 2, .. })
        ));
        stdfs::write(&mountinfo, "22 27 0:21 / /proc rw - proc proc rw\n").expect("write");
        assert!(matches!(
            CgroupManager::discover(&mountinfo, &missing, "runcell"),
            Err(CgroupError::ReadProcCgroup { .. })
        ));
        // No cgroup mounts at all: usable nothing, not an error.
        assert!(CgroupManager::discover(&mountinfo, &cgroup, "runcell")
            .expect("discover")
            .is_none());
        assert!(matches!(
            CgroupManager::discover(&mountinfo, &cgroup, "../escape"),
            Err(CgroupError::InvalidName { .. })
        ));
    }

    #[test]
    fn handles_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<CgroupManager>();
        check::<Cgroup>();
    }

    #[test]
    fn version_display() {
        assert_eq!(CgroupVersion::V1.to_string(), "v1");
        assert_eq!(CgroupVersion::V2.to_string(), "v2");
    }

    #[test]
    fn name_validation() {
        for good in ["1234-deadbeef", "a", "runcell-test-1-x", "x.y", "..."] {
            assert!(validate_name(good).is_ok(), "{good:?} should be accepted");
        }
        for bad in ["", ".", "..", "a/b", "/", "a\0b", &"x".repeat(256)] {
            assert!(
                matches!(validate_name(bad), Err(CgroupError::InvalidName { .. })),
                "{bad:?} should be rejected"
            );
        }
    }

    #[test]
    fn base_validation() {
        assert!(validate_base("runcell").is_ok());
        assert!(validate_base("runcell/nested").is_ok());
        for bad in ["", "/runcell", "../x", "a//b", "a/", "a/.."] {
            assert!(validate_base(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn keyed_value_parsing() {
        let events = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 1\n";
        assert_eq!(keyed_value(events, "oom_kill"), Some(2));
        assert_eq!(keyed_value(events, "max"), Some(12));
        assert_eq!(keyed_value(events, "oom"), Some(3));
        assert_eq!(keyed_value(events, "missing"), None);
        assert_eq!(keyed_value("max\n", "max"), None);
        assert_eq!(keyed_value("max x\n", "max"), None);
    }
}
