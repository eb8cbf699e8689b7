//! Cgroup v1: taking the migration lock's slow start off a cold run's path.
//!
//! Every write to a `cgroup.procs` file takes the cgroup core's global threadgroup lock for
//! writing. The first such write after a quiet moment flips that per-CPU lock into its slow
//! mode, which waits for an RCU grace period: 6–16 ms on this 2-CPU v1 host (0.2 ms with
//! `/sys/kernel/rcu_expedited`, a host-wide setting runcell never changes). The lock stays in
//! slow mode for one or two grace periods after the write, and a write in that window costs
//! 0.05–0.2 ms (measured: a second write 1–12 ms after the first took 0.03–0.2 ms; one 20 ms
//! after, 7.8 ms again).
//!
//! A cold run writes the pid of its sandbox's pid 1 into the run's group (the helper's step
//! H7) about 5 ms after `runcell run` starts (the CLI's set-up, then the helper's exec). So
//! the run first has a thread write the supervisor's own pid into the group the supervisor
//! is already in: a migration that moves nothing, but that pays the grace period while the
//! supervisor goes on with its set-up, so that the helper's real write lands in the cheap
//! window. Nothing changes on the host: the process stays where it was, and a write that
//! is refused (an unprivileged caller) costs nothing and is ignored.
//!
//! On cgroup v2 runcell creates pid 1 in its group (`CLONE_INTO_CGROUP`), without any
//! `cgroup.procs` write, so there is nothing to warm: [`own_v1_procs_file`] finds no v1
//! hierarchy.

use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// The v1 controllers whose hierarchy is used, in order of preference: any v1 hierarchy
/// shares the one global lock, these are the ones runcell's groups live in.
const PREFERRED: [&str; 4] = ["pids", "memory", "cpu", "cpuacct"];

/// The `cgroup.procs` file of the group this process is in, in a v1 hierarchy mounted under
/// `cgroup_root` (normally `/sys/fs/cgroup`), from the text of `/proc/self/cgroup`. `None`
/// when the process is in no v1 hierarchy (a pure v2 host) or the file is not there.
pub fn own_v1_procs_file(proc_self_cgroup: &str, cgroup_root: &Path) -> Option<PathBuf> {
    let mut found: Vec<(usize, PathBuf)> = Vec::new();
    for line in proc_self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        // `0::/...` is the v2 line; `name=systemd` is a named hierarchy without controllers.
        if controllers.is_empty() || controllers.starts_with("name=") {
            continue;
        }
        let Some(rank) = controllers
            .split(',')
            .filter_map(|c| PREFERRED.iter().position(|p| *p == c))
            .min()
        else {
            continue;
        };
        // A path from the kernel is absolute and normal; anything else is not followed.
        let relative = Path::new(path.trim_start_matches('/'));
        if !path.starts_with('/')
            || relative
                .components()
                .any(|c| !matches!(c, Component::Normal(_)))
        {
            continue;
        }
        let file = cgroup_root
            .join(controllers)
            .join(relative)
            .join("cgroup.procs");
        if file.is_file() {
            found.push((rank, file));
        }
    }
    found
        .into_iter()
        .min_by_key(|(rank, _)| *rank)
        .map(|(_, f)| f)
}

/// One warm-up at a time: a burst of cold runs shares the grace period anyway.
static IN_FLIGHT: AtomicBool = AtomicBool::new(false);

/// Start paying the migration lock's grace period now, on a thread of its own, by writing
/// this process's pid into the v1 group it is already in (see the module docs). Returns at
/// once; does nothing on a host without v1 hierarchies, or while another warm-up runs.
pub fn warm_migrations(proc_self_cgroup: &Path, cgroup_root: &Path) {
    if IN_FLIGHT.swap(true, Ordering::AcqRel) {
        return;
    }
    let Some(file) = std::fs::read_to_string(proc_self_cgroup)
        .ok()
        .and_then(|text| own_v1_procs_file(&text, cgroup_root))
    else {
        IN_FLIGHT.store(false, Ordering::Release);
        return;
    };
    let spawned = std::thread::Builder::new()
        .name("cgroup-warm".into())
        .spawn(move || {
            // The pid names this whole process (its thread group): it is in this group
            // already, so the kernel moves nothing. A refusal is fine: then it was no help.
            if let Ok(mut f) = std::fs::OpenOptions::new().write(true).open(&file) {
                let _ = f.write_all(std::process::id().to_string().as_bytes());
            }
            IN_FLIGHT.store(false, Ordering::Release);
        });
    if spawned.is_err() {
        IN_FLIGHT.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(dirs: &[&str]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        for d in dirs {
            let dir = root.path().join(d);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("cgroup.procs"), "").unwrap();
        }
        root
    }

    #[test]
    fn the_own_group_of_a_v1_host_is_found_preferring_pids() {
        let root = tree(&["pids", "memory/process_api/abc", "cpu,cpuacct/user.slice"]);
        let text = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/abc\n\
                    2:cpu,cpuacct:/user.slice\n0::/\n";
        assert_eq!(
            own_v1_procs_file(text, root.path()),
            Some(root.path().join("pids/cgroup.procs"))
        );
        // Without pids: memory; the co-mounted cpu,cpuacct directory comes after it.
        let text = "4:memory:/process_api/abc\n2:cpu,cpuacct:/user.slice\n";
        assert_eq!(
            own_v1_procs_file(text, root.path()),
            Some(root.path().join("memory/process_api/abc/cgroup.procs"))
        );
        let text = "2:cpu,cpuacct:/user.slice\n";
        assert_eq!(
            own_v1_procs_file(text, root.path()),
            Some(root.path().join("cpu,cpuacct/user.slice/cgroup.procs"))
        );
    }

    #[test]
    fn nothing_on_v2_for_named_hierarchies_missing_files_or_odd_paths() {
        let root = tree(&["pids", "systemd", "unified"]);
        for text in [
            "0::/user.slice/session-1.scope\n",
            "1:name=systemd:/\n0::/\n",
            "5:pids:/gone\n",
            "5:pids:/../../etc\n",
            "5:pids:relative\n",
            "garbage\n",
            "",
        ] {
            assert_eq!(own_v1_procs_file(text, root.path()), None, "{text:?}");
        }
    }

    #[test]
    fn warming_writes_the_own_pid_into_the_own_group_once_at_a_time() {
        let root = tree(&["pids/runs"]);
        let self_cgroup = root.path().join("self-cgroup");
        std::fs::write(&self_cgroup, "3:pids:/runs\n0::/\n").unwrap();
        warm_migrations(&self_cgroup, root.path());
        let procs = root.path().join("pids/runs/cgroup.procs");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::fs::read_to_string(&procs).unwrap().is_empty() {
            assert!(std::time::Instant::now() < deadline, "nothing written");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(
            std::fs::read_to_string(&procs).unwrap(),
            std::process::id().to_string()
        );
        while IN_FLIGHT.load(Ordering::Acquire) {
            assert!(
                std::time::Instant::now() < deadline,
                "the warm-up never ended"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // A v2-only host: nothing to do, and nothing left in flight.
        std::fs::write(&self_cgroup, "0::/\n").unwrap();
        warm_migrations(&self_cgroup, root.path());
        assert!(!IN_FLIGHT.load(Ordering::Acquire));
    }
}
