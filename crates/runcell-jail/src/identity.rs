//! Who the supervisor is, and what that lets the helper do.
//!
//! Three shapes, told apart by the effective uid and `/proc/self/uid_map`:
//! - **host root**: euid 0 with the full identity map `0 0 4294967295` (the initial user
//!   namespace, or one that maps every id onto itself, e.g. a privileged container);
//! - **root in a user namespace**: euid 0 with any other map (a pod with `hostUsers: false`,
//!   podman `--uidmap 0:200000:65536`, `unshare --map-root-user`). Its capabilities count in
//!   its own namespace only: it cannot make device nodes (`mknod` needs CAP_MKNOD in the
//!   initial namespace), and unless the runtime gave it CAP_SYS_ADMIN over its mount namespace
//!   it cannot mount there either (`fsopen`, `open_tree` fail with EPERM);
//! - **unprivileged**: any other euid (rootless).
//!
//! What the helper may do is not decided by the shape alone (a root whose bounding set lacks
//! CAP_MKNOD, a container whose seccomp profile refuses `fsopen`): [`probe_powers`] tries each
//! privileged step once in the supervisor, and the helper takes the unprivileged path for each
//! one that failed. The verdict's `enforcement` reports the result ([`Identity`], private or
//! host device nodes, a uid of the sandbox's own or the supervisor's).

use std::fs;
use std::path::Path;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

/// Where the kernel describes this process's user namespace.
pub(crate) const SELF_UID_MAP: &str = "/proc/self/uid_map";
pub(crate) const SELF_GID_MAP: &str = "/proc/self/gid_map";
pub(crate) const SELF_SETGROUPS: &str = "/proc/self/setgroups";

/// Which of the three shapes the supervisor runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Identity {
    /// euid 0 in the initial user namespace (or one mapping every id onto itself).
    HostRoot,
    /// euid 0 in a user namespace that maps only part of the ids (a user-namespaced pod).
    NamespacedRoot,
    /// Any other euid.
    Unprivileged,
}

impl Identity {
    /// The name used in the verdict and by `runcell doctor`.
    pub fn as_str(self) -> &'static str {
        match self {
            Identity::HostRoot => "root",
            Identity::NamespacedRoot => "root_in_user_namespace",
            Identity::Unprivileged => "unprivileged",
        }
    }

    /// The shape of the running process (read once).
    pub fn current() -> Identity {
        static CURRENT: OnceLock<Identity> = OnceLock::new();
        *CURRENT.get_or_init(|| {
            identity_of(rustix::process::geteuid().as_raw(), Path::new(SELF_UID_MAP))
        })
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One line of a `uid_map`/`gid_map`: ids `inside..inside+count` of the namespace are ids
/// `outside..outside+count` of its parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    pub inside: u32,
    pub outside: u32,
    pub count: u32,
}

/// Parse a `uid_map`/`gid_map`. Malformed lines are skipped (the kernel writes the file, and a
/// line we cannot read is a line whose ids we will not use).
pub fn parse_id_map(text: &str) -> Vec<IdRange> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace().map(|s| s.parse::<u32>());
            match (f.next(), f.next(), f.next(), f.next()) {
                (Some(Ok(inside)), Some(Ok(outside)), Some(Ok(count)), None) if count > 0 => {
                    Some(IdRange {
                        inside,
                        outside,
                        count,
                    })
                }
                _ => None,
            }
        })
        .collect()
}

/// Whether a map is the initial namespace's: every id maps onto itself.
pub fn is_full_identity(map: &[IdRange]) -> bool {
    map == [IdRange {
        inside: 0,
        outside: 0,
        count: u32::MAX,
    }]
}

/// The shape for effective uid `euid`, whose user namespace's map is at `uid_map`. An
/// unreadable map counts as the full one: kernels without user namespaces have no such file.
pub fn identity_of(euid: u32, uid_map: &Path) -> Identity {
    if euid != 0 {
        return Identity::Unprivileged;
    }
    match fs::read_to_string(uid_map) {
        Ok(text) if !is_full_identity(&parse_id_map(&text)) => Identity::NamespacedRoot,
        _ => Identity::HostRoot,
    }
}

/// A block of ids the supervisor may give its sandboxes, one each: `start..start+len`, mapped
/// in both the uid and the gid map of the supervisor's namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdPool {
    pub start: u32,
    pub len: u32,
}

/// The host root's pool: far above the ranges distributions hand out (system users, regular
/// users, /etc/subuid), in no /etc/passwd.
impl IdPool {
    /// One half of the pool: the upper half for sandboxes whose interpreter may be forked from
    /// a template (`templated`), the lower for all others. A template may switch only to ids
    /// of its half (its seccomp filter, `template::filter`), so whatever the operator's
    /// preload modules did in a template could never take the uid of a sandbox that does not
    /// already run code from it. A pool of one id is not split.
    pub fn half(self, templated: bool) -> IdPool {
        if self.len < 2 {
            return self;
        }
        let low = self.len / 2;
        match templated {
            false => IdPool {
                start: self.start,
                len: low,
            },
            true => IdPool {
                start: self.start + low,
                len: self.len - low,
            },
        }
    }
}

pub const HOST_ROOT_POOL: IdPool = IdPool {
    start: 2_000_000_000,
    len: 1_000_000,
};

/// Below this, ids of a user namespace are the image's own users (system users, uid 1000 of
/// a `runAsUser: 1000` pod): a sandbox never takes one of them.
pub const NAMESPACE_ID_MIN: u32 = 10_000;

/// Ids a sandbox never gets: the overflow ids (65534, "nobody", which unmapped files show as),
/// 65535 (-1 of 16-bit ids), 4294967295 (-1, "no change" to setresuid), and 65532, the
/// conventional user of distroless and many other images (a sidecar of the same pod shares
/// the pod's user namespace, so the same id would be the same user on the node).
const RESERVED_IDS: [u32; 4] = [65_532, 65_534, 65_535, u32::MAX];

/// The largest block of ids at or above [`NAMESPACE_ID_MIN`] mapped in both maps, minus the
/// reserved ids and `avoid` (the supervisor's own uid, gid and supplementary groups: a pod's
/// `runAsUser`, `runAsGroup`, `fsGroup`, whose files a sandbox must not own), capped at
/// [`HOST_ROOT_POOL`]'s length. `None`: no such id (a namespace that maps only uid 0, as
/// `unshare --map-root-user` makes).
pub fn namespace_pool(uid_map: &[IdRange], gid_map: &[IdRange], avoid: &[u32]) -> Option<IdPool> {
    // Half-open intervals in u64, so that `start + count` cannot overflow.
    let spans = |map: &[IdRange]| -> Vec<(u64, u64)> {
        map.iter()
            .map(|r| (r.inside as u64, r.inside as u64 + r.count as u64))
            .collect()
    };
    let mut both = Vec::new();
    for (us, ue) in spans(uid_map) {
        for (gs, ge) in spans(gid_map) {
            let (s, e) = (us.max(gs).max(NAMESPACE_ID_MIN as u64), ue.min(ge));
            if s < e {
                both.push((s, e));
            }
        }
    }
    let mut pieces = Vec::new();
    for (mut s, e) in both {
        let mut cuts: Vec<u64> = RESERVED_IDS
            .iter()
            .chain(avoid)
            .map(|&r| r as u64)
            .filter(|&r| r >= s && r < e)
            .collect();
        cuts.sort_unstable();
        cuts.dedup();
        for c in cuts {
            if s < c {
                pieces.push((s, c));
            }
            s = c + 1;
        }
        if s < e {
            pieces.push((s, e));
        }
    }
    pieces
        .into_iter()
        .max_by_key(|&(s, e)| (e - s, std::cmp::Reverse(s)))
        .map(|(s, e)| IdPool {
            start: s as u32,
            len: (e - s).min(HOST_ROOT_POOL.len as u64) as u32,
        })
}

/// What the helper may do beyond an unprivileged user, decided once per supervisor. Each
/// `false` makes it take the path rootless runcell takes for that step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HelperPowers {
    /// Create each sandbox's user namespace as a uid of its own from the pool (needs
    /// CAP_SETUID and CAP_SETGID and a pool); otherwise the sandbox maps to the supervisor's
    /// own uid.
    pub switch_ids: bool,
    /// Drop the supplementary groups before the clone (needs CAP_SETGID and `setgroups`
    /// allowed in this namespace).
    pub clear_groups: bool,
    /// Make the sandbox's own device nodes on a detached tmpfs (needs to mount here and
    /// CAP_MKNOD in the initial namespace); otherwise pid 1 binds the host's nodes.
    pub private_dev: bool,
    /// Clone the host directories for the overlays in the helper (needs CAP_SYS_ADMIN over
    /// this mount namespace); otherwise pid 1 clones them itself.
    pub clone_layers: bool,
}

/// Whether this process holds `cap` in its effective set.
fn has_capability(cap: rustix::thread::CapabilitySet) -> bool {
    rustix::thread::capabilities(None).is_ok_and(|c| c.effective.contains(cap))
}

/// Whether `setgroups` is allowed in this namespace (`/proc/self/setgroups` says "allow", or
/// the kernel predates the file).
pub fn setgroups_allowed(setgroups: &Path) -> bool {
    match fs::read_to_string(setgroups) {
        Ok(s) => s.trim() == "allow",
        Err(_) => true,
    }
}

/// Try each privileged step of the helper once, here in the supervisor (none of them changes
/// this process: the mounts made are detached and dropped at once), so that sandboxes are
/// built the way that works and the verdict says which.
pub fn probe_powers(identity: Identity, pool: Option<IdPool>, setgroups: &Path) -> HelperPowers {
    use rustix::thread::CapabilitySet as Cap;
    if identity == Identity::Unprivileged {
        return HelperPowers::default();
    }
    let setgid = has_capability(Cap::SETGID);
    HelperPowers {
        switch_ids: pool.is_some() && setgid && has_capability(Cap::SETUID),
        clear_groups: setgid && setgroups_allowed(setgroups),
        private_dev: crate::rootfs::private_dev().is_ok(),
        clone_layers: crate::rootfs::layer_clone(Path::new("/")).is_ok(),
    }
}

/// The supervisor's shape, its id pool and its helper's powers, found once per process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub identity: Identity,
    pub pool: Option<IdPool>,
    pub powers: HelperPowers,
    /// Root that cannot drop its supplementary groups (`setgroups` denied in its namespace)
    /// and has some: the sandbox keeps them.
    pub kept_groups: bool,
}

impl Shape {
    pub fn current() -> Shape {
        static SHAPE: OnceLock<Shape> = OnceLock::new();
        *SHAPE.get_or_init(|| {
            let identity = Identity::current();
            let pool = match identity {
                Identity::HostRoot => Some(HOST_ROOT_POOL),
                Identity::NamespacedRoot => {
                    let read = |p: &str| parse_id_map(&fs::read_to_string(p).unwrap_or_default());
                    // The pod's own users and groups are never a sandbox's.
                    let mut own = vec![
                        rustix::process::getuid().as_raw(),
                        rustix::process::geteuid().as_raw(),
                        rustix::process::getgid().as_raw(),
                        rustix::process::getegid().as_raw(),
                    ];
                    if let Ok(groups) = rustix::process::getgroups() {
                        own.extend(groups.iter().map(|g| g.as_raw()));
                    }
                    namespace_pool(&read(SELF_UID_MAP), &read(SELF_GID_MAP), &own)
                }
                Identity::Unprivileged => None,
            };
            let powers = probe_powers(identity, pool, Path::new(SELF_SETGROUPS));
            let has_groups = rustix::process::getgroups().is_ok_and(|g| !g.is_empty());
            Shape {
                identity,
                pool,
                powers,
                kept_groups: identity != Identity::Unprivileged
                    && !powers.clear_groups
                    && has_groups,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(inside: u32, outside: u32, count: u32) -> IdRange {
        IdRange {
            inside,
            outside,
            count,
        }
    }

    #[test]
    fn maps_parse_as_the_kernel_writes_them() {
        let text = "         0          0 4294967295\n";
        assert_eq!(parse_id_map(text), vec![r(0, 0, u32::MAX)]);
        assert!(is_full_identity(&parse_id_map(text)));
        let podman = "         0     200000      65536\n";
        assert_eq!(parse_id_map(podman), vec![r(0, 200_000, 65_536)]);
        assert!(!is_full_identity(&parse_id_map(podman)));
        assert_eq!(
            parse_id_map("0 1000 1\n1 100000 65536\nbroken line\n"),
            vec![r(0, 1000, 1), r(1, 100_000, 65_536)]
        );
        assert!(parse_id_map("").is_empty());
    }

    #[test]
    fn identity_reads_euid_and_the_map() {
        let dir = tempfile::tempdir().unwrap();
        let map = dir.path().join("uid_map");
        fs::write(&map, "         0          0 4294967295\n").unwrap();
        assert_eq!(identity_of(0, &map), Identity::HostRoot);
        assert_eq!(identity_of(1000, &map), Identity::Unprivileged);
        fs::write(&map, "         0     200000      65536\n").unwrap();
        assert_eq!(identity_of(0, &map), Identity::NamespacedRoot);
        assert_eq!(identity_of(1000, &map), Identity::Unprivileged);
        // Root mapped onto one host uid (unshare --map-root-user), even host uid 0.
        fs::write(&map, "0 0 1\n").unwrap();
        assert_eq!(identity_of(0, &map), Identity::NamespacedRoot);
        // No file: a kernel without user namespaces, where root is host root.
        assert_eq!(
            identity_of(0, &dir.path().join("absent")),
            Identity::HostRoot
        );
    }

    #[test]
    fn a_pod_map_gives_ids_above_the_images_users() {
        let pod = [r(0, 200_000, 65_536)];
        let p = namespace_pool(&pod, &pod, &[]).unwrap();
        // 10000..65532: 65532 (images' conventional user), 65534 and 65535 (overflow ids) are
        // never handed out.
        assert_eq!(
            p,
            IdPool {
                start: NAMESPACE_ID_MIN,
                len: 65_532 - NAMESPACE_ID_MIN
            }
        );
    }

    /// Regression (review of issue 23): the pool was the whole range above 10000, so a sandbox
    /// could get the uid of a sidecar of the same pod, or the pod's fsGroup, and pass the
    /// owner or group checks on their files. The supervisor's own ids are cut out.
    #[test]
    fn the_pods_own_ids_are_never_a_sandboxs() {
        let pod = [r(0, 200_000, 65_536)];
        let p = namespace_pool(&pod, &pod, &[40_000, 40_000, 12_000, 500]).unwrap();
        let ids = p.start..p.start + p.len;
        assert!(!ids.contains(&40_000) && !ids.contains(&12_000) && !ids.contains(&65_532));
        // The largest piece that is left: 12001..40000.
        assert_eq!(
            p,
            IdPool {
                start: 12_001,
                len: 40_000 - 12_001
            }
        );
    }

    #[test]
    fn the_pool_needs_ids_mapped_in_both_maps() {
        let uids = [r(0, 100_000, 65_536)];
        let gids = [r(0, 100_000, 20_000)];
        assert_eq!(
            namespace_pool(&uids, &gids, &[]),
            Some(IdPool {
                start: 10_000,
                len: 10_000
            })
        );
        // Only root mapped, or only ids below the minimum: no pool.
        assert_eq!(namespace_pool(&[r(0, 0, 1)], &[r(0, 0, 1)], &[]), None);
        assert_eq!(
            namespace_pool(&[r(0, 100_000, 5_000)], &[r(0, 100_000, 5_000)], &[]),
            None
        );
    }

    #[test]
    fn a_large_map_is_capped_and_skips_reserved_ids() {
        let big = [r(0, 1_000_000, 100_000_000)];
        let p = namespace_pool(&big, &big, &[]).unwrap();
        // The largest piece is above 65535.
        assert_eq!(p.start, 65_536);
        assert_eq!(p.len, HOST_ROOT_POOL.len);
        // Several ranges: the largest wins.
        let split = [
            r(0, 1_000_000, 1),
            r(20_000, 2_000_000, 100),
            r(30_000, 3_000_000, 500),
        ];
        assert_eq!(
            namespace_pool(&split, &split, &[]),
            Some(IdPool {
                start: 30_000,
                len: 500
            })
        );
        // The full map ends at u32::MAX without overflow, and never hands out -1.
        let full = [r(0, 0, u32::MAX)];
        let p = namespace_pool(&full, &full, &[]).unwrap();
        assert!(p.start as u64 + p.len as u64 <= u32::MAX as u64);
    }

    #[test]
    fn setgroups_file_decides_whether_groups_can_be_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("setgroups");
        fs::write(&f, "allow\n").unwrap();
        assert!(setgroups_allowed(&f));
        fs::write(&f, "deny\n").unwrap();
        assert!(!setgroups_allowed(&f));
        assert!(setgroups_allowed(&dir.path().join("absent")));
    }

    #[test]
    fn an_unprivileged_supervisor_has_no_powers() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            probe_powers(Identity::Unprivileged, None, &dir.path().join("s")),
            HelperPowers::default()
        );
    }
}
