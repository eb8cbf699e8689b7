//! What this host offers, checked without building a sandbox (for `runcell doctor` and for
//! refusing early in strict mode). `/proc` paths are parameters so the logic is testable.

use std::fs;
use std::path::Path;

use crate::cgroup::CgroupVersion;

/// One isolation layer and whether the host provides it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    pub name: &'static str,
    pub available: bool,
    /// What was found (version, ABI, ...).
    pub detail: String,
    /// What to do when it is missing.
    pub fix: Option<String>,
}

/// Probe every layer.
pub fn layers() -> Vec<Layer> {
    // Root in a user namespace counts as unprivileged for both: creating a nested user
    // namespace is "unprivileged" to the sysctls, and it may only use a delegated cgroup.
    let root = crate::identity::Identity::current() == crate::identity::Identity::HostRoot;
    vec![
        user_namespaces(Path::new("/proc/sys"), root),
        mount_api(),
        seccomp(),
        landlock(),
        cgroups(
            crate::supervisor::cgroup_version(),
            root,
            &crate::advice::current_place(),
        ),
    ]
}

/// User namespaces: everything else hangs on them.
pub fn user_namespaces(proc_sys: &Path, root: bool) -> Layer {
    let read = |rel: &str| {
        fs::read_to_string(proc_sys.join(rel))
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
    };
    let max = read("user/max_user_namespaces");
    let debian_switch = read("kernel/unprivileged_userns_clone");
    let apparmor = read("kernel/apparmor_restrict_unprivileged_userns");
    let mut fix = None;
    let available = match max {
        Some(0) => {
            fix = Some("sysctl -w user.max_user_namespaces=15000".to_string());
            false
        }
        _ if !root && debian_switch == Some(0) => {
            fix = Some(
                "sysctl -w kernel.unprivileged_userns_clone=1 (or run runcell as root)".into(),
            );
            false
        }
        _ if !root && apparmor == Some(1) => {
            fix = Some(
                "AppArmor blocks unprivileged user namespaces: run runcell as root, or add an \
                 AppArmor profile granting 'userns' to the runcell binary"
                    .into(),
            );
            false
        }
        _ => true,
    };
    Layer {
        name: "user namespaces",
        available,
        detail: match max {
            Some(n) => format!("max_user_namespaces={n}"),
            None => "no /proc/sys/user/max_user_namespaces".into(),
        },
        fix,
    }
}

/// The new mount API (open_tree, move_mount, mount_setattr: Linux 5.12) that makes read-only
/// binds recursive.
pub fn mount_api() -> Layer {
    let release = rustix::system::uname()
        .release()
        .to_string_lossy()
        .into_owned();
    let ok = kernel_at_least(&release, 5, 12);
    Layer {
        name: "mount API (5.12+)",
        available: ok,
        detail: format!("kernel {release}"),
        fix: (!ok).then(|| "upgrade to Linux 5.12 or newer".to_string()),
    }
}

pub fn seccomp() -> Layer {
    let ok = crate::sys::seccomp_available();
    Layer {
        name: "seccomp",
        available: ok,
        detail: if ok {
            "filter mode supported".into()
        } else {
            "not supported".into()
        },
        fix: (!ok).then(|| "use a kernel built with CONFIG_SECCOMP_FILTER=y".to_string()),
    }
}

/// The Landlock ABI runcell's rules need in full (scoping of signals and abstract sockets).
pub const LANDLOCK_FULL_ABI: u32 = 6;

pub fn landlock() -> Layer {
    landlock_for_abi(crate::sys::landlock_abi_version())
}

fn landlock_for_abi(abi: u32) -> Layer {
    Layer {
        name: "landlock",
        available: abi >= LANDLOCK_FULL_ABI,
        detail: match abi {
            0 => "not enabled".into(),
            a if a < LANDLOCK_FULL_ABI => format!(
                "ABI {a} (partial: runcell's rules need ABI {LANDLOCK_FULL_ABI}, Linux 6.12)"
            ),
            a => format!("ABI {a}"),
        },
        fix: (abi < LANDLOCK_FULL_ABI).then(|| {
            if abi == 0 {
                "boot a kernel with CONFIG_SECURITY_LANDLOCK=y and 'landlock' in the lsm= list \
                 (Linux 5.13+; 6.12+ for all of runcell's rules)"
                    .to_string()
            } else {
                "upgrade to Linux 6.12 or newer for Landlock ABI 6".to_string()
            }
        }),
    }
}

/// `root`: host root (who may create groups anywhere in the hierarchy); the fix depends on
/// `place` (a pod's is not a host's).
pub fn cgroups(version: Option<CgroupVersion>, root: bool, place: &crate::advice::Place) -> Layer {
    Layer {
        name: "cgroups",
        available: version.is_some(),
        detail: match version {
            Some(v) => format!("{v}"),
            None => "no usable hierarchy".into(),
        },
        fix: version
            .is_none()
            .then(|| crate::advice::fix(place, crate::advice::Failure::NoCgroup, root)),
    }
}

/// Whether a `uname -r` string is at least `major.minor`.
pub fn kernel_at_least(release: &str, major: u32, minor: u32) -> bool {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u32>().unwrap_or(0));
    let (ma, mi) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (ma, mi) >= (major, minor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions_compare() {
        assert!(kernel_at_least("6.18.44-fc-v595", 5, 12));
        assert!(kernel_at_least("5.12.0", 5, 12));
        assert!(!kernel_at_least("5.11.22-generic", 5, 12));
        assert!(!kernel_at_least("4.19.0", 5, 12));
    }

    #[test]
    fn landlock_below_abi_6_is_partial() {
        assert!(!landlock_for_abi(0).available);
        let l = landlock_for_abi(3);
        assert!(!l.available);
        assert!(l.detail.contains("partial"), "{}", l.detail);
        assert!(landlock_for_abi(6).available);
        assert!(landlock_for_abi(7).available);
    }

    #[test]
    fn user_namespace_probe_reads_sysctls() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("user")).unwrap();
        fs::create_dir_all(dir.path().join("kernel")).unwrap();
        fs::write(dir.path().join("user/max_user_namespaces"), "0\n").unwrap();
        let l = user_namespaces(dir.path(), true);
        assert!(!l.available);
        assert!(l.fix.unwrap().contains("max_user_namespaces"));

        fs::write(dir.path().join("user/max_user_namespaces"), "1000\n").unwrap();
        fs::write(
            dir.path()
                .join("kernel/apparmor_restrict_unprivileged_userns"),
            "1\n",
        )
        .unwrap();
        assert!(user_namespaces(dir.path(), true).available);
        let l = user_namespaces(dir.path(), false);
        assert!(!l.available);
        assert!(l.fix.unwrap().contains("AppArmor"));
    }
}
