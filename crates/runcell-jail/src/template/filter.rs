//! The template's own seccomp filter (T3): installed in the template before any Python runs,
//! and so inherited by every fork, beneath the run's three filters (X7).
//!
//! It bounds what the operator's preload modules, run as root with `CAP_SETUID` and
//! `CAP_SETGID`, could do with those two powers or with the kernel:
//!
//! * the id calls (`setuid` ... `setfsgid`) take only ids of the pool's half that sandboxes
//!   forked from templates get ([`crate::identity::IdPool::half`]), the sandbox's own view id
//!   (1000, so that a program in a forked sandbox can still pass its own id, a no-op the kernel
//!   allows), or -1; anything else is `EINVAL`, what the kernel answers in a sandbox, whose
//!   user namespace maps no other id. `setgroups` only empties the list.
//! * no new namespaces: `unshare`, `clone` with a namespace flag (`EPERM`), `clone3` (`ENOSYS`,
//!   its flags are behind a pointer; glibc falls back to `clone`).
//! * no mounts, no tracing or reading of other processes, no descriptors taken from them, no
//!   kernel modules, keys, BPF, perf, userfaultfd, handles or reboots (`EPERM`).
//!
//! A fork's program gets the same answers it would get without this filter: everything it
//! denies, the run's filters deny too (and the run's errno wins, its filters being newer),
//! except ids the kernel would refuse it anyway.

use libc::sock_filter;

use crate::config::{SANDBOX_GID, SANDBOX_UID};
use crate::identity::IdPool;

const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
/// `struct seccomp_data`: nr at 0, arch at 4, args from 16 (8 bytes each; the low 32 bits
/// first on little-endian x86_64).
const NR: u32 = 0;
const ARCH: u32 = 4;
const fn arg_low(i: u32) -> u32 {
    16 + 8 * i
}

const RET_ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
const RET_KILL: u32 = libc::SECCOMP_RET_KILL_PROCESS;
const fn ret_errno(e: i32) -> u32 {
    libc::SECCOMP_RET_ERRNO | (e as u32 & libc::SECCOMP_RET_DATA)
}

/// Every `CLONE_NEW*` flag (`CLONE_NEWTIME` included).
const NAMESPACE_FLAGS: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u32
    | 0x80;

/// Denied outright, with `EPERM`.
const DENIED: &[libc::c_long] = &[
    libc::SYS_unshare,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_pidfd_getfd,
    libc::SYS_kcmp,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_userfaultfd,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_acct,
    libc::SYS_quotactl,
];

/// The id calls and how many id arguments each takes.
const ID_CALLS: &[(libc::c_long, u32, bool)] = &[
    (libc::SYS_setuid, 1, true),
    (libc::SYS_setreuid, 2, true),
    (libc::SYS_setresuid, 3, true),
    (libc::SYS_setfsuid, 1, true),
    (libc::SYS_setgid, 1, false),
    (libc::SYS_setregid, 2, false),
    (libc::SYS_setresgid, 3, false),
    (libc::SYS_setfsgid, 1, false),
];

fn stmt(code: u32, k: u32) -> sock_filter {
    sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u32, k: u32, jt: usize, jf: usize) -> sock_filter {
    sock_filter {
        code: code as u16,
        jt: jt as u8,
        jf: jf as u8,
        k,
    }
}

const LD_W_ABS: u32 = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
const JEQ: u32 = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
const JGE: u32 = libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K;
const JSET: u32 = libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K;
const RET: u32 = libc::BPF_RET | libc::BPF_K;

/// The filter for templates whose forks take host ids from `pool` (the templated half).
pub(super) fn program(pool: IdPool) -> Vec<sock_filter> {
    let lo = pool.start;
    let hi = pool.start.saturating_add(pool.len);
    let mut p = vec![
        stmt(LD_W_ABS, ARCH),
        jump(JEQ, AUDIT_ARCH_X86_64, 1, 0),
        stmt(RET, RET_KILL),
        stmt(LD_W_ABS, NR),
    ];
    // Each block starts with the accumulator holding the syscall number, and either returns
    // or jumps past its end with it unchanged.
    for &nr in DENIED {
        p.push(jump(JEQ, nr as u32, 0, 1));
        p.push(stmt(RET, ret_errno(libc::EPERM)));
    }
    p.push(jump(JEQ, libc::SYS_clone3 as u32, 0, 1));
    p.push(stmt(RET, ret_errno(libc::ENOSYS)));
    // clone: the flags are the first argument.
    p.extend([
        jump(JEQ, libc::SYS_clone as u32, 0, 4),
        stmt(LD_W_ABS, arg_low(0)),
        jump(JSET, NAMESPACE_FLAGS, 1, 0),
        stmt(RET, RET_ALLOW),
        stmt(RET, ret_errno(libc::EPERM)),
    ]);
    // setgroups: only an empty list.
    p.extend([
        jump(JEQ, libc::SYS_setgroups as u32, 0, 4),
        stmt(LD_W_ABS, arg_low(0)),
        jump(JEQ, 0, 0, 1),
        stmt(RET, RET_ALLOW),
        stmt(RET, ret_errno(libc::EPERM)),
    ]);
    for &(nr, argc, uid) in ID_CALLS {
        let own = if uid { SANDBOX_UID } else { SANDBOX_GID };
        // jeq nr | per argument: ld, jeq -1, jeq own, jge hi, jge lo | ret allow | ret deny
        let len = 1 + 5 * argc as usize + 2;
        let deny = len - 1;
        p.push(jump(JEQ, nr as u32, 0, len - 1));
        for i in 0..argc {
            let at = 1 + 5 * i as usize;
            let next = at + 5;
            p.push(stmt(LD_W_ABS, arg_low(i)));
            p.push(jump(JEQ, u32::MAX, next - (at + 1) - 1, 0));
            p.push(jump(JEQ, own, next - (at + 2) - 1, 0));
            p.push(jump(JGE, hi, deny - (at + 3) - 1, 0));
            p.push(jump(JGE, lo, 0, deny - (at + 4) - 1));
        }
        p.push(stmt(RET, RET_ALLOW));
        // EINVAL: what the kernel answers in the sandbox, whose user namespace maps no id
        // but 1000 (a fork's program sees no difference).
        p.push(stmt(RET, ret_errno(libc::EINVAL)));
    }
    p.push(stmt(RET, RET_ALLOW));
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny classic-BPF interpreter for the instructions `program` uses.
    fn run(prog: &[sock_filter], nr: libc::c_long, args: [u64; 6]) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&(nr as u32).to_le_bytes());
        data[4..8].copy_from_slice(&AUDIT_ARCH_X86_64.to_le_bytes());
        for (i, a) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
        }
        let mut acc = 0u32;
        let mut pc = 0usize;
        loop {
            let ins = prog[pc];
            let k = ins.k;
            match ins.code as u32 {
                LD_W_ABS => {
                    let o = k as usize;
                    acc = u32::from_le_bytes(data[o..o + 4].try_into().unwrap());
                    pc += 1;
                }
                JEQ => pc += 1 + if acc == k { ins.jt } else { ins.jf } as usize,
                JGE => pc += 1 + if acc >= k { ins.jt } else { ins.jf } as usize,
                JSET => pc += 1 + if acc & k != 0 { ins.jt } else { ins.jf } as usize,
                RET => return k,
                other => panic!("unexpected instruction {other:#x}"),
            }
        }
    }

    const POOL: IdPool = IdPool {
        start: 2_000_500_000,
        len: 500_000,
    };

    #[test]
    fn ids_only_from_the_templated_half_the_sandbox_view_or_unchanged() {
        let p = program(POOL);
        let eperm = ret_errno(libc::EPERM);
        let einval = ret_errno(libc::EINVAL);
        let id = |v: u32| v as u64;
        for nr in [libc::SYS_setresuid, libc::SYS_setresgid] {
            let ok = [id(POOL.start), id(POOL.start + 7), id(u32::MAX)];
            assert_eq!(run(&p, nr, [ok[0], ok[1], ok[2], 0, 0, 0]), RET_ALLOW);
            assert_eq!(run(&p, nr, [1000, 1000, 1000, 0, 0, 0]), RET_ALLOW);
            for bad in [0, 1, 999, 2_000_000_000, 2_000_499_999, 2_001_000_000] {
                assert_eq!(run(&p, nr, [ok[0], bad, ok[2], 0, 0, 0]), einval, "{bad}");
                assert_eq!(run(&p, nr, [bad, ok[0], ok[0], 0, 0, 0]), einval, "{bad}");
                assert_eq!(run(&p, nr, [ok[0], ok[0], bad, 0, 0, 0]), einval, "{bad}");
            }
        }
        assert_eq!(run(&p, libc::SYS_setuid, [0, 0, 0, 0, 0, 0]), einval);
        assert_eq!(run(&p, libc::SYS_setfsuid, [0, 0, 0, 0, 0, 0]), einval);
        assert_eq!(
            run(
                &p,
                libc::SYS_setuid,
                [id(POOL.start + POOL.len - 1), 0, 0, 0, 0, 0]
            ),
            RET_ALLOW
        );
        assert_eq!(run(&p, libc::SYS_setgroups, [0, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(run(&p, libc::SYS_setgroups, [1, 0x1000, 0, 0, 0, 0]), eperm);
    }

    #[test]
    fn no_namespaces_mounts_or_tracing_but_forks_and_setns_work() {
        let p = program(POOL);
        let eperm = ret_errno(libc::EPERM);
        assert_eq!(run(&p, libc::SYS_unshare, [0; 6]), eperm);
        assert_eq!(run(&p, libc::SYS_mount, [0; 6]), eperm);
        assert_eq!(run(&p, libc::SYS_ptrace, [0; 6]), eperm);
        assert_eq!(run(&p, libc::SYS_pidfd_getfd, [0; 6]), eperm);
        assert_eq!(run(&p, libc::SYS_clone3, [0; 6]), ret_errno(libc::ENOSYS));
        let fork_flags = libc::SIGCHLD as u64;
        assert_eq!(
            run(&p, libc::SYS_clone, [fork_flags, 0, 0, 0, 0, 0]),
            RET_ALLOW
        );
        for ns in [
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWNS,
            libc::CLONE_NEWNET,
            0x80,
        ] {
            let flags = fork_flags | ns as u64;
            assert_eq!(run(&p, libc::SYS_clone, [flags, 0, 0, 0, 0, 0]), eperm);
        }
        // What a fork needs, and a program's everyday calls.
        for nr in [
            libc::SYS_setns,
            libc::SYS_read,
            libc::SYS_kill,
            libc::SYS_execve,
        ] {
            assert_eq!(run(&p, nr, [0; 6]), RET_ALLOW);
        }
        // Another architecture's calls are killed.
        let mut other = p.clone();
        other[1].k = 0;
        assert_eq!(run(&other, libc::SYS_read, [0; 6]), RET_KILL);
    }
}
