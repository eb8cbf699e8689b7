//! Tests against the host's real cgroup v1 hierarchies. They need root and a v1 memory
//! hierarchy; anywhere else they report as ignored (the `host_root` and `host_cgroup_v1`
//! cfgs, probed by build.rs), never as passed. Every test uses its own base group
//! (`runcell-test-base-<test>-<pid>`), and guards remove groups, children and bases even
//! when an assertion fails.

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use super::real_support::{dirs_of, fixture, gated_shell, read_trimmed, PYTHON};
use super::{CgroupLimits, CgroupVersion};

#[test]
#[cfg_attr(
    not(all(host_root, host_cgroup_v1)),
    ignore = "needs root and a cgroup v1 memory hierarchy"
)]
fn real_v1_limits_stats_kill_and_destroy() {
    let fx = fixture(CgroupVersion::V1, "basic");
    let name = format!("runcell-test-{}-x", std::process::id());
    let limits = CgroupLimits {
        memory_bytes: Some(256 << 20),
        pids_max: Some(16),
        cpu_millis: Some(500),
        io: None,
    };
    let mut group = fx.manager.create(&name, &limits).expect("create");
    let e = group.enforced();
    assert!(e.memory && e.pids && e.cpu && e.cpu_accounting, "{e:?}");

    let mem = group.path().to_path_buf();
    assert!(
        mem.starts_with("/sys/fs/cgroup/memory"),
        "{}",
        mem.display()
    );
    assert_eq!(
        read_trimmed(&mem.join("memory.limit_in_bytes")),
        (256u64 << 20).to_string()
    );
    let memsw = mem.join("memory.memsw.limit_in_bytes");
    assert_eq!(e.memory_swap, memsw.exists());
    if memsw.exists() {
        assert_eq!(read_trimmed(&memsw), (256u64 << 20).to_string());
    }
    let dirs = dirs_of(&group);
    let dir_for = |ctrl: &str| {
        dirs.iter()
            .find(|d| d.components().any(|c| c.as_os_str() == ctrl))
            .unwrap_or_else(|| panic!("no {ctrl} dir in {dirs:?}"))
            .clone()
    };
    assert_eq!(read_trimmed(&dir_for("pids").join("pids.max")), "16");
    let cpu = dir_for("cpu");
    assert_eq!(read_trimmed(&cpu.join("cpu.cfs_period_us")), "100000");
    assert_eq!(read_trimmed(&cpu.join("cpu.cfs_quota_us")), "50000");

    let mut child = gated_shell("exec sleep 30");
    group.add_process(child.pid()).expect("add");
    assert_eq!(group.pids(), vec![child.pid()]);
    for file in group.procs_files() {
        assert_eq!(
            read_trimmed(&file),
            child.pid().to_string(),
            "{}",
            file.display()
        );
    }
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
    assert!(stats.cpu_usage_ns.is_some_and(|ns| ns > 0), "{stats:?}");
    assert!(stats.memory_peak_bytes.is_some_and(|b| b > 0), "{stats:?}");
    assert_eq!(stats.oom_kills, 0);
    assert_eq!(stats.pids_limit_hits, 0);

    group.reset_peak();
    let after = group.stats().memory_peak_bytes.expect("peak after reset");
    assert!(
        after <= stats.memory_peak_bytes.unwrap_or(0),
        "{after} {stats:?}"
    );

    group.kill_all().expect("kill_all");
    let status = child
        .wait_timeout(Duration::from_secs(5))
        .expect("child died");
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");

    group.destroy().expect("destroy");
    for dir in &dirs {
        assert!(!dir.exists(), "{} still exists", dir.display());
    }
    group.destroy().expect("idempotent");
}

#[test]
#[cfg_attr(
    not(all(host_root, host_cgroup_v1)),
    ignore = "needs root and a cgroup v1 memory hierarchy"
)]
fn real_v1_oom_kill_is_counted() {
    let fx = fixture(CgroupVersion::V1, "oom");
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
        .wait_timeout(Duration::from_secs(20))
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
    not(all(host_root, host_cgroup_v1)),
    ignore = "needs root and a cgroup v1 memory hierarchy"
)]
fn real_v1_pids_limit_hits_are_counted() {
    let fx = fixture(CgroupVersion::V1, "pids");
    let limits = CgroupLimits {
        pids_max: Some(5),
        ..CgroupLimits::default()
    };
    let name = format!("runcell-test-{}-pids", std::process::id());
    let mut group = fx.manager.create(&name, &limits).expect("create");
    assert!(group.enforced().pids);
    let sleeps = "sleep 5 & ".repeat(20);
    let mut child = gated_shell(&format!("{sleeps} wait"));
    group.add_process(child.pid()).expect("add");
    child.release();
    let hit = super::wait_until(Duration::from_secs(5), || {
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
    not(all(host_root, host_cgroup_v1)),
    ignore = "needs root and a cgroup v1 memory hierarchy"
)]
fn real_v1_sweep_removes_groups_of_dead_supervisors() {
    let fx = fixture(CgroupVersion::V1, "sweep");
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
    let dead_dirs = dirs_of(&dead);
    // As if the supervisor had crashed: nobody destroys this group but the sweep. (The
    // flag is restored right after, so `dead` still cleans up if an assertion fails.)
    dead.destroyed = true;
    let removed = fx
        .manager
        .sweep_stale(&|name: &str| name.starts_with(&format!("{dead_pid}-")));
    dead.destroyed = false;
    assert_eq!(removed, 1);
    for dir in &dead_dirs {
        assert!(!dir.exists(), "{} still exists", dir.display());
    }
    let status = child.wait_timeout(Duration::from_secs(5)).expect("killed");
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    assert!(live.path().exists(), "a live supervisor's group stays");
}

#[test]
#[cfg_attr(
    not(all(host_root, host_cgroup_v1)),
    ignore = "needs root and a cgroup v1 memory hierarchy"
)]
fn real_v1_kill_all_stops_a_forking_tree() {
    let fx = fixture(CgroupVersion::V1, "forking");
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
        super::wait_until(Duration::from_secs(5), || group.pids().len() > 2),
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
