//! Root without usable cgroups (a container with a read-only cgroupfs, say): the kill path
//! must not depend on the cgroup. runcell runs in a private mount namespace of its own where
//! /sys/fs/cgroup is detached; the host's mount table is checked unchanged by the harness.

mod common;

use common::*;

fn without_cgroups(code: &str, extra: &str) -> Run {
    let script = format!(
        "umount -l /sys/fs/cgroup && exec {} run --json --lang bash {extra} -c '{code}'",
        runcell_bin().display()
    );
    let argv: Vec<String> = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        &script,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    run_argv(&argv, |_| {})
}

#[test]
#[cfg_attr(
    not(all(host_root, host_unshare)),
    ignore = "needs root and unshare (util-linux) for a private mount namespace"
)]
fn a_timeout_without_cgroups_leaves_no_process_behind() {
    // Without a cgroup to kill, the pid namespace is what takes every process down: the
    // daemons below (one double-forked, one in its own session) must not survive the timeout.
    // (The helper-kill path is pinned by engine_api::killing_the_helper_kills_the_whole_sandbox.)
    let m = marker("nocg");
    let r = without_cgroups(
        &format!(
            "(exec -a {m} sleep 1000 &) ; setsid bash -c \"exec -a {m} sleep 1000\" & \
             until [ \"$(pgrep -c -f {m})\" = 2 ]; do sleep 0.01; done; \
             echo daemons $(pgrep -c -f {m}); \
             while :; do sleep 1; done"
        ),
        "--timeout 2",
    );
    r.assert_category("timeout");
    assert_eq!(r.verdict["enforcement"]["cgroup"], "none");
    assert_eq!(
        r.stdout(),
        "daemons 2\n",
        "both daemons were running before the timeout"
    );
    assert_marker_gone(&m, LOADED_MARGIN);
}

#[test]
#[cfg_attr(
    not(all(host_root, host_unshare)),
    ignore = "needs root and unshare (util-linux) for a private mount namespace"
)]
fn without_cgroups_the_verdict_says_what_is_missing_and_strict_refuses() {
    let r = without_cgroups("true", "");
    r.assert_ok();
    let missing = r.verdict["enforcement"]["missing"].to_string();
    assert!(missing.contains("cgroup"), "{missing}");
    let r = without_cgroups("true", "--strict");
    r.assert_category("sandbox_failure");
    assert!(r.message().contains("cgroups"), "{}", r.message());
}
