//! Thin wrappers over the system calls that rustix does not cover (raw `clone`, `fork`,
//! `mount_setattr`, `execve`, the capability bounding set, `kill(-1)`, the loopback ioctl).
//!
//! Everything here is called from the single-threaded helper processes (see `init.rs`), never
//! from a multi-threaded supervisor: `fork`/`clone` in a threaded process may copy a locked
//! allocator mutex into the child (conventions, "No fork in a threaded process").

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// What a raw `clone(2)` returns on each side.
pub enum Forked {
    /// We are the new process.
    Child,
    /// We are the parent; the child has this pid (in our pid namespace) and pidfd.
    Parent { pid: i32, pidfd: OwnedFd },
}

/// `clone(2)` without a new stack (fork semantics) with the given `CLONE_NEW*` flags, returning a
/// pidfd for the child (`CLONE_PIDFD`, Linux 5.2) so that the parent can poll for its exit.
///
/// # Safety
/// The calling process must be single-threaded: the child gets a copy of the address space in
/// which a lock held by another thread would stay locked forever.
pub unsafe fn clone_with_pidfd(ns_flags: libc::c_int) -> io::Result<Forked> {
    let mut pidfd: libc::c_int = -1;
    let flags = (ns_flags | libc::CLONE_PIDFD | libc::SIGCHLD) as libc::c_ulong;
    // SAFETY: clone(2) with a NULL stack behaves like fork(2): the child gets a copy-on-write copy
    // of our address space and continues from this point. The process is single-threaded (the
    // helper is a freshly exec'd binary that starts no threads), so no lock can be held by
    // another thread at the time of the copy. On x86_64 and aarch64 the argument order is
    // (flags, stack, parent_tid, child_tid, tls); with CLONE_PIDFD the kernel stores the pidfd
    // at `parent_tid`, which points at a live local variable.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags,
            std::ptr::null_mut::<libc::c_void>(),
            &mut pidfd as *mut libc::c_int,
            std::ptr::null_mut::<libc::c_int>(),
            0 as libc::c_ulong,
        )
    };
    match ret {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent {
            pid: pid as i32,
            // SAFETY: the kernel just created this descriptor for us and nothing else owns it.
            pidfd: unsafe { OwnedFd::from_raw_fd(pidfd) },
        }),
    }
}

/// `CLONE_INTO_CGROUP` (Linux 5.7): clone3(2) creates the child directly in the cgroup v2 group
/// whose directory descriptor is passed in `clone_args.cgroup`.
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// As [`clone_with_pidfd`], but the child starts life in the cgroup v2 group `cgroup` (a
/// directory descriptor, `O_PATH` is enough): `clone3(CLONE_INTO_CGROUP)`. No `cgroup.procs`
/// write is needed afterwards, so the child is never outside its group, even for an instant,
/// and the write's wait for an RCU grace period (the cgroup core's `percpu_down_write` on the
/// threadgroup lock) is gone from the path. The kernel checks the *caller's* right to write
/// the group's `cgroup.procs` (its fsuid), as for a write.
///
/// `Ok(None)`: clone3 is unavailable (`ENOSYS`, e.g. a container runtime's seccomp profile);
/// the caller falls back to [`clone_with_pidfd`] and a `cgroup.procs` write.
///
/// # Safety
/// As for [`clone_with_pidfd`]: the calling process must be single-threaded.
pub unsafe fn clone_into_cgroup_with_pidfd(
    ns_flags: libc::c_int,
    cgroup: BorrowedFd<'_>,
) -> io::Result<Option<Forked>> {
    let mut pidfd: libc::c_int = -1;
    let args = libc::clone_args {
        flags: (ns_flags as u32 as u64) | libc::CLONE_PIDFD as u64 | CLONE_INTO_CGROUP,
        pidfd: &mut pidfd as *mut libc::c_int as u64,
        child_tid: 0,
        parent_tid: 0,
        exit_signal: libc::SIGCHLD as u64,
        stack: 0,
        stack_size: 0,
        tls: 0,
        set_tid: 0,
        set_tid_size: 0,
        cgroup: cgroup.as_raw_fd() as u64,
    };
    // SAFETY: clone3(2) without a stack behaves like fork(2): the child gets a copy-on-write
    // copy of our address space and continues from this point (the caller guarantees that the
    // process is single-threaded, so no lock can be held by another thread at the copy).
    // `args` is a valid clone_args of the size passed; the kernel writes the pidfd through
    // `args.pidfd`, which points at a live local variable, and only reads `args` itself.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const libc::clone_args,
            std::mem::size_of::<libc::clone_args>(),
        )
    };
    match ret {
        -1 => match io::Error::last_os_error() {
            e if e.raw_os_error() == Some(libc::ENOSYS) => Ok(None),
            e => Err(e),
        },
        0 => Ok(Some(Forked::Child)),
        pid => Ok(Some(Forked::Parent {
            pid: pid as i32,
            // SAFETY: the kernel just created this descriptor for us and nothing else owns it.
            pidfd: unsafe { OwnedFd::from_raw_fd(pidfd) },
        })),
    }
}

/// Set the filesystem uid only (`setfsuid(2)`). The helper, as root, switches its effective uid
/// to the sandbox's host uid for the clone (H4a: the new user namespace is owned by its
/// creator's euid) but keeps fsuid 0, so that the kernel's permission check for
/// `CLONE_INTO_CGROUP` (a write to the root-owned group's `cgroup.procs`) still passes. Allowed
/// without privilege while the real or saved uid is that value; the kernel restores the file
/// capabilities of the permitted set with fsuid 0. Returns the previous fsuid.
pub fn set_fsuid(uid: u32) -> u32 {
    // SAFETY: setfsuid(2) only changes this thread's credentials; it reads no memory.
    unsafe { libc::setfsuid(uid) as u32 }
}

/// Plain `fork(2)`, for the sandbox's pid 1 starting a program.
///
/// # Safety
/// As for [`clone_with_pidfd`]: the calling process must be single-threaded.
pub unsafe fn fork() -> io::Result<Option<i32>> {
    // SAFETY: called only from the sandbox's pid 1, which is single-threaded (it is a clone of
    // the single-threaded helper), so the child inherits no lock held by another thread.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(None),
        pid => Ok(Some(pid)),
    }
}

/// Clear the supplementary groups (host root's group 0 must not follow us into the sandbox).
pub fn clear_supplementary_groups() -> io::Result<()> {
    // SAFETY: setgroups(0, NULL) reads no memory.
    if unsafe { libc::setgroups(0, std::ptr::null()) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Attributes for `mount_setattr(2)` (Linux 5.12).
pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `mount_setattr(2)` on the mount at `fd` (an `open_tree` result) or at `path` relative to it.
/// With `recursive`, the whole subtree gets the attributes, which a classic
/// `MS_REMOUNT|MS_BIND|MS_RDONLY` cannot do (it only changes the top mount).
pub fn mount_setattr(
    fd: BorrowedFd<'_>,
    path: &CStr,
    recursive: bool,
    attr_set: u64,
    propagation_private: bool,
) -> io::Result<()> {
    let mut flags = libc::AT_EMPTY_PATH as libc::c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    let attr = MountAttr {
        attr_set,
        attr_clr: 0,
        propagation: if propagation_private {
            libc::MS_PRIVATE
        } else {
            0
        },
        userns_fd: 0,
    };
    // SAFETY: `path` is a valid NUL-terminated string, `attr` is a properly laid out
    // `struct mount_attr` (MOUNT_ATTR_SIZE_VER0 = 32 bytes) that lives across the call, and the
    // kernel only reads it.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            path.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if ret == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Close every descriptor from `first` upwards (`close_range(2)`, Linux 5.9), so that nothing of
/// the supervisor leaks into the sandboxed program.
///
/// # Safety
/// No live object (`OwnedFd`, `File`, ...) may own a descriptor at or above `first` and be used
/// or dropped afterwards: it would act on a closed, or reused, number.
pub unsafe fn close_fds_from(first: u32) -> io::Result<()> {
    // SAFETY: close_range only closes descriptors; the caller owns none above `first` that it
    // still uses (it is about to exec).
    let ret = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0) };
    if ret == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Drop every capability from the bounding set, so that no later execve can regain one.
pub fn drop_bounding_set() -> io::Result<()> {
    for cap in 0..=63 {
        // SAFETY: PR_CAPBSET_DROP takes a plain integer argument and touches no memory.
        let ret = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        if ret == -1 {
            let err = io::Error::last_os_error();
            // EINVAL: past the last capability this kernel knows.
            if err.raw_os_error() == Some(libc::EINVAL) {
                break;
            }
            return Err(err);
        }
    }
    Ok(())
}

/// Lock the securebits so that uid 0 (were it ever mapped) would get no capabilities on exec
/// and no setuid transition could restore them.
pub fn lock_securebits() -> io::Result<()> {
    const SECBIT_NOROOT: libc::c_ulong = 1 << 0;
    const SECBIT_NOROOT_LOCKED: libc::c_ulong = 1 << 1;
    const SECBIT_NO_SETUID_FIXUP: libc::c_ulong = 1 << 2;
    const SECBIT_NO_SETUID_FIXUP_LOCKED: libc::c_ulong = 1 << 3;
    const SECBIT_KEEP_CAPS_LOCKED: libc::c_ulong = 1 << 5;
    const SECBIT_NO_CAP_AMBIENT_RAISE: libc::c_ulong = 1 << 6;
    const SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED: libc::c_ulong = 1 << 7;
    let bits = SECBIT_NOROOT
        | SECBIT_NOROOT_LOCKED
        | SECBIT_NO_SETUID_FIXUP
        | SECBIT_NO_SETUID_FIXUP_LOCKED
        | SECBIT_KEEP_CAPS_LOCKED
        | SECBIT_NO_CAP_AMBIENT_RAISE
        | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;
    // SAFETY: PR_SET_SECUREBITS takes a plain integer argument and touches no memory.
    if unsafe { libc::prctl(libc::PR_SET_SECUREBITS, bits, 0, 0, 0) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// SIGKILL every process of the caller's pid namespace except the caller (`kill(-1)`).
///
/// Refuses unless the caller is pid 1 of its namespace: run from the host's pid namespace this
/// call would kill every process of the machine that the caller may signal.
pub fn kill_rest_of_namespace() -> io::Result<()> {
    signal_rest_of_namespace(libc::SIGKILL)
}

/// SIGSTOP every process of the caller's pid namespace except the caller (`kill(-1)`): the
/// first step of freezing a session between its cells (see `init.rs`, `spare_interpreter`).
/// The kernel makes a signal sent to many processes atomic with fork: a fork in progress
/// either fails and is restarted after the signal, or its child gets the signal too. (pid 1
/// does not rely on it: its sweep repeats until it finds nothing.) Refuses unless the caller
/// is pid 1 of its namespace, as [`kill_rest_of_namespace`] does.
pub fn stop_rest_of_namespace() -> io::Result<()> {
    signal_rest_of_namespace(libc::SIGSTOP)
}

fn signal_rest_of_namespace(sig: i32) -> io::Result<()> {
    if rustix::process::getpid().as_raw_nonzero().get() != 1 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "refusing kill(-1): not pid 1 of a private pid namespace",
        ));
    }
    // SAFETY: kill takes plain integers. As pid 1 of a fresh pid namespace, -1 reaches only
    // the processes of that namespace (the kernel skips processes it cannot see).
    if unsafe { libc::kill(-1, sig) } == -1 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::ESRCH) {
            return Err(err);
        }
    }
    Ok(())
}

/// Send `sig` to the process group `pgid` (a program started by pid 1 leads its own session
/// and group): Ctrl-C for a running cell. ESRCH (the group is gone) is not an error.
pub fn signal_group(pgid: i32, sig: i32) -> io::Result<()> {
    if pgid <= 1 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: kill takes plain integers; a negative pid names the process group, which pid 1
    // checked is a program's own (never -1, never pid 1's).
    if unsafe { libc::kill(-pgid, sig) } == -1 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::ESRCH) {
            return Err(err);
        }
    }
    Ok(())
}

/// Send `sig` to the process `pid` of the caller's namespace, never to pid 1 (a session's
/// interpreter: SIGSTOP and SIGCONT around its cells). ESRCH (it is gone) is not an error.
pub fn signal_process(pid: i32, sig: rustix::process::Signal) -> io::Result<()> {
    let Some(pid) = rustix::process::Pid::from_raw(pid).filter(|p| !p.is_init()) else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    match rustix::process::kill_process(pid, sig) {
        Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// SIGKILL every live process of the pid namespace except pid 1 and `spare` (a session's
/// interpreter, which must outlive the cell), by listing `proc` (the namespace's own procfs).
/// Zombies are left to their parents. Returns how many processes were signalled: call again
/// until it is 0, reaping in between (a process forked during the sweep is caught by the next).
pub fn kill_all_but(proc: &std::path::Path, spare: i32) -> io::Result<usize> {
    if rustix::process::getpid().as_raw_nonzero().get() != 1 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "refusing to sweep: not pid 1 of a private pid namespace",
        ));
    }
    let mut signalled = 0;
    for entry in std::fs::read_dir(proc)? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if pid <= 1 || pid == spare || !is_live(&entry.path()) {
            continue;
        }
        // SAFETY: kill takes plain integers; `pid` is a process of this namespace other than
        // pid 1 (read from this namespace's /proc).
        if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
            signalled += 1;
        }
    }
    Ok(signalled)
}

/// Whether the process at `dir` (`/proc/<pid>`) has a thread that is not a zombie. The state
/// of `/proc/<pid>/stat` is its main thread's: a process whose main thread ended on its own
/// (`pthread_exit`, a raw `exit` syscall) shows `Z` there while its other threads run on, so
/// a zombie main thread sends the check on to `/proc/<pid>/task`. A process that is gone by
/// now is not live; a zombie cannot be killed and is its parent's to reap.
fn is_live(dir: &std::path::Path) -> bool {
    match task_state(&dir.join("stat")) {
        None | Some(b'X') => false,
        Some(b'Z') => std::fs::read_dir(dir.join("task")).is_ok_and(|tasks| {
            tasks
                .flatten()
                .any(|t| !matches!(task_state(&t.path().join("stat")), None | Some(b'Z' | b'X')))
        }),
        Some(_) => true,
    }
}

/// The state letter of a `stat` file: "pid (comm) S ..."; the state follows the last ')'.
fn task_state(stat: &std::path::Path) -> Option<u8> {
    let stat = std::fs::read(stat).ok()?;
    let i = stat.iter().rposition(|&b| b == b')')?;
    stat.get(i + 2).copied()
}

/// Bring the loopback interface of the current network namespace up (it starts down), so that
/// programs can talk to themselves over 127.0.0.1; nothing else exists in the namespace.
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: socket() takes plain integers; the returned descriptor is owned right away.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor owned by nothing else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the NUL-terminated name and writes ifr_flags inside `req`,
    // which outlives the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the union member ifru_flags was just written by the kernel.
    unsafe {
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: as above; SIOCSIFFLAGS only reads `req`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `execve(2)`. Only returns on failure.
pub fn execve(path: &CStr, argv: &[CString], envp: &[CString]) -> io::Error {
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut envp_ptrs: Vec<*const libc::c_char> = envp.iter().map(|e| e.as_ptr()).collect();
    envp_ptrs.push(std::ptr::null());
    // SAFETY: all pointers point into CStrings that outlive the call, and both arrays are
    // NULL-terminated as execve requires.
    unsafe { libc::execve(path.as_ptr(), argv_ptrs.as_ptr(), envp_ptrs.as_ptr()) };
    io::Error::last_os_error()
}

/// Exit immediately without running destructors or atexit handlers (for forked children).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and is async-signal-safe.
    unsafe { libc::_exit(code) }
}

/// Move `fd` to exactly `target` (clearing close-on-exec on the copy).
///
/// # Safety
/// Whatever `target` referred to is closed: no live object may own it and be used afterwards.
pub unsafe fn dup_to(fd: RawFd, target: RawFd) -> io::Result<()> {
    if fd == target {
        // dup2 would be a no-op and leave FD_CLOEXEC set; clear it instead.
        // SAFETY: fcntl on an fd number with integer arguments touches no memory.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } == -1 {
            return Err(io::Error::last_os_error());
        }
        return Ok(());
    }
    // SAFETY: dup2 takes plain integers.
    if unsafe { libc::dup2(fd, target) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The Landlock ABI version the kernel offers (0 when Landlock is missing or disabled).
pub fn landlock_abi_version() -> u32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a NULL attr, size 0 and the VERSION flag the kernel reads no memory and
    // returns the ABI version or an error.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if ret < 0 {
        0
    } else {
        ret as u32
    }
}

/// Whether the kernel supports seccomp filters (`prctl(PR_GET_SECCOMP)` answers rather than
/// failing with EINVAL).
pub fn seccomp_available() -> bool {
    // SAFETY: PR_GET_SECCOMP takes no pointers.
    unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) >= 0 }
}

/// Install a classic BPF seccomp filter on the calling thread (`seccomp(SECCOMP_SET_MODE_FILTER)`),
/// setting `PR_SET_NO_NEW_PRIVS` first, which an unprivileged filter requires. Allocation-free.
pub fn install_seccomp_filter(prog: &[libc::sock_filter]) -> io::Result<()> {
    let len = u16::try_from(prog.len())
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: PR_SET_NO_NEW_PRIVS takes no pointers.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let fprog = libc::sock_fprog {
        len,
        filter: prog.as_ptr().cast_mut(),
    };
    // SAFETY: `fprog` points at `len` valid instructions that outlive the call; the kernel
    // copies the program (copy_from_user) and keeps no reference to our memory.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0 as libc::c_ulong,
            &fprog as *const libc::sock_fprog,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// CPU time of all reaped descendants (`getrusage(RUSAGE_CHILDREN)`), for per-step deltas.
pub struct ChildrenUsage {
    pub cpu_ns: u64,
}

pub fn children_rusage() -> ChildrenUsage {
    // SAFETY: rusage is plain old data; all-zero is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into `ru`, which outlives the call.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) } == -1 {
        return ChildrenUsage { cpu_ns: 0 };
    }
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    ChildrenUsage {
        cpu_ns: tv(ru.ru_utime) + tv(ru.ru_stime),
    }
}

/// Move `fd` to the descriptor number `target` (closing whatever was there) and return it as
/// the owner of `target`, close-on-exec or not as asked.
///
/// # Safety
/// Whatever `target` referred to is closed: no other live object may own it and be used or
/// dropped afterwards.
pub unsafe fn move_fd(fd: OwnedFd, target: RawFd, cloexec: bool) -> io::Result<OwnedFd> {
    let fd_flags = if cloexec { libc::FD_CLOEXEC } else { 0 };
    if fd.as_raw_fd() == target {
        // SAFETY: fcntl on a descriptor we own, with integer arguments.
        if unsafe { libc::fcntl(target, libc::F_SETFD, fd_flags) } == -1 {
            return Err(io::Error::last_os_error());
        }
        return Ok(fd);
    }
    let flags = if cloexec { libc::O_CLOEXEC } else { 0 };
    // SAFETY: dup3 takes plain integers; `fd` is a valid open descriptor.
    if unsafe { libc::dup3(fd.as_raw_fd(), target, flags) } == -1 {
        return Err(io::Error::last_os_error());
    }
    drop(fd);
    // SAFETY: dup3 just made `target` a copy of our descriptor, and by this function's contract
    // nothing else that is still used owns that number.
    Ok(unsafe { OwnedFd::from_raw_fd(target) })
}

/// Block SIGCHLD and return a non-blocking signalfd for it, so that pid 1 can wait for child
/// exits and for supervisor messages in one `poll` (no signal handler runs, nothing is async).
pub fn sigchld_fd() -> io::Result<OwnedFd> {
    // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise it in place.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t owned by this frame.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
    }
    // SAFETY: sigprocmask reads `set`, which outlives the call; no old mask is requested.
    if unsafe { libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) } == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: signalfd(-1, ...) creates a new descriptor from the mask in `set`.
    let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) };
    if fd == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just created this descriptor for us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Unblock every signal (a forked child inherits pid 1's blocked SIGCHLD, and the mask survives
/// execve: the program must start with a clean mask).
pub fn unblock_all_signals() -> io::Result<()> {
    // SAFETY: as in `sigchld_fd`; an empty set passed to SIG_SETMASK unblocks everything.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t owned by this frame.
    unsafe { libc::sigemptyset(&mut set) };
    // SAFETY: sigprocmask reads `set`, which outlives the call.
    if unsafe { libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reset every signal to its default disposition. Ignored signals survive execve, and the
/// helper's Rust runtime ignores SIGPIPE: without this, `yes | head -1` would make `yes` print
/// "Broken pipe" instead of dying quietly, as it does on any shell.
pub fn reset_signal_dispositions() {
    for sig in 1..=libc::SIGRTMAX() {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: installing SIG_DFL runs no code of ours in a signal context; invalid or
        // reserved signal numbers are refused by the kernel with EINVAL, which is ignored.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
}

/// A child reaped by [`reap_one`].
pub struct Reaped {
    pub pid: i32,
    /// The raw wait status.
    pub status: i32,
    /// That child's own peak resident set (its waited-for descendants included), in bytes.
    pub max_rss_bytes: u64,
}

impl Reaped {
    /// The signal that killed it, if any.
    pub fn signal(&self) -> Option<i32> {
        libc::WIFSIGNALED(self.status).then(|| libc::WTERMSIG(self.status))
    }
    /// Its exit code, if it exited.
    pub fn code(&self) -> Option<i32> {
        libc::WIFEXITED(self.status).then(|| libc::WEXITSTATUS(self.status))
    }
}

/// Reap one exited child without blocking (`wait4(-1, WNOHANG)`), with its resource usage.
/// `Ok(None)` when no child has exited; `Err(ECHILD)` when there are no children.
pub fn reap_one() -> io::Result<Option<Reaped>> {
    let mut status = 0;
    // SAFETY: rusage is plain old data; all-zero is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 writes the status and the rusage into locals that outlive the call.
    let pid = unsafe { libc::wait4(-1, &mut status, libc::WNOHANG, &mut ru) };
    match pid {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(None),
        pid => Ok(Some(Reaped {
            pid,
            status,
            max_rss_bytes: ru.ru_maxrss as u64 * 1024,
        })),
    }
}

/// Most descriptors one message may carry ([`recv_with_fds`]; more are closed).
pub const MAX_PASSED_FDS: usize = 16;

/// Receive into `buf` from a unix socket, with the descriptors attached to those bytes
/// (`SCM_RIGHTS`, received close-on-exec), at most [`MAX_PASSED_FDS`] of them.
pub fn recv_with_fds(
    sock: &std::os::unix::net::UnixStream,
    buf: &mut [u8],
) -> io::Result<(usize, Vec<OwnedFd>)> {
    use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut space =
        [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_PASSED_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut iov = [io::IoSliceMut::new(buf)];
    let msg = loop {
        match recvmsg(sock, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC) {
            Err(rustix::io::Errno::INTR) => continue,
            r => break r?,
        }
    };
    let mut got = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = m {
            got.extend(fds);
        }
    }
    Ok((msg.bytes, got))
}

/// Receive into `buf` from a unix socket whose `SO_PASSCRED` is on, with the sender's pid as
/// the kernel attached it (translated into our pid namespace; `None` if none came).
pub fn recv_with_pid(
    sock: &std::os::unix::net::UnixStream,
    buf: &mut [u8],
) -> io::Result<(usize, Option<i32>)> {
    use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut space = [std::mem::MaybeUninit::<u8>::uninit();
        rustix::cmsg_space!(ScmCredentials(1), ScmRights(MAX_PASSED_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut iov = [io::IoSliceMut::new(buf)];
    let msg = loop {
        match recvmsg(sock, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC) {
            Err(rustix::io::Errno::INTR) => continue,
            r => break r?,
        }
    };
    let mut pid = None;
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmCredentials(c) = m {
            pid = Some(c.pid.as_raw_nonzero().get());
        }
    }
    Ok((msg.bytes, pid))
}

/// Send `bytes` on a unix socket with one descriptor attached (`SCM_RIGHTS`).
pub fn send_with_fd(
    sock: &std::os::unix::net::UnixStream,
    bytes: &[u8],
    fd: BorrowedFd<'_>,
) -> io::Result<()> {
    send_with_fds(sock, bytes, &[fd])
}

/// Send `bytes` on a unix socket with descriptors attached (`SCM_RIGHTS`, at most
/// [`MAX_PASSED_FDS`]).
pub fn send_with_fds(
    sock: &std::os::unix::net::UnixStream,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    if fds.len() > MAX_PASSED_FDS {
        return Err(io::Error::other("too many descriptors"));
    }
    let mut space =
        [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_PASSED_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("no room for the descriptors"));
    }
    let iov = [io::IoSlice::new(bytes)];
    let sent = sendmsg(sock, &iov, &mut control, SendFlags::NOSIGNAL)?;
    if sent != bytes.len() {
        // The rest goes without descriptors: the peer reads a stream.
        use std::io::Write;
        (&mut &*sock).write_all(&bytes[sent..])?;
    }
    Ok(())
}

/// `setns(2)`: join the namespace `fd` refers to (any type).
pub fn setns(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: setns takes a descriptor and an integer and touches no memory of ours.
    if unsafe { libc::setns(fd.as_raw_fd(), 0) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `pid` (of our pid namespace) is a live child of this process.
pub fn is_child(pid: i32) -> bool {
    let Some(p) = rustix::process::Pid::from_raw(pid) else {
        return false;
    };
    rustix::process::waitid(
        rustix::process::WaitId::Pid(p),
        rustix::process::WaitIdOptions::EXITED
            | rustix::process::WaitIdOptions::NOHANG
            | rustix::process::WaitIdOptions::NOWAIT,
    )
    .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake `/proc/<pid>` with the given main-thread state and `(tid, state)` tasks.
    fn fake_process(root: &std::path::Path, pid: u32, state: char, tasks: &[(u32, char)]) {
        let dir = root.join(pid.to_string());
        // A command name with a space and a ')' inside: the state follows the last ')'.
        let stat = |id: u32, s: char| format!("{id} (a) b) {s} 1 1 1 0 -1\n");
        std::fs::create_dir_all(dir.join("task")).unwrap();
        std::fs::write(dir.join("stat"), stat(pid, state)).unwrap();
        for &(tid, s) in tasks {
            let t = dir.join("task").join(tid.to_string());
            std::fs::create_dir_all(&t).unwrap();
            std::fs::write(t.join("stat"), stat(tid, s)).unwrap();
        }
    }

    /// Regression: a process whose main thread exited while another thread ran on showed `Z`
    /// in `/proc/<pid>/stat`, and the sweep after a session's cell skipped it as a zombie: it
    /// outlived the cell, and its thread kept running between calls.
    #[test]
    fn a_process_whose_main_thread_ended_is_live_while_another_thread_runs() {
        let root = tempfile::tempdir().unwrap();
        let proc = root.path();
        fake_process(proc, 10, 'R', &[(10, 'R')]);
        fake_process(proc, 11, 'T', &[(11, 'T')]);
        fake_process(proc, 12, 'Z', &[(12, 'Z'), (13, 'R')]);
        fake_process(proc, 14, 'Z', &[(14, 'Z')]);
        fake_process(proc, 15, 'Z', &[]);
        fake_process(proc, 16, 'X', &[(16, 'X')]);
        let live = |pid: u32| is_live(&proc.join(pid.to_string()));
        assert!(live(10) && live(11) && live(12));
        assert!(!live(14) && !live(15) && !live(16));
        // Gone by the time it is looked at.
        assert!(!live(99));
        assert_eq!(task_state(&proc.join("12/task/13/stat")), Some(b'R'));
    }
}
