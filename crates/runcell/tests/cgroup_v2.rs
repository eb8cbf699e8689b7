//! runcell on cgroup v2 started from a shell that shares its cgroup: as root at the root of a
//! container's cgroup namespace, and as an unprivileged user in a delegated group. The kernel's
//! no-internal-processes rule forbids a group that holds processes (the shell) from enabling
//! controllers for children, so runcell must move the shell out along with itself (before,
//! every run failed with EBUSY; found by scripts/cgroup-v2-guest.sh).
//!
//! They need a cgroup v2 host; on a v1 host they are ignored, and scripts/cgroup-v2-guest.sh
//! runs them in a v2 VM (`--include-ignored`).

mod common;
use common::*;

use std::fs;
use std::path::{Path, PathBuf};

/// A group of the host's v2 tree made for one test, removed with whatever runcell left under
/// it (its base group and its `supervisor` leaf, once their processes are gone).
struct TestGroup {
    path: PathBuf,
}

impl TestGroup {
    fn new(tag: &str) -> TestGroup {
        assert_eq!(
            host_cgroup_version(),
            "v2",
            "built for a cgroup v2 host (cfg host_cgroup_v2) but running on another; rebuild"
        );
        let path =
            Path::new("/sys/fs/cgroup").join(format!("runcell-test-{tag}-{}", std::process::id()));
        fs::create_dir(&path).expect("create the test's cgroup");
        TestGroup { path }
    }

    fn str(&self) -> &str {
        self.path.to_str().expect("UTF-8 path")
    }

    /// The groups below it, by name.
    fn children(&self, below: &str) -> Vec<String> {
        fs::read_dir(self.path.join(below))
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.path().is_dir())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for TestGroup {
    fn drop(&mut self) {
        fn remove(dir: &Path) {
            if let Ok(rd) = fs::read_dir(dir) {
                for e in rd.flatten() {
                    if e.path().is_dir() {
                        remove(&e.path());
                    }
                }
            }
            let _ = fs::remove_dir(dir);
        }
        remove(&self.path);
    }
}

const BOMB: &str = "b = bytearray(1 << 30)\nprint(len(b))";

#[test]
#[cfg_attr(
    not(all(host_root, host_cgroup_v2, host_unshare)),
    ignore = "needs root, a cgroup v2 host and unshare (scripts/cgroup-v2-guest.sh)"
)]
fn root_in_a_container_cgroup_namespace_with_its_shell_gets_v2_limits() {
    let group = TestGroup::new("ctr");
    // The shell joins the group, then becomes a "container": a cgroup namespace rooted at the
    // group, cgroup2 mounted afresh in a mount namespace of its own. It stays in the group
    // while runcell runs (runcell is its child, not exec'd).
    let script = format!(
        "echo $$ > {grp}/cgroup.procs && exec unshare --cgroup --mount --propagation private \
         sh -c 'umount -l /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup && \
         {runcell} run --json --memory 64M -c \"{BOMB}\"; echo'",
        grp = group.str(),
        runcell = runcell_bin().display(),
    );
    let r = run_argv(&["sh".into(), "-c".into(), script], |_| {});
    assert_eq!(r.verdict["enforcement"]["cgroup"], "v2", "{:#}", r.verdict);
    r.assert_category("memory_limit");
    // The shell and runcell were moved into the leaf; runcell's run group is gone.
    assert_eq!(
        fs::read_to_string(group.path.join("cgroup.procs"))
            .unwrap()
            .trim(),
        ""
    );
    assert!(
        group.children("runcell").is_empty(),
        "{:?}",
        group.children("runcell")
    );
}

#[test]
#[cfg_attr(
    not(all(host_root, host_cgroup_v2, host_setpriv)),
    ignore = "needs root, a cgroup v2 host and setpriv (scripts/cgroup-v2-guest.sh)"
)]
fn unprivileged_in_a_delegated_group_with_its_shell_gets_v2_limits() {
    let group = TestGroup::new("deleg");
    // Delegation, as systemd does it for `Delegate=yes`: the directory and the files that
    // create groups and move processes belong to the user.
    for f in [
        "",
        "cgroup.procs",
        "cgroup.subtree_control",
        "cgroup.threads",
    ] {
        let p = group.path.join(f);
        std::os::unix::fs::chown(&p, Some(65534), Some(65534)).expect("chown");
    }
    let script = format!(
        "echo $$ > {grp}/cgroup.procs && exec setpriv --reuid=65534 --regid=65534 --clear-groups \
         sh -c '{runcell} run --json --memory 64M -c \"{BOMB}\"; echo'",
        grp = group.str(),
        runcell = runcell_bin().display(),
    );
    let r = run_argv(&["sh".into(), "-c".into(), script], |_| {});
    let e = &r.verdict["enforcement"];
    assert_eq!(e["cgroup"], "v2", "{:#}", r.verdict);
    assert_eq!(e["rootless"], true, "{e:#}");
    r.assert_category("memory_limit");
    assert_eq!(
        fs::read_to_string(group.path.join("cgroup.procs"))
            .unwrap()
            .trim(),
        ""
    );
    // Unprivileged, runcell makes its run groups in its own group, next to the leaf.
    assert_eq!(group.children(""), ["supervisor"]);
}
