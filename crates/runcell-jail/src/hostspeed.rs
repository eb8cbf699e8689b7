//! Host settings that make a sandbox start faster, for `runcell doctor` to recommend. runcell
//! only reads them: each is host-wide, with costs for everything else on the host, and is the
//! operator's decision (runcell never changes a host setting itself).
//!
//! The wait they remove: on cgroup v1, moving pid 1 into the run's groups (a `cgroup.procs`
//! write, step H7) makes the kernel take its global threadgroup lock for writing, which first
//! waits for an RCU grace period whenever no other such write happened in the last one (6-12
//! ms measured on a 2-CPU v1 host, 0.2 ms with expedited grace periods). runcell overlaps it
//! with pid 1's mounts, but on a small host it is still the longest wait of a cold start. On
//! cgroup v2 runcell creates pid 1 inside its group (`clone3(CLONE_INTO_CGROUP)`) and does not
//! write `cgroup.procs` at all.

use std::path::Path;

use crate::cgroup::CgroupVersion;

/// Where the kernel says whether normal RCU grace periods are expedited.
pub const RCU_EXPEDITED: &str = "/sys/kernel/rcu_expedited";

/// One host setting and what runcell makes of it here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartupHint {
    /// The setting, as an operator would look it up.
    pub setting: &'static str,
    /// Its value on this host, in words.
    pub state: String,
    /// Whether changing it would make runcell's cold start faster on this host.
    pub recommended: bool,
    /// What it gains and how to set it.
    pub advice: &'static str,
    /// What it costs the rest of the host.
    pub trade_off: &'static str,
}

/// The hints for a host with `cgroup` (what runcell uses; `None`: no cgroups) and the RCU
/// setting read from `rcu_expedited` (normally [`RCU_EXPEDITED`]).
pub fn startup_hints(cgroup: Option<CgroupVersion>, rcu_expedited: &Path) -> Vec<StartupHint> {
    let mut hints = Vec::new();
    let v1 = cgroup == Some(CgroupVersion::V1);
    let expedited = std::fs::read_to_string(rcu_expedited)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    hints.push(StartupHint {
        setting: "cgroup v2 (unified hierarchy)",
        state: match cgroup {
            Some(CgroupVersion::V2) => "in use".into(),
            Some(CgroupVersion::V1) => "not in use: runcell uses cgroup v1".into(),
            None => "no cgroup runcell can use".into(),
        },
        recommended: v1,
        advice: "on v2 runcell creates each sandbox's pid 1 directly in its group \
                 (clone3 CLONE_INTO_CGROUP): no cgroup.procs write and no RCU wait at start. \
                 Boot with systemd.unified_cgroup_hierarchy=1 or \
                 cgroup_no_v1=all",
        trade_off: "host-wide and needs a reboot; everything else on the host that uses \
                    cgroups (container runtimes, monitoring, older JVMs) must support v2",
    });
    hints.push(StartupHint {
        setting: "/sys/kernel/rcu_expedited",
        state: match expedited {
            Some(0) => "0 (normal grace periods)".into(),
            Some(n) => format!("{n} (expedited)"),
            None => format!("unknown ({} unreadable)", rcu_expedited.display()),
        },
        recommended: v1 && expedited == Some(0),
        advice: "on cgroup v1 the first cgroup.procs write of a moment waits for an RCU grace \
                 period (6-12 ms measured on a 2-CPU host; 0.2 ms expedited), about half of \
                 runcell's start-up cost there. `echo 1 > /sys/kernel/rcu_expedited` (until \
                 reboot) or boot with rcupdate.rcu_expedited=1",
        trade_off: "host-wide: every synchronize_rcu() in the kernel interrupts all CPUs \
                    (IPIs) instead of waiting, which costs CPU time and adds latency jitter to \
                    everything else, more so with many CPUs; not for real-time or \
                    latency-sensitive hosts. Unneeded on cgroup v2",
    });
    hints
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hints(cgroup: Option<CgroupVersion>, rcu: Option<&str>) -> Vec<StartupHint> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("rcu_expedited");
        if let Some(v) = rcu {
            std::fs::write(&path, v).expect("write");
        }
        startup_hints(cgroup, &path)
    }

    fn recommended(h: &[StartupHint]) -> Vec<&'static str> {
        h.iter()
            .filter(|h| h.recommended)
            .map(|h| h.setting)
            .collect()
    }

    #[test]
    fn a_v1_host_with_normal_grace_periods_gets_both_hints() {
        let h = hints(Some(CgroupVersion::V1), Some("0\n"));
        assert_eq!(
            recommended(&h),
            ["cgroup v2 (unified hierarchy)", "/sys/kernel/rcu_expedited"]
        );
        assert!(h.iter().all(|h| !h.trade_off.is_empty()));
    }

    #[test]
    fn expedited_grace_periods_are_recognised() {
        let h = hints(Some(CgroupVersion::V1), Some("1\n"));
        assert_eq!(recommended(&h), ["cgroup v2 (unified hierarchy)"]);
        assert_eq!(h[1].state, "1 (expedited)");
    }

    #[test]
    fn a_v2_host_needs_neither() {
        assert!(recommended(&hints(Some(CgroupVersion::V2), Some("0"))).is_empty());
        assert!(recommended(&hints(None, Some("0"))).is_empty());
    }

    #[test]
    fn an_unreadable_setting_is_said_so_and_not_recommended() {
        let h = hints(Some(CgroupVersion::V1), None);
        assert!(h[1].state.starts_with("unknown"), "{}", h[1].state);
        assert!(!h[1].recommended);
    }
}
