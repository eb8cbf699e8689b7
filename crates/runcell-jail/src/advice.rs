//! Where runcell runs (a host, a container, a Kubernetes pod) and, for each way building a
//! sandbox fails there, the one fix that fits that place (for `runcell doctor`). The facts are
//! read below a root directory and from an environment lookup, both parameters, so the
//! mapping is tested on temp-dir fixtures.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The inodes of the initial namespaces (`PROC_CGROUP_INIT_INO`, `PROC_USER_INIT_INO` in
/// include/linux/proc_ns.h): any other inode means a namespace of a container.
const INIT_CGROUP_NS_INO: u64 = 0xEFFF_FFFB;
const INIT_USER_NS_INO: u64 = 0xEFFF_FFFD;

/// Where runcell runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    Host,
    /// A container; `engine` when it says which ("podman", "docker", or pid 1's `container=`).
    Container {
        engine: Option<String>,
    },
    /// A Kubernetes pod.
    Pod,
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Host => f.write_str("host"),
            Place::Container { engine: None } => f.write_str("container"),
            Place::Container { engine: Some(e) } => write!(f, "container ({e})"),
            Place::Pod => f.write_str("kubernetes pod"),
        }
    }
}

/// What the place gives away about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlaceFacts {
    /// `KUBERNETES_SERVICE_HOST` is set (kubelet sets it in every container).
    pub kubernetes_env: bool,
    /// `/var/run/secrets/kubernetes.io` exists (service account token mount).
    pub kubernetes_secrets: bool,
    /// `/run/.containerenv` (podman, CRI-O).
    pub containerenv: bool,
    /// `/.dockerenv` (Docker).
    pub dockerenv: bool,
    /// `container=` in pid 1's environment (systemd's convention: podman, lxc, nspawn).
    pub pid1_container: Option<String>,
    /// The inode of `/proc/self/ns/cgroup`, and of `/proc/self/ns/user`.
    pub cgroup_ns: Option<u64>,
    pub user_ns: Option<u64>,
}

impl PlaceFacts {
    /// Read the facts below `root` (normally `/`), with `env` looking up this process's
    /// environment.
    pub fn gather(root: &Path, env: &dyn Fn(&str) -> Option<String>) -> PlaceFacts {
        let exists = |rel: &str| root.join(rel).exists();
        let ino = |rel: &str| fs::metadata(root.join(rel)).ok().map(|m| m.ino());
        let pid1_container = fs::read(root.join("proc/1/environ"))
            .ok()
            .and_then(|env| {
                env.split(|&b| b == 0)
                    .find_map(|kv| kv.strip_prefix(b"container="))
                    .map(|v| String::from_utf8_lossy(v).into_owned())
            })
            .filter(|v| !v.is_empty());
        PlaceFacts {
            kubernetes_env: env("KUBERNETES_SERVICE_HOST").is_some_and(|v| !v.is_empty()),
            kubernetes_secrets: exists("var/run/secrets/kubernetes.io"),
            containerenv: exists("run/.containerenv"),
            dockerenv: exists(".dockerenv"),
            pid1_container,
            cgroup_ns: ino("proc/self/ns/cgroup"),
            user_ns: ino("proc/self/ns/user"),
        }
    }

    pub fn place(&self) -> Place {
        if self.kubernetes_env || self.kubernetes_secrets {
            return Place::Pod;
        }
        if self.containerenv {
            return Place::Container {
                engine: Some("podman".into()),
            };
        }
        if self.dockerenv {
            return Place::Container {
                engine: Some("docker".into()),
            };
        }
        if let Some(e) = &self.pid1_container {
            return Place::Container {
                engine: Some(e.clone()),
            };
        }
        let foreign = |ino: Option<u64>, init: u64| ino.is_some_and(|i| i != init);
        if foreign(self.cgroup_ns, INIT_CGROUP_NS_INO) || foreign(self.user_ns, INIT_USER_NS_INO) {
            return Place::Container { engine: None };
        }
        Place::Host
    }
}

/// Where this process runs.
pub fn current_place() -> Place {
    PlaceFacts::gather(Path::new("/"), &|k| std::env::var(k).ok()).place()
}

/// The failures that have a fix depending on the place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// `mount proc` refused: the runtime masks parts of /proc (mount_too_revealing).
    ProcMasked,
    /// `clone`, `unshare` or `pivot_root` refused by a seccomp profile (ENOSYS/EPERM).
    SyscallFiltered,
    /// User namespaces cannot be created at all (sysctl, AppArmor) on a host.
    UserNamespacesDenied,
    /// No cgroup hierarchy runcell may write.
    NoCgroup,
    /// A step that needs host root failed as root in a user namespace or without the
    /// capability (`fsopen`/`mknod`/`open_tree` EPERM).
    RootWithoutPrivilege,
}

/// Which failure a sandbox setup error describes: its message (the step and the cause, as
/// `error_chain` prints them) and its errno, when there is one.
pub fn classify(message: &str, errno: Option<&str>) -> Option<Failure> {
    let refused = |names: &[&str]| {
        errno.is_some_and(|e| names.contains(&e))
            || names.iter().any(|n| match *n {
                "EPERM" => message.contains("Operation not permitted"),
                "ENOSYS" => message.contains("Function not implemented"),
                "EACCES" => message.contains("Permission denied"),
                _ => false,
            })
    };
    let step = |s: &str| message.contains(s);
    if step("mount proc") && refused(&["EPERM", "EACCES"]) {
        Some(Failure::ProcMasked)
    } else if (step("clone") || step("unshare") || step("pivot_root"))
        && refused(&["EPERM", "ENOSYS", "EACCES"])
    {
        Some(Failure::SyscallFiltered)
    } else if (step("fsopen") || step("mknod") || step("open_tree") || step("fsmount"))
        && refused(&["EPERM", "ENOSYS"])
    {
        Some(Failure::RootWithoutPrivilege)
    } else {
        None
    }
}

/// The one-line fix for `failure` in `place`. `root`: runcell runs as uid 0 (in whichever
/// user namespace).
pub fn fix(place: &Place, failure: Failure, root: bool) -> String {
    use Failure::*;
    match (failure, place) {
        (ProcMasked, Place::Pod) => "set `securityContext.procMount: Unmasked` on the runcell \
             container (allowed only with `spec.hostUsers: false`)"
            .into(),
        (ProcMasked, Place::Container { .. }) => "run the container with \
             `--security-opt unmask=/proc/*` (podman) or `--security-opt systempaths=unconfined` \
             (docker)"
            .into(),
        (ProcMasked, Place::Host) => "mount /proc without hidepid= and without files mounted \
             over its entries: runcell mounts a fresh /proc for each sandbox"
            .into(),
        (SyscallFiltered, Place::Pod) => "set `securityContext.seccompProfile: {type: Localhost, \
             localhostProfile: runcell.json}` (deploy/k8s/seccomp/runcell.json on each node) or \
             `{type: Unconfined}`: RuntimeDefault refuses pivot_root"
            .into(),
        (SyscallFiltered, Place::Container { .. }) => "run the container with \
             `--security-opt seccomp=deploy/k8s/seccomp/runcell.json` (or seccomp=unconfined): the \
             default profile refuses pivot_root and namespace clones"
            .into(),
        (SyscallFiltered, Place::Host) => "a seccomp filter on runcell's own process refuses \
             namespace calls: start runcell without one (systemd `SystemCallFilter=`, a parent \
             sandbox)"
            .into(),
        (UserNamespacesDenied, Place::Pod) => "the node refuses user namespaces: set \
             `user.max_user_namespaces` above 0 on the node, or use nodes that allow them"
            .into(),
        (UserNamespacesDenied, Place::Container { .. }) => "the host refuses user namespaces: \
             `sysctl -w user.max_user_namespaces=15000` on the host (and, on Ubuntu 23.10+, \
             `--security-opt apparmor=unconfined`)"
            .into(),
        (UserNamespacesDenied, Place::Host) => {
            "`sysctl -w user.max_user_namespaces=15000` (or run runcell as root)".into()
        }
        (NoCgroup, Place::Pod) => "no writable cgroup in this pod: run it `privileged: true` \
             on a dedicated node pool, or as uid 0 with `hostUsers: false` on a runtime handler \
             with writable cgroups (containerd `cgroup_writable`)"
            .into(),
        (NoCgroup, Place::Container { .. }) => "no writable cgroup in this container: run it \
             `--privileged`, or as uid 0 in a user namespace (`--userns=auto`) on cgroup v2 with \
             crun, which delegates the container's cgroup to its root"
            .into(),
        (NoCgroup, Place::Host) if root => "mount cgroup2 at /sys/fs/cgroup (or the v1 memory, \
             pids and cpu controllers)"
            .into(),
        (NoCgroup, Place::Host) => "run runcell from the systemd unit \
             deploy/systemd/runcell.service (`Delegate=yes`), or under \
             `systemd-run --user --scope -p Delegate=yes runcell ...`"
            .into(),
        (RootWithoutPrivilege, Place::Pod) => "run as a non-root user \
             (`securityContext.runAsUser: 1000`), or `privileged: true` on dedicated nodes"
            .into(),
        (RootWithoutPrivilege, Place::Container { .. }) => {
            "run as a non-root user (`--user 1000`), or `--privileged`".into()
        }
        (RootWithoutPrivilege, Place::Host) => "run runcell as an ordinary user, or as root \
             with its full capability set (CAP_SYS_ADMIN, CAP_MKNOD)"
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn an_empty_root_is_a_host() {
        let dir = tempfile::tempdir().unwrap();
        let f = PlaceFacts::gather(dir.path(), &no_env);
        assert_eq!(f, PlaceFacts::default());
        assert_eq!(f.place(), Place::Host);
    }

    #[test]
    fn kubernetes_is_told_by_env_or_secrets_and_wins() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(".dockerenv"), "").unwrap();
        let env = |k: &str| (k == "KUBERNETES_SERVICE_HOST").then(|| "10.0.0.1".to_string());
        assert_eq!(PlaceFacts::gather(dir.path(), &env).place(), Place::Pod);
        fs::create_dir_all(dir.path().join("var/run/secrets/kubernetes.io")).unwrap();
        assert_eq!(PlaceFacts::gather(dir.path(), &no_env).place(), Place::Pod);
    }

    #[test]
    fn containers_are_told_by_their_marks() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(".dockerenv"), "").unwrap();
        assert_eq!(
            PlaceFacts::gather(dir.path(), &no_env).place(),
            Place::Container {
                engine: Some("docker".into())
            }
        );
        fs::create_dir_all(dir.path().join("run")).unwrap();
        fs::write(dir.path().join("run/.containerenv"), "").unwrap();
        assert_eq!(
            PlaceFacts::gather(dir.path(), &no_env).place(),
            Place::Container {
                engine: Some("podman".into())
            }
        );

        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("proc/1")).unwrap();
        fs::write(
            dir.path().join("proc/1/environ"),
            b"PATH=/bin\0container=lxc\0HOME=/\0",
        )
        .unwrap();
        assert_eq!(
            PlaceFacts::gather(dir.path(), &no_env).place(),
            Place::Container {
                engine: Some("lxc".into())
            }
        );
    }

    #[test]
    fn a_namespace_other_than_the_initial_one_means_a_container() {
        let host = PlaceFacts {
            cgroup_ns: Some(INIT_CGROUP_NS_INO),
            user_ns: Some(INIT_USER_NS_INO),
            ..Default::default()
        };
        assert_eq!(host.place(), Place::Host);
        let cgns = PlaceFacts {
            cgroup_ns: Some(4026532500),
            ..host.clone()
        };
        assert_eq!(cgns.place(), Place::Container { engine: None });
        let userns = PlaceFacts {
            user_ns: Some(4026532501),
            ..host
        };
        assert_eq!(userns.place(), Place::Container { engine: None });
    }

    #[test]
    fn failures_are_classified_by_step_and_errno() {
        assert_eq!(
            classify(
                "setting up the sandbox: mount proc /newroot/proc: Operation not permitted (os error 1)",
                None
            ),
            Some(Failure::ProcMasked)
        );
        assert_eq!(
            classify("setting up the sandbox: pivot_root", Some("ENOSYS")),
            Some(Failure::SyscallFiltered)
        );
        assert_eq!(
            classify("clone: Function not implemented (os error 38)", None),
            Some(Failure::SyscallFiltered)
        );
        assert_eq!(
            classify("fsopen /dev: Operation not permitted (os error 1)", None),
            Some(Failure::RootWithoutPrivilege)
        );
        assert_eq!(
            classify("mknod null", Some("EPERM")),
            Some(Failure::RootWithoutPrivilege)
        );
        // A step without a place-dependent fix, or a cause that is not a refusal.
        assert_eq!(classify("mount proc: No such device", None), None);
        assert_eq!(
            classify("write id map: Operation not permitted", None),
            None
        );
    }

    #[test]
    fn every_fix_is_one_line_and_fits_its_place() {
        use Failure::*;
        let places = [
            Place::Host,
            Place::Container {
                engine: Some("podman".into()),
            },
            Place::Pod,
        ];
        for failure in [
            ProcMasked,
            SyscallFiltered,
            UserNamespacesDenied,
            NoCgroup,
            RootWithoutPrivilege,
        ] {
            for place in &places {
                for root in [true, false] {
                    let f = fix(place, failure, root);
                    assert!(!f.contains('\n') && !f.contains("  "), "{f:?}");
                    let pod_words = ["securityContext", "hostUsers", "privileged: true", "node"];
                    if *place == Place::Host {
                        assert!(!pod_words.iter().any(|w| f.contains(w)), "{f}");
                    }
                }
            }
        }
        let pod = |f| fix(&Place::Pod, f, false);
        let podman = |f| {
            fix(
                &Place::Container {
                    engine: Some("podman".into()),
                },
                f,
                false,
            )
        };
        assert!(pod(ProcMasked).contains("procMount: Unmasked"));
        assert!(pod(ProcMasked).contains("hostUsers: false"));
        assert!(podman(ProcMasked).contains("unmask=/proc/*"));
        assert!(pod(SyscallFiltered).contains("runcell.json"));
        assert!(pod(SyscallFiltered).contains("Unconfined"));
        assert!(podman(SyscallFiltered).contains("--security-opt seccomp="));
        assert!(fix(&Place::Host, NoCgroup, false).contains("Delegate=yes"));
        assert!(fix(&Place::Host, NoCgroup, false).contains("deploy/systemd/runcell.service"));
        assert!(fix(&Place::Host, NoCgroup, true).contains("cgroup2"));
        assert!(pod(NoCgroup).contains("privileged"));
        assert!(!pod(NoCgroup).contains("systemd"));
        assert!(pod(RootWithoutPrivilege).contains("runAsUser: 1000"));
        assert!(podman(RootWithoutPrivilege).contains("--user 1000"));
    }
}
