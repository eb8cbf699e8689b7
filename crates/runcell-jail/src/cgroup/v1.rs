//! cgroup v1 (one hierarchy per controller or per set of co-mounted controllers).

use std::path::Path;
use std::sync::Arc;

use super::fs::CgroupFs;
use super::mountinfo::MountEntry;
use super::{
    ensure_dirs, read_keyed, read_u64, set_limit, wait_until, Cgroup, CgroupError, CgroupLimits,
    CgroupStats, CgroupVersion, Enforced, GroupDir, V1Hierarchy, FREEZE_WAIT,
};

/// Hierarchies runcell places sandboxes in. cpuacct gives CPU usage, freezer makes
/// killing race-free; the others enforce limits.
const WANTED: [&str; 6] = ["memory", "pids", "cpu", "cpuacct", "freezer", "blkio"];
/// At least one of these must exist, or the hierarchy set limits nothing.
const LIMITING: [&str; 3] = ["memory", "pids", "cpu"];

/// Picks one writable mount per wanted controller (the first; later ones are usually
/// bind mounts of the same hierarchy). Co-mounted controllers share one entry.
///
/// Groups are made in `<mount point>/<base>`, or, when `own` (the content of
/// `/proc/self/cgroup`) is given because runcell runs confined, in `<own group of that
/// hierarchy>/<base>`: v1 has no rule against processes beside child groups, so nothing
/// needs to move.
pub(super) fn discover_hierarchies(
    mounts: &[MountEntry],
    base: &str,
    own: Option<&[u8]>,
) -> Option<Vec<V1Hierarchy>> {
    let mut hierarchies: Vec<V1Hierarchy> = Vec::new();
    for mount in mounts
        .iter()
        .filter(|m| m.fstype == "cgroup" && !m.read_only())
    {
        let controllers = mount.v1_controllers();
        let useful = controllers.iter().any(|c| WANTED.contains(&c.as_str()));
        let seen = controllers
            .iter()
            .any(|c| hierarchies.iter().any(|h| h.has(c)));
        if useful && !seen {
            let parent = own
                .and_then(|own| {
                    let path = controllers
                        .iter()
                        .find_map(|c| super::mountinfo::own_v1_path(own, c))?;
                    super::mountinfo::dir_in_mount(mount, &path)
                })
                .unwrap_or_else(|| mount.mount_point.clone());
            hierarchies.push(V1Hierarchy {
                // All of the mount's controllers, so that a cpuset co-mounted with a
                // wanted controller is noticed and configured.
                controllers,
                base: parent.join(base),
            });
        }
    }
    let limiting = hierarchies
        .iter()
        .any(|h| LIMITING.iter().any(|c| h.has(c)));
    limiting.then_some(hierarchies)
}

/// A new cpuset group has empty `cpuset.cpus`/`cpuset.mems`, and no task can join it
/// until they are set: inherit the parent's.
fn copy_cpuset(fs: &dyn CgroupFs, dir: &Path) -> Result<(), CgroupError> {
    let Some(parent) = dir.parent() else {
        return Ok(());
    };
    for file in ["cpuset.cpus", "cpuset.mems"] {
        let path = dir.join(file);
        let copy = |source| CgroupError::CopyCpuset {
            path: path.clone(),
            source,
        };
        let value = fs.read(&parent.join(file)).map_err(copy)?;
        fs.write(&path, value.trim()).map_err(copy)?;
    }
    Ok(())
}

pub(super) fn create(
    fs: &Arc<dyn CgroupFs>,
    hierarchies: &[V1Hierarchy],
    name: &str,
    limits: &CgroupLimits,
) -> Result<Cgroup, CgroupError> {
    if hierarchies.is_empty() {
        return Err(CgroupError::NoHierarchy);
    }
    // An early return drops `group`, which removes the directories made so far.
    let mut group = Cgroup::new(Arc::clone(fs), CgroupVersion::V1, Vec::new());
    let fs = fs.as_ref();
    for hierarchy in hierarchies {
        let cpuset = hierarchy.has("cpuset");
        for dir in ensure_dirs(fs, &hierarchy.base)? {
            if cpuset {
                copy_cpuset(fs, &dir)?;
            }
        }
        let path = hierarchy.base.join(name);
        fs.mkdir(&path).map_err(|source| CgroupError::CreateDir {
            path: path.clone(),
            source,
        })?;
        group.dirs.push(GroupDir {
            path: path.clone(),
            controllers: hierarchy.controllers.clone(),
        });
        if cpuset {
            copy_cpuset(fs, &path)?;
        }
    }
    let mut enforced = Enforced::default();
    if let (Some(dir), Some(bytes)) = (group.dir_with("memory"), limits.memory_bytes) {
        // memsw must never be below the memory limit, so memory goes first (a new group
        // starts with both unlimited).
        set_limit(fs, dir.join("memory.limit_in_bytes"), bytes.to_string())?;
        enforced.memory = true;
        // Only present when swap accounting is compiled in and enabled.
        let memsw = dir.join("memory.memsw.limit_in_bytes");
        if fs.exists(&memsw) {
            set_limit(fs, memsw, bytes.to_string())?;
            enforced.memory_swap = true;
        }
        // v1 charges TCP socket buffers to the group only once this is set (v2 always does):
        // without it a run could queue gigabytes in sockets beyond its limit. Best effort:
        // kernels without kmem accounting refuse it, and `Enforced` says so. UDP buffers are
        // never charged on v1: seccomp keeps them at their defaults.
        let tcp = dir.join("memory.kmem.tcp.limit_in_bytes");
        if fs.exists(&tcp) {
            enforced.socket_memory = fs.write(&tcp, &bytes.to_string()).is_ok();
        }
    }
    if let (Some(dir), Some(max)) = (group.dir_with("pids"), limits.pids_max) {
        set_limit(fs, dir.join("pids.max"), max.to_string())?;
        enforced.pids = true;
    }
    if let (Some(dir), Some(quota)) = (group.dir_with("cpu"), limits.cpu_quota()) {
        // The quota is validated against the period, so the period goes first.
        set_limit(
            fs,
            dir.join("cpu.cfs_period_us"),
            quota.period_us.to_string(),
        )?;
        set_limit(fs, dir.join("cpu.cfs_quota_us"), quota.quota_us.to_string())?;
        enforced.cpu = true;
    }
    if let (Some(dir), Some(io)) = (group.dir_with("blkio"), limits.io) {
        let (major, minor) = io.device;
        for (file, value) in [
            ("blkio.throttle.read_bps_device", io.read_bps),
            ("blkio.throttle.write_bps_device", io.write_bps),
            ("blkio.throttle.read_iops_device", io.read_iops),
            ("blkio.throttle.write_iops_device", io.write_iops),
        ] {
            set_limit(fs, dir.join(file), format!("{major}:{minor} {value}"))?;
        }
        enforced.io = true;
    }
    enforced.cpu_accounting = group.dir_with("cpuacct").is_some();
    group.enforced = enforced;
    Ok(group)
}

pub(super) fn stats(group: &Cgroup) -> CgroupStats {
    let fs = group.fs.as_ref();
    let mut stats = CgroupStats::default();
    if let Some(dir) = group.dir_with("memory") {
        let memory = read_u64(fs, &dir.join("memory.max_usage_in_bytes"));
        // memory+swap: the quantity the limit applies to.
        let memsw = read_u64(fs, &dir.join("memory.memsw.max_usage_in_bytes"));
        stats.memory_peak_bytes = memory.max(memsw);
        // memory.failcnt counts reclaim-worthy limit hits, not kills: only oom_kill
        // (kernel ≥ 4.13) says a process died.
        stats.oom_kills = read_keyed(fs, &dir.join("memory.oom_control"), "oom_kill").unwrap_or(0);
    }
    if let Some(dir) = group.dir_with("pids") {
        stats.pids_limit_hits = read_keyed(fs, &dir.join("pids.events"), "max").unwrap_or(0);
    }
    if let Some(dir) = group.dir_with("cpuacct") {
        stats.cpu_usage_ns = read_u64(fs, &dir.join("cpuacct.usage"));
    }
    stats
}

pub(super) fn reset_peak(group: &Cgroup) {
    if let Some(dir) = group.dir_with("memory") {
        for file in [
            "memory.max_usage_in_bytes",
            "memory.memsw.max_usage_in_bytes",
        ] {
            let path = dir.join(file);
            if group.fs.exists(&path) {
                let _ = group.fs.write(&path, "0");
            }
        }
    }
}

/// The v1 freezer: `freezer.state` goes THAWED → FREEZING → FROZEN.
pub(super) fn freeze(group: &Cgroup) -> bool {
    let Some(dir) = group.dir_with("freezer") else {
        return false;
    };
    let fs = group.fs.as_ref();
    let state = dir.join("freezer.state");
    if fs.write(&state, "FROZEN").is_err() {
        return false;
    }
    wait_until(FREEZE_WAIT, || {
        fs.read(&state).is_ok_and(|s| s.trim() == "FROZEN")
    });
    true
}

pub(super) fn thaw(group: &Cgroup) {
    if let Some(dir) = group.dir_with("freezer") {
        let _ = group.fs.write(&dir.join("freezer.state"), "THAWED");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::fake::{Event, FakeFs};
    use crate::cgroup::CgroupManager;
    use std::fs;
    use std::path::PathBuf;

    struct Setup {
        _tmp: tempfile::TempDir,
        fake: Arc<FakeFs>,
        root: PathBuf,
        manager: CgroupManager,
    }

    /// One fake hierarchy per entry of `mounts` (`"cpu,cpuacct"` co-mounts), groups
    /// under `<mount>/runcell`.
    fn setup(mounts: &[&str], memsw: bool) -> Setup {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().to_path_buf();
        let mut fake = FakeFs::new();
        let mut pairs = Vec::new();
        for mount in mounts {
            let controllers: Vec<&str> = mount.split(',').collect();
            fake.add_v1_root(&root.join(mount), &controllers, memsw);
            for c in controllers {
                pairs.push((c.to_owned(), root.join(mount).join("runcell")));
            }
        }
        let fake = Arc::new(fake);
        let manager = CgroupManager::v1_with(fake.clone(), pairs);
        Setup {
            _tmp: tmp,
            fake,
            root,
            manager,
        }
    }

    const STANDARD: [&str; 5] = ["memory", "pids", "cpu", "cpuacct", "freezer"];

    fn read(path: &Path) -> String {
        fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
            .trim()
            .to_owned()
    }

    fn full_limits() -> CgroupLimits {
        CgroupLimits {
            memory_bytes: Some(64 << 20),
            pids_max: Some(16),
            cpu_millis: Some(500),
            io: None,
        }
    }

    fn position(events: &[Event], file: &Path) -> usize {
        events
            .iter()
            .position(|e| matches!(e, Event::Write(p, _) if p == file))
            .unwrap_or_else(|| panic!("no write to {}", file.display()))
    }

    #[test]
    fn io_limits_are_written_for_the_disk() {
        let s = setup(&["memory", "blkio"], true);
        let limits = CgroupLimits {
            io: Some(crate::cgroup::TEST_IO),
            ..full_limits()
        };
        let group = s.manager.create("1-io", &limits).expect("create");
        assert!(group.enforced().io);
        let dir = s.root.join("blkio/runcell/1-io");
        for (file, want) in [
            ("blkio.throttle.read_bps_device", "254:0 67108864"),
            ("blkio.throttle.write_bps_device", "254:0 33554432"),
            ("blkio.throttle.read_iops_device", "254:0 16384"),
            ("blkio.throttle.write_iops_device", "254:0 8192"),
        ] {
            assert_eq!(read(&dir.join(file)), want, "{file}");
        }
        // Without a blkio hierarchy nothing is claimed.
        let s = setup(&["memory"], true);
        let group = s.manager.create("1-io", &limits).expect("create");
        assert!(!group.enforced().io);
    }

    #[test]
    fn create_writes_limits_in_the_required_order() {
        let s = setup(&STANDARD, true);
        let group = s.manager.create("77-beef", &full_limits()).expect("create");
        let mem = s.root.join("memory/runcell/77-beef");
        assert_eq!(group.path(), mem);
        assert_eq!(group.version(), CgroupVersion::V1);
        assert_eq!(read(&mem.join("memory.limit_in_bytes")), "67108864");
        assert_eq!(read(&mem.join("memory.memsw.limit_in_bytes")), "67108864");
        assert_eq!(
            read(&mem.join("memory.kmem.tcp.limit_in_bytes")),
            "67108864"
        );
        let pids = s.root.join("pids/runcell/77-beef");
        assert_eq!(read(&pids.join("pids.max")), "16");
        let cpu = s.root.join("cpu/runcell/77-beef");
        assert_eq!(read(&cpu.join("cpu.cfs_period_us")), "100000");
        assert_eq!(read(&cpu.join("cpu.cfs_quota_us")), "50000");
        let events = s.fake.events();
        assert!(
            position(&events, &mem.join("memory.limit_in_bytes"))
                < position(&events, &mem.join("memory.memsw.limit_in_bytes"))
        );
        assert!(
            position(&events, &cpu.join("cpu.cfs_period_us"))
                < position(&events, &cpu.join("cpu.cfs_quota_us"))
        );
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
        let procs: Vec<PathBuf> = STANDARD
            .iter()
            .map(|c| s.root.join(c).join("runcell/77-beef/cgroup.procs"))
            .collect();
        assert_eq!(group.procs_files(), procs);
        // Nothing written to oom_control: the OOM killer stays on.
        assert!(s.fake.writes_to("memory.oom_control").is_empty());
    }

    #[test]
    fn without_swap_accounting_swap_is_not_claimed() {
        let s = setup(&STANDARD, false);
        let group = s.manager.create("1-x", &full_limits()).expect("create");
        let e = group.enforced();
        assert!(e.memory && !e.memory_swap, "{e:?}");
        assert!(!group.path().join("memory.memsw.limit_in_bytes").exists());
    }

    #[test]
    fn missing_hierarchies_are_reported() {
        let s = setup(&["memory"], true);
        let group = s.manager.create("1-x", &full_limits()).expect("create");
        let e = group.enforced();
        assert!(e.memory && e.memory_swap, "{e:?}");
        assert!(!e.pids && !e.cpu && !e.cpu_accounting, "{e:?}");
        let stats = group.stats();
        assert_eq!(stats.cpu_usage_ns, None);
        assert_eq!(stats.pids_limit_hits, 0);
    }

    #[test]
    fn comounted_cpu_cpuacct_share_one_dir() {
        let s = setup(&["memory", "cpu,cpuacct"], true);
        assert_eq!(s.manager.base_dirs().len(), 2);
        let group = s.manager.create("1-x", &full_limits()).expect("create");
        assert_eq!(group.procs_files().len(), 2);
        let e = group.enforced();
        assert!(e.cpu && e.cpu_accounting, "{e:?}");
        let dir = s.root.join("cpu,cpuacct/runcell/1-x");
        assert_eq!(read(&dir.join("cpu.cfs_quota_us")), "50000");
        fs::write(dir.join("cpuacct.usage"), "987654321\n").expect("write");
        assert_eq!(group.stats().cpu_usage_ns, Some(987_654_321));
    }

    #[test]
    fn v1_at_merges_pairs_naming_the_same_dir() {
        let manager = CgroupManager::v1_at(vec![
            ("cpu".into(), PathBuf::from("/c/cpu,cpuacct/r")),
            ("memory".into(), PathBuf::from("/c/memory/r")),
            ("cpuacct".into(), PathBuf::from("/c/cpu,cpuacct/r")),
            ("net_cls,net_prio".into(), PathBuf::from("/c/net/r")),
        ]);
        assert_eq!(manager.version(), CgroupVersion::V1);
        let crate::cgroup::Layout::V1 { hierarchies } = &manager.layout else {
            panic!("not v1");
        };
        assert_eq!(hierarchies.len(), 3);
        assert_eq!(hierarchies[0].controllers, ["cpu", "cpuacct"]);
        assert_eq!(hierarchies[2].controllers, ["net_cls", "net_prio"]);
    }

    #[test]
    fn cpuset_is_copied_from_the_parent() {
        let s = setup(&["memory", "cpuset"], true);
        let group = s.manager.create("1-x", &full_limits()).expect("create");
        for dir in [
            s.root.join("cpuset/runcell"),
            s.root.join("cpuset/runcell/1-x"),
        ] {
            assert_eq!(read(&dir.join("cpuset.cpus")), "0-7");
            assert_eq!(read(&dir.join("cpuset.mems")), "0");
        }
        assert_eq!(group.procs_files().len(), 2);
    }

    #[test]
    fn stats_parsing() {
        let s = setup(&STANDARD, true);
        let group = s
            .manager
            .create("1-x", &CgroupLimits::default())
            .expect("create");
        let mem = s.root.join("memory/runcell/1-x");
        fs::write(mem.join("memory.max_usage_in_bytes"), "1000\n").expect("write");
        fs::write(mem.join("memory.memsw.max_usage_in_bytes"), "2000\n").expect("write");
        fs::write(
            mem.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
        )
        .expect("write");
        fs::write(mem.join("memory.failcnt"), "99\n").expect("write");
        fs::write(s.root.join("pids/runcell/1-x/pids.events"), "max 4\n").expect("write");
        fs::write(
            s.root.join("cpuacct/runcell/1-x/cpuacct.usage"),
            "123456789\n",
        )
        .expect("write");
        let stats = group.stats();
        assert_eq!(stats.memory_peak_bytes, Some(2000), "memsw peak wins");
        assert_eq!(stats.oom_kills, 3);
        assert_eq!(stats.pids_limit_hits, 4);
        assert_eq!(stats.cpu_usage_ns, Some(123_456_789));

        // Old kernel: no oom_kill line. failcnt > 0 is not a kill.
        fs::write(
            mem.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\n",
        )
        .expect("write");
        fs::remove_file(mem.join("memory.memsw.max_usage_in_bytes")).expect("rm");
        let stats = group.stats();
        assert_eq!(stats.oom_kills, 0);
        assert_eq!(stats.memory_peak_bytes, Some(1000));
    }

    #[test]
    fn reset_peak_writes_zero_to_both_watermarks() {
        let s = setup(&STANDARD, true);
        let group = s
            .manager
            .create("1-x", &CgroupLimits::default())
            .expect("create");
        group.reset_peak();
        let mem = group.path().to_path_buf();
        assert_eq!(
            s.fake.writes_to("memory.max_usage_in_bytes"),
            vec![(mem.join("memory.max_usage_in_bytes"), "0".to_owned())]
        );
        assert_eq!(
            s.fake.writes_to("memory.memsw.max_usage_in_bytes"),
            vec![(mem.join("memory.memsw.max_usage_in_bytes"), "0".to_owned())]
        );
    }

    #[test]
    fn add_process_writes_every_hierarchy() {
        let s = setup(&STANDARD, true);
        let group = s
            .manager
            .create("1-x", &CgroupLimits::default())
            .expect("create");
        group.add_process(4242).expect("add");
        for file in group.procs_files() {
            assert_eq!(read(&file), "4242");
        }
        // Union over hierarchies, deduplicated.
        fs::write(s.root.join("cpu/runcell/1-x/cgroup.procs"), "4242\n5000\n").expect("write");
        assert_eq!(group.pids(), vec![4242, 5000]);
    }

    #[test]
    fn destroy_of_an_empty_group_skips_the_freezer_and_kill_sweeps() {
        let s = setup(&STANDARD, true);
        let mut group = s
            .manager
            .create("1-x", &CgroupLimits::default())
            .expect("create");
        let path = group.path().to_path_buf();
        group.destroy().expect("destroy");
        assert!(s.fake.writes_to("freezer.state").is_empty());
        assert!(s.fake.killed().is_empty());
        assert!(!path.exists());
    }

    #[test]
    fn destroy_of_a_busy_group_still_freezes_and_kills() {
        let s = setup(&STANDARD, true);
        let mut group = s
            .manager
            .create("1-x", &CgroupLimits::default())
            .expect("create");
        group.add_process(4242).expect("add");
        group.destroy().expect("destroy");
        assert!(!s.fake.writes_to("freezer.state").is_empty());
        assert_eq!(s.fake.killed(), vec![4242]);
    }

    #[test]
    fn kill_all_freezes_signals_every_pid_then_thaws() {
        let s = setup(&STANDARD, true);
        let group = s
            .manager
            .create("1-x", &CgroupLimits::default())
            .expect("create");
        group.add_process(4242).expect("add");
        group.add_process(4243).expect("add");
        group.kill_all().expect("kill");
        let state = s.root.join("freezer/runcell/1-x/freezer.state");
        let relevant: Vec<Event> = s
            .fake
            .events()
            .into_iter()
            .filter(|e| {
                matches!(e, Event::Kill(_)) || matches!(e, Event::Write(p, _) if *p == state)
            })
            .collect();
        assert_eq!(
            relevant,
            vec![
                Event::Write(state.clone(), "FROZEN".into()),
                Event::Kill(4242),
                Event::Kill(4243),
                Event::Write(state, "THAWED".into()),
            ]
        );
        assert!(group.is_empty());
    }

    #[test]
    fn kill_all_without_freezer() {
        let s = setup(&["memory", "pids"], true);
        let group = s
            .manager
            .create("1-x", &CgroupLimits::default())
            .expect("create");
        group.add_process(11).expect("add");
        group.kill_all().expect("kill");
        assert_eq!(s.fake.killed(), vec![11]);
        assert!(group.is_empty());
    }

    #[test]
    fn destroy_removes_every_dir() {
        let s = setup(&STANDARD, true);
        let mut group = s
            .manager
            .create("1-x", &CgroupLimits::default())
            .expect("create");
        group.add_process(4242).expect("add");
        group.destroy().expect("destroy");
        for c in STANDARD {
            assert!(!s.root.join(c).join("runcell/1-x").exists(), "{c}");
            assert!(s.root.join(c).join("runcell").exists(), "{c} base stays");
        }
        assert_eq!(s.fake.killed(), vec![4242]);
        group.destroy().expect("idempotent");
    }

    #[test]
    fn failure_half_way_removes_what_was_created() {
        let s = setup(&STANDARD, true);
        // A leftover in the cpu hierarchy makes the mkdir there fail.
        fs::create_dir_all(s.root.join("cpu/runcell/1-x")).expect("mkdir");
        let err = s
            .manager
            .create("1-x", &CgroupLimits::default())
            .expect_err("must fail");
        assert!(
            matches!(&err, CgroupError::CreateDir { path, .. } if *path == s.root.join("cpu/runcell/1-x")),
            "{err:?}"
        );
        assert!(!s.root.join("memory/runcell/1-x").exists());
        assert!(!s.root.join("pids/runcell/1-x").exists());
        assert!(
            s.root.join("cpu/runcell/1-x").exists(),
            "not ours: untouched"
        );
    }

    #[test]
    fn failing_memsw_write_is_an_error() {
        let s = setup(&STANDARD, true);
        s.fake.fail_writes_to("memory.memsw.limit_in_bytes");
        let err = s
            .manager
            .create("1-x", &full_limits())
            .expect_err("must fail");
        assert!(matches!(err, CgroupError::SetLimit { .. }), "{err:?}");
        assert!(!s.root.join("memory/runcell/1-x").exists());
    }

    #[test]
    fn sweep_stale_removes_only_dead_supervisors_groups() {
        let s = setup(&STANDARD, true);
        let none = CgroupLimits::default();
        let dead = s.manager.create("111-aa", &none).expect("create");
        dead.add_process(9001).expect("add");
        let alive = s.manager.create("222-bb", &none).expect("create");
        let other = s.manager.create("not-a-pid", &none).expect("create");
        // Leave the dead supervisor's group behind as if it had crashed.
        let mut dead = dead;
        dead.destroyed = true;
        let removed = s
            .manager
            .sweep_stale(&|name: &str| name.starts_with("111-"));
        assert_eq!(removed, 1);
        for c in STANDARD {
            let base = s.root.join(c).join("runcell");
            assert!(!base.join("111-aa").exists(), "{c}");
            assert!(base.join("222-bb").exists(), "{c}");
            assert!(base.join("not-a-pid").exists(), "{c}");
        }
        assert_eq!(s.fake.killed(), vec![9001]);
        assert_eq!(s.manager.sweep_stale(&|_: &str| false), 0);
        drop((alive, other));
    }
}
