//! Tests against the host's real cgroup v2 hierarchy. They need root and a cgroup2 mount
//! offering the memory controller; anywhere else they report as ignored (the `host_root` and
//! `host_cgroup_v2` cfgs, probed by build.rs), never as passed. On a v1 host,
//! `scripts/cgroup-v2-guest.sh` runs them in a cgroup v2 VM (`--include-ignored`). Every test
//! uses its own base group (`runcell-test-base-<test>-<pid>`), and guards remove groups,
//! children and bases even when an assertion fails.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::real_support::{fixture, gated_shell, read_trimmed, PYTHON};
use super::{CgroupLimits, CgroupVersion, IoLimits};

/// The mount root of the v2 hierarchy `dir` is in (the first ancestor without
/// `cgroup.controllers` is outside it).
fn mount_root(dir: &Path) -> PathBuf {
    dir.ancestors()
        .take_while(|d| d.join("cgroup.controllers").exists())
        .last()
        .expect("a cgroup dir")
        .to_path_buf()
}

fn words(path: &Path) -> Vec<String> {
    read_trimmed(path)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

#[test]
#[cfg_attr(
    not(all(host_root, host_cgroup_v2)),
    ignore = "needs root and a cgroup v2 memory hierarchy (scripts/cgroup-v2-guest.sh runs it)"
)]
fn real_v2_limits_stats_kill_and_destroy() {
    let fx = fixture(CgroupVersion::V2, "basic");
    let name = format!("runcell-test-{}-x", std::process::id());
    let limits = CgroupLimits {
        memory_bytes: Some(256 << 20),
        pids_max: Some(16),
        cpu_millis: Some(500),
        io: None,
    };
    let mut group = fx.manager.create(&name, &limits).expect("create");
    let e = group.enforced();
    assert!(
        e.memory && e.socket_memory && e.pids && e.cpu && e.cpu_accounting,
        "{e:?}"
    );

    // One directory, in the unified tree, with every controller the limits need enabled
    // along the way down to it.
    let dir = group.path().to_path_buf();
    assert_eq!(group.procs_files(), vec![dir.join("cgroup.procs")]);
    let root = mount_root(&dir);
    let base = dir.parent().expect("base");
    for level in [root.as_path(), base] {
        let enabled = words(&level.join("cgroup.subtree_control"));
        for c in ["memory", "pids", "cpu"] {
            assert!(
                enabled.iter().any(|e| e == c),
                "{c} at {}: {enabled:?}",
                level.display()
            );
        }
    }
    assert_eq!(
        read_trimmed(&dir.join("memory.max")),
        (256u64 << 20).to_string()
    );
    let swap = dir.join("memory.swap.max");
    assert_eq!(e.memory_swap, swap.exists());
    if swap.exists() {
        assert_eq!(read_trimmed(&swap), "0");
    }
    assert_eq!(read_trimmed(&dir.join("pids.max")), "16");
    assert_eq!(read_trimmed(&dir.join("cpu.max")), "50000 100000");
    // The OOM killer takes one process, as anywhere else; a program may survive a child's.
    assert_eq!(read_trimmed(&dir.join("memory.oom.group")), "0");

    let mut child = gated_shell("exec sleep 30");
    group.add_process(child.pid()).expect("add");
    assert_eq!(group.pids(), vec![child.pid()]);
    let relative = dir.strip_prefix(&root).expect("under the mount");
    assert_eq!(
        read_trimmed(&PathBuf::from(format!("/proc/{}/cgroup", child.pid()))),
        format!("0::/{}", relative.display()),
        "the process is in the group"
    );
    // Let it run (and exec) inside the group until there is something to account.
    child.release();
    assert!(
        super::wait_until(Duration::from_secs(5), || {
            let s = group.stats();
            s.cpu_usage_ns.is_some_and(|ns| ns > 0) && s.memory_peak_bytes.is_some_and(|b| b > 0)
        }),
        "nothing accounted: {:?}",
        group.stats()
    );
    let stats = group.stats();
    eprintln!("basic: {stats:?}");
    assert_eq!(stats.oom_kills, 0);
    assert_eq!(stats.pids_limit_hits, 0);

    group.kill_all().expect("kill_all");
    let status = child
        .wait_timeout(Duration::from_secs(5))
        .expect("child died");
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");

    group.destroy().expect("destroy");
    assert!(!dir.exists(), "{} still exists", dir.display());
    group.destroy().expect("idempotent");
}

#[test]
#[cfg_attr(
    not(all(host_root, host_cgroup_v2)),
    ignore = "needs root and a cgroup v2 memory hierarchy (scripts/cgroup-v2-guest.sh runs it)"
)]
fn real_v2_oom_kill_is_counted() {
    let fx = fixture(CgroupVersion::V2, "oom");
    let limits = CgroupLimits {
        memory_bytes: Some(64 << 20),
        ..CgroupLimits::default()
    };
    let name = format!("runcell-test-{}-oom", std::process::id());
    let group = fx.manager.create(&name, &limits).expect("create");
    assert!(group.enforced().memory);
    let mut child = gated_shell(&format!(
        "exec {PYTHON} -c 'a = bytearray(200 * 1024 * 1024)'"
    ));
    group.add_process(child.pid()).expect("add");
    child.release();
    let status = child
        .wait_timeout(Duration::from_secs(30))
        .expect("python finished");
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    let stats = group.stats();
    eprintln!("oom: {stats:?}");
    assert!(stats.oom_kills >= 1, "{stats:?}");
    let peak = stats.memory_peak_bytes.expect("peak");
    assert!(
        peak > 32 << 20 && peak <= 80 << 20,
        "peak {peak} near the limit"
    );
}

#[test]
#[cfg_attr(
    not(all(host_root, host_cgroup_v2)),
    ignore = "needs root and a cgroup v2 memory hierarchy (scripts/cgroup-v2-guest.sh runs it)"
)]
fn real_v2_pids_limit_hits_are_counted() {
    let fx = fixture(CgroupVersion::V2, "pids");
    let limits = CgroupLimits {
        pids_max: Some(5),
        ..CgroupLimits::default()
    };
    let name = format!("runcell-test-{}-pids", std::process::id());
    let mut group = fx.manager.create(&name, &limits).expect("create");
    assert!(group.enforced().pids);
    // Each sleep holds its pid until the group is destroyed (a short one could end, on a slow
    // machine, before the shell has started five).
    let sleeps = "sleep 1000 & ".repeat(20);
    let mut child = gated_shell(&format!("{sleeps} wait"));
    group.add_process(child.pid()).expect("add");
    child.release();
    let hit = super::wait_until(Duration::from_secs(10), || {
        group.stats().pids_limit_hits >= 1
    });
    assert!(hit, "{:?}", group.stats());
    assert!(group.pids().len() <= 5, "{:?}", group.pids());
    group.destroy().expect("destroy");
    let status = child
        .wait_timeout(Duration::from_secs(5))
        .expect("shell gone");
    // The shell either gave up on the failed fork or was killed with its children.
    assert!(status.signal() == Some(libc::SIGKILL) || status.code().is_some());
}

#[test]
#[cfg_attr(
    not(all(host_root, host_cgroup_v2)),
    ignore = "needs root and a cgroup v2 memory hierarchy (scripts/cgroup-v2-guest.sh runs it)"
)]
fn real_v2_sweep_removes_groups_of_dead_supervisors() {
    let fx = fixture(CgroupVersion::V2, "sweep");
    let dead_pid: u32 = 999_999_999;
    let none = CgroupLimits::default();
    let mut dead = fx
        .manager
        .create(&format!("{dead_pid}-stale"), &none)
        .expect("create");
    let live = fx
        .manager
        .create(&format!("{}-live", std::process::id()), &none)
        .expect("create");
    let mut child = gated_shell("exec sleep 30");
    dead.add_process(child.pid()).expect("add");
    let dead_dir = dead.path().to_path_buf();
    // As if the supervisor had crashed: nobody destroys this group but the sweep. (The
    // flag is restored right after, so `dead` still cleans up if an assertion fails.)
    dead.destroyed = true;
    let removed = fx
        .manager
        .sweep_stale(&|name: &str| name.starts_with(&format!("{dead_pid}-")));
    dead.destroyed = false;
    assert_eq!(removed, 1);
    assert!(!dead_dir.exists(), "{} still exists", dead_dir.display());
    let status = child.wait_timeout(Duration::from_secs(5)).expect("killed");
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    assert!(live.path().exists(), "a live supervisor's group stays");
}

#[test]
#[cfg_attr(
    not(all(host_root, host_cgroup_v2)),
    ignore = "needs root and a cgroup v2 memory hierarchy (scripts/cgroup-v2-guest.sh runs it)"
)]
fn real_v2_kill_all_stops_a_forking_tree() {
    let fx = fixture(CgroupVersion::V2, "forking");
    let limits = CgroupLimits {
        pids_max: Some(64),
        ..CgroupLimits::default()
    };
    let name = format!("runcell-test-{}-fork", std::process::id());
    let mut group = fx.manager.create(&name, &limits).expect("create");
    // Forks as fast as it can, each child forking again: a moving target for kill.
    let mut child = gated_shell("while :; do (sleep 30 &) ; done");
    group.add_process(child.pid()).expect("add");
    child.release();
    assert!(
        super::wait_until(Duration::from_secs(10), || group.pids().len() > 2),
        "the tree never grew: {:?}",
        group.pids()
    );
    group.kill_all().expect("kill_all");
    assert!(
        super::wait_until(Duration::from_secs(2), || group.is_empty()),
        "still in the group: {:?}",
        group.pids()
    );
    let status = child
        .wait_timeout(Duration::from_secs(5))
        .expect("shell gone");
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    group.destroy().expect("destroy");
}

/// `(major, minor)` of the kernel release, e.g. `(6, 12)`.
fn kernel_version() -> (u32, u32) {
    let release = read_trimmed(Path::new("/proc/sys/kernel/osrelease"));
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let mut next = || parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (next(), next())
}

/// A step's peak memory is measured from a reset (on v2, a write to `memory.peak`, Linux
/// 6.12+): what an earlier step of the same sandbox used must not count.
#[test]
#[cfg_attr(
    not(all(host_root, host_cgroup_v2)),
    ignore = "needs root and a cgroup v2 memory hierarchy (scripts/cgroup-v2-guest.sh runs it)"
)]
fn real_v2_peak_reset_is_per_descriptor() {
    let fx = fixture(CgroupVersion::V2, "peak");
    let name = format!("runcell-test-{}-peak", std::process::id());
    let group = fx
        .manager
        .create(&name, &CgroupLimits::default())
        .expect("create");
    // Touches 96 MiB, frees it, and stays.
    let mut child = gated_shell(&format!(
        "exec {PYTHON} -c 'import time; a = bytearray(96 << 20); del a; time.sleep(30)'"
    ));
    group.add_process(child.pid()).expect("add");
    child.release();
    let current = group.path().join("memory.current");
    let freed = super::wait_until(Duration::from_secs(20), || {
        group.stats().memory_peak_bytes.unwrap_or(0) >= 96 << 20
            && read_trimmed(&current).parse::<u64>().unwrap_or(u64::MAX) < 48 << 20
    });
    assert!(
        freed,
        "{:?}, current {}",
        group.stats(),
        read_trimmed(&current)
    );
    group.reset_peak();
    let kept = group
        .peak_fd
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .is_some();
    if kernel_version() >= (6, 12) {
        assert!(kept, "the kernel takes a reset of memory.peak since 6.12");
        let after = group.stats().memory_peak_bytes.expect("peak");
        assert!(after < 48 << 20, "peak after the reset: {after}");
        // The reset is the descriptor's own: the file read afresh still has the old peak.
        let fresh: u64 = read_trimmed(&group.path().join("memory.peak"))
            .parse()
            .expect("number");
        assert!(fresh >= 96 << 20, "{fresh}");
    } else {
        assert!(!kept, "memory.peak is read-only before 6.12");
    }
    drop(child);
}

/// `io.max` on a real disk: the kernel takes the line runcell writes, all four limits at once.
/// (The host's own disk is in limits.rs; in the VM the files are on 9p, so the VM's virtio
/// disk stands in.)
#[test]
#[cfg_attr(
    not(all(host_root, host_cgroup_v2)),
    ignore = "needs root and a cgroup v2 memory hierarchy (scripts/cgroup-v2-guest.sh runs it)"
)]
fn real_v2_io_max_is_written_for_a_real_disk() {
    let fx = fixture(CgroupVersion::V2, "io");
    // A whole disk backed by a device (loop and ram disks have no `device`).
    let disk = std::fs::read_dir("/sys/block")
        .expect("/sys/block")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("device").exists())
        .expect("a disk in /sys/block");
    let dev = read_trimmed(&disk.join("dev"));
    let (major, minor) = dev.split_once(':').expect("major:minor");
    let io = IoLimits {
        device: (major.parse().expect("major"), minor.parse().expect("minor")),
        read_bps: 8 << 20,
        write_bps: 4 << 20,
        read_iops: 1000,
        write_iops: 500,
    };
    let name = format!("runcell-test-{}-io", std::process::id());
    let group = fx
        .manager
        .create(
            &name,
            &CgroupLimits {
                io: Some(io),
                ..CgroupLimits::default()
            },
        )
        .expect("create");
    assert!(group.enforced().io);
    assert_eq!(
        read_trimmed(&group.path().join("io.max")),
        format!("{dev} rbps=8388608 wbps=4194304 riops=1000 wiops=500")
    );
}
