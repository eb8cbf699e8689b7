//! Isolation: what sandboxed code can see and touch of the host (filesystem, identity,
//! environment, other processes, namespaces). Every test checks the verdict *and* the host.

mod common;
use common::*;

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

// ---------------------------------------------------------------------------------------------
// Filesystem
// ---------------------------------------------------------------------------------------------

#[test]
fn host_secrets_and_system_directories_are_not_visible() {
    let r = run(
        "python",
        &py(r#"
read("shadow", "/etc/shadow")
read("gshadow", "/etc/gshadow")
read("sudoers", "/etc/sudoers")
read("ssh_host_key", "/etc/ssh/ssh_host_ed25519_key")
for d in ["/root", "/run", "/sys", "/boot", "/work", "/mnt", "/opt", "/srv", "/media", "/old_root", "/lost+found"]:
    attempt("ls" + d, lambda: os.listdir(d))
# /home is the sandbox's own: only E2B's home directory, another name for /workspace.
print("home=" + json.dumps([os.listdir("/home"), os.readlink("/home/user"), os.readlink("/app")]))
# /var holds nothing of the host's: only the path down to the (read-only) Python data stack.
print("var=" + json.dumps([sorted(os.listdir(p)) for p in ["/var", "/var/lib", "/var/lib/runcell"]]))
print("stacks=" + json.dumps(sorted(os.listdir("/var/lib/runcell/python"))))
read("dockerenv", "/.dockerenv")
read("container_info", "/container_info.json")
read("runcell_src", "/work/main/Cargo.toml")
"#),
        &[],
    );
    r.assert_ok();
    let mut want = vec![
        ("shadow", "ENOENT"),
        ("gshadow", "ENOENT"),
        ("sudoers", "ENOENT"),
        ("ssh_host_key", "ENOENT"),
    ];
    let dirs = [
        "/root",
        "/run",
        "/sys",
        "/boot",
        "/work",
        "/mnt",
        "/opt",
        "/srv",
        "/media",
        "/old_root",
        "/lost+found",
    ];
    let labels: Vec<String> = dirs.iter().map(|d| format!("ls{d}")).collect();
    for l in &labels {
        want.push((l.as_str(), "ENOENT"));
    }
    want.extend([
        ("dockerenv", "ENOENT"),
        ("container_info", "ENOENT"),
        ("runcell_src", "ENOENT"),
    ]);
    r.expect(&want);
    assert_eq!(r.out("var"), r#"[["lib"], ["runcell"], ["python"]]"#);
    assert_eq!(r.out("home"), r#"[["user"], "/workspace", "/workspace"]"#);
    let stacks: Vec<String> = serde_json::from_str(&r.out("stacks")).unwrap();
    assert_eq!(stacks.len(), 1, "only the stack in use: {stacks:?}");
    assert!(stacks[0].starts_with("cp311-"), "{stacks:?}");
    // The host still has them (the test would be meaningless otherwise).
    assert!(Path::new("/etc/shadow").exists() && Path::new("/root").is_dir());
}

#[test]
fn host_tmp_is_not_the_sandbox_tmp() {
    let id = unique_digits();
    let host = HostFile::create(
        format!("/tmp/runcell-test-host-{id}"),
        format!("secret-{id}").as_bytes(),
    );
    let escape = format!("/tmp/runcell-test-escape-{id}");
    let r = run(
        "python",
        &py(&format!(
            r#"
print("tmp_listing=" + json.dumps(sorted(os.listdir("/tmp"))))
read("host_file", "{host}")
write("create_in_tmp", "{escape}", b"from the sandbox")
read("read_back", "{escape}")
"#,
            host = host.path_str()
        )),
        &[],
    );
    r.assert_ok();
    r.expect(&[
        // Only matplotlib's font cache, seeded by runcell for Python runs.
        ("tmp_listing", "[\".config\"]"),
        ("host_file", "ENOENT"),
        ("create_in_tmp", "OK"),
        ("read_back", "DATA"),
    ]);
    assert_not_on_host(&escape);
    assert_eq!(
        fs::read(&host.path).unwrap(),
        format!("secret-{id}").as_bytes(),
        "host file unchanged"
    );
}

#[test]
fn root_directory_has_only_the_expected_entries() {
    let r = run(
        "python",
        r#"
import os, json
print("root=" + json.dumps(sorted(os.listdir("/"))))
print("etc=" + json.dumps(sorted(os.listdir("/etc"))))
print("ssl=" + json.dumps(sorted(os.listdir("/etc/ssl"))))
import ssl
print("tls_cas=" + str(ssl.create_default_context().cert_store_stats()["x509_ca"]))
for l in ["/bin", "/lib", "/lib64", "/sbin"]:
    print(f"link{l}=" + (os.readlink(l) if os.path.islink(l) else "NOT_A_LINK"))
"#,
        &[],
    );
    r.assert_ok();
    let root: Vec<String> = serde_json::from_str(&r.out("root")).unwrap();
    assert_eq!(
        root,
        [
            // agent-sandbox's base directory: another name of /workspace (a symlink).
            "app",
            "bin",
            "dev",
            "etc",
            "home",
            "lib",
            "lib64",
            "proc",
            "sbin",
            "tmp",
            "usr",
            // Only the path to the read-only Python data stack (see the test above).
            "var",
            "workspace"
        ],
        "ls / in the sandbox"
    );
    let etc: Vec<String> = serde_json::from_str(&r.out("etc")).unwrap();
    assert_eq!(
        etc,
        [
            "alternatives",
            "fonts",
            "group",
            "hostname",
            "hosts",
            "ld.so.cache",
            "nsswitch.conf",
            "passwd",
            // Only its certs/: the public CA certificates TLS clients verify with.
            "ssl"
        ],
        "ls /etc in the sandbox"
    );
    assert!(
        r.out("tls_cas").parse::<u64>().unwrap() > 0,
        "the sandbox's TLS clients find the host's CA certificates"
    );
    assert_eq!(
        r.out("ssl"),
        "[\"certs\"]",
        "only the certificates of /etc/ssl"
    );
    for l in ["/bin", "/lib", "/lib64", "/sbin"] {
        let host = fs::read_link(l)
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "NOT_A_LINK".into());
        assert_eq!(
            r.out(&format!("link{l}")),
            host,
            "{l} is the same symlink as on the host"
        );
    }
}

#[test]
fn etc_passwd_and_group_are_synthetic() {
    let r = run(
        "python",
        r#"
import json, pwd, grp, os
print("passwd=" + json.dumps(open("/etc/passwd").read()))
print("group=" + json.dumps(open("/etc/group").read()))
print("me=" + pwd.getpwuid(os.getuid()).pw_name + ":" + pwd.getpwuid(os.getuid()).pw_dir)
print("mygroup=" + grp.getgrgid(os.getgid()).gr_name)
print("hostname_file=" + open("/etc/hostname").read().strip())
print("hosts_has_localhost=" + str("127.0.0.1" in open("/etc/hosts").read()))
"#,
        &[],
    );
    r.assert_ok();
    let passwd: String = serde_json::from_str(&r.out("passwd")).unwrap();
    let group: String = serde_json::from_str(&r.out("group")).unwrap();
    let users: BTreeSet<&str> = passwd.lines().filter_map(|l| l.split(':').next()).collect();
    assert_eq!(
        users,
        BTreeSet::from(["root", "sandbox", "nobody"]),
        "{passwd}"
    );
    assert!(
        passwd
            .lines()
            .any(|l| l.starts_with("sandbox:x:1000:1000:")),
        "{passwd}"
    );
    // No host account leaks in (the host has several besides root and nobody).
    let host_passwd = fs::read_to_string("/etc/passwd").unwrap();
    let host_only: Vec<&str> = host_passwd
        .lines()
        .filter_map(|l| l.split(':').next())
        .filter(|u| !["root", "nobody"].contains(u))
        .collect();
    assert!(!host_only.is_empty());
    for u in host_only {
        assert!(
            !passwd.contains(&format!("{u}:")),
            "host user {u} visible in the sandbox"
        );
    }
    let groups: BTreeSet<&str> = group.lines().filter_map(|l| l.split(':').next()).collect();
    assert_eq!(
        groups,
        BTreeSet::from(["root", "sandbox", "nogroup"]),
        "{group}"
    );
    r.expect(&[
        ("me", "sandbox:/tmp"),
        ("mygroup", "sandbox"),
        ("hostname_file", "runcell"),
        ("hosts_has_localhost", "True"),
    ]);
}

#[test]
fn system_paths_and_proc_sys_are_read_only() {
    let id = unique_digits();
    let core_pattern_before = fs::read("/proc/sys/kernel/core_pattern").unwrap();
    let hostname_before = fs::read("/etc/hostname").ok();
    let passwd_before = fs::read("/etc/passwd").unwrap();
    let r = run(
        "python",
        &py(&format!(
            r#"
write("usr", "/usr/pwned-{id}")
write("usr_bin", "/usr/bin/pwned-{id}")
write("etc", "/etc/pwned-{id}")
write("root", "/pwned-{id}")
write("etc_passwd", "/etc/passwd", b"root::0:0::/:/bin/sh\n")
write("etc_hostname", "/etc/hostname", b"pwned\n")
write("ld_so_cache", "/etc/ld.so.cache", b"")
write("core_pattern", "/proc/sys/kernel/core_pattern", b"|/tmp/evil")
write("sysrq", "/proc/sysrq-trigger", b"b")
def sysrq_device():
    st = os.stat("/proc/sysrq-trigger")
    print(f"sysrq_rdev={{os.major(st.st_rdev)}}:{{os.minor(st.st_rdev)}}", flush=True)
attempt("sysrq_stat", sysrq_device)
attempt("mkdir_usr", lambda: os.mkdir("/usr/pwned-dir-{id}"))
attempt("unlink_hosts", lambda: os.unlink("/etc/hosts"))
attempt("chmod_python", lambda: os.chmod("/usr/bin/python3", 0o4777))
attempt("symlink_root", lambda: os.symlink("/etc/passwd", "/pwned-link-{id}"))
"#
        )),
        &[],
    );
    r.assert_ok();
    r.expect(&[
        ("usr", "EROFS"),
        ("usr_bin", "EROFS"),
        ("etc", "EROFS"),
        ("root", "EROFS"),
        ("etc_passwd", "EROFS"),
        ("etc_hostname", "EROFS"),
        ("ld_so_cache", "EROFS"),
        ("core_pattern", "EROFS"),
        ("mkdir_usr", "EROFS"),
        ("unlink_hosts", "EROFS"),
        ("chmod_python", "EROFS"),
        ("symlink_root", "EROFS"),
    ]);
    // /proc/sysrq-trigger, where the kernel has it, is masked by a read-only bind of /dev/null.
    // A read-only mount refuses writes to files, directories and links but not to a device
    // node, so the write goes to /dev/null and is swallowed (as /proc/kmsg's is in
    // sensitive_proc_files_are_masked_or_absent); what matters is that it never reaches the
    // kernel's sysrq handler: the file is the null device.
    if Path::new("/proc/sysrq-trigger").exists() {
        assert!(
            matches!(r.out("sysrq").as_str(), "OK" | "EROFS" | "EACCES"),
            "{:#}",
            r.verdict
        );
        assert_eq!(r.out("sysrq_rdev"), "1:3", "masked by /dev/null");
    } else {
        r.expect(&[("sysrq", "ENOENT"), ("sysrq_stat", "ENOENT")]);
    }
    for p in [
        format!("/usr/pwned-{id}"),
        format!("/usr/bin/pwned-{id}"),
        format!("/etc/pwned-{id}"),
        format!("/pwned-{id}"),
        format!("/usr/pwned-dir-{id}"),
        format!("/pwned-link-{id}"),
    ] {
        assert_not_on_host(&p);
    }
    assert_eq!(
        fs::read("/proc/sys/kernel/core_pattern").unwrap(),
        core_pattern_before
    );
    assert_eq!(fs::read("/etc/hostname").ok(), hostname_before);
    assert_eq!(fs::read("/etc/passwd").unwrap(), passwd_before);
}

#[test]
fn workspace_tmp_and_dev_shm_are_writable_and_cwd_is_workspace() {
    let r = run(
        "python",
        &py(r#"
print("cwd=" + os.getcwd())
print("PWD=" + os.environ.get("PWD", ""))
print("HOME=" + os.environ.get("HOME", ""))
for d in ["/workspace", "/tmp", "/dev/shm"]:
    p = d + "/probe.txt"
    write("w" + d, p, b"hello " + d.encode())
    print(f"r{d}=" + open(p).read())
attempt("mkdir", lambda: os.makedirs("/workspace/a/b/c"))
write("relative", "rel.txt", b"relative")
print("rel_abs=" + str(os.path.exists("/workspace/rel.txt")))
print("ls_workspace=" + json.dumps(sorted(os.listdir("/workspace"))))
"#),
        &[],
    );
    r.assert_ok();
    r.expect(&[
        ("cwd", "/workspace"),
        ("PWD", "/workspace"),
        ("HOME", "/tmp"),
        ("w/workspace", "OK"),
        ("w/tmp", "OK"),
        ("w/dev/shm", "OK"),
        ("r/workspace", "hello /workspace"),
        ("r/tmp", "hello /tmp"),
        ("r/dev/shm", "hello /dev/shm"),
        ("mkdir", "OK"),
        ("relative", "OK"),
        ("rel_abs", "True"),
    ]);
    let ls: Vec<String> = serde_json::from_str(&r.out("ls_workspace")).unwrap();
    assert!(
        ls.contains(&"probe.txt".to_string()) && ls.contains(&"rel.txt".to_string()),
        "{ls:?}"
    );
    // Nothing of it appears on the host.
    assert_not_on_host("/workspace");
    assert!(
        !Path::new("/dev/shm/probe.txt").exists(),
        "sandbox /dev/shm is not the host's"
    );
}

/// Checks exactly the lists pid 1 applies (`runcell_core::PROC_*`), so the test cannot drift
/// from the code: every masked file reads empty, every masked directory is an empty read-only
/// tmpfs, every read-only directory is mounted read-only.
#[test]
fn sensitive_proc_files_are_masked_or_absent() {
    use runcell_core::{PROC_MASKED_DIRS, PROC_MASKED_FILES, PROC_READONLY_DIRS};
    let list = |l: &[&str]| serde_json::to_string(l).unwrap();
    let r = run(
        "python",
        &py(&format!(
            r#"
for f in {files}:
    read(f, "/proc/" + f)
def entries_and_ro(d):
    n = len(os.listdir("/proc/" + d))
    ro = bool(os.statvfs("/proc/" + d).f_flag & os.ST_RDONLY)
    print(f"{{d}}_entries={{n}}")
    print(f"{{d}}_ro={{ro}}")
for d in {masked_dirs} + {readonly_dirs}:
    attempt("ls_" + d, lambda: entries_and_ro(d))
write("write_kmsg", "/proc/kmsg", b"x")
read("kmsg_after_write", "/proc/kmsg")
"#,
            files = list(PROC_MASKED_FILES),
            masked_dirs = list(PROC_MASKED_DIRS),
            readonly_dirs = list(PROC_READONLY_DIRS),
        )),
        &[],
    );
    r.assert_ok();
    let got = r.outcomes();
    // /proc/cgroups counts every cgroup of the host: a run saw others start and end.
    assert!(PROC_MASKED_FILES.contains(&"cgroups"));
    for f in PROC_MASKED_FILES {
        let inside = got.get(*f).map(String::as_str);
        // Masked (bound to /dev/null) when the host kernel has the file; absent otherwise.
        if Path::new("/proc").join(f).exists() {
            assert_eq!(
                inside,
                Some("EMPTY"),
                "/proc/{f} must read empty; verdict {:#}",
                r.verdict
            );
        } else {
            assert!(
                matches!(inside, Some("ENOENT") | Some("EMPTY")),
                "/proc/{f}: {inside:?}"
            );
        }
    }
    for d in PROC_MASKED_DIRS {
        if Path::new("/proc").join(d).is_dir() {
            assert_eq!(
                r.out(&format!("{d}_entries")),
                "0",
                "/proc/{d} is masked by an empty tmpfs"
            );
            assert_eq!(r.out(&format!("{d}_ro")), "True", "/proc/{d} is read-only");
        }
    }
    for d in PROC_READONLY_DIRS {
        if Path::new("/proc").join(d).is_dir() {
            assert_eq!(r.out(&format!("ls_{d}")), "OK", "{:#}", r.verdict);
            assert_eq!(r.out(&format!("{d}_ro")), "True", "/proc/{d} is read-only");
        }
    }
    // The mask is /dev/null: a write is refused or swallowed, and the file stays empty.
    assert!(
        matches!(r.out("write_kmsg").as_str(), "OK" | "EROFS" | "EACCES"),
        "{:#}",
        r.verdict
    );
    if Path::new("/proc/kmsg").exists() {
        assert_eq!(r.out("kmsg_after_write"), "EMPTY");
    }
}

#[test]
fn proc_shows_only_the_sandbox_processes() {
    let r = run(
        "python",
        r#"
import os, json
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
me = os.getpid()
# pid 1 and the program only: pid 2 when pid 1 started it, another when it was forked from a
# template (docs/isolation.md, F5-F6).
print("pids_are_init_and_me=%s" % (pids == [1, me]))
print("parent=%d" % os.getppid())
print("sid_is_me=%s" % (os.getsid(0) == me))
"#,
        &[],
    );
    r.assert_ok();
    r.expect(&[
        ("pids_are_init_and_me", "True"),
        ("parent", "1"),
        ("sid_is_me", "True"),
    ]);
}

#[test]
fn dev_has_only_the_allowed_nodes() {
    let r = run(
        "python",
        &py(r#"
print("dev=" + json.dumps(sorted(os.listdir("/dev"))))
for n in ["kmsg", "mem", "kmem", "port", "sda", "vda", "tty", "console", "ptmx", "pts", "fuse", "net/tun", "kvm", "mqueue", "loop0", "nvme0n1", "hpet", "rtc0", "watchdog"]:
    attempt("open_" + n, lambda: os.close(os.open("/dev/" + n, os.O_RDONLY)))
write("null", "/dev/null")
print("zero=" + str(open("/dev/zero", "rb").read(8) == bytes(8)))
print("urandom_len=%d" % len(open("/dev/urandom", "rb").read(16)))
write("full", "/dev/full")
write("urandom_write", "/dev/urandom")
attempt("mknod", lambda: os.mknod("/tmp/sda", 0o600 | 0o060000, os.makedev(8, 0)))
print("links=" + json.dumps({n: os.readlink("/dev/" + n) for n in ["fd", "stdin", "stdout", "stderr"]}))
"#),
        &[],
    );
    r.assert_ok();
    let dev: Vec<String> = serde_json::from_str(&r.out("dev")).unwrap();
    assert_eq!(
        dev,
        ["fd", "full", "null", "random", "shm", "stderr", "stdin", "stdout", "urandom", "zero"],
        "ls /dev"
    );
    let absent = [
        "kmsg", "mem", "kmem", "port", "sda", "vda", "tty", "console", "ptmx", "pts", "fuse",
        "net/tun", "kvm", "mqueue", "loop0", "nvme0n1", "hpet", "rtc0", "watchdog",
    ];
    let labels: Vec<String> = absent.iter().map(|n| format!("open_{n}")).collect();
    let mut want: Vec<(&str, &str)> = labels.iter().map(|l| (l.as_str(), "ENOENT")).collect();
    want.extend([
        ("null", "OK"),
        ("zero", "True"),
        ("urandom_len", "16"),
        ("full", "ENOSPC"),
        // /dev/urandom is world-writable on the host: only Landlock refuses this write.
        ("urandom_write", "EACCES"),
        ("mknod", "EPERM"),
    ]);
    r.expect(&want);
    let links: serde_json::Value = serde_json::from_str(&r.out("links")).unwrap();
    assert_eq!(
        links,
        serde_json::json!({"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"})
    );
}

#[test]
fn mountinfo_shows_only_the_sandbox_mounts() {
    let r = run(
        "python",
        r#"
import json
mps = [l.split()[4] for l in open("/proc/self/mountinfo")]
print("mounts=" + json.dumps(mps))
"#,
        &[],
    );
    r.assert_ok();
    let mounts: Vec<String> = serde_json::from_str(&r.out("mounts")).unwrap();
    let allowed = [
        "/",
        "/usr",
        "/etc/ld.so.cache",
        "/etc/alternatives",
        "/etc/fonts",
        "/etc/ssl/certs",
        "/dev",
        "/dev/null",
        "/dev/zero",
        "/dev/full",
        "/dev/random",
        "/dev/urandom",
        "/tmp",
        "/workspace",
        "/dev/shm",
        "/proc",
    ];
    for m in &mounts {
        assert!(
            allowed.contains(&m.as_str())
                || m.starts_with("/proc/")
                || m.starts_with("/var/lib/runcell/python/"),
            "unexpected mount {m} in the sandbox: {mounts:?}"
        );
    }
    for must in ["/", "/usr", "/proc", "/tmp", "/workspace", "/dev/shm"] {
        assert!(
            mounts.iter().any(|m| m == must),
            "{must} missing from {mounts:?}"
        );
    }
    // The host's own mount points (other than /, /usr, /proc, /tmp, /dev...) are not there.
    for host in host_mounts() {
        let mp = host.split_whitespace().next().unwrap_or("");
        for secret in [
            "/home",
            "/root",
            "/work",
            "/var",
            "/run",
            "/sys",
            "/boot",
            "/mnt",
            "/etc/hosts",
            "/etc/resolv.conf",
        ] {
            if mp == secret || mp.starts_with(&format!("{secret}/")) {
                assert!(
                    !mounts.contains(&mp.to_string()),
                    "host mount {mp} visible in the sandbox"
                );
            }
        }
    }
}

/// Issue 10: mountinfo named host paths and devices (`/dev/vda`, the Go cache's host
/// directory as an overlay lower layer), and `statfs` of `/dev/null` showed the host's
/// devtmpfs, whose size is half the host's memory.
#[test]
fn mountinfo_and_dev_name_no_host_path_device_or_size() {
    let r = run(
        "python",
        r#"
import json, os
lines = open("/proc/self/mountinfo").read().splitlines()
print("lines=" + json.dumps(lines))
for p in ["/dev", "/dev/null", "/dev/shm"]:
    st = os.statvfs(p)
    print("size%s=%d" % (p, st.f_blocks * st.f_frsize))
"#,
        &[],
    );
    r.assert_ok();
    let lines: Vec<String> = serde_json::from_str(&r.out("lines")).unwrap();
    for line in &lines {
        // Fields after " - ": fstype, source, super options.
        let (_, fs) = line.split_once(" - ").expect("mountinfo separator");
        let mut f = fs.split_whitespace();
        let (fstype, source, opts) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
        assert!(
            ["tmpfs", "overlay", "proc"].contains(&fstype),
            "a host filesystem is mounted in the sandbox: {line}"
        );
        assert!(
            !source.starts_with("/dev/"),
            "mountinfo names a host device: {line}"
        );
        for opt in opts.split(',') {
            if let Some(dirs) = opt.strip_prefix("lowerdir=") {
                for d in dirs.split(':') {
                    assert!(
                        d.starts_with("/tmp/.layers/"),
                        "an overlay names a host directory: {line}"
                    );
                }
            }
        }
    }
    // The /dev of the sandbox is a tiny filesystem of its own, and /dev/null is on it.
    assert!(
        r.out("size/dev").parse::<u64>().unwrap() <= 1 << 20,
        "{:#}",
        r.verdict
    );
    assert_eq!(r.out("size/dev/null"), r.out("size/dev"));
}

/// Review of issue 10's overlays: a host with a mount below `/usr` (a separate `/usr/local`,
/// a driver's files bound under `/usr/lib`) failed every run: the kernel refuses a
/// non-recursive clone of a directory with locked mounts below it in the sandbox's namespace.
/// Here the mounts exist only in a private mount namespace that `runcell run` is started in: a
/// tmpfs directory and a bound file below `/usr/share/doc`, both seen read-only in the run.
#[test]
fn mounts_below_a_shown_host_directory_are_shown_read_only() {
    // util-linux (scripts/test.sh installs it) and Debian's /usr/share/doc.
    assert!(have("/usr/bin/unshare") && Path::new("/usr/share/doc").is_dir());
    let script = format!(
        "mount -t tmpfs t /usr/share/doc && echo below > /usr/share/doc/x && \
         touch /usr/share/doc/y && mount --bind /etc/hostname /usr/share/doc/y && \
         exec {} run -l bash -c 'cat /usr/share/doc/x; cat /usr/share/doc/y >/dev/null && echo file; \
         (echo z > /usr/share/doc/x) 2>/dev/null || echo read-only'",
        runcell_bin().display()
    );
    let out = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout, "below\nfile\nread-only\n");
}

/// Issue 10: `flock` on shared read-only files (the Python binary, `/etc/ld.so.cache`,
/// `/dev/null`) locked the host's inodes: a run could block the host's own locks and signal
/// other runs through them. The host holds locks on those files here (flock, and a POSIX
/// write lock on ld.so.cache); the run must get its own locks on the same paths regardless,
/// and the host's locks must be untouched.
#[test]
fn locks_on_shared_files_are_the_runs_own() {
    let python = fs::canonicalize("/usr/bin/python3").unwrap();
    let files = [
        python.to_str().unwrap(),
        "/etc/ld.so.cache",
        "/dev/null",
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
    ];
    let files: Vec<&str> = files
        .into_iter()
        .filter(|f| Path::new(f).exists())
        .collect();
    // The host side: a process that holds an exclusive flock on every file, and a POSIX write
    // lock on ld.so.cache (opened read-write by root; nothing is written).
    let holder = r#"
import fcntl, os, signal, sys
fds = []
for f in sys.argv[1:]:
    fd = os.open(f, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    fds.append(fd)
w = os.open("/etc/ld.so.cache", os.O_RDWR)
fcntl.lockf(w, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("held", flush=True)
signal.pause()  # until the test kills it: it must outlast the run, however long that takes
"#;
    let mut child = std::process::Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(holder)
        .args(&files)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    struct KillOnDrop(std::process::Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut out = child.stdout.take().unwrap();
    let mut child = KillOnDrop(child);
    let mut line = [0u8; 5];
    std::io::Read::read_exact(&mut out, &mut line).unwrap();
    assert_eq!(&line, b"held\n");

    let code = format!(
        r#"
import fcntl, os
for f in {files:?}:
    fd = os.open(f, os.O_RDONLY)
    attempt("flock" + f, lambda: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB))
    attempt("posix" + f, lambda: fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB))
"#
    );
    let r = run("python", &py(&code), &[]);
    r.assert_ok();
    let mut want = Vec::new();
    let labels: Vec<(String, String)> = files
        .iter()
        .map(|f| (format!("flock{f}"), format!("posix{f}")))
        .collect();
    for (a, b) in &labels {
        want.push((a.as_str(), "OK"));
        want.push((b.as_str(), "OK"));
    }
    r.expect(&want);
    // The host's holder still runs (its locks were never contended away).
    assert!(child.0.try_wait().unwrap().is_none());
}

#[test]
fn no_directory_outside_the_scratch_space_is_writable() {
    let r = run(
        "python",
        r#"
import os, json
writable = []
checked = 0
skip = ("/proc", "/tmp", "/workspace", "/dev/shm")
for top, dirs, files in os.walk("/"):
    if top.startswith(skip) or top.count("/") > 3:
        dirs[:] = []
        continue
    checked += 1
    p = os.path.join(top, ".runcell-write-probe")
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        writable.append(top)
    except OSError:
        pass
print("checked=%d" % checked)
print("writable=" + json.dumps(writable))
"#,
        &["--timeout", "20"],
    );
    r.assert_ok();
    assert!(
        r.out("checked").parse::<u32>().unwrap() > 100,
        "the walk covered /usr: {:#}",
        r.verdict
    );
    assert_eq!(r.out("writable"), "[]");
}

// ---------------------------------------------------------------------------------------------
// Identity
// ---------------------------------------------------------------------------------------------

#[test]
fn runs_as_uid_1000_with_no_capabilities_no_new_privs_and_seccomp() {
    let r = run(
        "python",
        r#"
import os
print("ids=%s" % (os.getresuid() + os.getresgid(),))
print("groups_other_than_1000=%s" % [g for g in os.getgroups() if g != 1000])
for line in open("/proc/self/status"):
    k, _, v = line.partition(":")
    if k.startswith("Cap") or k in ("NoNewPrivs", "Seccomp", "Seccomp_filters", "Uid", "Gid"):
        print(f"{k}={v.strip()}")
"#,
        &[],
    );
    r.assert_ok();
    r.expect(&[
        ("ids", "(1000, 1000, 1000, 1000, 1000, 1000)"),
        ("groups_other_than_1000", "[]"),
        ("CapInh", "0000000000000000"),
        ("CapPrm", "0000000000000000"),
        ("CapEff", "0000000000000000"),
        ("CapBnd", "0000000000000000"),
        ("CapAmb", "0000000000000000"),
        ("NoNewPrivs", "1"),
        ("Seccomp", "2"),
    ]);
    assert!(r.out("Seccomp_filters").parse::<u32>().unwrap() >= 1);
}

#[test]
fn uid_map_maps_only_1000_to_an_unprivileged_host_uid() {
    let tag = unique_digits();
    let p = spawn(
        "python",
        &format!(
            r#"
import os
print("uid_map=" + " ".join(open("/proc/self/uid_map").read().split()))
print("gid_map=" + " ".join(open("/proc/self/gid_map").read().split()))
print("uid_map_lines=%d" % len(open("/proc/self/uid_map").read().splitlines()), flush=True)
os.execvp("sleep", ["sleep", "1.{tag}"])
"#
        ),
        &[],
    );
    // While it runs, look at the program from the host: its real uid is the mapped one.
    assert!(
        wait_for_marker(&tag, START_WITHIN),
        "the program never started"
    );
    let host_view = processes_with_marker(&tag)
        .first()
        .and_then(|(pid, _)| fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .unwrap_or_default();
    let r = p.finish();
    r.assert_ok();
    let uid_map: Vec<u64> = r
        .out("uid_map")
        .split(' ')
        .map(|x| x.parse().unwrap())
        .collect();
    let gid_map: Vec<u64> = r
        .out("gid_map")
        .split(' ')
        .map(|x| x.parse().unwrap())
        .collect();
    assert_eq!(
        r.out("uid_map_lines"),
        "1",
        "exactly one mapping: no uid 0 inside"
    );
    assert_eq!((uid_map[0], uid_map[2]), (1000, 1));
    assert_eq!((gid_map[0], gid_map[2]), (1000, 1));
    let host_uid = uid_map[1];
    assert!(
        (2_000_000_000..2_001_000_000).contains(&host_uid),
        "host uid {host_uid}"
    );
    assert!(
        (2_000_000_000..2_001_000_000).contains(&gid_map[1]),
        "host gid {}",
        gid_map[1]
    );
    let uid_line = host_view
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .unwrap_or_default();
    let host_uids: Vec<u64> = uid_line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap())
        .collect();
    assert_eq!(
        host_uids,
        vec![host_uid; 4],
        "the host sees the program as uid {host_uid}: {host_view}"
    );
}

#[test]
fn becoming_root_fails() {
    let r = run(
        "python",
        &py(r#"
attempt("setuid0", lambda: os.setuid(0))
attempt("seteuid0", lambda: os.seteuid(0))
attempt("setresuid0", lambda: os.setresuid(0, 0, 0))
attempt("setgid0", lambda: os.setgid(0))
attempt("setgroups0", lambda: os.setgroups([0]))
attempt("setuid_host_root_alias", lambda: os.setuid(65534))
attempt("chroot", lambda: os.chroot("/tmp"))
attempt("chown_to_root", lambda: os.chown("/tmp", 0, 0))
print("uid_after=%d" % os.getuid())
"#),
        &[],
    );
    r.assert_ok();
    r.expect(&[
        // uid 0 is not mapped in the user namespace: EINVAL, not merely EPERM.
        ("setuid0", "EINVAL"),
        ("seteuid0", "EINVAL"),
        ("setresuid0", "EINVAL"),
        ("setgid0", "EINVAL"),
        ("setgroups0", "EPERM"),
        ("setuid_host_root_alias", "EINVAL"),
        ("chroot", "EPERM"),
        ("chown_to_root", "EINVAL"),
        ("uid_after", "1000"),
    ]);
}

#[test]
fn hostname_is_runcell_and_cannot_be_changed() {
    let host_before = fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let r = run(
        "python",
        &py(r#"
print("nodename=" + os.uname().nodename)
print("gethostname=" + socket.gethostname())
attempt("sethostname", lambda: socket.sethostname("pwned"))
sc("setdomainname", 171, 0, 0)
print("after=" + os.uname().nodename)
"#),
        &[],
    );
    r.assert_ok();
    r.expect(&[
        ("nodename", "runcell"),
        ("gethostname", "runcell"),
        ("sethostname", "EPERM"),
        ("setdomainname", "EPERM"),
        ("after", "runcell"),
    ]);
    assert_eq!(
        fs::read_to_string("/proc/sys/kernel/hostname").unwrap(),
        host_before
    );
}

#[test]
fn every_namespace_differs_from_the_host() {
    let kinds = ["user", "pid", "mnt", "net", "ipc", "uts", "cgroup"];
    let r = run(
        "python",
        r#"
import os
for k in ["user", "pid", "mnt", "net", "ipc", "uts", "cgroup"]:
    print(f"{k}=" + os.readlink("/proc/self/ns/" + k))
print("cgroup_paths=" + ",".join(sorted(set(l.strip().split(":", 2)[2] for l in open("/proc/self/cgroup")))))
"#,
        &[],
    );
    r.assert_ok();
    for k in kinds {
        let host = fs::read_link(format!("/proc/self/ns/{k}"))
            .unwrap()
            .display()
            .to_string();
        let inside = r.out(k);
        assert!(inside.starts_with(&format!("{k}:[")), "{inside}");
        assert_ne!(inside, host, "the sandbox shares the host's {k} namespace");
    }
    // Cgroup namespace: the sandbox sees itself at the root of every hierarchy.
    assert_eq!(r.out("cgroup_paths"), "/");
}

#[test]
#[cfg_attr(not(host_ipcmk), ignore = "needs ipcmk (util-linux)")]
fn host_sysv_ipc_objects_are_invisible() {
    let out = std::process::Command::new("ipcmk")
        .args(["-M", "4096"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let id: String = text.chars().filter(|c| c.is_ascii_digit()).collect();
    assert!(out.status.success() && !id.is_empty(), "ipcmk: {text}");
    struct Rm(String);
    impl Drop for Rm {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ipcrm")
                .args(["-m", &self.0])
                .status();
        }
    }
    let _rm = Rm(id.clone());
    assert!(
        fs::read_to_string("/proc/sysvipc/shm")
            .unwrap()
            .lines()
            .count()
            > 1
    );
    let r = run(
        "python",
        &py(&format!(
            r#"
print("shm_lines=%d" % len(open("/proc/sysvipc/shm").read().splitlines()))
libc.shmat.restype = ctypes.c_void_p
ctypes.set_errno(0)
r = libc.shmat({id}, None, 0)
print("shmat=" + ("OK" if r not in (None, 2**64 - 1) else _en(ctypes.get_errno())))
"#
        )),
        &[],
    );
    r.assert_ok();
    r.expect(&[("shm_lines", "1"), ("shmat", "EINVAL")]);
}

// ---------------------------------------------------------------------------------------------
// Environment and descriptors
// ---------------------------------------------------------------------------------------------

#[test]
fn runcells_environment_does_not_reach_the_program() {
    let secret = format!("s3cr3t-{}", unique_digits());
    let r = run_with(
        "python",
        &py(&format!(
            r#"
secret = bytes.fromhex("{hex}")
print("env_keys=" + json.dumps(sorted(os.environ)))
print("in_environ=" + str(any(secret in (k + "=" + v).encode() for k, v in os.environ.items())))
read("pid1_environ", "/proc/1/environ")
found = []
for p in os.listdir("/proc"):
    if not p.isdigit():
        continue
    for f in ["environ", "cmdline"]:
        try:
            if secret in open(f"/proc/{{p}}/{{f}}", "rb").read():
                found.append(f"{{p}}/{{f}}")
        except OSError:
            pass
print("found=" + json.dumps(found))
print("pythonpath=" + str(any("/evil" in p for p in sys.path)))
"#,
            hex = runcell_core::to_hex(secret.as_bytes())
        )),
        &[],
        |c| {
            c.env("RUNCELL_TEST_SECRET", &secret)
                .env("AWS_SECRET_ACCESS_KEY", &secret)
                .env("PYTHONPATH", "/evil")
                .env("LD_LIBRARY_PATH", "/evil");
        },
    );
    r.assert_ok();
    let keys: Vec<String> = serde_json::from_str(&r.out("env_keys")).unwrap();
    assert_eq!(
        keys,
        [
            "HOME",
            "LANG",
            "LOGNAME",
            "MPLBACKEND",
            "MPLCONFIGDIR",
            "OMP_NUM_THREADS",
            "OPENBLAS_NUM_THREADS",
            "PATH",
            "PWD",
            "PYTHONDONTWRITEBYTECODE",
            "PYTHONUNBUFFERED",
            "TMPDIR",
            "USER",
            "VIRTUAL_ENV"
        ]
    );
    r.expect(&[
        ("in_environ", "False"),
        ("found", "[]"),
        ("pythonpath", "False"),
    ]);
    assert!(
        matches!(r.out("pid1_environ").as_str(), "EACCES" | "EMPTY"),
        "/proc/1/environ must be unreadable or empty: {}",
        r.out("pid1_environ")
    );
    assert!(!r.stdout().contains(&secret));
}

#[test]
fn only_stdin_stdout_and_stderr_are_open() {
    let r = run(
        "python",
        r#"
import os, json, stat
# Before opening anything: what is on 0, 1 and 2, and is anything else open?
for fd in range(3):
    try:
        st = os.fstat(fd)
        kind = "chr" if stat.S_ISCHR(st.st_mode) else "fifo" if stat.S_ISFIFO(st.st_mode) else "other"
        print(f"fd{fd}={kind}")
    except OSError as e:
        print(f"fd{fd}=closed")
open_fds = []
for fd in range(3, 4096):
    try:
        os.fstat(fd)
        open_fds.append(fd)
    except OSError:
        pass
print("extra_fds=" + json.dumps(open_fds))
print("fd0_target=" + os.path.realpath("/proc/self/fd/0"))
d = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY)
print("listing_fd=%d" % d)
print("listing=" + json.dumps(sorted(int(x) for x in os.listdir(d))))
"#,
        &[],
    );
    r.assert_ok();
    r.expect(&[
        ("fd0", "chr"),
        ("fd1", "fifo"),
        ("fd2", "fifo"),
        ("extra_fds", "[]"),
        ("fd0_target", "/dev/null"),
        ("listing_fd", "3"),
    ]);
    // listdir(fd) works on a duplicate of fd 3: 0, 1, 2, 3 and at most that duplicate.
    let listing: Vec<u32> = serde_json::from_str(&r.out("listing")).unwrap();
    assert!(
        listing.starts_with(&[0, 1, 2, 3]) && listing.len() <= 5,
        "{listing:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Other processes
// ---------------------------------------------------------------------------------------------

#[test]
fn pid1_cannot_be_inspected() {
    let r = run(
        "python",
        &py(r#"
for f in ["environ", "mem", "maps", "smaps", "auxv", "stack", "syscall", "pagemap", "personality"]:
    read("pid1_" + f, "/proc/1/" + f)
attempt("pid1_fd", lambda: os.listdir("/proc/1/fd"))
attempt("pid1_exe", lambda: os.readlink("/proc/1/exe"))
attempt("pid1_root", lambda: os.listdir("/proc/1/root"))
attempt("pid1_cwd", lambda: os.listdir("/proc/1/cwd"))
read("pid1_root_passwd", "/proc/1/root/etc/passwd")
sc("ptrace_attach_pid1", 101, 16, 1, 0, 0)
sc("ptrace_seize_pid1", 101, 0x4206, 1, 0, 0)
buf = ctypes.create_string_buffer(64)
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
local = iovec(ctypes.cast(buf, ctypes.c_void_p), 64)
remote = iovec(0x400000, 64)
sc("process_vm_readv_pid1", 310, 1, ctypes.addressof(local), 1, ctypes.addressof(remote), 1, 0)
sc("pidfd_getfd", 438, 0, 0, 0)
"#),
        &[],
    );
    r.assert_ok();
    let files = [
        "environ",
        "mem",
        "maps",
        "smaps",
        "auxv",
        "stack",
        "syscall",
        "pagemap",
        "personality",
    ];
    let labels: Vec<String> = files.iter().map(|f| format!("pid1_{f}")).collect();
    let mut want: Vec<(&str, &str)> = labels.iter().map(|l| (l.as_str(), "EACCES")).collect();
    want.extend([
        ("pid1_fd", "EACCES"),
        ("pid1_exe", "EACCES"),
        ("pid1_root", "EACCES"),
        ("pid1_cwd", "EACCES"),
        ("pid1_root_passwd", "EACCES"),
        ("ptrace_attach_pid1", "EPERM"),
        ("ptrace_seize_pid1", "EPERM"),
        ("process_vm_readv_pid1", "EPERM"),
        ("pidfd_getfd", "EPERM"),
    ]);
    r.expect(&want);
}

#[test]
fn signalling_pid1_does_not_end_the_run() {
    const TIMEOUT_SECS: f64 = 10.0;
    let r = run(
        "python",
        &py(r#"
for s in ["SIGTERM", "SIGINT", "SIGHUP", "SIGSTOP", "SIGKILL"]:
    attempt("kill1_" + s, lambda: os.kill(1, getattr(signal, s)))
time.sleep(0.3)
print("alive=yes")
"#),
        &["--timeout", &TIMEOUT_SECS.to_string()],
    );
    r.assert_ok();
    assert_eq!(r.out("alive"), "yes");
    for s in ["SIGTERM", "SIGINT", "SIGHUP", "SIGSTOP", "SIGKILL"] {
        let o = r.out(&format!("kill1_{s}"));
        // pid 1 runs under other credentials (EPERM); if the kernel accepted the signal, the
        // pid-namespace init protection must have dropped it (the run went on).
        assert!(matches!(o.as_str(), "EPERM" | "OK"), "kill(1, {s}): {o}");
    }
    // A frozen run would only have ended at its timeout.
    assert!(
        r.execution_time() < TIMEOUT_SECS,
        "SIGSTOP must not have frozen the run"
    );
}

#[test]
fn kill_minus_one_only_kills_the_programs_own_processes() {
    // A host process that must survive whatever the sandbox signals.
    let tag = unique_digits();
    let mut host_proc = std::process::Command::new("sleep")
        .arg(format!("30.{tag}"))
        .spawn()
        .unwrap();
    let r = run(
        "python",
        &py(r#"
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, b"up")
    time.sleep(30)
    os._exit(0)
os.read(r, 2)  # the child runs
attempt("kill_all", lambda: os.kill(-1, signal.SIGKILL))
info = os.waitid(os.P_PID, pid, os.WEXITED)
print("child_code=%d" % info.si_code)
print("child_signal=%d" % info.si_status)
print("survived=yes")
"#),
        &["--timeout", "10"],
    );
    let host_alive = host_proc.try_wait().unwrap().is_none();
    let _ = host_proc.kill();
    let _ = host_proc.wait();
    r.assert_ok();
    // CLD_KILLED == 2
    r.expect(&[
        ("kill_all", "OK"),
        ("child_code", "2"),
        ("child_signal", "9"),
        ("survived", "yes"),
    ]);
    assert!(
        host_alive,
        "a host process was killed by the sandbox's kill(-1)"
    );
}

#[test]
fn the_runcell_binary_cannot_be_overwritten_through_proc() {
    // CVE-2019-5736 class: pid 1 is runcell; its /proc/1/exe must not open for writing.
    let bin = runcell_bin();
    let before = fs::read(&bin).unwrap();
    let r = run(
        "python",
        &py(r#"
attempt("open_exe_w", lambda: os.close(os.open("/proc/1/exe", os.O_WRONLY)))
attempt("open_exe_r", lambda: os.close(os.open("/proc/1/exe", os.O_RDONLY)))
attempt("open_self_exe_w", lambda: os.close(os.open("/proc/self/exe", os.O_WRONLY)))
attempt("open_1_fd_3", lambda: os.close(os.open("/proc/1/fd/3", os.O_RDWR)))
"#),
        &[],
    );
    r.assert_ok();
    r.expect(&[
        ("open_exe_w", "EACCES"),
        ("open_exe_r", "EACCES"),
        ("open_1_fd_3", "EACCES"),
    ]);
    assert!(
        fs::read(&bin).unwrap() == before,
        "the runcell binary changed"
    );
}

#[test]
fn concurrent_sandboxes_cannot_see_each_other() {
    let tag = unique_digits();
    let sock = format!("runcell-peer-{tag}");
    // Sandbox A: leaves traces in /tmp, /dev/shm and an abstract socket, then waits.
    let a = spawn(
        "python",
        &format!(
            r#"
import os, socket
open("/tmp/peer-{tag}", "w").write("a")
open("/dev/shm/peer-{tag}", "w").write("a")
s = socket.socket(socket.AF_UNIX)
s.bind("\0{sock}")
s.listen()
print("uid_map=" + " ".join(open("/proc/self/uid_map").read().split()), flush=True)
os.execvp("sleep", ["sleep", "2.{tag}"])
"#
        ),
        &[],
    );
    assert!(
        wait_for_marker(&tag, START_WITHIN),
        "sandbox A never started"
    );
    // Sandbox B, while A runs.
    let b = run(
        "python",
        &py(&format!(
            r#"
print("uid_map=" + " ".join(open("/proc/self/uid_map").read().split()))
read("peer_tmp", "/tmp/peer-{tag}")
read("peer_shm", "/dev/shm/peer-{tag}")
u = socket.socket(socket.AF_UNIX)
attempt("peer_socket", lambda: u.connect("\0{sock}"))
print("pids=" + str(sorted(int(p) for p in os.listdir("/proc") if p.isdigit()) == [1, os.getpid()]))
print("sleepers=%d" % sum(1 for p in os.listdir("/proc") if p.isdigit() and b"{tag}" in open(f"/proc/{{p}}/cmdline", "rb").read()))
"#
        )),
        &[],
    );
    let a = a.finish();
    a.assert_ok();
    b.assert_ok();
    b.expect(&[
        ("peer_tmp", "ENOENT"),
        ("peer_shm", "ENOENT"),
        ("peer_socket", "ECONNREFUSED"),
        // pid 1 and the program itself only.
        ("pids", "True"),
        ("sleepers", "0"),
    ]);
    // Every run gets its own host uid, so the two could not signal each other either.
    assert_ne!(
        a.out("uid_map"),
        b.out("uid_map"),
        "two concurrent runs share a host uid"
    );
}
