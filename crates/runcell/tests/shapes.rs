//! The permission shapes of a container, reproduced without one (issue 23): root inside a user
//! namespace that maps part of the ids (a pod with `hostUsers: false`, podman `--uidmap
//! 0:200000:65536`), with and without a mount namespace of its own (podman rows K and L of
//! docs/isolation.md), root mapped onto one id only (`unshare --map-root-user`), and host root
//! without CAP_MKNOD. Each runs `print(1)` with the layers its verdict claims, and `--strict`
//! refuses where one is missing, naming it.

mod common;
use common::*;

use std::fs;
use std::io::Write;
use std::process::Command;
use std::time::{Duration, Instant};

/// The map of a user-namespaced pod or `podman --uidmap 0:200000:65536`.
const POD_MAP: &str = "0 200000 65536\n";

/// The layers every shape has: all namespaces, seccomp, full Landlock.
fn assert_core_layers(e: &serde_json::Value) {
    assert_eq!(
        e["namespaces"],
        serde_json::json!(["user", "pid", "mount", "net", "ipc", "uts", "cgroup"]),
        "{e:#}"
    );
    assert_eq!(e["seccomp"], true, "{e:#}");
    assert_eq!(e["landlock"], "full", "{e:#}");
}

/// `runcell run --json ARGS` as uid 0 of a new user namespace mapped with `map` (for uids
/// and gids), which has a mount namespace of its own when `own_mounts`. A sleeper holds the
/// namespaces; this process (host root) writes their maps as a container runtime does, and
/// `nsenter` starts runcell in them as the namespace's root. (A process that entered the
/// namespace before its maps existed would have lost its capabilities at its next exec.)
fn as_namespaced_root(map: &str, own_mounts: bool, args: &[&str]) -> Run {
    let mut argv = vec!["run".to_string(), "--json".to_string()];
    argv.extend(args.iter().map(|s| s.to_string()));
    in_namespace(map, own_mounts, &argv, |argv| run_argv(&argv, |_| {}))
}

/// Call `f` with a command line that runs `runcell ARGS` as root of a new user namespace
/// mapped with `map` (see `as_namespaced_root`).
fn in_namespace<T>(
    map: &str,
    own_mounts: bool,
    args: &[String],
    f: impl FnOnce(Vec<String>) -> T,
) -> T {
    let mut holder = Command::new("unshare");
    holder.arg("--user");
    if own_mounts {
        holder.args(["--mount", "--propagation", "private"]);
    }
    let mut holder = KillOnDrop(holder.args(["sleep", "1000"]).spawn().unwrap());
    let ours = fs::read_link("/proc/self/ns/user").unwrap();
    let theirs = format!("/proc/{}/ns/user", holder.0.id());
    let deadline = Instant::now() + Duration::from_secs(60);
    while fs::read_link(&theirs).ok().as_ref() == Some(&ours) {
        assert!(
            Instant::now() < deadline,
            "unshare never entered a user namespace"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    for file in ["gid_map", "uid_map"] {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .open(format!("/proc/{}/{file}", holder.0.id()))
            .unwrap();
        f.write_all(map.as_bytes()).unwrap();
    }
    let mut argv: Vec<String> = vec![
        "nsenter".into(),
        "--target".into(),
        holder.0.id().to_string(),
        "--user".into(),
    ];
    if own_mounts {
        argv.push("--mount".into());
    }
    argv.extend([
        "--setuid".into(),
        "0".into(),
        "--setgid".into(),
        "0".into(),
        runcell_bin().display().to_string(),
    ]);
    argv.extend(args.iter().cloned());
    let r = f(argv);
    let _ = holder.0.kill();
    let _ = holder.0.wait();
    r
}

/// Kills the namespace holder if the test fails before it does.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The sandbox's view of its own uid map, and the verdict.
fn pod_shape_runs(own_mounts: bool) {
    let r = as_namespaced_root(
        POD_MAP,
        own_mounts,
        &[
            "-c",
            "print(1)\nprint(open('/proc/self/uid_map').read().split())",
        ],
    );
    r.assert_ok();
    let mut lines = r.stdout().lines();
    assert_eq!(lines.next(), Some("1"), "{:#}", r.verdict);
    let e = &r.verdict["enforcement"];
    assert_core_layers(e);
    assert_eq!(e["identity"], "root_in_user_namespace", "{e:#}");
    // No CAP_MKNOD over the host's devices in a user namespace: the host's nodes are bound.
    assert_eq!(e["devices"], "host", "{e:#}");
    assert_eq!(e["rootless"], true, "{e:#}");
    // This host's hierarchy belongs to host root: nothing is delegated to the namespace.
    assert_eq!(e["cgroup"], "none", "{e:#}");
    assert!(
        e["missing"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m.as_str().unwrap().starts_with("cgroup")),
        "{e:#}"
    );
    // A uid of its own, from the namespace's ids above the image's users, never root.
    assert_eq!(e["own_uid"], true, "{e:#}");
    let map = lines.next().unwrap_or_default();
    let fields: Vec<String> = serde_json::from_str(&map.replace('\'', "\"")).unwrap();
    assert_eq!(fields[0], "1000", "{map}");
    assert_eq!(fields[2], "1", "{map}");
    let outside: u32 = fields[1].parse().unwrap();
    assert!((10_000..65_534).contains(&outside), "{map}");
}

#[test]
#[cfg_attr(
    not(all(host_root, host_unshare, host_setpriv)),
    ignore = "needs root, unshare and setpriv (util-linux) to make a user namespace"
)]
fn root_in_a_user_namespace_runs_with_every_layer_but_cgroups() {
    // Podman row K / a pod with hostUsers: false: no mount namespace of its own, so the
    // helper can neither fsopen nor clone layers; pid 1 does what needs doing.
    pod_shape_runs(false);
}

#[test]
#[cfg_attr(
    not(all(host_root, host_unshare, host_setpriv)),
    ignore = "needs root, unshare and setpriv (util-linux) to make a user namespace"
)]
fn root_in_a_user_namespace_that_may_mount_binds_devices_where_mknod_fails() {
    // Podman row L (root in a user namespace with CAP_SYS_ADMIN over its mounts): fsopen
    // works, mknod does not.
    pod_shape_runs(true);
}

#[test]
#[cfg_attr(
    not(all(host_root, host_unshare, host_setpriv)),
    ignore = "needs root, unshare and setpriv (util-linux) to make a user namespace"
)]
fn strict_refuses_root_in_a_user_namespace_without_cgroups() {
    let r = as_namespaced_root(
        POD_MAP,
        false,
        &["--strict", "-c", "open('/tmp/strict-ran', 'w')"],
    );
    r.assert_category("sandbox_failure");
    assert_eq!(r.exit_code(), None, "nothing ran: {:#}", r.verdict);
    assert!(r.message().contains("cgroup"), "{}", r.message());
}

#[test]
#[cfg_attr(
    not(all(host_root, host_unshare)),
    ignore = "needs root and unshare (util-linux) to make a user namespace"
)]
fn root_mapped_onto_one_id_runs_and_says_the_uid_is_shared() {
    // Only uid 0 exists in the namespace: each sandbox maps to it, which the verdict names as
    // missing (and --strict would refuse).
    let argv: Vec<String> = [
        "unshare",
        "--user",
        "--map-root-user",
        &runcell_bin().display().to_string(),
        "run",
        "--json",
        "-c",
        "print(1)",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let r = run_argv(&argv, |_| {});
    r.assert_ok();
    assert_eq!(r.stdout(), "1\n");
    let e = &r.verdict["enforcement"];
    assert_core_layers(e);
    assert_eq!(e["identity"], "root_in_user_namespace", "{e:#}");
    assert_eq!(e["own_uid"], false, "{e:#}");
    assert!(
        e["missing"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m.as_str().unwrap().contains("a uid of its own")),
        "{e:#}"
    );
}

#[test]
#[cfg_attr(
    not(all(host_root, host_setpriv)),
    ignore = "needs root and setpriv (util-linux) to drop CAP_MKNOD"
)]
fn root_without_cap_mknod_binds_the_hosts_device_nodes() {
    let code = py(r#"
with open("/dev/null", "w") as f:
    print("null=" + str(f.write("x")))
print("zero=" + open("/dev/zero", "rb").read(4).hex())
print("urandom=" + str(len(open("/dev/urandom", "rb").read(16))))
print("nodes=" + ",".join(sorted(n for n in os.listdir("/dev") if not os.path.islink("/dev/" + n) and n != "shm")))
"#);
    let argv: Vec<String> = [
        "setpriv",
        "--bounding-set=-mknod",
        "--inh-caps=-mknod",
        &runcell_bin().display().to_string(),
        "run",
        "--json",
        "-c",
        &code,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let r = run_argv(&argv, |_| {});
    r.assert_ok();
    r.expect(&[
        ("null", "1"),
        ("zero", "00000000"),
        ("urandom", "16"),
        ("nodes", "full,null,random,urandom,zero"),
    ]);
    let e = &r.verdict["enforcement"];
    assert_core_layers(e);
    assert_eq!(e["identity"], "root", "{e:#}");
    assert_eq!(e["devices"], "host", "{e:#}");
    assert_eq!(e["own_uid"], true, "{e:#}");
    assert_eq!(e["rootless"], false, "{e:#}");
    // The cgroup is host root's as before (it does not need CAP_MKNOD).
    assert_ne!(e["cgroup"], "none", "{e:#}");
}

#[test]
#[cfg_attr(not(host_root), ignore = "needs root")]
fn host_root_makes_its_own_device_nodes() {
    let r = run("python", "print(1)", &[]);
    r.assert_ok();
    let e = &r.verdict["enforcement"];
    assert_eq!(e["identity"], "root", "{e:#}");
    assert_eq!(e["devices"], "private", "{e:#}");
    assert_eq!(e["own_uid"], true, "{e:#}");
}

#[test]
#[cfg_attr(
    not(all(host_root, host_unshare)),
    ignore = "needs root and unshare (util-linux) to make a user namespace"
)]
fn doctor_as_root_in_a_user_namespace_says_what_is_enforced_and_gives_container_fixes() {
    let out = in_namespace(
        POD_MAP,
        false,
        &["doctor".into(), "--json".into()],
        |argv| Command::new(&argv[0]).args(&argv[1..]).output().unwrap(),
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json: {e}; stderr {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    // A user namespace that is not the initial one: a container, whichever engine.
    assert!(
        report["place"].as_str().unwrap().starts_with("container"),
        "{report:#}"
    );
    assert_eq!(report["identity"], "root_in_user_namespace", "{report:#}");
    let test = &report["sandbox_test"];
    assert_eq!(test["ok"], true, "{report:#}");
    assert_eq!(test["enforcement"]["devices"], "host", "{report:#}");
    assert_eq!(test["enforcement"]["cgroup"], "none", "{report:#}");
    // Missing cgroups: the fix is a container's, not a host's, and the exit code says so.
    let cgroups = report["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "cgroups")
        .expect("a cgroups layer");
    assert_eq!(cgroups["available"], false, "{report:#}");
    let fix = cgroups["fix"].as_str().unwrap();
    assert!(fix.contains("--privileged"), "{fix}");
    assert!(!fix.contains("systemd-run"), "{fix}");
    assert_eq!(out.status.code(), Some(1));
}
