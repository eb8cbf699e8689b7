//! The CLI contract: verdict shape, languages, exit codes, invalid input.

mod common;
use common::*;

#[test]
fn python_prints_and_the_verdict_has_every_contract_field() {
    let r = run("python", "print(1)", &[]);
    r.assert_ok();
    assert_eq!(r.stdout(), "1\n");
    assert!(
        r.stderr.is_empty(),
        "--json must print nothing else: {}",
        r.stderr
    );
    let v = &r.verdict;
    for k in [
        "stdout",
        "stderr",
        "exit_code",
        "execution_time",
        "stdout_truncated",
        "stderr_truncated",
        "error",
        "usage",
        "files",
        "enforcement",
    ] {
        assert!(v.get(k).is_some(), "missing {k}: {v:#}");
    }
    assert!(v["usage"]["cpu_time"].as_f64().is_some());
    assert!(v["usage"]["peak_memory_bytes"].as_u64().unwrap() > 0);
    assert!(v["execution_time"].as_f64().unwrap() > 0.0);
    let e = &v["enforcement"];
    assert_eq!(
        e["namespaces"],
        serde_json::json!(["user", "pid", "mount", "net", "ipc", "uts", "cgroup"])
    );
    assert_eq!(e["seccomp"], true);
    assert_eq!(e["landlock"], "full");
    assert_eq!(e["cgroup"], host_cgroup_version());
    assert_eq!(r.code, Some(0));
}
