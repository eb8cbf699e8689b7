//! cgroup v2 (unified hierarchy) specifics.

use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::fs::CgroupFs;
use super::mountinfo::{self, MountEntry};
use super::{
    ensure_dirs, read_keyed, set_limit, wait_until, Cgroup, CgroupError, CgroupLimits, CgroupStats,
    CgroupVersion, GroupDir, Host, Layout, FREEZE_WAIT, SUPERVISOR_LEAF,
};

/// The controllers runcell enables, whichever of them are available.
pub(super) const WANTED: [&str; 4] = ["memory", "pids", "cpu", "io"];

/// The controllers listed in `<dir>/cgroup.controllers` (what the parent makes available).
pub(super) fn controllers(fs: &dyn CgroupFs, dir: &Path) -> Result<Vec<String>, CgroupError> {
    let path = dir.join("cgroup.controllers");
    let content = fs
        .read(&path)
        .map_err(|source| CgroupError::ReadControllers { path, source })?;
    Ok(content.split_whitespace().map(str::to_owned).collect())
}

fn has_controller(fs: &dyn CgroupFs, dir: &Path, controller: &str) -> bool {
    controllers(fs, dir).is_ok_and(|c| c.iter().any(|c| c == controller))
}

/// Where this process runs, for [`discover_layout`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Placement<'a> {
    /// The own group's path from `/proc/self/cgroup`.
    pub own: Option<&'a Path>,
    /// The own group or an ancestor has a memory limit (see `own_group_is_limited`).
    pub confined: bool,
}

/// Decides whether `mount` is usable and where groups go. `Ok(None)`: not usable.
pub(super) fn discover_layout(
    fs: &dyn CgroupFs,
    mount: &MountEntry,
    placement: Placement<'_>,
    base: &str,
    host: Host,
) -> Result<Option<Layout>, CgroupError> {
    let top = &mount.mount_point;
    let own_dir = placement
        .own
        .and_then(|own| mountinfo::dir_in_mount(mount, own));
    if host.is_root {
        // A hybrid host's cgroup2 mount (only hugetlb, say) fails this test.
        if !has_controller(fs, top, "memory") {
            return Ok(None);
        }
        // Confined below the mount's root (a privileged pod whose cgroup2 mount shows the
        // node's root, a container without a cgroup namespace, a limited unit): the groups go
        // under the own group, the delegated subtree, so every run is charged inside the
        // limits on runcell. The own group must first hold no processes of its own (the
        // supervisor leaf, as for delegation), and it is the top: nothing above it is touched.
        if let Some(mut dir) = own_dir.clone().filter(|_| placement.confined) {
            if dir.file_name().is_some_and(|n| n == SUPERVISOR_LEAF) && dir != *top {
                if let Some(parent) = dir.parent() {
                    dir = parent.to_path_buf();
                }
            }
            if dir != *top && has_controller(fs, &dir, "memory") {
                vacate(fs, &dir, Some(host.pid))?;
                return Ok(Some(Layout::V2 {
                    top: dir.clone(),
                    base: dir.join(base),
                }));
            }
        }
        // In a cgroup namespace (a container) the mount root is itself a non-root group
        // (only those have cgroup.type), so the no-internal-processes rule applies to it
        // and enabling controllers there fails while we sit in it: vacate it first.
        let in_top = own_dir
            .as_deref()
            .is_some_and(|d| d == top.as_path() || d == top.join(SUPERVISOR_LEAF));
        if in_top && fs.exists(&top.join("cgroup.type")) {
            vacate(fs, top, Some(host.pid))?;
        }
        return Ok(Some(Layout::V2 {
            top: top.clone(),
            base: top.join(base),
        }));
    }
    let Some(mut dir) = own_dir else {
        return Ok(None);
    };
    // Discovering a second time, we find ourselves in the leaf made the first time.
    if dir.file_name().is_some_and(|n| n == SUPERVISOR_LEAF) && dir != *top {
        if let Some(parent) = dir.parent() {
            dir = parent.to_path_buf();
        }
    }
    let delegated = fs.writable(&dir)
        && fs.writable(&dir.join("cgroup.procs"))
        && fs.writable(&dir.join("cgroup.subtree_control"));
    if !delegated || !has_controller(fs, &dir, "memory") {
        return Ok(None);
    }
    vacate(fs, &dir, Some(host.pid))?;
    // Unprivileged, the only place we may create groups is our own delegated group.
    Ok(Some(Layout::V2 {
        top: dir.clone(),
        base: dir,
    }))
}

/// How many times [`vacate`] re-reads a group that processes keep appearing in (forked by
/// one it has not moved yet) before it leaves the rest to fail visibly.
const VACATE_ROUNDS: usize = 8;

/// Moves every process of `dir` into `<dir>/supervisor`, `own` (this process) first, so that
/// `dir` has no processes of its own and may distribute controllers to its children: the
/// kernel's *no internal processes* rule, which binds every group but the hierarchy's root.
///
/// Moving only runcell itself was not enough (found running the tests on a real v2 kernel,
/// scripts/cgroup-v2-guest.sh): whatever started it usually shares its group (the shell
/// of a container whose cgroup namespace root it is, or the user's shell in a delegated
/// group), and then enabling a controller failed with EBUSY for every run. The others
/// stay in the same subtree, under the same limits, one level down; container entrypoints
/// (Docker-in-Docker, kind) move a container's processes into a leaf for the same reason.
fn vacate(fs: &dyn CgroupFs, dir: &Path, own: Option<u32>) -> Result<(), CgroupError> {
    let leaf = dir.join(SUPERVISOR_LEAF);
    match fs.mkdir(&leaf) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(source) => return Err(CgroupError::CreateDir { path: leaf, source }),
    }
    let path = leaf.join("cgroup.procs");
    if let Some(pid) = own {
        fs.write(&path, &pid.to_string())
            .map_err(|source| CgroupError::MoveSelf {
                path: path.clone(),
                pid,
                source,
            })?;
    }
    let procs = dir.join("cgroup.procs");
    for _ in 0..VACATE_ROUNDS {
        let content = fs.read(&procs).map_err(|source| CgroupError::ReadProcs {
            path: procs.clone(),
            source,
        })?;
        let pids: Vec<u32> = content
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        if pids.is_empty() {
            return Ok(());
        }
        for pid in pids {
            match fs.write(&path, &pid.to_string()) {
                Ok(()) => {}
                // It exited in between.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(source) => {
                    return Err(CgroupError::MoveProcess {
                        from: dir.to_path_buf(),
                        path,
                        pid,
                        source,
                    })
                }
            }
        }
    }
    // Still not empty: enabling the controllers will fail with EBUSY and say where.
    Ok(())
}

/// The highest cgroup at or above `root_dir`: walk up while the parents are cgroups
/// (have `cgroup.controllers`), skipping levels that do not exist yet.
#[cfg(test)]
pub(super) fn find_top(fs: &dyn CgroupFs, root_dir: &Path) -> PathBuf {
    let mut top = None;
    for dir in root_dir.ancestors() {
        if dir.as_os_str().is_empty() {
            break;
        }
        if fs.exists(&dir.join("cgroup.controllers")) {
            top = Some(dir);
        } else if fs.exists(dir) {
            break;
        }
    }
    top.unwrap_or(root_dir).to_path_buf()
}

/// `top` and every directory below it down to `base`, top-down.
fn chain(top: &Path, base: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![top.to_path_buf()];
    if let Ok(rest) = base.strip_prefix(top) {
        let mut dir = top.to_path_buf();
        for component in rest.components() {
            dir.push(component);
            dirs.push(dir.clone());
        }
    }
    dirs
}

/// Adds the `wanted` controllers missing from `<dir>/cgroup.subtree_control`.
fn enable_controllers(fs: &dyn CgroupFs, dir: &Path, wanted: &[String]) -> Result<(), CgroupError> {
    let path = dir.join("cgroup.subtree_control");
    let current = fs
        .read(&path)
        .map_err(|source| CgroupError::ReadControllers {
            path: path.clone(),
            source,
        })?;
    let missing: Vec<String> = wanted
        .iter()
        .filter(|w| !current.split_whitespace().any(|c| c == w.as_str()))
        .map(|w| format!("+{w}"))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let controllers = missing.join(" ");
    fs.write(&path, &controllers)
        .map_err(|source| CgroupError::EnableControllers {
            path,
            controllers,
            source,
        })
}

pub(super) fn create(
    fs: &Arc<dyn CgroupFs>,
    top: &Path,
    base: &Path,
    name: &str,
    limits: &CgroupLimits,
) -> Result<Cgroup, CgroupError> {
    ensure_dirs(fs.as_ref(), base)?;
    let available = controllers(fs.as_ref(), top)?;
    let wanted: Vec<String> = WANTED
        .iter()
        .filter(|w| available.iter().any(|a| a == *w))
        .map(|w| (*w).to_owned())
        .collect();
    for dir in chain(top, base) {
        match enable_controllers(fs.as_ref(), &dir, &wanted) {
            // Processes joined the top group since discovery vacated it (a `docker exec`
            // into the container whose cgroup it is): vacate it again, once.
            Err(CgroupError::EnableControllers { source, .. })
                if dir == top
                    && source.raw_os_error() == Some(libc::EBUSY)
                    && fs.exists(&top.join("cgroup.type")) =>
            {
                vacate(fs.as_ref(), top, None)?;
                enable_controllers(fs.as_ref(), &dir, &wanted)?;
            }
            result => result?,
        }
    }
    let path = base.join(name);
    fs.mkdir(&path).map_err(|source| CgroupError::CreateDir {
        path: path.clone(),
        source,
    })?;
    let has = |c: &str| wanted.iter().any(|w| w == c);
    // From here on an early return drops `group`, which removes the directory again.
    let mut group = Cgroup::new(
        Arc::clone(fs),
        CgroupVersion::V2,
        vec![GroupDir {
            path: path.clone(),
            controllers: wanted.clone(),
        }],
    );
    let fs = fs.as_ref();
    let mut enforced = super::Enforced::default();
    if has("memory") {
        if let Some(bytes) = limits.memory_bytes {
            set_limit(fs, path.join("memory.max"), bytes.to_string())?;
            enforced.memory = true;
            // v2 charges socket memory to the group unconditionally.
            enforced.socket_memory = true;
            let swap = path.join("memory.swap.max");
            // Absent when the kernel has no swap support or swap accounting is off.
            if fs.exists(&swap) {
                set_limit(fs, swap, "0".to_owned())?;
                enforced.memory_swap = true;
            }
        }
        // memory.oom.group stays 0: as on v1 and on any Linux machine, the OOM killer takes
        // the largest process, and a program may survive the loss of a child.
    }
    if has("pids") {
        if let Some(max) = limits.pids_max {
            set_limit(fs, path.join("pids.max"), max.to_string())?;
            enforced.pids = true;
        }
    }
    if has("cpu") {
        if let Some(quota) = limits.cpu_quota() {
            let value = format!("{} {}", quota.quota_us, quota.period_us);
            set_limit(fs, path.join("cpu.max"), value)?;
            enforced.cpu = true;
        }
    }
    if has("io") {
        if let Some(io) = limits.io {
            let (major, minor) = io.device;
            let value = format!(
                "{major}:{minor} rbps={} wbps={} riops={} wiops={}",
                io.read_bps, io.write_bps, io.read_iops, io.write_iops
            );
            set_limit(fs, path.join("io.max"), value)?;
            enforced.io = true;
        }
    }
    // cpu.stat's usage is core cgroup accounting, present even without the cpu controller.
    enforced.cpu_accounting = fs.exists(&path.join("cpu.stat"));
    group.enforced = enforced;
    Ok(group)
}

pub(super) fn stats(group: &Cgroup) -> CgroupStats {
    let Some(dir) = group.dirs.first().map(|d| d.path.as_path()) else {
        return CgroupStats::default();
    };
    let fs = group.fs.as_ref();
    CgroupStats {
        memory_peak_bytes: peak(group, dir),
        oom_kills: read_keyed(fs, &dir.join("memory.events"), "oom_kill").unwrap_or(0),
        pids_limit_hits: read_keyed(fs, &dir.join("pids.events"), "max").unwrap_or(0),
        cpu_usage_ns: read_keyed(fs, &dir.join("cpu.stat"), "usage_usec")
            .map(|us| us.saturating_mul(1000)),
    }
}

fn peak(group: &Cgroup, dir: &Path) -> Option<u64> {
    let mut slot = group.peak_fd.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(file) = slot.as_mut() {
        let mut content = String::new();
        let read = file
            .seek(SeekFrom::Start(0))
            .and_then(|_| file.read_to_string(&mut content));
        if read.is_ok() {
            if let Ok(value) = content.trim().parse() {
                return Some(value);
            }
        }
    }
    super::read_u64(group.fs.as_ref(), &dir.join("memory.peak"))
}

/// Since 6.12 a write to `memory.peak` resets the watermark *for reads through the same
/// descriptor*, so the descriptor is kept and `stats` reads through it.
pub(super) fn reset_peak(group: &Cgroup) {
    let Some(dir) = group.dirs.first() else {
        return;
    };
    let Ok(mut file) = group.fs.open_rw(&dir.path.join("memory.peak")) else {
        return;
    };
    if file.write_all(b"reset\n").is_ok() {
        *group.peak_fd.lock().unwrap_or_else(|e| e.into_inner()) = Some(file);
    }
}

/// `cgroup.freeze` (kernel ≥ 5.2). Freezing completes asynchronously; `cgroup.events`
/// says when.
pub(super) fn freeze(group: &Cgroup) -> bool {
    let Some(dir) = group.dirs.first().map(|d| d.path.as_path()) else {
        return false;
    };
    let fs = group.fs.as_ref();
    let path = dir.join("cgroup.freeze");
    if !fs.exists(&path) || fs.write(&path, "1").is_err() {
        return false;
    }
    let events = dir.join("cgroup.events");
    wait_until(FREEZE_WAIT, || read_keyed(fs, &events, "frozen") == Some(1));
    true
}

pub(super) fn thaw(group: &Cgroup) {
    if let Some(dir) = group.dirs.first() {
        let _ = group.fs.write(&dir.path.join("cgroup.freeze"), "0");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::fake::{Event, FakeFs, V2Features};
    use crate::cgroup::{CgroupManager, Enforced};
    use std::fs;

    const ALL: &str = "cpuset cpu io memory hugetlb pids rdma misc";

    struct Setup {
        _tmp: tempfile::TempDir,
        fake: Arc<FakeFs>,
        mount: PathBuf,
        manager: CgroupManager,
    }

    /// A v2 mount root offering `controllers`, groups under `<mount>/runcell`.
    fn setup(controllers: &str, features: V2Features) -> Setup {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mount = tmp.path().join("cgroup");
        let mut fake = FakeFs::new();
        fake.add_v2_root(&mount, controllers, features);
        let fake = Arc::new(fake);
        let manager = CgroupManager::v2_with(fake.clone(), mount.join("runcell"));
        Setup {
            _tmp: tmp,
            fake,
            mount,
            manager,
        }
    }

    fn read(path: &Path) -> String {
        fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
            .trim()
            .to_owned()
    }

    fn full_limits() -> CgroupLimits {
        CgroupLimits {
            memory_bytes: Some(64 << 20),
            pids_max: Some(32),
            cpu_millis: Some(500),
            io: None,
        }
    }

    #[test]
    fn find_top_walks_up_to_the_mount_root() {
        let s = setup(ALL, V2Features::MODERN);
        let fs = s.fake.as_ref();
        // The base does not exist yet: the walk skips it and stops at the mount root.
        assert_eq!(find_top(fs, &s.mount.join("runcell")), s.mount);
        assert_eq!(find_top(fs, &s.mount.join("a/b/c")), s.mount);
        assert_eq!(find_top(fs, &s.mount), s.mount);
        // Outside any cgroup tree the dir itself is taken as the top.
        let plain = s.mount.parent().expect("parent").join("plain");
        fs::create_dir(&plain).expect("mkdir");
        assert_eq!(find_top(fs, &plain.join("x")), plain.join("x"));
    }

    #[test]
    fn io_limits_are_written_for_the_disk() {
        let s = setup(ALL, V2Features::MODERN);
        let limits = CgroupLimits {
            io: Some(crate::cgroup::TEST_IO),
            ..full_limits()
        };
        let group = s.manager.create("1-io", &limits).expect("create");
        assert!(group.enforced().io);
        assert_eq!(
            read(&s.mount.join("runcell/1-io/io.max")),
            "254:0 rbps=67108864 wbps=33554432 riops=16384 wiops=8192"
        );
        // Without the io controller nothing is claimed.
        let s = setup("cpu memory pids", V2Features::MODERN);
        let group = s.manager.create("1-io", &limits).expect("create");
        assert!(!group.enforced().io);
    }

    #[test]
    fn create_writes_limits_and_enables_controllers_along_the_path() {
        let s = setup(ALL, V2Features::MODERN);
        let group = s
            .manager
            .create("4242-cafe", &full_limits())
            .expect("create");
        let dir = s.mount.join("runcell/4242-cafe");
        assert_eq!(group.path(), dir);
        assert_eq!(group.version(), CgroupVersion::V2);
        assert_eq!(read(&dir.join("memory.max")), (64u64 << 20).to_string());
        assert_eq!(read(&dir.join("memory.swap.max")), "0");
        assert_eq!(
            read(&dir.join("memory.oom.group")),
            "0",
            "oom.group left at the default"
        );
        assert_eq!(read(&dir.join("pids.max")), "32");
        assert_eq!(read(&dir.join("cpu.max")), "50000 100000");
        for level in [s.mount.clone(), s.mount.join("runcell")] {
            let control = read(&level.join("cgroup.subtree_control"));
            let mut enabled: Vec<&str> = control.split_whitespace().collect();
            enabled.sort_unstable();
            assert_eq!(
                enabled,
                ["cpu", "io", "memory", "pids"],
                "at {}",
                level.display()
            );
        }
        assert_eq!(
            group.enforced(),
            Enforced {
                memory: true,
                memory_swap: true,
                socket_memory: true,
                pids: true,
                cpu: true,
                cpu_accounting: true,
                io: false,
            }
        );
        assert_eq!(group.procs_files(), vec![dir.join("cgroup.procs")]);
    }

    #[test]
    fn nested_base_is_created_and_enabled_at_every_level() {
        let s = setup(ALL, V2Features::MODERN);
        let manager = CgroupManager::v2_with(s.fake.clone(), s.mount.join("a/b"));
        let group = manager
            .create("1-x", &CgroupLimits::default())
            .expect("create");
        assert!(group.path().is_dir());
        let enabled_at: Vec<PathBuf> = s
            .fake
            .writes_to("cgroup.subtree_control")
            .into_iter()
            .map(|(p, v)| {
                assert_eq!(v, "+memory +pids +cpu +io");
                p.parent().expect("dir").to_path_buf()
            })
            .collect();
        assert_eq!(
            enabled_at,
            vec![s.mount.clone(), s.mount.join("a"), s.mount.join("a/b")]
        );
    }

    #[test]
    fn only_missing_controllers_are_enabled() {
        let s = setup(ALL, V2Features::MODERN);
        fs::write(s.mount.join("cgroup.subtree_control"), "memory io").expect("write");
        let _group = s.manager.create("1-x", &full_limits()).expect("create");
        let writes = s.fake.writes_to("cgroup.subtree_control");
        assert_eq!(
            writes[0],
            (s.mount.join("cgroup.subtree_control"), "+pids +cpu".into())
        );
        assert_eq!(writes[1].1, "+memory +pids +cpu +io");
        assert_eq!(writes.len(), 2);
        // A second group needs no more writes.
        let _second = s.manager.create("1-y", &full_limits()).expect("create");
        assert_eq!(s.fake.writes_to("cgroup.subtree_control").len(), 2);
    }

    #[test]
    fn unavailable_controller_is_reported_not_enforced() {
        let s = setup("cpu pids", V2Features::MODERN);
        let group = s.manager.create("1-x", &full_limits()).expect("create");
        let e = group.enforced();
        assert!(!e.memory && !e.memory_swap, "{e:?}");
        assert!(e.pids && e.cpu && e.cpu_accounting, "{e:?}");
        assert!(!group.path().join("memory.max").exists());
        assert_eq!(read(&s.mount.join("cgroup.subtree_control")), "pids cpu");
    }

    #[test]
    fn old_kernel_without_swap_peak_or_oom_group() {
        let features = V2Features {
            kill: false,
            swap: false,
            peak: false,
            oom_group: false,
            freeze: false,
        };
        let s = setup(ALL, features);
        let group = s.manager.create("1-x", &full_limits()).expect("create");
        let e = group.enforced();
        assert!(e.memory && !e.memory_swap, "{e:?}");
        assert_eq!(read(&group.path().join("memory.max")), "67108864");
        assert_eq!(group.stats().memory_peak_bytes, None);
        group.reset_peak(); // must not fail or panic
    }

    #[test]
    fn no_limits_requested_means_nothing_enforced() {
        let s = setup(ALL, V2Features::MODERN);
        let group = s
            .manager
            .create("1-x", &CgroupLimits::default())
            .expect("create");
        assert_eq!(
            group.enforced(),
            Enforced {
                cpu_accounting: true,
                ..Enforced::default()
            }
        );
        assert_eq!(read(&group.path().join("memory.max")), "max");
        assert_eq!(read(&group.path().join("pids.max")), "max");
        // oom.group is set whenever the memory controller is there.
        assert_eq!(read(&group.path().join("memory.oom.group")), "0");
    }

    #[test]
    fn failed_limit_write_is_an_error_and_leaves_nothing_behind() {
        let s = setup(ALL, V2Features::MODERN);
        s.fake.fail_writes_to("pids.max");
        let err = s
            .manager
            .create("1-x", &full_limits())
            .expect_err("must fail");
        match err {
            CgroupError::SetLimit { path, value, .. } => {
                assert_eq!(path, s.mount.join("runcell/1-x/pids.max"));
                assert_eq!(value, "32");
            }
            other => panic!("unexpected error {other:?}"),
        }
        assert!(!s.mount.join("runcell/1-x").exists());
        assert!(s.mount.join("runcell").exists(), "the base stays");
    }

    #[test]
    fn duplicate_and_invalid_names_are_rejected() {
        let s = setup(ALL, V2Features::MODERN);
        let first = s
            .manager
            .create("1-x", &CgroupLimits::default())
            .expect("create");
        assert!(matches!(
            s.manager.create("1-x", &CgroupLimits::default()),
            Err(CgroupError::CreateDir { .. })
        ));
        assert!(first.path().is_dir(), "the existing group is untouched");
        for bad in ["", "..", "a/b"] {
            assert!(matches!(
                s.manager.create(bad, &CgroupLimits::default()),
                Err(CgroupError::InvalidName { .. })
            ));
        }
    }

    #[test]
    fn add_process_and_pids() {
        let s = setup(ALL, V2Features::MODERN);
        let group = s
            .manager
            .create("1-x", &CgroupLimits::default())
            .expect("create");
        assert!(group.is_empty());
        group.add_process(202).expect("add");
        group.add_process(101).expect("add");
        assert_eq!(group.pids(), vec![101, 202]);
        assert!(!group.is_empty());
    }

    #[test]
    fn stats_parsing() {
        let s = setup(ALL, V2Features::MODERN);
        let group = s
            .manager
            .create("1-x", &CgroupLimits::default())
            .expect("create");
        let dir = group.path().to_path_buf();
        fs::write(
            dir.join("memory.events"),
            "low 0\nhigh 0\nmax 17\noom 2\noom_kill 2\noom_group_kill 1\n",
        )
        .expect("write");
        fs::write(dir.join("pids.events"), "max 5\n").expect("write");
        fs::write(
            dir.join("cpu.stat"),
            "usage_usec 1234567\nuser_usec 1000000\nsystem_usec 234567\nnr_periods 0\n",
        )
        .expect("write");
        fs::write(dir.join("memory.peak"), "73400320\n").expect("write");
        let stats = group.stats();
        assert_eq!(stats.oom_kills, 2);
        assert_eq!(stats.pids_limit_hits, 5);
        assert_eq!(stats.cpu_usage_ns, Some(1_234_567_000));
        assert_eq!(stats.memory_peak_bytes, Some(73_400_320));

        for file in ["memory.events", "pids.events", "cpu.stat", "memory.peak"] {
            fs::remove_file(dir.join(file)).expect("rm");
        }
        let stats = group.stats();
        assert_eq!(stats.oom_kills, 0);
        assert_eq!(stats.pids_limit_hits, 0);
        assert_eq!(stats.cpu_usage_ns, None);
        assert_eq!(stats.memory_peak_bytes, None);
    }

    #[test]
    fn reset_peak_keeps_the_descriptor_and_reads_through_it() {
        let s = setup(ALL, V2Features::MODERN);
        let group = s
            .manager
            .create("1-x", &CgroupLimits::default())
            .expect("create");
        let peak = group.path().join("memory.peak");
        fs::write(&peak, "5000\n").expect("write");
        assert_eq!(group.stats().memory_peak_bytes, Some(5000));
        group.reset_peak();
        assert!(lock_is_some(&group), "the descriptor is kept after a reset");
        assert!(read(&peak).starts_with("reset"), "the reset was written");
        // The "kernel" now reports the post-reset watermark for that descriptor.
        fs::write(&peak, "1000\n").expect("write");
        assert_eq!(group.stats().memory_peak_bytes, Some(1000));
    }

    fn lock_is_some(group: &Cgroup) -> bool {
        group
            .peak_fd
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    #[test]
    fn kill_all_uses_cgroup_kill() {
        let s = setup(ALL, V2Features::MODERN);
        let group = s
            .manager
            .create("1-x", &CgroupLimits::default())
            .expect("create");
        group.add_process(101).expect("add");
        group.add_process(102).expect("add");
        group.kill_all().expect("kill");
        assert_eq!(
            s.fake.writes_to("cgroup.kill"),
            vec![(group.path().join("cgroup.kill"), "1".to_owned())]
        );
        assert!(s.fake.killed().is_empty(), "no per-pid signals needed");
        assert!(group.is_empty());
    }

    #[test]
    fn destroy_of_an_empty_group_skips_the_freezer_and_kill_sweeps() {
        for kill in [true, false] {
            let features = V2Features {
                kill,
                ..V2Features::MODERN
            };
            let s = setup(ALL, features);
            let mut group = s
                .manager
                .create("1-x", &CgroupLimits::default())
                .expect("create");
            let path = group.path().to_path_buf();
            group.destroy().expect("destroy");
            assert!(s.fake.writes_to("cgroup.kill").is_empty());
            assert!(s.fake.writes_to("cgroup.freeze").is_empty());
            assert!(s.fake.killed().is_empty());
            assert!(!path.exists());
        }
    }

    #[test]
    fn destroy_of_a_busy_group_without_cgroup_kill_still_freezes_and_kills() {
        let features = V2Features {
            kill: false,
            ..V2Features::MODERN
        };
        let s = setup(ALL, features);
        let mut group = s
            .manager
            .create("1-x", &CgroupLimits::default())
            .expect("create");
        group.add_process(101).expect("add");
        group.destroy().expect("destroy");
        assert!(!s.fake.writes_to("cgroup.freeze").is_empty());
        assert_eq!(s.fake.killed(), vec![101]);
    }

    #[test]
    fn kill_all_without_cgroup_kill_freezes_signals_and_thaws() {
        let features = V2Features {
            kill: false,
            ..V2Features::MODERN
        };
        let s = setup(ALL, features);
        let group = s
            .manager
            .create("1-x", &CgroupLimits::default())
            .expect("create");
        group.add_process(101).expect("add");
        group.add_process(102).expect("add");
        group.kill_all().expect("kill");
        let freeze = group.path().join("cgroup.freeze");
        let tail: Vec<Event> = s
            .fake
            .events()
            .into_iter()
            .filter(|e| {
                matches!(e, Event::Kill(_)) || matches!(e, Event::Write(p, _) if *p == freeze)
            })
            .collect();
        assert_eq!(
            tail,
            vec![
                Event::Write(freeze.clone(), "1".into()),
                Event::Kill(101),
                Event::Kill(102),
                Event::Write(freeze, "0".into()),
            ]
        );
        assert!(group.is_empty());
    }

    #[test]
    fn kill_all_without_kill_or_freezer_just_signals() {
        let features = V2Features {
            kill: false,
            freeze: false,
            ..V2Features::MODERN
        };
        let s = setup(ALL, features);
        let group = s
            .manager
            .create("1-x", &CgroupLimits::default())
            .expect("create");
        group.add_process(7).expect("add");
        group.kill_all().expect("kill");
        assert_eq!(s.fake.killed(), vec![7]);
        assert!(group.is_empty());
    }

    #[test]
    fn destroy_removes_the_dir_and_is_idempotent() {
        let s = setup(ALL, V2Features::MODERN);
        let mut group = s
            .manager
            .create("1-x", &CgroupLimits::default())
            .expect("create");
        group.add_process(55).expect("add");
        let dir = group.path().to_path_buf();
        group.destroy().expect("destroy");
        assert!(!dir.exists());
        assert!(
            s.mount.join("runcell").is_dir(),
            "the base is shared and stays"
        );
        group.destroy().expect("second destroy");
        let rmdirs = s
            .fake
            .events()
            .iter()
            .filter(|e| matches!(e, Event::Rmdir(_)))
            .count();
        assert_eq!(rmdirs, 1);
    }

    #[test]
    fn drop_destroys() {
        let s = setup(ALL, V2Features::MODERN);
        let dir = {
            let group = s
                .manager
                .create("1-x", &CgroupLimits::default())
                .expect("create");
            group.add_process(9).expect("add");
            group.path().to_path_buf()
        };
        assert!(!dir.exists());
    }

    #[test]
    fn destroy_of_an_externally_removed_group_succeeds() {
        let s = setup(ALL, V2Features::MODERN);
        let mut group = s
            .manager
            .create("1-x", &CgroupLimits::default())
            .expect("create");
        fs::remove_dir_all(group.path()).expect("rm");
        group.destroy().expect("destroy");
    }
}
