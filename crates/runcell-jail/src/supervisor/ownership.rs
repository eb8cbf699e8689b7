//! Who owns a sandbox's cgroup, and how groups outlive their owner only briefly.
//!
//! Each sandbox gets its own group under the host's `runcell` group, named after the
//! supervisor that created it. A supervisor killed with SIGKILL cannot remove its groups; its
//! sandboxes died with it (the lifeline), so only empty directories remain, and the next
//! supervisor on the host removes those whose owner is no longer running. A group whose
//! removal failed at teardown is kept and retried whenever a sandbox is created.

use std::sync::{Mutex, OnceLock};

use crate::cgroup::{Cgroup, CgroupManager, CgroupVersion};

/// Where the kernel describes this process's mounts and cgroups.
const SELF_MOUNTINFO: &str = "/proc/self/mountinfo";
pub(super) const SELF_CGROUP: &str = "/proc/self/cgroup";
/// Where the cgroup hierarchies are mounted (v1: one directory per controller below it).
pub(super) const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// The group under which every sandbox's group is created.
const BASE_GROUP: &str = "runcell";

/// The host's cgroup hierarchy, discovered once per process.
pub(crate) fn cgroup_manager() -> Option<&'static CgroupManager> {
    static MANAGER: OnceLock<Option<CgroupManager>> = OnceLock::new();
    MANAGER
        .get_or_init(|| {
            let m =
                CgroupManager::discover(SELF_MOUNTINFO.as_ref(), SELF_CGROUP.as_ref(), BASE_GROUP)
                    .ok()
                    .flatten()?;
            // Groups left by a supervisor that was SIGKILLed: their processes died with it (the
            // lifeline), only the empty directories remain.
            m.sweep_stale(&|name| {
                group_is_stale(name, &self_identity(), &|pid| process_start(pid))
            });
            Some(m)
        })
        .as_ref()
}

/// The host's cgroup version, if runcell can use cgroups here.
pub fn cgroup_version() -> Option<CgroupVersion> {
    cgroup_manager().map(CgroupManager::version)
}

/// Groups whose removal failed at teardown (a process in uninterruptible sleep, say); retried
/// whenever a sandbox is created, so a long-running server does not leak them.
fn pending_removal() -> &'static Mutex<Vec<Cgroup>> {
    static PENDING: OnceLock<Mutex<Vec<Cgroup>>> = OnceLock::new();
    PENDING.get_or_init(Default::default)
}

/// Keep a group whose removal failed, to retry later. It is not dropped: `Drop` would wait for
/// it all over again.
pub(super) fn defer_removal(cg: Cgroup) {
    pending_removal()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(cg);
}

pub(super) fn retry_pending_removals() {
    let mut pending = pending_removal().lock().unwrap_or_else(|p| p.into_inner());
    // Only the empty ones: destroy() on a busy group would wait for it.
    pending.retain_mut(|cg| !(cg.is_empty() && cg.destroy().is_ok()));
}

/// Start paying cgroup v1's migration grace period now (`cgroup::warm_migrations`).
pub(super) fn warm_cgroup_migrations() {
    crate::cgroup::warm_migrations(SELF_CGROUP.as_ref(), CGROUP_ROOT.as_ref());
}

/// A fresh group name for a template of this supervisor (`template`): a sandbox's name with
/// `-template` after it, so that the sweep of a dead supervisor's groups finds it too.
pub(crate) fn template_group_name() -> String {
    format!("{}-template", new_group_name())
}

/// A fresh group name for a sandbox of this supervisor.
pub(super) fn new_group_name() -> String {
    group_name(&self_identity(), random_u64())
}

/// Who owns a cgroup: the supervisor's pid, its pid namespace, and its start time (so that a
/// reused pid, or a supervisor with the same pid in another container sharing the cgroup
/// hierarchy, is never mistaken for the owner).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Owner {
    pid: u32,
    pidns: u64,
    start: u64,
}

fn self_identity() -> Owner {
    let pid = std::process::id();
    Owner {
        pid,
        pidns: std::fs::metadata("/proc/self/ns/pid")
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            .unwrap_or(0),
        start: process_start(pid).unwrap_or(0),
    }
}

/// A process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat).
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// `<pid>-<pid namespace inode>-<start time>-<random>`.
fn group_name(owner: &Owner, random: u64) -> String {
    format!(
        "{}-{}-{}-{random:016x}",
        owner.pid, owner.pidns, owner.start
    )
}

/// A group is stale when its owner, in our pid namespace, is no longer running (its pid is
/// gone or belongs to a process that started at another time). Groups of other pid
/// namespaces are left alone: we cannot see their supervisors.
fn group_is_stale(name: &str, me: &Owner, start_of: &dyn Fn(u32) -> Option<u64>) -> bool {
    let mut parts = name.split('-');
    let (Some(pid), Some(pidns), Some(start), Some(_)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let (Ok(pid), Ok(pidns), Ok(start)) = (
        pid.parse::<u32>(),
        pidns.parse::<u64>(),
        start.parse::<u64>(),
    ) else {
        return false;
    };
    if pidns != me.pidns || (pid == me.pid && start == me.start) {
        return false;
    }
    start_of(pid) != Some(start)
}

pub(super) fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    let _ = rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty());
    u64::from_ne_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_groups_are_recognised_by_pid_namespace_and_start_time() {
        let me = Owner {
            pid: 100,
            pidns: 7,
            start: 555,
        };
        let name = |pid: u32, ns: u64, start: u64| {
            group_name(
                &Owner {
                    pid,
                    pidns: ns,
                    start,
                },
                1,
            )
        };
        let running = |pid: u32| match pid {
            200 => Some(900),
            _ => None,
        };
        assert!(
            !group_is_stale(&name(100, 7, 555), &me, &running),
            "our own"
        );
        assert!(
            !group_is_stale(&name(200, 7, 900), &me, &running),
            "a live supervisor"
        );
        assert!(
            group_is_stale(&name(200, 7, 800), &me, &running),
            "pid reused by another process"
        );
        assert!(
            group_is_stale(&name(300, 7, 1), &me, &running),
            "owner gone"
        );
        assert!(
            !group_is_stale(&name(300, 8, 1), &me, &running),
            "another pid namespace"
        );
        assert!(!group_is_stale("not-ours", &me, &running));
        assert!(!group_is_stale("12-abc", &me, &running), "unknown format");
    }

    #[test]
    fn process_start_reads_proc_stat() {
        assert!(process_start(std::process::id()).unwrap() > 0);
        assert_eq!(process_start(u32::MAX), None);
    }
}
