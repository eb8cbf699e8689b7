//! The seccomp policy: which system calls sandboxed code may make.
//!
//! The policy is data, not code: `policy.json` (next to this file) is a
//! [seccompiler JSON file](https://github.com/rust-vmm/seccompiler/blob/master/docs/json_format.md)
//! in which every entry carries a `comment` saying why it is there. Review changes to that
//! file, not to this module. It holds three filters, which `build.rs` compiles to classic BPF
//! with seccompiler when the crate is built (as Firecracker does), so that the binary embeds
//! ready-made programs and no JSON is parsed at run time. The three are **stacked** (all are
//! installed; the kernel runs every installed filter on every syscall):
//!
//! 1. `allow` — an allowlist. Matching syscalls are allowed, everything else fails with
//!    `ENOSYS`. It is derived from Docker's default profile (the set of syscalls ordinary
//!    Linux programs use), trimmed to what CPython, Node (libuv, V8), Ruby, the Go toolchain
//!    (`go build` and the programs it produces) and bash/coreutils need. A syscall the
//!    kernel gains tomorrow is not on the list, so the policy fails closed.
//! 2. `deny` — a deny list. The known-dangerous syscalls (ptrace, mount and the new mount
//!    API, namespaces, keyrings, bpf, perf, userfaultfd, io_uring, modules, kexec, clocks,
//!    file handles, ...) fail with `EPERM`; everything else passes this filter. None of them is
//!    on the allowlist, so the allowlist alone would already refuse them: the deny list exists
//!    so that (a) a reviewer sees the blocked set, each with its reason, in one place, and
//!    (b) the program and the agent reading its output get "Operation not permitted" instead
//!    of a misleading "Function not implemented".
//! 3. `noop` — syscalls that return 0 without running (`SECCOMP_RET_ERRNO` with errno 0):
//!    the `sync` family and `POSIX_FADV_DONTNEED`. `sync()` flushes every filesystem of the
//!    host, even an `fsync` of a read-only host file sends a cache flush to the host's disk,
//!    and `POSIX_FADV_DONTNEED` evicts a host file from the page cache; everything a run can
//!    write is tmpfs, where they have nothing to do, so success is the answer that keeps
//!    programs working (issue 10). They are on no other list: should this filter be missing,
//!    the allowlist refuses them with `ENOSYS`.
//!
//! Some syscalls are allowed only for some arguments and appear in both filters with
//! complementary conditions, so that every call is either allowed or refused with `EPERM`:
//! `clone` (refused with any namespace flag), `personality` (only the five personas Docker
//! allows; `ADDR_NO_RANDOMIZE` and friends are refused), `socket` (only `AF_UNIX`,
//! `AF_INET`/`AF_INET6` with TCP or UDP, and `AF_NETLINK`/`NETLINK_ROUTE`; so no `AF_ALG`,
//! `AF_VSOCK`, `AF_PACKET`, `AF_KEY`, MPTCP, UDP-Lite, SCTP, ...), `ioctl` (refused for
//! `TIOCSTI` and `TIOCLINUX`, the terminal input injection requests of the CVE-2017-5226
//! class), `setsockopt` (no socket buffer sizes, no socket filters), `prlimit64` (own limits
//! only) and `fcntl` (no `F_NOTIFY`: directory events on the host's shared directories).
//! `preadv2` (not with `RWF_NOWAIT`, a page-cache oracle) and `msync` (`MS_SYNC` goes to the
//! `noop` filter) are conditional in the allowlist alone.
//!
//! # `ENOSYS` versus `EPERM`
//!
//! `ENOSYS` means "this kernel does not have that syscall", and well-written libraries react
//! by falling back to an older one: glibc's `posix_spawn`/`fork`/`pthread_create` fall back
//! from `clone3` to `clone`, libuv falls back from io_uring to epoll and its thread pool,
//! glibc from `statx` to `fstatat`, and so on. That is the right answer for "not on the
//! allowlist". `EPERM` means "you may not", which is the right answer, and the one a human
//! or an agent understands, for a deliberately blocked operation.
//!
//! # Stacking order
//!
//! With several filters installed, the kernel takes the most restrictive action (kill beats
//! trap beats errno beats allow). When two filters return the same action type, e.g. both
//! `SECCOMP_RET_ERRNO`, the result of the filter installed **last** wins. [`SeccompPolicy::apply`]
//! therefore installs `allow` first, `deny` second and `noop` last: a denied syscall gets
//! `ENOSYS` from the allowlist and `EPERM` from the deny list, and `EPERM` is what the caller
//! sees; a no-op syscall gets `ENOSYS` from the allowlist and 0 from `noop`, and returns 0.
//!
//! # `clone3`
//!
//! Seccomp BPF sees only the syscall number and the six register arguments; it cannot follow
//! pointers. `clone3` passes its flags in a struct in memory, so the filter could not tell a
//! thread from a new user namespace. `clone3` is therefore on neither list and gets `ENOSYS`
//! from the allowlist, glibc falls back to `clone`, and `clone`'s flags are a register the
//! filter does inspect. (This is what Docker does too.)
//!
//! # Other ABIs: x32 and i386
//!
//! Each compiled filter starts with an architecture check emitted by seccompiler: a syscall
//! whose `seccomp_data.arch` is not `AUDIT_ARCH_X86_64` kills the whole process
//! (`SECCOMP_RET_KILL_PROCESS`, visible as `SIGSYS`). That covers the i386 ABI (`int 0x80`,
//! 32-bit `sysenter`), whose syscall numbers differ from x86_64's. The x32 ABI reports
//! `AUDIT_ARCH_X86_64` too, but with bit 30 (`__X32_SYSCALL_BIT`, `0x40000000`) set in the
//! syscall number; the filters compare the full number, so no x32 syscall matches any entry
//! and all of them get `ENOSYS` from the allowlist, whether or not the kernel supports x32.
//!
//! # Where it is installed
//!
//! The caller installs the policy in the sandboxed child as the very last step, after the
//! namespaces, mounts, Landlock ruleset, rlimits and capability drop, and with
//! `PR_SET_NO_NEW_PRIVS` set, immediately before `execve`. [`SeccompPolicy::apply`] does not
//! allocate (the programs are static data), so it is safe to call in the child of a
//! multithreaded parent. Filters are per thread and inherited across `fork`/`clone`/`execve`;
//! they cannot be removed.
//!
//! # Departures from Docker's default profile
//!
//! Besides the explicit deny list (Docker allows some of those syscalls to processes holding
//! the matching capability, and allows `adjtimex`, `clock_adjtime`, `name_to_handle_at`,
//! `modify_ldt`, and `ptrace`/`process_vm_*` on recent kernels): `socket` is limited to four
//! families rather than "anything but `AF_VSOCK`"; `ioctl` refuses `TIOCSTI`/`TIOCLINUX`;
//! inotify, fanotify and dnotify are refused (the read-only binds are the host's inodes, so
//! they reported the host's activity, issue 10); `sync`, `syncfs` and `fsync` do nothing;
//! and `memfd_secret`,
//! `set_thread_area`/`get_thread_area` (32-bit TLS), `epoll_ctl_old`/`epoll_wait_old`
//! (never implemented) and the NUMA policy calls are simply absent (`ENOSYS`).
//!
//! Only x86_64 has a policy today; building for another architecture fails in `build.rs` with
//! a message saying so (seccompiler also knows aarch64 and riscv64, but `policy.json` names
//! x86_64 syscalls, many of which do not exist there).

use std::io;

use libc::sock_filter;

#[cfg(test)]
mod compile;

/// Name of the allowlist filter in `policy.json`.
const ALLOW: &str = "allow";
/// Name of the deny-list filter in `policy.json`.
const DENY: &str = "deny";
/// Name of the filter whose syscalls return 0 without running.
const NOOP: &str = "noop";

/// The two filters as `build.rs` serialised them: 8 bytes per instruction (`code` u16 LE,
/// `jt`, `jf`, `k` u32 LE).
const ALLOW_BPF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/seccomp_allow.bpf"));
const DENY_BPF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/seccomp_deny.bpf"));
const NOOP_BPF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/seccomp_noop.bpf"));
const INSN_BYTES: usize = 8;
const _: () = assert!(
    ALLOW_BPF.len().is_multiple_of(INSN_BYTES)
        && DENY_BPF.len().is_multiple_of(INSN_BYTES)
        && NOOP_BPF.len().is_multiple_of(INSN_BYTES)
);

/// The programs, decoded at compile time: installing them needs no allocation and no parsing.
static ALLOW_PROG: [sock_filter; ALLOW_BPF.len() / INSN_BYTES] = decode(ALLOW_BPF);
static DENY_PROG: [sock_filter; DENY_BPF.len() / INSN_BYTES] = decode(DENY_BPF);
static NOOP_PROG: [sock_filter; NOOP_BPF.len() / INSN_BYTES] = decode(NOOP_BPF);

const fn decode<const N: usize>(bytes: &[u8]) -> [sock_filter; N] {
    let mut prog = [sock_filter {
        code: 0,
        jt: 0,
        jf: 0,
        k: 0,
    }; N];
    let mut i = 0;
    while i < N {
        let b = i * INSN_BYTES;
        prog[i] = sock_filter {
            code: u16::from_le_bytes([bytes[b], bytes[b + 1]]),
            jt: bytes[b + 2],
            jf: bytes[b + 3],
            k: u32::from_le_bytes([bytes[b + 4], bytes[b + 5], bytes[b + 6], bytes[b + 7]]),
        };
        i += 1;
    }
    prog
}

/// Errors installing the seccomp policy.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// The kernel refused to install a filter (or `PR_SET_NO_NEW_PRIVS` failed).
    #[error("cannot install the {filter:?} seccomp filter")]
    Apply {
        /// Which filter: `"allow"`, `"deny"` or `"noop"`.
        filter: &'static str,
        source: io::Error,
    },
}

/// The policy: the three BPF programs, ready to install.
#[derive(Clone, Copy)]
pub struct SeccompPolicy {
    allow: &'static [sock_filter],
    deny: &'static [sock_filter],
    noop: &'static [sock_filter],
}

impl std::fmt::Debug for SeccompPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeccompPolicy")
            .field("allow_instructions", &self.allow.len())
            .field("deny_instructions", &self.deny.len())
            .field("noop_instructions", &self.noop.len())
            .finish()
    }
}

impl SeccompPolicy {
    /// The policy compiled from `policy.json` when the crate was built.
    pub fn embedded() -> SeccompPolicy {
        SeccompPolicy {
            allow: &ALLOW_PROG,
            deny: &DENY_PROG,
            noop: &NOOP_PROG,
        }
    }

    /// Installs the three filters on the calling thread: the allowlist first, then the deny
    /// list, then the no-op filter (the later filter wins between two errno results, so denied
    /// syscalls report `EPERM` and the no-op ones return 0).
    ///
    /// The caller should have set `PR_SET_NO_NEW_PRIVS` already (it is set again here, which
    /// is harmless). Does not allocate: it is meant to run in a forked child right before
    /// `execve`. If a later filter fails to install, the earlier ones stay installed; the
    /// caller must then abandon the child.
    pub fn apply(&self) -> Result<(), SeccompError> {
        crate::sys::install_seccomp_filter(self.allow).map_err(|source| SeccompError::Apply {
            filter: ALLOW,
            source,
        })?;
        crate::sys::install_seccomp_filter(self.deny).map_err(|source| SeccompError::Apply {
            filter: DENY,
            source,
        })?;
        crate::sys::install_seccomp_filter(self.noop).map_err(|source| SeccompError::Apply {
            filter: NOOP,
            source,
        })?;
        Ok(())
    }
}

/// The policy file, the source of truth the embedded programs were compiled from; the tests
/// read its comments and conditions.
#[cfg(test)]
const POLICY_JSON: &str = include_str!("policy.json");

/// One rule of a filter in `policy.json`, as far as the tests need it.
#[cfg(test)]
#[derive(Debug, serde::Deserialize)]
struct RuleDoc {
    syscall: String,
    #[serde(default)]
    comment: Option<String>,
    #[serde(default)]
    args: Option<Vec<serde_json::Value>>,
}

/// One filter of `policy.json`; the actions are left to seccompiler.
#[cfg(test)]
#[derive(Debug, serde::Deserialize)]
struct FilterDoc {
    filter: Vec<RuleDoc>,
}

/// Parses `policy.json` for the tests.
#[cfg(test)]
fn policy_doc() -> std::collections::HashMap<String, FilterDoc> {
    serde_json::from_str(POLICY_JSON).expect("policy.json is valid JSON")
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    use std::collections::BTreeSet;
    use std::ffi::{c_char, c_long, CString};
    use std::os::unix::ffi::OsStrExt;
    use std::panic::AssertUnwindSafe;
    use std::path::Path;
    use std::time::{Duration, Instant};

    // ---------------------------------------------------------------------------------------
    // The policy file itself.
    // ---------------------------------------------------------------------------------------

    /// Syscalls that appear in both filters, with complementary argument conditions.
    const CONDITIONAL: [&str; 7] = [
        "clone",
        "ioctl",
        "personality",
        "socket",
        "prlimit64",
        "setsockopt",
        "fcntl",
    ];

    fn names(filter: &FilterDoc) -> BTreeSet<&str> {
        filter.filter.iter().map(|r| r.syscall.as_str()).collect()
    }

    #[test]
    fn policy_compiles_and_the_filters_are_non_empty() {
        let policy = SeccompPolicy::embedded();
        // More than the 3-instruction architecture check plus the default return.
        assert!(
            policy.allow.len() > 10,
            "allow filter: {} insns",
            policy.allow.len()
        );
        assert!(
            policy.deny.len() > 10,
            "deny filter: {} insns",
            policy.deny.len()
        );
        assert!(
            policy.noop.len() > 5,
            "noop filter: {} insns",
            policy.noop.len()
        );
        // Classic BPF programs are limited to 4096 instructions (BPF_MAXINSNS).
        assert!(policy.allow.len() <= 4096 && policy.deny.len() <= 4096);
        assert!(policy.noop.len() <= 4096);
        let doc = policy_doc();
        assert_eq!(
            doc.keys().map(String::as_str).collect::<BTreeSet<_>>(),
            BTreeSet::from([ALLOW, DENY, NOOP]),
            "policy.json holds exactly the three filters"
        );
    }

    #[test]
    fn filters_have_the_documented_actions() {
        let v: serde_json::Value = serde_json::from_str(POLICY_JSON).unwrap();
        assert_eq!(v[ALLOW]["filter_action"], serde_json::json!("allow"));
        assert_eq!(
            v[ALLOW]["mismatch_action"],
            serde_json::json!({ "errno": 38 })
        );
        assert_eq!(v[DENY]["filter_action"], serde_json::json!({ "errno": 1 }));
        assert_eq!(v[DENY]["mismatch_action"], serde_json::json!("allow"));
        assert_eq!(v[NOOP]["filter_action"], serde_json::json!({ "errno": 0 }));
        assert_eq!(v[NOOP]["mismatch_action"], serde_json::json!("allow"));
    }

    /// The no-op filter's syscalls are in neither other filter unconditionally: the allowlist
    /// must not let them run should the no-op filter be missing, and an unconditional deny
    /// entry would hide the no-op (EPERM and 0 are both errno actions; the later filter wins).
    /// Conditional deny entries (other `setsockopt` options) are checked call by call in the
    /// BPF tests.
    #[test]
    fn noop_syscalls_are_not_allowed_or_denied_outright() {
        let doc = policy_doc();
        let allow = &doc[ALLOW].filter;
        for rule in &doc[NOOP].filter {
            for d in doc[DENY]
                .filter
                .iter()
                .filter(|d| d.syscall == rule.syscall)
            {
                assert!(d.args.is_some(), "{} is denied", rule.syscall);
            }
            for a in allow.iter().filter(|a| a.syscall == rule.syscall) {
                assert!(
                    a.args.is_some(),
                    "{} is allowed unconditionally",
                    rule.syscall
                );
            }
        }
    }

    #[test]
    fn allow_and_deny_are_disjoint_except_the_conditional_syscalls() {
        let doc = policy_doc();
        let allow = names(&doc[ALLOW]);
        let deny = names(&doc[DENY]);
        let both: BTreeSet<&str> = allow.intersection(&deny).copied().collect();
        assert_eq!(both, BTreeSet::from(CONDITIONAL));
        // The conditional syscalls must be conditional in *every* rule of both filters:
        // an unconditional rule would swallow the conditions of the others.
        for rule in doc[ALLOW].filter.iter().chain(&doc[DENY].filter) {
            if CONDITIONAL.contains(&rule.syscall.as_str()) {
                assert!(
                    rule.args.as_ref().is_some_and(|a| !a.is_empty()),
                    "{} must always carry conditions",
                    rule.syscall
                );
            }
        }
        // clone3 must be in neither filter: ENOSYS is what makes glibc fall back to clone.
        assert!(!allow.contains("clone3") && !deny.contains("clone3"));
        // Every other syscall is listed once per filter.
        for filter in [&doc[ALLOW], &doc[DENY]] {
            let mut seen = BTreeSet::new();
            for rule in &filter.filter {
                let name = rule.syscall.as_str();
                assert!(
                    seen.insert(name) || CONDITIONAL.contains(&name),
                    "{name} listed twice"
                );
            }
        }
    }

    #[test]
    fn every_entry_and_condition_has_a_comment() {
        let doc = policy_doc();
        for (filter_name, filter) in &doc {
            for rule in &filter.filter {
                assert!(
                    rule.comment
                        .as_deref()
                        .is_some_and(|c| !c.trim().is_empty()),
                    "{filter_name}: {} has no comment",
                    rule.syscall
                );
                for cond in rule.args.iter().flatten() {
                    assert!(
                        cond["comment"]
                            .as_str()
                            .is_some_and(|c| !c.trim().is_empty()),
                        "{filter_name}: a condition of {} has no comment",
                        rule.syscall
                    );
                }
            }
        }
    }

    #[test]
    fn the_deny_filter_names_the_dangerous_syscalls() {
        let doc = policy_doc();
        let deny = names(&doc[DENY]);
        for name in [
            "ptrace",
            "mount",
            "unshare",
            "bpf",
            "io_uring_setup",
            "clone",
            "socket",
        ] {
            assert!(deny.contains(name), "{name} missing from {deny:?}");
        }
        for name in ["read", "execve", "clone3"] {
            assert!(!deny.contains(name), "{name} must not be denied");
        }
    }

    #[test]
    fn embedded_bpf_is_a_fresh_compile_of_policy_json() {
        let compile::Programs { allow, deny, noop } =
            compile::compile(POLICY_JSON.as_bytes(), seccompiler::TargetArch::x86_64).unwrap();
        let policy = SeccompPolicy::embedded();
        assert_eq!(
            compile::serialize(&allow),
            ALLOW_BPF,
            "allow filter is stale"
        );
        assert_eq!(compile::serialize(&deny), DENY_BPF, "deny filter is stale");
        assert_eq!(compile::serialize(&noop), NOOP_BPF, "noop filter is stale");
        // And the compile-time decoding reads back the same instructions.
        let same = |embedded: &[sock_filter], fresh: &[seccompiler::sock_filter]| {
            embedded.len() == fresh.len()
                && embedded
                    .iter()
                    .zip(fresh)
                    .all(|(a, b)| (a.code, a.jt, a.jf, a.k) == (b.code, b.jt, b.jf, b.k))
        };
        assert!(same(policy.allow, &allow) && same(policy.deny, &deny));
        assert!(same(policy.noop, &noop));
    }

    #[test]
    fn compile_reports_bad_policies() {
        let unknown = r#"{"allow": {"mismatch_action": {"errno": 38}, "filter_action": "allow",
            "filter": [{"syscall": "no_such_syscall"}]},
            "deny": {"mismatch_action": "allow", "filter_action": {"errno": 1}, "filter": []}}"#;
        assert!(matches!(
            compile::compile(unknown.as_bytes(), seccompiler::TargetArch::x86_64),
            Err(compile::CompileError::Json(_))
        ));
        let no_deny = r#"{"allow": {"mismatch_action": {"errno": 38}, "filter_action": "allow",
            "filter": [{"syscall": "read"}]},
            "noop": {"mismatch_action": "allow", "filter_action": {"errno": 0}, "filter": []}}"#;
        assert!(matches!(
            compile::compile(no_deny.as_bytes(), seccompiler::TargetArch::x86_64),
            Err(compile::CompileError::MissingFilter("deny"))
        ));
    }

    // ---------------------------------------------------------------------------------------
    // A classic-BPF interpreter, to check the compiled programs on inputs the kernel of the
    // test machine cannot produce (x32 is often compiled out) or that would be unsafe to
    // issue for real, and to check the stacking semantics on every syscall number.
    // ---------------------------------------------------------------------------------------

    const RET_KILL_PROCESS: u32 = 0x8000_0000;
    const RET_ERRNO: u32 = 0x0005_0000;
    const RET_ALLOW: u32 = 0x7fff_0000;
    const RET_ACTION_FULL: u32 = 0xffff_0000;
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    const AUDIT_ARCH_I386: u32 = 0x4000_0003;
    const X32_SYSCALL_BIT: i64 = 0x4000_0000;

    const EPERM: u32 = RET_ERRNO | libc::EPERM as u32;
    /// `SECCOMP_RET_ERRNO` with errno 0: the syscall is skipped and returns 0.
    const NOOP_RET: u32 = RET_ERRNO;
    const ENOSYS: u32 = RET_ERRNO | libc::ENOSYS as u32;

    /// `struct seccomp_data`.
    struct Data {
        nr: i64,
        arch: u32,
        args: [u64; 6],
    }

    impl Data {
        fn x86_64(nr: i64, args: &[u64]) -> Data {
            let mut a = [0u64; 6];
            a[..args.len()].copy_from_slice(args);
            Data {
                nr,
                arch: AUDIT_ARCH_X86_64,
                args: a,
            }
        }

        /// A 32-bit load at byte offset `k`, little-endian like x86_64.
        fn word(&self, k: u32) -> u32 {
            match k {
                0 => self.nr as u32,
                4 => self.arch,
                16..=63 => {
                    let arg = self.args[(k as usize - 16) / 8];
                    match (k - 16) % 8 {
                        0 => arg as u32,
                        4 => (arg >> 32) as u32,
                        _ => panic!("misaligned seccomp_data offset {k}"),
                    }
                }
                _ => panic!("unexpected seccomp_data offset {k}"),
            }
        }
    }

    fn run_bpf(prog: &[sock_filter], d: &Data) -> u32 {
        let mut acc = 0u32;
        let mut pc = 0usize;
        loop {
            let ins = &prog[pc];
            pc += 1;
            let jump = |cond: bool| usize::from(if cond { ins.jt } else { ins.jf });
            match ins.code {
                0x20 => acc = d.word(ins.k),          // BPF_LD | BPF_W | BPF_ABS
                0x54 => acc &= ins.k,                 // BPF_ALU | BPF_AND | BPF_K
                0x05 => pc += ins.k as usize,         // BPF_JMP | BPF_JA
                0x15 => pc += jump(acc == ins.k),     // BPF_JMP | BPF_JEQ | BPF_K
                0x25 => pc += jump(acc > ins.k),      // BPF_JMP | BPF_JGT | BPF_K
                0x35 => pc += jump(acc >= ins.k),     // BPF_JMP | BPF_JGE | BPF_K
                0x45 => pc += jump(acc & ins.k != 0), // BPF_JMP | BPF_JSET | BPF_K
                0x06 => return ins.k,                 // BPF_RET | BPF_K
                code => panic!("unsupported BPF opcode {code:#x} at {}", pc - 1),
            }
        }
    }

    /// What the kernel returns with both filters installed (kernel/seccomp.c,
    /// `seccomp_run_filters`): newest filter first, a later result replaces the current one
    /// only if its action is strictly more restrictive (signed comparison).
    fn stacked(policy: &SeccompPolicy, d: &Data) -> u32 {
        let mut ret = RET_ALLOW;
        for prog in [policy.noop, policy.deny, policy.allow] {
            let cur = run_bpf(prog, d);
            if ((cur & RET_ACTION_FULL) as i32) < ((ret & RET_ACTION_FULL) as i32) {
                ret = cur;
            }
        }
        ret
    }

    fn check(policy: &SeccompPolicy, nr: c_long, args: &[u64]) -> u32 {
        stacked(policy, &Data::x86_64(nr, args))
    }

    /// x86_64 numbers of the deny list's syscalls (independently of seccompiler's table).
    fn deny_nr(name: &str) -> Option<c_long> {
        use libc::*;
        Some(match name {
            "ptrace" => SYS_ptrace,
            "process_vm_readv" => SYS_process_vm_readv,
            "process_vm_writev" => SYS_process_vm_writev,
            "kcmp" => SYS_kcmp,
            "pidfd_getfd" => SYS_pidfd_getfd,
            "mount" => SYS_mount,
            "umount2" => SYS_umount2,
            "pivot_root" => SYS_pivot_root,
            "chroot" => SYS_chroot,
            "move_mount" => SYS_move_mount,
            "open_tree" => SYS_open_tree,
            "fsopen" => SYS_fsopen,
            "fsconfig" => SYS_fsconfig,
            "fsmount" => SYS_fsmount,
            "fspick" => SYS_fspick,
            "mount_setattr" => SYS_mount_setattr,
            "unshare" => SYS_unshare,
            "setns" => SYS_setns,
            "keyctl" => SYS_keyctl,
            "add_key" => SYS_add_key,
            "request_key" => SYS_request_key,
            "bpf" => SYS_bpf,
            "perf_event_open" => SYS_perf_event_open,
            "userfaultfd" => SYS_userfaultfd,
            "io_uring_setup" => SYS_io_uring_setup,
            "io_uring_enter" => SYS_io_uring_enter,
            "io_uring_register" => SYS_io_uring_register,
            "init_module" => SYS_init_module,
            "finit_module" => SYS_finit_module,
            "delete_module" => SYS_delete_module,
            "kexec_load" => SYS_kexec_load,
            "kexec_file_load" => SYS_kexec_file_load,
            "reboot" => SYS_reboot,
            "swapon" => SYS_swapon,
            "swapoff" => SYS_swapoff,
            "acct" => SYS_acct,
            "settimeofday" => SYS_settimeofday,
            "clock_settime" => SYS_clock_settime,
            "clock_adjtime" => SYS_clock_adjtime,
            "adjtimex" => SYS_adjtimex,
            "open_by_handle_at" => SYS_open_by_handle_at,
            "name_to_handle_at" => SYS_name_to_handle_at,
            "lookup_dcookie" => SYS_lookup_dcookie,
            "quotactl" => SYS_quotactl,
            "quotactl_fd" => SYS_quotactl_fd,
            "syslog" => SYS_syslog,
            "vhangup" => SYS_vhangup,
            "iopl" => SYS_iopl,
            "ioperm" => SYS_ioperm,
            "uselib" => SYS_uselib,
            "sysfs" => SYS_sysfs,
            "_sysctl" => SYS__sysctl,
            "fanotify_init" => SYS_fanotify_init,
            "fanotify_mark" => SYS_fanotify_mark,
            "inotify_init" => SYS_inotify_init,
            "inotify_init1" => SYS_inotify_init1,
            "inotify_add_watch" => SYS_inotify_add_watch,
            "inotify_rm_watch" => SYS_inotify_rm_watch,
            "fcntl" => SYS_fcntl,
            "sethostname" => SYS_sethostname,
            "setdomainname" => SYS_setdomainname,
            "migrate_pages" => SYS_migrate_pages,
            "move_pages" => SYS_move_pages,
            "process_madvise" => SYS_process_madvise,
            "modify_ldt" => SYS_modify_ldt,
            "nfsservctl" => SYS_nfsservctl,
            "create_module" => 174,
            "get_kernel_syms" => 177,
            "query_module" => 178,
            "tuxcall" => SYS_tuxcall,
            "security" => SYS_security,
            "afs_syscall" => SYS_afs_syscall,
            "putpmsg" => SYS_putpmsg,
            "getpmsg" => SYS_getpmsg,
            "vserver" => SYS_vserver,
            "clone" => SYS_clone,
            "personality" => SYS_personality,
            "socket" => SYS_socket,
            "ioctl" => SYS_ioctl,
            "prlimit64" => SYS_prlimit64,
            "setsockopt" => SYS_setsockopt,
            "io_setup" => SYS_io_setup,
            _ => return None,
        })
    }

    #[test]
    fn bpf_prlimit_on_other_processes_and_socket_buffers_are_refused_or_ignored() {
        use libc::{SYS_prlimit64, SYS_setsockopt};
        let policy = SeccompPolicy::embedded();
        assert_eq!(
            check(&policy, SYS_prlimit64, &[0, 7, 0, 0, 0, 0]),
            RET_ALLOW,
            "own limits"
        );
        assert_eq!(
            check(&policy, SYS_prlimit64, &[1, 7, 0, 0, 0, 0]),
            EPERM,
            "pid 1's limits"
        );
        for opt in [32, 33] {
            assert_eq!(
                check(&policy, SYS_setsockopt, &[3, 1, opt, 0, 4, 0]),
                EPERM,
                "option {opt}"
            );
        }
        // SO_SNDBUF and SO_RCVBUF succeed without doing anything.
        for opt in [7, 8] {
            assert_eq!(
                check(&policy, SYS_setsockopt, &[3, 1, opt, 0, 4, 0]),
                libc::SECCOMP_RET_ERRNO,
                "option {opt}"
            );
        }
        assert_eq!(
            check(&policy, SYS_setsockopt, &[3, 1, 2, 0, 4, 0]),
            RET_ALLOW,
            "SO_REUSEADDR"
        );
        // The same numbers at other levels are other options (IP_PKTINFO, TCP_SYNCNT).
        assert_eq!(
            check(&policy, SYS_setsockopt, &[3, 0, 8, 0, 4, 0]),
            RET_ALLOW,
            "IP_PKTINFO"
        );
        assert_eq!(
            check(&policy, SYS_setsockopt, &[3, 6, 7, 0, 4, 0]),
            RET_ALLOW,
            "TCP_SYNCNT"
        );
        assert_eq!(
            check(&policy, libc::SYS_io_setup, &[1, 0, 0, 0, 0, 0]),
            EPERM,
            "Linux AIO"
        );
    }

    #[test]
    fn bpf_every_unconditional_deny_entry_gives_eperm() {
        let policy = SeccompPolicy::embedded();
        for rule in &policy_doc()[DENY].filter {
            let nr = deny_nr(&rule.syscall)
                .unwrap_or_else(|| panic!("add {} to deny_nr()", rule.syscall));
            if rule.args.is_none() {
                for args in [[0u64; 6], [u64::MAX; 6]] {
                    assert_eq!(
                        check(&policy, nr, &args),
                        EPERM,
                        "{} with args {args:x?}",
                        rule.syscall
                    );
                }
            }
        }
    }

    #[test]
    fn bpf_every_syscall_number_is_allowed_or_refused_with_an_errno() {
        let policy = SeccompPolicy::embedded();
        let mut allowed = 0;
        for nr in 0..1024 {
            match check(&policy, nr, &[]) {
                RET_ALLOW => allowed += 1,
                EPERM | ENOSYS | NOOP_RET => {}
                other => panic!("syscall {nr}: unexpected result {other:#x}"),
            }
        }
        assert!(
            (250..=300).contains(&allowed),
            "{allowed} syscall numbers allowed"
        );
        // Spot checks, including the stacking order: EPERM (deny, installed last) wins over
        // ENOSYS (allowlist mismatch).
        assert_eq!(check(&policy, libc::SYS_read, &[]), RET_ALLOW);
        assert_eq!(check(&policy, libc::SYS_execve, &[]), RET_ALLOW);
        assert_eq!(check(&policy, libc::SYS_ptrace, &[]), EPERM);
        assert_eq!(check(&policy, libc::SYS_clone3, &[]), ENOSYS);
        assert_eq!(check(&policy, libc::SYS_io_uring_setup, &[]), EPERM);
        assert_eq!(check(&policy, 1000, &[]), ENOSYS);
        assert_eq!(check(&policy, -1, &[]), ENOSYS);
    }

    #[test]
    fn bpf_x32_syscalls_get_enosys() {
        let policy = SeccompPolicy::embedded();
        for nr in (0..1024).map(|nr| nr | X32_SYSCALL_BIT) {
            assert_eq!(check(&policy, nr, &[]), ENOSYS, "x32 syscall {nr:#x}");
        }
    }

    #[test]
    fn bpf_other_architectures_are_killed() {
        let policy = SeccompPolicy::embedded();
        for arch in [
            AUDIT_ARCH_I386,
            0xc000_00b7, /* AUDIT_ARCH_AARCH64 */
            0,
        ] {
            for nr in [0, 1, 20, 39, 59, 435] {
                let d = Data {
                    nr,
                    arch,
                    args: [0; 6],
                };
                assert_eq!(run_bpf(policy.allow, &d), RET_KILL_PROCESS);
                assert_eq!(run_bpf(policy.deny, &d), RET_KILL_PROCESS);
                assert_eq!(run_bpf(policy.noop, &d), RET_KILL_PROCESS);
                assert_eq!(stacked(&policy, &d), RET_KILL_PROCESS);
            }
        }
    }

    const NS_FLAGS: [u64; 7] = [
        libc::CLONE_NEWNS as u64,
        libc::CLONE_NEWCGROUP as u64,
        libc::CLONE_NEWUTS as u64,
        libc::CLONE_NEWIPC as u64,
        libc::CLONE_NEWUSER as u64,
        libc::CLONE_NEWPID as u64,
        libc::CLONE_NEWNET as u64,
    ];

    #[test]
    fn bpf_clone_namespace_flags_are_refused() {
        let policy = SeccompPolicy::embedded();
        assert_eq!(NS_FLAGS.iter().fold(0, |a, f| a | f), 0x7E02_0000);
        let sigchld = libc::SIGCHLD as u64;
        let thread = (libc::CLONE_VM
            | libc::CLONE_FS
            | libc::CLONE_FILES
            | libc::CLONE_SIGHAND
            | libc::CLONE_THREAD
            | libc::CLONE_SYSVSEM
            | libc::CLONE_SETTLS
            | libc::CLONE_PARENT_SETTID
            | libc::CLONE_CHILD_CLEARTID) as u64;
        let vfork = (libc::CLONE_VM | libc::CLONE_VFORK) as u64 | sigchld;
        for flags in [sigchld, thread, vfork, 0, !0x7E02_0000] {
            assert_eq!(
                check(&policy, libc::SYS_clone, &[flags]),
                RET_ALLOW,
                "{flags:#x}"
            );
        }
        for ns in NS_FLAGS {
            for base in [0, sigchld, thread, vfork] {
                let flags = base | ns;
                assert_eq!(
                    check(&policy, libc::SYS_clone, &[flags]),
                    EPERM,
                    "{flags:#x}"
                );
            }
        }
        assert_eq!(check(&policy, libc::SYS_clone, &[u64::MAX]), EPERM);
    }

    #[test]
    fn bpf_personality_only_allows_dockers_personas() {
        let policy = SeccompPolicy::embedded();
        let allowed = [0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];
        for p in allowed {
            assert_eq!(
                check(&policy, libc::SYS_personality, &[p]),
                RET_ALLOW,
                "{p:#x}"
            );
        }
        let refused = [
            0x0040000, // ADDR_NO_RANDOMIZE
            0x0040008, // PER_LINUX32 | ADDR_NO_RANDOMIZE
            0x0400000, // READ_IMPLIES_EXEC
            0x0200000, // ADDR_COMPAT_LAYOUT
            0x8000000, // ADDR_LIMIT_3GB
            0x1,
            0x9,
            0xffff_fffe,
        ];
        for p in refused {
            assert_eq!(check(&policy, libc::SYS_personality, &[p]), EPERM, "{p:#x}");
        }
    }

    #[test]
    fn bpf_socket_families_and_netlink_protocols() {
        let policy = SeccompPolicy::embedded();
        // Issue 10: MPTCP (262), UDP-Lite (136), SCTP (132), raw (255) among the protocols.
        for family in 0..=64u64 {
            for protocol in (0..=32u64).chain([58, 132, 136, 255, 256, 262, 1 << 32 | 6]) {
                let ok = family == 1
                    || (matches!(family, 2 | 10) && matches!(protocol as u32, 0 | 6 | 17))
                    || (family == 16 && protocol == 0);
                let want = if ok { RET_ALLOW } else { EPERM };
                assert_eq!(
                    check(&policy, libc::SYS_socket, &[family, 1, protocol]),
                    want,
                    "socket({family}, _, {protocol})"
                );
            }
        }
        // Only the low 32 bits are the int the kernel reads.
        assert_eq!(
            check(&policy, libc::SYS_socket, &[0xffff_ffff_0000_0001]),
            RET_ALLOW
        );
        assert_eq!(check(&policy, libc::SYS_socket, &[0x1_0000_0026]), EPERM);
    }

    /// Issue 10: socket filters are kernel code nothing in the sandbox needs.
    #[test]
    fn bpf_socket_filter_options_are_refused() {
        let policy = SeccompPolicy::embedded();
        // SO_ATTACH_FILTER, SO_ATTACH_BPF, SO_ATTACH_REUSEPORT_CBPF, SO_ATTACH_REUSEPORT_EBPF.
        for opt in [26, 50, 51, 52] {
            assert_eq!(
                check(&policy, libc::SYS_setsockopt, &[3, 1, opt, 0, 16, 0]),
                EPERM,
                "SOL_SOCKET option {opt}"
            );
        }
        // SO_DETACH_FILTER, SO_LOCK_FILTER, SO_KEEPALIVE, SO_REUSEPORT stay; so do the same
        // numbers at IPPROTO_IP (26 is IP_NODEFRAG there).
        for opt in [27, 44, 9, 15] {
            assert_eq!(
                check(&policy, libc::SYS_setsockopt, &[3, 1, opt, 0, 4, 0]),
                RET_ALLOW,
                "SOL_SOCKET option {opt}"
            );
        }
        assert_eq!(
            check(&policy, libc::SYS_setsockopt, &[3, 0, 26, 0, 4, 0]),
            RET_ALLOW
        );
    }

    /// Issue 10: file-event APIs report host activity on the shared read-only binds.
    #[test]
    fn bpf_file_event_apis_are_refused() {
        let policy = SeccompPolicy::embedded();
        for nr in [
            libc::SYS_inotify_init,
            libc::SYS_inotify_init1,
            libc::SYS_inotify_add_watch,
            libc::SYS_inotify_rm_watch,
            libc::SYS_fanotify_init,
            libc::SYS_fanotify_mark,
        ] {
            assert_eq!(check(&policy, nr, &[0, 0, 0]), EPERM, "syscall {nr}");
        }
        const F_NOTIFY: u64 = 1026;
        assert_eq!(check(&policy, libc::SYS_fcntl, &[3, F_NOTIFY, 0]), EPERM);
        assert_eq!(
            check(
                &policy,
                libc::SYS_fcntl,
                &[3, F_NOTIFY | 0xffff_ffff_0000_0000, 0]
            ),
            EPERM
        );
        for cmd in [
            libc::F_GETFL,
            libc::F_SETFL,
            libc::F_SETFD,
            libc::F_DUPFD_CLOEXEC,
            libc::F_SETLK,
            libc::F_SETLKW,
            libc::F_GETLK,
            libc::F_OFD_SETLK,
            libc::F_SETPIPE_SZ,
        ] {
            assert_eq!(
                check(&policy, libc::SYS_fcntl, &[3, cmd as u64, 0]),
                RET_ALLOW,
                "fcntl cmd {cmd}"
            );
        }
    }

    /// Issue 10: a `sync()` loop did 117,000 host-wide flushes in 8 s; an `fsync` of a
    /// read-only host file costs one device flush. They return 0 without running.
    #[test]
    fn bpf_sync_family_returns_0_without_running() {
        let policy = SeccompPolicy::embedded();
        for nr in [
            libc::SYS_sync,
            libc::SYS_syncfs,
            libc::SYS_fsync,
            libc::SYS_fdatasync,
            libc::SYS_sync_file_range,
        ] {
            for args in [[0u64; 6], [u64::MAX; 6]] {
                assert_eq!(check(&policy, nr, &args), NOOP_RET, "syscall {nr}");
            }
        }
        let ms = |flags: i32| check(&policy, libc::SYS_msync, &[0, 4096, flags as u64]);
        assert_eq!(ms(libc::MS_SYNC), NOOP_RET);
        assert_eq!(ms(libc::MS_SYNC | libc::MS_INVALIDATE), NOOP_RET);
        assert_eq!(ms(libc::MS_ASYNC), RET_ALLOW);
        assert_eq!(ms(libc::MS_INVALIDATE), RET_ALLOW);
        assert_eq!(ms(0), RET_ALLOW);
        let fadvise = |advice: u64| check(&policy, libc::SYS_fadvise64, &[3, 0, 0, advice]);
        assert_eq!(fadvise(libc::POSIX_FADV_DONTNEED as u64), NOOP_RET);
        for advice in [
            libc::POSIX_FADV_NORMAL,
            libc::POSIX_FADV_SEQUENTIAL,
            libc::POSIX_FADV_WILLNEED,
        ] {
            assert_eq!(fadvise(advice as u64), RET_ALLOW, "advice {advice}");
        }
        // The no-op filter lets everything else through.
        let noop_only = |nr: i64| run_bpf(policy.noop, &Data::x86_64(nr, &[]));
        for nr in [libc::SYS_read, libc::SYS_ptrace, libc::SYS_clone3, 1000] {
            assert_eq!(noop_only(nr), RET_ALLOW, "syscall {nr}");
        }
    }

    /// Issue 10: `preadv2(RWF_NOWAIT)` answers EAGAIN for pages not in the page cache, an
    /// oracle for the host's and other runs' use of the shared binds.
    #[test]
    fn bpf_preadv2_nowait_is_refused() {
        let policy = SeccompPolicy::embedded();
        let p = |flags: u64| check(&policy, libc::SYS_preadv2, &[3, 0, 1, 0, 0, flags]);
        for flags in [0, 0x1 /* RWF_HIPRI */, 0x10 /* RWF_APPEND */] {
            assert_eq!(p(flags), RET_ALLOW, "{flags:#x}");
        }
        for flags in [0x8, 0x9, 0xffff_ffff] {
            assert_eq!(p(flags), ENOSYS, "{flags:#x}");
        }
    }

    #[test]
    fn bpf_ioctl_terminal_injection_is_refused() {
        let policy = SeccompPolicy::embedded();
        for cmd in [libc::TIOCSTI, libc::TIOCLINUX] {
            assert_eq!(
                check(&policy, libc::SYS_ioctl, &[0, cmd]),
                EPERM,
                "{cmd:#x}"
            );
            // The kernel reads `unsigned int cmd`; garbage in the upper half changes nothing.
            let padded = cmd | 0xffff_ffff_0000_0000;
            assert_eq!(check(&policy, libc::SYS_ioctl, &[0, padded]), EPERM);
        }
        for cmd in [
            libc::TCGETS,
            libc::TIOCGWINSZ,
            libc::FIONREAD,
            libc::FIONBIO,
            libc::FIOCLEX,
        ] {
            assert_eq!(
                check(&policy, libc::SYS_ioctl, &[0, cmd]),
                RET_ALLOW,
                "{cmd:#x}"
            );
        }
    }

    // ---------------------------------------------------------------------------------------
    // The real kernel, in forked children that install the filter first.
    // ---------------------------------------------------------------------------------------

    /// Exit code of a child whose `apply` failed.
    const APPLY_FAILED: i32 = 200;
    /// Exit code of a child whose closure panicked.
    const PANICKED: i32 = 201;

    fn errno() -> i32 {
        // SAFETY: __errno_location returns a valid pointer to this thread's errno.
        unsafe { *libc::__errno_location() }
    }

    /// Exit code (or 128 + signal number) from a `waitpid` status.
    fn decode_status(status: i32) -> i32 {
        if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else if libc::WIFSIGNALED(status) {
            128 + libc::WTERMSIG(status)
        } else {
            -1
        }
    }

    /// Reaps `pid` (blocking). Async-signal-safe, for use inside a forked child too: returns
    /// its exit code, 128 + signal number if it was killed, or -1 if waitpid failed.
    fn reap(pid: libc::pid_t) -> i32 {
        let mut status = 0;
        loop {
            // SAFETY: `status` is a valid out-pointer; waitpid is async-signal-safe.
            let r = unsafe { libc::waitpid(pid, &mut status, 0) };
            if r == pid {
                return decode_status(status);
            }
            if r == -1 && errno() != libc::EINTR {
                return -1;
            }
        }
    }

    /// Waits in the parent for `pid` to end, at most `timeout`: a filter that is missing a
    /// syscall can make a program spin instead of fail. On timeout the child and its process
    /// group (if it made one) are killed and the test fails.
    fn wait_with_timeout(pid: libc::pid_t, timeout: Duration) -> i32 {
        let deadline = Instant::now() + timeout;
        loop {
            let mut status = 0;
            // SAFETY: `status` is a valid out-pointer.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                return decode_status(status);
            }
            assert!(
                r == 0 || errno() == libc::EINTR,
                "waitpid({pid}) failed: {}",
                std::io::Error::last_os_error()
            );
            if Instant::now() > deadline {
                // SAFETY: signals only our own child and the process group it leads (a
                // process group id cannot be reused while the group exists, so -pid is
                // either our child's group or no group at all).
                unsafe {
                    libc::kill(-pid, libc::SIGKILL);
                    libc::kill(pid, libc::SIGKILL);
                }
                reap(pid);
                panic!("child {pid} still running after {timeout:?}; killed it");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Forks, runs `f` in the child and returns the child's exit code (128 + signal number if
    /// it was killed); fails the test if the child runs longer than `timeout`. The test binary
    /// is multithreaded, so `f` may only do async-signal-safe things: raw syscalls,
    /// [`SeccompPolicy::apply`], no allocation, no locks.
    fn in_child_with_timeout(f: impl FnOnce() -> i32, timeout: Duration) -> i32 {
        // SAFETY: fork has no memory-safety preconditions; the child only runs `f`, which is
        // restricted to async-signal-safe operations, and then `_exit`s without unwinding
        // into the test harness.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed: {}", std::io::Error::last_os_error());
        if pid == 0 {
            let code = std::panic::catch_unwind(AssertUnwindSafe(f)).unwrap_or(PANICKED);
            // SAFETY: _exit ends the child without running the parent's atexit handlers or
            // destructors.
            unsafe { libc::_exit(code) }
        }
        wait_with_timeout(pid, timeout)
    }

    /// [`in_child_with_timeout`] for children that only make a few syscalls.
    fn in_child(f: impl FnOnce() -> i32) -> i32 {
        in_child_with_timeout(f, Duration::from_secs(30))
    }

    /// A raw syscall. Test-only: callers pass integers, NULL, or pointers to live buffers of
    /// the size the syscall expects.
    fn raw_syscall(nr: c_long, a: [usize; 6]) -> c_long {
        // SAFETY: see above; the syscalls used in these tests either only read their pointer
        // arguments, write into buffers that are large enough, or create a copy of the process
        // (clone without CLONE_VM), which is as safe as fork.
        unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]) }
    }

    macro_rules! sys {
        ($nr:expr $(, $arg:expr)* $(,)?) => {{
            let given: &[usize] = &[$(($arg) as i64 as usize),*];
            let mut args = [0usize; 6];
            args[..given.len()].copy_from_slice(given);
            raw_syscall($nr, args)
        }};
    }

    /// Runs `f` in a child with the policy installed; returns 0 if the syscall `f` makes
    /// succeeded, its errno if it returned -1.
    fn errno_under_policy(policy: &SeccompPolicy, f: impl FnOnce() -> c_long) -> i32 {
        in_child(|| {
            if policy.apply().is_err() {
                return APPLY_FAILED;
            }
            if f() == -1 {
                errno()
            } else {
                0
            }
        })
    }

    fn describe(code: i32) -> String {
        match code {
            0 => "success".into(),
            APPLY_FAILED => "apply() failed".into(),
            PANICKED => "panic".into(),
            c if c > 128 => format!("killed by signal {}", c - 128),
            c => format!("{} ({c})", std::io::Error::from_raw_os_error(c)),
        }
    }

    type Case = (&'static str, fn() -> c_long);

    fn expect_all(policy: &SeccompPolicy, cases: &[Case], expected: i32) {
        let failures: Vec<String> = cases
            .iter()
            .filter_map(|(name, f)| {
                let got = errno_under_policy(policy, f);
                (got != expected).then(|| format!("{name}: {}", describe(got)))
            })
            .collect();
        assert!(
            failures.is_empty(),
            "expected {} but got:\n{}",
            describe(expected),
            failures.join("\n")
        );
    }

    #[test]
    fn child_exit_codes_and_signals_are_reported() {
        assert_eq!(in_child(|| 7), 7);
        assert_eq!(
            in_child(|| {
                sys!(libc::SYS_kill, sys!(libc::SYS_getpid), libc::SIGKILL);
                0
            }),
            128 + libc::SIGKILL
        );
    }

    #[test]
    fn ordinary_syscalls_work_under_the_policy() {
        let policy = SeccompPolicy::embedded();
        let cases: &[Case] = &[
            ("getpid", || sys!(libc::SYS_getpid)),
            ("write to /dev/null", || {
                let fd = sys!(
                    libc::SYS_openat,
                    libc::AT_FDCWD,
                    c"/dev/null".as_ptr(),
                    libc::O_WRONLY
                );
                if fd < 0 {
                    return fd;
                }
                let n = sys!(libc::SYS_write, fd, b"hello".as_ptr(), 5);
                if n == 5 {
                    0
                } else {
                    -1
                }
            }),
            ("pipe2 + ioctl(FIONREAD)", || {
                let mut fds = [0i32; 2];
                if sys!(libc::SYS_pipe2, fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                    return -1;
                }
                let mut n: i32 = -1;
                sys!(libc::SYS_ioctl, fds[0], libc::FIONREAD, &mut n as *mut i32)
            }),
            ("uname", || {
                let mut u = std::mem::MaybeUninit::<libc::utsname>::uninit();
                sys!(libc::SYS_uname, u.as_mut_ptr())
            }),
            ("socket(AF_UNIX, SOCK_STREAM)", || {
                sys!(libc::SYS_socket, libc::AF_UNIX, libc::SOCK_STREAM, 0)
            }),
            ("socket(AF_INET, SOCK_DGRAM)", || {
                sys!(libc::SYS_socket, libc::AF_INET, libc::SOCK_DGRAM, 0)
            }),
            ("socket(AF_INET6, SOCK_STREAM)", || {
                sys!(libc::SYS_socket, libc::AF_INET6, libc::SOCK_STREAM, 0)
            }),
            ("socket(AF_NETLINK, NETLINK_ROUTE)", || {
                sys!(
                    libc::SYS_socket,
                    libc::AF_NETLINK,
                    libc::SOCK_RAW,
                    libc::NETLINK_ROUTE
                )
            }),
            ("personality(0xffffffff)", || {
                sys!(libc::SYS_personality, 0xffff_ffffu32)
            }),
            ("prctl(PR_SET_NAME)", || {
                sys!(libc::SYS_prctl, libc::PR_SET_NAME, c"runcell-test".as_ptr())
            }),
            ("clone(SIGCHLD), i.e. fork", || {
                let pid = sys!(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0);
                if pid == 0 {
                    // SAFETY: ends the grandchild immediately.
                    unsafe { libc::_exit(0) }
                }
                if pid < 0 {
                    return pid;
                }
                if reap(pid as libc::pid_t) == 0 {
                    0
                } else {
                    -1
                }
            }),
        ];
        expect_all(&policy, cases, 0);
    }

    #[test]
    fn dangerous_syscalls_fail_with_eperm() {
        let policy = SeccompPolicy::embedded();
        // The arguments are chosen so that each call would fail harmlessly (EFAULT, EINVAL,
        // EBADF, ...) or only affect the throwaway child if the filter ever let it through.
        let cases: &[Case] = &[
            ("ptrace(PTRACE_TRACEME)", || {
                sys!(libc::SYS_ptrace, libc::PTRACE_TRACEME, 0, 0, 0)
            }),
            ("process_vm_readv", || {
                sys!(libc::SYS_process_vm_readv, 0, 0, 0, 0, 0, 0)
            }),
            ("process_vm_writev", || {
                sys!(libc::SYS_process_vm_writev, 0, 0, 0, 0, 0, 0)
            }),
            ("kcmp", || sys!(libc::SYS_kcmp, 0, 0, 0, 0, 0)),
            ("pidfd_getfd", || sys!(libc::SYS_pidfd_getfd, -1, -1, 0)),
            ("mount(NULL...)", || sys!(libc::SYS_mount, 0, 0, 0, 0, 0)),
            ("umount2(NULL)", || sys!(libc::SYS_umount2, 0, 0)),
            ("pivot_root(NULL, NULL)", || {
                sys!(libc::SYS_pivot_root, 0, 0)
            }),
            ("chroot(NULL)", || sys!(libc::SYS_chroot, 0)),
            ("open_tree", || sys!(libc::SYS_open_tree, -1, 0, 0)),
            ("move_mount", || sys!(libc::SYS_move_mount, -1, 0, -1, 0, 0)),
            ("fsopen(NULL)", || sys!(libc::SYS_fsopen, 0, 0)),
            ("fsconfig", || sys!(libc::SYS_fsconfig, -1, 0, 0, 0, 0)),
            ("fsmount", || sys!(libc::SYS_fsmount, -1, 0, 0)),
            ("fspick", || sys!(libc::SYS_fspick, -1, 0, 0)),
            ("mount_setattr", || {
                sys!(libc::SYS_mount_setattr, -1, 0, 0, 0, 0)
            }),
            ("unshare(CLONE_NEWUSER)", || {
                sys!(libc::SYS_unshare, libc::CLONE_NEWUSER)
            }),
            ("unshare(CLONE_FILES)", || {
                sys!(libc::SYS_unshare, libc::CLONE_FILES)
            }),
            ("setns(-1)", || sys!(libc::SYS_setns, -1, 0)),
            ("keyctl(bad op)", || {
                sys!(libc::SYS_keyctl, 99999, 0, 0, 0, 0)
            }),
            ("add_key(NULL)", || sys!(libc::SYS_add_key, 0, 0, 0, 0, 0)),
            ("request_key(NULL)", || {
                sys!(libc::SYS_request_key, 0, 0, 0, 0)
            }),
            ("bpf(bad cmd)", || sys!(libc::SYS_bpf, 9999, 0, 0)),
            ("perf_event_open(NULL)", || {
                sys!(libc::SYS_perf_event_open, 0, 0, -1, -1, 0)
            }),
            ("userfaultfd(bad flags)", || {
                sys!(libc::SYS_userfaultfd, 0xffff_ffffu32)
            }),
            ("io_uring_setup(0, NULL)", || {
                sys!(libc::SYS_io_uring_setup, 0, 0)
            }),
            ("io_uring_enter(-1)", || {
                sys!(libc::SYS_io_uring_enter, -1, 0, 0, 0, 0, 0)
            }),
            ("io_uring_register(-1)", || {
                sys!(libc::SYS_io_uring_register, -1, 0, 0, 0)
            }),
            ("init_module(NULL)", || sys!(libc::SYS_init_module, 0, 0, 0)),
            ("finit_module(-1)", || {
                sys!(libc::SYS_finit_module, -1, 0, 0)
            }),
            ("delete_module(NULL)", || {
                sys!(libc::SYS_delete_module, 0, 0)
            }),
            // An invalid architecture in the flags and too many segments: EINVAL if unblocked.
            ("kexec_load(bad)", || {
                sys!(libc::SYS_kexec_load, 0, 1000, 0, 0xffff_0000u32)
            }),
            ("kexec_file_load(bad)", || {
                sys!(libc::SYS_kexec_file_load, -1, -1, 0, 0, 0xffff_ffffu32)
            }),
            // Wrong magic numbers: EINVAL if unblocked.
            ("reboot(bad magic)", || sys!(libc::SYS_reboot, 0, 0, 0, 0)),
            ("swapon(NULL)", || sys!(libc::SYS_swapon, 0, 0)),
            ("swapoff(NULL)", || sys!(libc::SYS_swapoff, 0)),
            // Not NULL, which would switch accounting off: an unmapped address (EFAULT).
            ("acct(bad pointer)", || sys!(libc::SYS_acct, 1)),
            ("settimeofday(tv_usec out of range)", || {
                let tv = libc::timeval {
                    tv_sec: 0,
                    tv_usec: 2_000_000,
                };
                sys!(libc::SYS_settimeofday, &tv as *const libc::timeval, 0)
            }),
            ("clock_settime(bad clock)", || {
                let ts = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                sys!(libc::SYS_clock_settime, 9999, &ts as *const libc::timespec)
            }),
            ("clock_adjtime(bad clock, NULL)", || {
                sys!(libc::SYS_clock_adjtime, 9999, 0)
            }),
            ("adjtimex(NULL)", || sys!(libc::SYS_adjtimex, 0)),
            ("open_by_handle_at(-1, NULL)", || {
                sys!(libc::SYS_open_by_handle_at, -1, 0, 0)
            }),
            ("name_to_handle_at(NULL)", || {
                sys!(libc::SYS_name_to_handle_at, -1, 0, 0, 0, 0)
            }),
            ("quotactl(NULL)", || sys!(libc::SYS_quotactl, 0, 0, 0, 0)),
            // SYSLOG_ACTION_SIZE_BUFFER only reads.
            ("syslog(SIZE_BUFFER)", || sys!(libc::SYS_syslog, 10, 0, 0)),
            ("vhangup (after setsid: no controlling terminal)", || {
                sys!(libc::SYS_setsid);
                sys!(libc::SYS_vhangup)
            }),
            ("iopl(0)", || sys!(libc::SYS_iopl, 0)),
            ("ioperm(0, 0, 0)", || sys!(libc::SYS_ioperm, 0, 0, 0)),
            ("modify_ldt(read, 0 bytes)", || {
                sys!(libc::SYS_modify_ldt, 0, 0, 0)
            }),
            ("fanotify_init(bad flags)", || {
                sys!(libc::SYS_fanotify_init, 0xffff_ffffu32, 0)
            }),
            // Longer than __NEW_UTS_LEN: EINVAL if unblocked.
            ("sethostname(len 1000)", || {
                sys!(libc::SYS_sethostname, c"x".as_ptr(), 1000)
            }),
            ("setdomainname(len 1000)", || {
                sys!(libc::SYS_setdomainname, c"x".as_ptr(), 1000)
            }),
            ("move_pages(count 0)", || {
                sys!(libc::SYS_move_pages, 0, 0, 0, 0, 0, 0)
            }),
            ("migrate_pages(NULL)", || {
                sys!(libc::SYS_migrate_pages, 0, 0, 0, 0)
            }),
            ("process_madvise(-1)", || {
                sys!(libc::SYS_process_madvise, -1, 0, 0, 0, 0)
            }),
            ("personality(ADDR_NO_RANDOMIZE)", || {
                sys!(libc::SYS_personality, libc::ADDR_NO_RANDOMIZE)
            }),
            ("clone(CLONE_NEWUSER|SIGCHLD)", || {
                let r = sys!(
                    libc::SYS_clone,
                    libc::CLONE_NEWUSER | libc::SIGCHLD,
                    0,
                    0,
                    0,
                    0
                );
                if r == 0 {
                    // SAFETY: ends the grandchild at once should the filter ever let it be born.
                    unsafe { libc::_exit(0) }
                }
                if r > 0 {
                    reap(r as libc::pid_t);
                }
                r
            }),
            ("clone(CLONE_NEWNET|CLONE_NEWNS|SIGCHLD)", || {
                let flags = libc::CLONE_NEWNET | libc::CLONE_NEWNS | libc::SIGCHLD;
                let r = sys!(libc::SYS_clone, flags, 0, 0, 0, 0);
                if r == 0 {
                    // SAFETY: as above.
                    unsafe { libc::_exit(0) }
                }
                if r > 0 {
                    reap(r as libc::pid_t);
                }
                r
            }),
            ("socket(AF_ALG)", || {
                sys!(libc::SYS_socket, libc::AF_ALG, libc::SOCK_SEQPACKET, 0)
            }),
            ("socket(AF_VSOCK)", || {
                sys!(libc::SYS_socket, libc::AF_VSOCK, libc::SOCK_STREAM, 0)
            }),
            ("socket(AF_PACKET)", || {
                sys!(libc::SYS_socket, libc::AF_PACKET, libc::SOCK_RAW, 0)
            }),
            ("socket(AF_KEY)", || {
                sys!(libc::SYS_socket, libc::AF_KEY, libc::SOCK_RAW, 2)
            }),
            ("socket(AF_NETLINK, NETLINK_AUDIT)", || {
                sys!(
                    libc::SYS_socket,
                    libc::AF_NETLINK,
                    libc::SOCK_RAW,
                    libc::NETLINK_AUDIT
                )
            }),
            // Issue 10: rare protocols, socket filters, file events.
            ("socket(AF_INET, SOCK_STREAM, IPPROTO_MPTCP)", || {
                sys!(libc::SYS_socket, libc::AF_INET, libc::SOCK_STREAM, 262)
            }),
            ("socket(AF_INET6, SOCK_STREAM, IPPROTO_MPTCP)", || {
                sys!(libc::SYS_socket, libc::AF_INET6, libc::SOCK_STREAM, 262)
            }),
            ("socket(AF_INET, SOCK_DGRAM, IPPROTO_UDPLITE)", || {
                sys!(libc::SYS_socket, libc::AF_INET, libc::SOCK_DGRAM, 136)
            }),
            ("setsockopt(SO_ATTACH_FILTER)", || {
                sys!(
                    libc::SYS_setsockopt,
                    -1,
                    libc::SOL_SOCKET,
                    libc::SO_ATTACH_FILTER,
                    0,
                    0
                )
            }),
            ("setsockopt(SO_ATTACH_REUSEPORT_CBPF)", || {
                sys!(libc::SYS_setsockopt, -1, libc::SOL_SOCKET, 51, 0, 0)
            }),
            ("inotify_init1", || sys!(libc::SYS_inotify_init1, 0)),
            ("inotify_add_watch", || {
                sys!(libc::SYS_inotify_add_watch, -1, 0, 0)
            }),
            ("fanotify_mark", || {
                sys!(libc::SYS_fanotify_mark, -1, 0, 0, 0, 0)
            }),
            ("fcntl(F_NOTIFY)", || sys!(libc::SYS_fcntl, -1, 1026, 0)),
            // fd -1 rather than a terminal, so nothing is injected even if unblocked (EBADF).
            ("ioctl(TIOCSTI)", || {
                let c = b'x';
                sys!(libc::SYS_ioctl, -1, libc::TIOCSTI, &c as *const u8)
            }),
            ("ioctl(TIOCLINUX)", || {
                let c = 0u8;
                sys!(libc::SYS_ioctl, -1, libc::TIOCLINUX, &c as *const u8)
            }),
        ];
        expect_all(&policy, cases, libc::EPERM);
    }

    /// Issue 10: the sync family returns 0 without running. With an invalid fd the kernel
    /// would answer EBADF, so 0 proves the call never reached it.
    #[test]
    fn sync_family_returns_0_without_running() {
        let policy = SeccompPolicy::embedded();
        let cases: &[Case] = &[
            ("sync()", || sys!(libc::SYS_sync)),
            ("syncfs(-1)", || sys!(libc::SYS_syncfs, -1)),
            ("fsync(-1)", || sys!(libc::SYS_fsync, -1)),
            ("fdatasync(-1)", || sys!(libc::SYS_fdatasync, -1)),
            ("sync_file_range(-1)", || {
                sys!(libc::SYS_sync_file_range, -1, 0, 0, 0)
            }),
            // An unmapped, page-aligned address: ENOMEM if the kernel saw it.
            ("fadvise64(-1, DONTNEED)", || {
                sys!(libc::SYS_fadvise64, -1, 0, 0, libc::POSIX_FADV_DONTNEED)
            }),
            ("msync(MS_SYNC) of nothing", || {
                sys!(libc::SYS_msync, 0x1000, 4096, libc::MS_SYNC)
            }),
        ];
        expect_all(&policy, cases, 0);
        // MS_ASYNC still runs: unwinders probe addresses with it.
        let cases: &[Case] = &[("msync(MS_ASYNC) of nothing", || {
            sys!(libc::SYS_msync, 0x1000, 4096, libc::MS_ASYNC)
        })];
        expect_all(&policy, cases, libc::ENOMEM);
        // Control: without the filter the kernel answers EBADF.
        let got = in_child(|| {
            if sys!(libc::SYS_syncfs, -1) == -1 {
                errno()
            } else {
                0
            }
        });
        assert_eq!(got, libc::EBADF);
    }

    #[test]
    fn unlisted_syscalls_fail_with_enosys() {
        let policy = SeccompPolicy::embedded();
        let cases: &[Case] = &[
            // The struct (and so the flags) is out of the filter's reach: ENOSYS makes glibc
            // fall back to clone.
            ("clone3(NULL, 0)", || sys!(libc::SYS_clone3, 0, 0)),
            // x32 ABI: getpid | __X32_SYSCALL_BIT.
            ("x32 getpid", || sys!(X32_SYSCALL_BIT | libc::SYS_getpid)),
            ("x32 ptrace", || {
                sys!(X32_SYSCALL_BIT | libc::SYS_ptrace, libc::PTRACE_TRACEME)
            }),
            // A syscall newer than the allowlist (listmount, Linux 6.8).
            ("listmount(NULL)", || sys!(458, 0, 0, 0, 0)),
            ("syscall 1000", || sys!(1000)),
        ];
        expect_all(&policy, cases, libc::ENOSYS);

        // Control: without the filter, clone3(NULL, 0) and listmount are real syscalls on this
        // kernel (EINVAL/EFAULT, not ENOSYS), so the ENOSYS above comes from the filter.
        for nr in [libc::SYS_clone3, 458] {
            let got = in_child(|| {
                if sys!(nr, 0, 0, 0, 0) == -1 {
                    errno()
                } else {
                    0
                }
            });
            assert_ne!(got, libc::ENOSYS, "syscall {nr} without the filter");
        }
    }

    /// getpid through the i386 ABI (`int 0x80`, eax = 20).
    fn int80_getpid() -> i32 {
        let ret: i32;
        // SAFETY: i386 getpid takes no arguments and touches no memory; on a 64-bit kernel
        // `int 0x80` returns in eax and may clear r8-r11, which are declared clobbered.
        unsafe {
            core::arch::asm!(
                "int 0x80",
                inlateout("eax") 20i32 => ret,
                lateout("r8") _, lateout("r9") _, lateout("r10") _, lateout("r11") _,
            );
        }
        ret
    }

    #[test]
    fn i386_syscalls_kill_the_process_with_sigsys() {
        let policy = SeccompPolicy::embedded();
        let pid_matches = || i32::from(int80_getpid() as c_long != sys!(libc::SYS_getpid));
        // Control: the kernel has the i386 ABI, and without the filter the call works.
        assert_eq!(
            in_child(pid_matches),
            0,
            "int 0x80 getpid without the filter"
        );
        let got = in_child(|| {
            // No core file from the intended SIGSYS.
            let no_core = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            sys!(
                libc::SYS_setrlimit,
                libc::RLIMIT_CORE,
                &no_core as *const libc::rlimit
            );
            sys!(libc::SYS_prctl, libc::PR_SET_DUMPABLE, 0);
            if policy.apply().is_err() {
                return APPLY_FAILED;
            }
            pid_matches();
            2 // not reached: the syscall must kill us
        });
        assert_eq!(got, 128 + libc::SIGSYS, "{}", describe(got));
    }

    // ---------------------------------------------------------------------------------------
    // Real programs under the policy: the allowlist must be complete enough for them.
    // ---------------------------------------------------------------------------------------

    /// Runs `argv` with `env` in a child that applies the policy right before execve (like the
    /// sandbox does), stdout and stderr going to a log file. Returns the exit code and log.
    fn run_under_policy(
        policy: &SeccompPolicy,
        argv: &[&str],
        env: &[(&str, &str)],
        log: &Path,
    ) -> (i32, String) {
        // Everything that allocates happens here, before fork.
        let argv_c: Vec<CString> = argv.iter().map(|a| CString::new(*a).unwrap()).collect();
        let env_c: Vec<CString> = env
            .iter()
            .map(|(k, v)| CString::new(format!("{k}={v}")).unwrap())
            .collect();
        let mut argv_p: Vec<*const c_char> = argv_c.iter().map(|a| a.as_ptr()).collect();
        argv_p.push(std::ptr::null());
        let mut env_p: Vec<*const c_char> = env_c.iter().map(|e| e.as_ptr()).collect();
        env_p.push(std::ptr::null());
        let log_c = CString::new(log.as_os_str().as_bytes()).unwrap();

        let child = || {
            // SAFETY: setpgid, open, dup2 and execve are async-signal-safe; every pointer
            // refers to a NUL-terminated string or NULL-terminated array built before the
            // fork and alive in this copy of the address space.
            unsafe {
                // Own process group, so that a timeout kills the program's children too.
                libc::setpgid(0, 0);
                let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC;
                let fd = libc::open(log_c.as_ptr(), flags, 0o600);
                if fd < 0 || libc::dup2(fd, 1) < 0 || libc::dup2(fd, 2) < 0 {
                    return 120;
                }
                let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
                if null < 0 || libc::dup2(null, 0) < 0 {
                    return 121;
                }
            }
            if policy.apply().is_err() {
                return APPLY_FAILED;
            }
            // SAFETY: as above.
            unsafe { libc::execve(argv_p[0], argv_p.as_ptr(), env_p.as_ptr()) };
            127
        };
        let code = in_child_with_timeout(child, Duration::from_secs(300));
        (code, std::fs::read_to_string(log).unwrap_or_default())
    }

    struct Scratch {
        dir: tempfile::TempDir,
    }

    impl Scratch {
        fn new() -> Scratch {
            let dir = tempfile::tempdir().unwrap();
            std::fs::create_dir(dir.path().join("home")).unwrap();
            Scratch { dir }
        }

        fn path(&self, name: &str) -> String {
            self.dir.path().join(name).to_str().unwrap().to_owned()
        }

        /// A minimal environment rooted in the scratch directory.
        fn env(&self) -> Vec<(&'static str, String)> {
            vec![
                ("PATH", "/usr/local/bin:/usr/bin:/bin".to_owned()),
                ("HOME", self.path("home")),
                ("TMPDIR", self.path("")),
                ("LANG", "C.UTF-8".to_owned()),
            ]
        }

        fn run(&self, policy: &SeccompPolicy, argv: &[&str], extra: &[(&str, String)]) -> String {
            let mut env = self.env();
            env.extend(extra.iter().map(|(k, v)| (*k, v.clone())));
            let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let log = self.dir.path().join("log");
            let (code, out) = run_under_policy(policy, argv, &env, &log);
            assert_eq!(
                code,
                0,
                "{argv:?} exited with {}; output:\n{out}",
                describe(code)
            );
            out
        }
    }

    #[test]
    fn bash_and_coreutils_run_under_the_policy() {
        let policy = SeccompPolicy::embedded();
        let s = Scratch::new();
        let out = s.run(
            &policy,
            &[
                "/bin/bash",
                "-c",
                "for i in 1 2 3; do echo $i | cat; done; ls / >/dev/null; sleep 0.1 & wait; \
                 f=$(mktemp); echo hi > \"$f\"; cp \"$f\" \"$f.2\"; [ \"$(cat \"$f.2\")\" = hi ]; \
                 rm \"$f\" \"$f.2\"; echo bash ok",
            ],
            &[],
        );
        assert_eq!(out, "1\n2\n3\nbash ok\n");
    }

    #[test]
    fn python_runs_under_the_policy() {
        let policy = SeccompPolicy::embedded();
        let s = Scratch::new();
        let script = r#"
import os, threading, subprocess, json, socket, multiprocessing, tempfile

def square(x):
    return x * x

out = subprocess.run(["echo", "hi"], capture_output=True, check=True).stdout
assert out == b"hi\n", out
got = []
t = threading.Thread(target=lambda: got.append(1))
t.start()
t.join()
assert got == [1]
with multiprocessing.Pool(2) as pool:
    assert pool.map(square, [1, 2, 3, 4]) == [1, 4, 9, 16]
a, b = socket.socketpair()
a.sendall(b"x")
assert b.recv(1) == b"x"
with tempfile.NamedTemporaryFile("w") as f:
    json.dump({"a": 1}, f)
    f.flush()
    with open(f.name) as g:
        assert json.load(g) == {"a": 1}
print("python ok")
"#;
        let out = s.run(&policy, &["/usr/bin/python3", "-c", script], &[]);
        assert_eq!(out, "python ok\n");
    }

    #[test]
    #[cfg_attr(not(host_node), ignore = "needs node (/usr/bin/node)")]
    fn node_runs_under_the_policy() {
        let policy = SeccompPolicy::embedded();
        let s = Scratch::new();
        let script = r#"
const fs = require('fs');
const path = require('path');
const out = path.join(process.env.TMPDIR, 'x');
fs.writeFileSync(out, 'y');
if (fs.readFileSync(out, 'utf8') !== 'y') process.exit(2);
if (require('child_process').execSync('echo sub').toString() !== 'sub\n') process.exit(3);
require('os').networkInterfaces();
const { Worker } = require('worker_threads');
const w = new Worker('require("worker_threads").parentPort.postMessage(6 * 7)', { eval: true });
w.on('message', (m) => { if (m !== 42) process.exit(4); });
w.on('error', (e) => { console.error(e); process.exit(5); });
w.on('exit', () => {
  fs.promises.readFile(out, 'utf8').then((y) => {
    if (y !== 'y') process.exit(6);
    setTimeout(() => console.log('node ok'), 10);
  });
});
"#;
        let out = s.run(&policy, &["/usr/bin/node", "-e", script], &[]);
        assert_eq!(out, "node ok\n");
    }

    #[test]
    #[cfg_attr(not(host_ruby), ignore = "needs ruby (/usr/bin/ruby)")]
    fn ruby_runs_under_the_policy() {
        let policy = SeccompPolicy::embedded();
        let s = Scratch::new();
        let script = r#"puts [1, 2].sum; Thread.new { 1 }.join; system("true") or exit 1; puts `echo ruby ok`"#;
        let out = s.run(&policy, &["/usr/bin/ruby", "-e", script], &[]);
        assert_eq!(out, "3\nruby ok\n");
    }

    #[test]
    #[cfg_attr(not(host_go), ignore = "needs go (/usr/bin/go)")]
    fn go_build_and_the_built_binary_run_under_the_policy() {
        let policy = SeccompPolicy::embedded();
        let s = Scratch::new();
        let main = s.path("main.go");
        std::fs::write(
            &main,
            "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hello from go\") }\n",
        )
        .unwrap();
        let hello = s.path("hello");
        let go_env = [
            ("GOCACHE", s.path("gocache")),
            ("GOPATH", s.path("gopath")),
            ("GOFLAGS", "-buildvcs=false".to_owned()),
        ];
        s.run(
            &policy,
            &["/usr/bin/go", "build", "-o", &hello, &main],
            &go_env,
        );
        let out = s.run(&policy, &[&hello], &[]);
        assert_eq!(out, "hello from go\n");
    }
}
