//! The processes that build a sandbox, in the order they run. `docs/isolation.md` lists the
//! same steps and the reason for each.
//!
//! ```text
//! supervisor (runcell run / serve; may be multi-threaded)
//!   └─ helper      `runcell __jail`, exec'd with an empty environment; host side, single-threaded.
//!        │         Writes the uid/gid maps, places pid 1 in the cgroup, dies with the supervisor.
//!        └─ pid 1  clone(NEWUSER|NEWNS|NEWPID|NEWNET|NEWIPC|NEWUTS), then NEWCGROUP. Builds the
//!             │    root filesystem, pivots into it, then runs programs on request and reaps.
//!             └─ program   setsid, rlimits, no_new_privs, Landlock, capabilities dropped,
//!                          seccomp, execve.
//! ```
//!
//! Descriptors of the helper: 0 = /dev/null, 1 = stdout pipe, 2 = stderr pipe, 3 = control
//! socket, 4 = lifeline (read end of a pipe whose write end only the supervisor holds).

use std::ffi::CString;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Instant;

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::fs::{Mode, OFlags};
use rustix::mount::{unmount, MountFlags, MountPropagationFlags, UnmountFlags};
use rustix::pipe::{pipe_with, PipeFlags};
use rustix::process::{
    pidfd_send_signal, waitpid, DumpableBehavior, Pid, Resource, Rlimit, Signal, WaitOptions,
};
use rustix::thread::{
    clear_ambient_capability_set, set_capabilities, set_no_new_privs, set_thread_res_gid,
    set_thread_res_uid, CapabilitySet, CapabilitySets, Gid, Uid,
};

use crate::collect::{self, Baseline};
use crate::config::{ExecStep, JailConfig, Rlimits, RootEntry, SANDBOX_GID, SANDBOX_UID};
use crate::protocol::{
    self, Browse, BrowseArea, CellStep, ChildError, ExitStatus, LandlockStatus, Report, Request,
};
use crate::rootfs::{self, under, Step, StepError};
use crate::seccomp::SeccompPolicy;
use crate::sys;

/// The argument that makes the runcell binary act as the helper.
pub const HELPER_ARG: &str = "__jail";

const CTRL_FD: RawFd = 3;
const LIFELINE_FD: RawFd = 4;
/// Where pid 1 assembles the new root before pivoting into it. It is a mount point in pid 1's
/// private mount namespace only (after P6 nothing propagates back to the host).
const NEW_ROOT: &str = "/tmp";
/// The largest host file copied into the sandbox's root (P8): `/etc/ld.so.cache` is tens of KiB.
const HOST_FILE_MAX: u64 = 4 << 20;
const HOSTNAME_FILE_MODE: u32 = 0o644;
/// The helper's words to pid 1 on the go pipe: "your uid/gid maps are written" (H6) and "you
/// are in the run's cgroup" (H7).
const GO: &[u8] = b"g";
const IN_CGROUP: &[u8] = b"c";

/// Entry point of `runcell __jail`. Never returns.
pub fn helper_main() -> ! {
    // H0. Check that fds 3 and 4 are what the supervisor hands over (run by hand, `runcell
    //     __jail` would otherwise take ownership of arbitrary descriptors), and close every
    //     descriptor above them: whatever runcell's own parent leaked to it (a shell's
    //     `exec 7>file`, socket activation) must not reach the sandbox's pid 1.
    let expect = |fd: RawFd, kind: rustix::fs::FileType| {
        // SAFETY: the descriptor is only borrowed for the duration of the fstat call.
        let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        rustix::fs::fstat(borrowed)
            .map(|st| rustix::fs::FileType::from_raw_mode(st.st_mode) == kind)
            .unwrap_or(false)
    };
    if !expect(CTRL_FD, rustix::fs::FileType::Socket)
        || !expect(LIFELINE_FD, rustix::fs::FileType::Fifo)
    {
        eprintln!("runcell __jail is started by runcell itself, not by hand");
        sys::exit_now(125);
    }
    // SAFETY: nothing in this fresh process owns a descriptor above 4 yet.
    if unsafe { sys::close_fds_from(LIFELINE_FD as u32 + 1) }.is_err() {
        sys::exit_now(125);
    }
    // SAFETY: fd 3 was just checked to be a socket; the supervisor set it up as our end of the
    // control socket and nothing else in this fresh process owns it.
    let ctrl = unsafe { UnixStream::from_raw_fd(CTRL_FD) };
    // SAFETY: fd 4 was just checked to be a pipe: the lifeline's read end, handed over the same way.
    let lifeline = unsafe { OwnedFd::from_raw_fd(LIFELINE_FD) };
    let code = match helper(&ctrl, lifeline) {
        Ok(code) => code,
        Err(e) => {
            report_failure(&ctrl, &e);
            125
        }
    };
    sys::exit_now(code)
}

fn report_failure(ctrl: &UnixStream, e: &StepError) {
    let _ = protocol::send(ctrl, &Report::from(e), &[]);
}

/// The helper: runs on the host side, single-threaded, as the supervisor's user.
fn helper(ctrl: &UnixStream, lifeline: OwnedFd) -> Result<i32, StepError> {
    // H1. Read the sandbox description. It comes over the socket, never through argv or the
    //     environment, which /proc would show.
    let cfg = match protocol::recv::<Request>(ctrl).step("read setup")? {
        Some(protocol::Frame {
            message: Request::Setup(cfg),
            ..
        }) => cfg,
        _ => {
            return Err(StepError {
                step: "read setup",
                path: None,
                source: io::Error::new(io::ErrorKind::InvalidData, "expected a setup message"),
            })
        }
    };

    // H2. As root, drop the supplementary groups (group 0 among them): they would follow the
    //     sandbox into its user namespace and still count in host permission checks. (Root in
    //     a user namespace whose `setgroups` is denied cannot: `enforcement` shows the shape.)
    if cfg.powers.clear_groups {
        sys::clear_supplementary_groups().step("setgroups")?;
    }

    // H3. The "go" pipe: pid 1 waits on it until its uid/gid maps are written (H6), and again
    //     until it is in its cgroup (H7).
    let (go_r, go_w) = pipe_with(PipeFlags::CLOEXEC).step("pipe")?;

    // H3a. As host root, build the sandbox's own /dev: fresh device nodes on a tiny tmpfs that
    //      is never attached to the host's tree (pid 1 moves it into place in P9). Nodes made
    //      inside the user namespace would not open, and nodes bound from the host share the
    //      host's inodes (a lock on /dev/null would be seen by the host and every other run).
    //      Rootless, as root in a user namespace, or as root without CAP_MKNOD the helper
    //      cannot make nodes (the supervisor found out once, identity::probe_powers): pid 1
    //      binds the host's, and `enforcement.devices` says so.
    let dev = if cfg.powers.private_dev {
        Some(rootfs::private_dev()?)
    } else {
        None
    };
    // H3b. As host root, the non-recursive clones of the host directories that pid 1 shows
    //      through overlays (P8): in pid 1's namespace the kernel would refuse them wherever a
    //      mount lies below (mounts copied into a less privileged namespace are locked).
    //      Without CAP_SYS_ADMIN over the helper's mount namespace (rootless, root in a user
    //      namespace without it), pid 1 clones them itself (and a host with mounts below them
    //      fails).
    let layers: Vec<Option<OwnedFd>> = cfg
        .root
        .iter()
        .map(|e| match e {
            RootEntry::Bind { path, dir: true } | RootEntry::BindAt { path, .. }
                if cfg.powers.clone_layers =>
            {
                rootfs::layer_clone(path).map(Some)
            }
            _ => Ok(None),
        })
        .collect::<Result<_, _>>()?;

    // H4. Create pid 1 of the sandbox in new user, mount, pid, network, ipc and uts namespaces
    //     in one clone: the user namespace comes first in the kernel's order, so the others are
    //     owned by it, and the uid 0 of the host never owns anything inside. On cgroup v2 pid 1
    //     is created inside the run's group (clone3 with CLONE_INTO_CGROUP): it never runs
    //     outside it, and H7 has nothing to write.
    let ns = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWNET
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS;
    let cgroup_dir = match &cfg.cgroup_dir {
        Some(dir) => Some(
            rustix::fs::open(
                dir,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .step_at("open cgroup", dir)?,
        ),
        None => None,
    };
    // H4a. As root, create the user namespace with the sandbox's host uid/gid as effective ids:
    //      the namespace's owner is who created it, and the kernel charges per-user budgets of
    //      everything inside (inotify instances, pending signals, processes) to the owner as
    //      well. Owned by root, one run could use up host root's budgets; owned by its own
    //      uid, it can only use up its own. Saved ids stay 0, so the helper gets root back
    //      right after the clone (H5 and H7 need it). The fsuid stays 0 as well: with
    //      CLONE_INTO_CGROUP the kernel checks the caller's right to write the root-owned
    //      group's cgroup.procs by it (pid 1 changes all its ids in P3 before it touches a file).
    //      Root in a user namespace does the same with an id of its namespace's pool; without
    //      a pool (only root mapped) or without CAP_SETUID, the sandbox maps to our own uid.
    if cfg.powers.switch_ids {
        set_thread_res_gid(None::<Gid>, Gid::from_raw(cfg.host_gid), None::<Gid>)
            .step("setegid")?;
        set_thread_res_uid(None::<Uid>, Uid::from_raw(cfg.host_uid), None::<Uid>)
            .step("seteuid")?;
        if cgroup_dir.is_some() {
            sys::set_fsuid(0);
        }
    }
    let mut joined = false;
    let forked = match &cgroup_dir {
        // SAFETY: the helper is a freshly exec'd binary that starts no threads.
        Some(dir) => match unsafe { sys::clone_into_cgroup_with_pidfd(ns, dir.as_fd()) } {
            Ok(Some(forked)) => {
                joined = true;
                Ok(forked)
            }
            // clone3 refused (a container's seccomp profile): clone, then write cgroup.procs.
            // SAFETY: as above.
            Ok(None) => unsafe { sys::clone_with_pidfd(ns) },
            Err(e) => Err(e),
        },
        // SAFETY: as above.
        None => unsafe { sys::clone_with_pidfd(ns) },
    };
    let (pid, pidfd) = match forked.step("clone")? {
        sys::Forked::Child => {
            drop(go_w);
            drop(lifeline);
            drop(cgroup_dir);
            sandbox_pid1(ctrl, &cfg, go_r, dev, layers)
        }
        sys::Forked::Parent { pid, pidfd } => (pid, pidfd),
    };
    drop(go_r);
    drop(dev);
    drop(layers);
    drop(cgroup_dir);
    let kill_child = |e: StepError| {
        let _ = pidfd_send_signal(&pidfd, Signal::KILL);
        e
    };

    // H5. Map the sandbox's uid/gid 1000 to an unprivileged host uid/gid, and nothing else:
    //     there is no uid 0 inside, so no process of the sandbox can ever act as host root (a
    //     sandbox root mapped to host root could, e.g., rewrite /proc/sys/kernel/core_pattern).
    //     "deny" setgroups first: required for unprivileged maps, and it stops the sandbox from
    //     dropping groups to get around group-based denials. The helper writes them still as
    //     the namespace's owner (H4a), mapping only its own effective ids, which the kernel
    //     allows the owner without any capability: root in a user namespace without
    //     CAP_SYS_ADMIN (a pod's default capabilities) has no power over a namespace owned
    //     by another uid, not even to write its `setgroups`. Root comes back after. The
    //     fsuid is 0 for these writes: pid 1 is not dumpable (its creator changed ids), so its
    //     /proc files are root's, and the file checks go by the fsuid, the map checks by the
    //     opener's euid.
    if cfg.powers.switch_ids {
        sys::set_fsuid(0);
    }
    write_proc(pid, "setgroups", "deny").map_err(kill_child)?;
    write_proc(
        pid,
        "gid_map",
        &format!("{SANDBOX_GID} {} 1\n", cfg.host_gid),
    )
    .map_err(kill_child)?;
    write_proc(
        pid,
        "uid_map",
        &format!("{SANDBOX_UID} {} 1\n", cfg.host_uid),
    )
    .map_err(kill_child)?;
    if cfg.powers.switch_ids {
        set_thread_res_uid(None::<Uid>, Uid::ROOT, None::<Uid>)
            .step("restore euid")
            .map_err(kill_child)?;
        set_thread_res_gid(None::<Gid>, Gid::ROOT, None::<Gid>)
            .step("restore egid")
            .map_err(kill_child)?;
    }

    // H6. Release pid 1 ("g") to build its root (P3-P15) while H7 runs. The write end stays
    //     open until the helper exits: pid 1 checks it after P3 to learn whether the helper is
    //     still there (see P3a).
    rustix::io::write(&go_w, GO).step("release pid 1")?;

    // H7. Put pid 1 into the sandbox's cgroup (each v1 hierarchy's cgroup.procs; on v2 it was
    //     created there in H4), then tell pid 1 ("c"). pid 1 waits for it (P15a) before it
    //     enters its cgroup namespace, reports Ready, runs or receives anything of the request:
    //     every process of the run other than pid 1 is forked after it, so all are accounted
    //     and limited. What pid 1 allocates before (mount structures, the root tmpfs's few
    //     files, the copy of ld.so.cache) is fixed by runcell and the runtime, not by the
    //     request, and small. The first cgroup.procs write of a moment waits for an RCU grace
    //     period in the kernel (6-12 ms on a v1 host): pid 1's mounts now run in that time.
    //     The helper itself stays outside the group.
    if !joined {
        for procs in &cfg.cgroup_procs {
            fs::write(procs, pid.to_string())
                .step_at("join cgroup", procs)
                .map_err(kill_child)?;
        }
    }
    // (Spawned first: pid 1's Ready, which follows the "c", must be the last setup report.)
    protocol::send(ctrl, &Report::Spawned { pid }, &[])
        .step("report spawned")
        .map_err(kill_child)?;
    rustix::io::write(&go_w, IN_CGROUP)
        .step("report cgroup joined")
        .map_err(kill_child)?;

    // H8. Hold no descriptor the program could need to see closed: the pipes' write ends and
    //     the control socket belong to pid 1 and the supervisor from now on.
    let null = File::open("/dev/null").step("open /dev/null")?;
    for fd in 0..=2 {
        // SAFETY: fds 0-2 are owned by no object in this process (they were inherited).
        unsafe { sys::dup_to(null.as_raw_fd(), fd) }.step("redirect stdio")?;
    }
    // The control socket is the caller's; it is closed when this process exits below.

    // H9. Wait for pid 1 to exit. If the supervisor dies (the lifeline reads EOF), kill pid 1:
    //     the kernel then kills every process of the sandbox's pid namespace.
    loop {
        let mut fds = [
            PollFd::new(&lifeline, PollFlags::IN),
            PollFd::new(&pidfd, PollFlags::IN),
        ];
        match poll(&mut fds, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e).step("poll"),
        }
        if !fds[0].revents().is_empty() {
            let _ = pidfd_send_signal(&pidfd, Signal::KILL);
        }
        if !fds[1].revents().is_empty() || !fds[0].revents().is_empty() {
            break;
        }
    }
    let status = waitpid(Pid::from_raw(pid), WaitOptions::empty()).step("wait for pid 1")?;
    Ok(match status {
        Some((_, st)) => st.exit_status().unwrap_or(125),
        None => 125,
    })
}

fn helper_gone() -> StepError {
    StepError {
        step: "wait for helper",
        path: None,
        source: io::Error::new(io::ErrorKind::UnexpectedEof, "helper went away"),
    }
}

fn write_proc(pid: i32, file: &str, content: &str) -> Result<(), StepError> {
    let path = PathBuf::from(format!("/proc/{pid}/{file}"));
    fs::write(&path, content).step_at("write id map", &path)
}

/// Pid 1 of the sandbox. Never returns.
fn sandbox_pid1(
    ctrl: &UnixStream,
    cfg: &JailConfig,
    go_r: OwnedFd,
    dev: Option<OwnedFd>,
    layers: Vec<Option<OwnedFd>>,
) -> ! {
    let service = build_sandbox(cfg, go_r, dev, layers).and_then(|()| prepare_service());
    let (seccomp, sigchld) = match service {
        Ok(s) => s,
        Err(e) => {
            report_failure(ctrl, &e);
            sys::exit_now(125);
        }
    };
    // P16a. A run with network by permission: listen on the sandbox's loopback for its
    //      egress proxy, and hand the socket over with `Ready` (below). The supervisor serves
    //      it from outside this network namespace; this process keeps no copy, so nothing in
    //      the sandbox can accept on it, and the port stays taken.
    let proxy = match cfg.proxy_port.map(|port| {
        std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port))
            .step("listen for the proxy")
    }) {
        None => None,
        Some(Ok(l)) => Some(l),
        Some(Err(e)) => {
            report_failure(ctrl, &e);
            sys::exit_now(125);
        }
    };
    // P17. Ready: the point a warm pool keeps sandboxes at.
    let ready = match &proxy {
        None => protocol::send(ctrl, &Report::Ready, &[]),
        Some(l) => protocol::encode(&Report::Ready, &[])
            .and_then(|frame| sys::send_with_fd(ctrl, &frame, l.as_fd())),
    };
    drop(proxy);
    if ready.is_err() {
        sys::exit_now(125);
    }
    serve(ctrl, &seccomp, &sigchld)
}

/// P16. What serving programs needs, prepared before `Ready` so that a failure here is a setup
/// failure: the seccomp policy (compiled to BPF when runcell was built; the forked program only
/// installs it), and a signalfd for SIGCHLD (one poll then covers child exits and the
/// supervisor's messages).
fn prepare_service() -> Result<(SeccompPolicy, OwnedFd), StepError> {
    let sigchld = sys::sigchld_fd().step("signalfd")?;
    Ok((SeccompPolicy::embedded(), sigchld))
}

/// The linear setup of the sandbox, run by its pid 1. Each step says why it is there and why
/// it comes where it does.
fn build_sandbox(
    cfg: &JailConfig,
    go_r: OwnedFd,
    dev: Option<OwnedFd>,
    mut layers: Vec<Option<OwnedFd>>,
) -> Result<(), StepError> {
    // P1. Die with the helper (which dies with the supervisor): when pid 1 dies, the kernel
    //     kills the whole pid namespace, so nothing of the run can outlive its supervisor.
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL)).step("pdeathsig")?;

    // P2. Wait until the helper wrote our uid/gid maps (H6). EOF without the byte means the
    //     helper died first (and so before P1 could take effect): give up.
    wait_for_word(&go_r, GO)?;

    // P3. Become uid/gid 1000 of the new user namespace now, keeping our capabilities in it
    //     (uid 0 is not mapped, so the kernel's setuid capability fix-up does not fire). Files
    //     created during setup are then owned by the sandbox user rather than by an unmapped
    //     id (which tmpfs would refuse with EOVERFLOW).
    set_thread_res_gid(
        Gid::from_raw(SANDBOX_GID),
        Gid::from_raw(SANDBOX_GID),
        Gid::from_raw(SANDBOX_GID),
    )
    .step("setresgid")?;
    set_thread_res_uid(
        Uid::from_raw(SANDBOX_UID),
        Uid::from_raw(SANDBOX_UID),
        Uid::from_raw(SANDBOX_UID),
    )
    .step("setresuid")?;

    // P3a. Arm the parent-death signal again: the kernel clears it whenever a process's
    //      credentials change, and P3 changed them (as root: host uid 0 -> the sandbox's host
    //      uid). Then make sure the helper did not die in between: it holds the go pipe's
    //      write end until it exits, so a hang-up on our end means it is gone.
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL)).step("pdeathsig")?;
    let mut fds = [PollFd::new(&go_r, PollFlags::IN)];
    poll(&mut fds, Some(&Timespec::default())).step("check helper")?;
    if fds[0].revents().contains(PollFlags::HUP) {
        return Err(helper_gone());
    }

    // P5. Non-dumpable: the program (same uid) cannot open /proc/1/{mem,environ,fd,exe,...}
    //     of this process, which holds the control socket and runs the runcell binary (runc
    //     CVE-2019-5736 overwrote the runtime through /proc/<pid>/exe).
    rustix::process::set_dumpable_behavior(DumpableBehavior::NotDumpable).step("dumpable")?;

    // P6. Stop mount propagation in both directions before mounting anything, so no mount made
    //     below can ever appear on the host.
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
    )
    .step("make mounts private")?;

    // P7. The new root: a small tmpfs, read-only once built (P15). It only holds directories,
    //     symlinks and the generated /etc files.
    let root = Path::new(NEW_ROOT);
    rootfs::mount_tmpfs(root, 8 << 20, 4096, 0o755)?;

    // P8. The host parts the runtime needs, read-only, nosuid, nodev. Each directory through a
    //     lower-only overlay of its own: the files and the page cache are the host's, but the
    //     inodes are this sandbox's, so a lock (flock, POSIX, OFD) on a shared file such as
    //     the Python binary is neither seen by nor blocks the host and the other runs, and
    //     mountinfo names no host path or device. Mounts below a directory (which an overlay
    //     layer does not include) are bound on top as they are. Single files (ld.so.cache)
    //     are copied into the root.
    let staging_layers = root.join(".layers");
    // The second layer every read-only overlay needs: an empty read-only tmpfs. Its mount is
    // detached once the overlays hold their own clones of it (its directory must stay alive:
    // an overlay cannot list a merged directory whose layer was removed).
    let empty = staging_layers.join("empty");
    rootfs::mkdir_p(&empty, 0o755)?;
    rootfs::mount_empty(&empty)?;
    let mountinfo = fs::read("/proc/self/mountinfo").step("read mountinfo")?;
    //     A host part is shown at its own path, or (BindAt) at a fixed one; never below the
    //     sandbox's own /tmp, /workspace, /dev or /proc, which would hide it (refused).
    for (i, entry) in cfg.root.iter().enumerate() {
        match entry {
            RootEntry::Bind { path, dir: true } | RootEntry::BindAt { path, .. } => {
                let at = match entry {
                    RootEntry::BindAt { at, .. } => at,
                    _ => path,
                };
                let dst = rootfs::shown_under(root, at).step_at("show host directory", path)?;
                let layer = staging_layers.join(i.to_string());
                let clone = layers.get_mut(i).and_then(Option::take);
                rootfs::overlay_readonly(path, clone, &layer, &empty, &dst)?;
                for sub in rootfs::submounts_under(&mountinfo, path) {
                    let rel = sub.strip_prefix(path).unwrap_or(Path::new(""));
                    rootfs::bind_readonly(&sub, &dst.join(rel), sub.is_dir())?;
                }
            }
            RootEntry::Bind { path, dir: false } => {
                let dst = rootfs::shown_under(root, path).step_at("show host file", path)?;
                rootfs::copy_host_file(path, &dst, HOST_FILE_MAX)?
            }
            RootEntry::Symlink { path, target } => {
                let dst = under(root, path);
                if let Some(parent) = dst.parent() {
                    rootfs::mkdir_p(parent, 0o755)?;
                }
                std::os::unix::fs::symlink(target, &dst).step_at("symlink", &dst)?;
            }
        }
    }

    // P9. A minimal /dev: the harmless character devices, the /dev/fd links, and nothing else
    //     (no block devices, kmsg, mem, tty). As host root, the helper built it with nodes of
    //     its own (H3a); wherever it could not, the host's nodes are bound (a user namespace
    //     cannot mknod), nosuid and noexec.
    let dev_dir = root.join("dev");
    match dev {
        Some(mnt) => rootfs::attach(mnt, &dev_dir)?,
        None => {
            rootfs::mkdir_p(&dev_dir, 0o755)?;
            for &(name, _, _) in rootfs::DEVICES {
                let host = Path::new("/dev").join(name);
                rootfs::bind_device(&host, &dev_dir.join(name))?;
            }
            for &(name, target) in rootfs::DEV_LINKS {
                let link = dev_dir.join(name);
                std::os::unix::fs::symlink(target, &link).step_at("symlink", &link)?;
            }
            rootfs::mkdir_p(&dev_dir.join("shm"), 0o755)?;
        }
    }
    let dev = dev_dir;

    // P10. The writable scratch space: ONE size- and inode-capped tmpfs, exposed at /tmp,
    //      /workspace and /dev/shm, so the disk limit covers all three together. It is staged
    //      at a temporary mount point, bound into place, and the staging mount is removed (the
    //      binds keep the filesystem alive).
    let staging = root.join(".scratch");
    rootfs::mkdir_p(&staging, 0o700)?;
    rootfs::mount_tmpfs(&staging, cfg.scratch_bytes, cfg.scratch_inodes, 0o755)?;
    for (sub, mode, target) in [
        ("tmp", 0o1777, root.join("tmp")),
        ("workspace", 0o755, root.join("workspace")),
        ("shm", 0o1777, dev.join("shm")),
    ] {
        let src = staging.join(sub);
        rootfs::mkdir_p(&src, mode)?;
        if !target.is_dir() {
            // (/dev/shm already exists on the read-only /dev.)
            rootfs::mkdir_p(&target, 0o755)?;
        }
        rootfs::bind_plain(&src, &target)?;
    }
    // P10a. Prepared read-only caches (Go's build cache) made writable by an overlay whose
    //       upper layer is on the scratch filesystem, outside the parts bound into the
    //       sandbox: writes count against the disk limit, and the host directory is never
    //       written. Must happen while the staging mount still gives a path to the scratch.
    for (i, ov) in cfg.overlays.iter().enumerate() {
        let layer = staging.join(format!(".overlay-{i}"));
        let (upper, work) = (layer.join("upper"), layer.join("work"));
        rootfs::mkdir_p(&upper, 0o755)?;
        rootfs::mkdir_p(&work, 0o755)?;
        let target = under(root, &ov.target);
        rootfs::mkdir_p(&target, 0o755)?;
        // Through a staging bind, so that mountinfo does not name the host directory.
        let lower = staging_layers.join(format!("cache-{i}"));
        rootfs::mkdir_p(&lower, 0o700)?;
        rootfs::bind_readonly(&ov.lower, &lower, true)?;
        rootfs::mount_overlay(&lower, &upper, &work, &target)?;
        unmount(&lower, UnmountFlags::DETACH).step_at("unmount layer", &lower)?;
        fs::remove_dir(&lower).step_at("rmdir layer", &lower)?;
    }
    unmount(&empty, UnmountFlags::DETACH).step_at("unmount layer", &empty)?;
    fs::remove_dir(&empty).step_at("rmdir", &empty)?;
    fs::remove_dir(&staging_layers).step_at("rmdir", &staging_layers)?;
    unmount(&staging, UnmountFlags::DETACH).step_at("unmount staging", &staging)?;
    fs::remove_dir(&staging).step_at("rmdir staging", &staging)?;

    // P11. A fresh /proc for the new pid namespace (only the sandbox's processes appear), with
    //      the entries that leak or act on the host masked or read-only.
    let proc_dir = root.join("proc");
    rootfs::mkdir_p(&proc_dir, 0o555)?;
    rustix::mount::mount(
        "proc",
        &proc_dir,
        "proc",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        None,
    )
    .step_at("mount proc", &proc_dir)?;
    rootfs::mask_proc(&proc_dir, &dev.join("null"))?;

    // P12. Synthetic identity files: the sandbox user exists, and nothing of the host's
    //      users, groups or hosts leaks in.
    let etc = root.join("etc");
    rootfs::mkdir_p(&etc, 0o755)?;
    let files: [(&str, String); 5] = [
        (
            "passwd",
            format!(
                "root:x:0:0:root:/root:/usr/sbin/nologin\n\
                 sandbox:x:{SANDBOX_UID}:{SANDBOX_GID}:sandbox:/tmp:/bin/bash\n\
                 nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            ),
        ),
        (
            "group",
            format!("root:x:0:\nsandbox:x:{SANDBOX_GID}:\nnogroup:x:65534:\n"),
        ),
        (
            "hosts",
            format!(
                "127.0.0.1\tlocalhost {h}\n::1\tlocalhost ip6-localhost ip6-loopback\n",
                h = cfg.hostname
            ),
        ),
        ("hostname", format!("{}\n", cfg.hostname)),
        (
            "nsswitch.conf",
            "passwd: files\ngroup: files\nhosts: files\n".to_string(),
        ),
    ];
    for (name, content) in files {
        let p = etc.join(name);
        fs::write(&p, content).step_at("write", &p)?;
        fs::set_permissions(&p, fs::Permissions::from_mode(HOSTNAME_FILE_MODE))
            .step_at("chmod", &p)?;
    }

    // P13. Own hostname (UTS namespace) and a loopback-only network (network namespace): no
    //      route out, no host loopback services, no host abstract unix sockets.
    rustix::system::sethostname(cfg.hostname.as_bytes()).step("sethostname")?;
    sys::loopback_up().step("bring up loopback")?;

    // P14. Enter the new root. pivot_root(".", ".") stacks the old root on top of the new one
    //      and the lazy unmount drops it, so no path to the host's tree remains (a chroot would
    //      leave the old root reachable).
    rustix::process::chdir(root).step("chdir new root")?;
    rustix::process::pivot_root(".", ".").step("pivot_root")?;
    unmount(".", UnmountFlags::DETACH).step("detach old root")?;
    rustix::process::chdir("/").step("chdir /")?;

    // P15. Freeze the root tmpfs: /etc, /dev and the mount points cannot be changed any more.
    //      /tmp, /workspace and /dev/shm are separate mounts and stay writable.
    let slash = File::open("/").step("open /")?;
    sys::mount_setattr(
        slash.as_fd(),
        c"",
        false,
        sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
        false,
    )
    .step("make root read-only")?;

    // P15a. Wait until the helper has put us into the run's cgroup (H7), which it did while we
    //       built the root. Nothing of the request has reached us yet, and we have forked
    //       nothing: from here on every process of the run is created inside the group.
    wait_for_word(&go_r, IN_CGROUP)?;
    drop(go_r);

    // P15b. A cgroup namespace rooted at the sandbox's cgroup (we are in it since P15a), so
    //       /proc/self/cgroup shows "/" and no host cgroup path.
    // SAFETY: unshare(CLONE_NEWCGROUP) only changes this process's cgroup namespace; the
    // process is single-threaded.
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWCGROUP) }
        .step("unshare cgroup namespace")?;

    Ok(())
}

/// Read the helper's next word on the go pipe; anything else (EOF: the helper died) ends the
/// setup.
fn wait_for_word(go_r: &OwnedFd, word: &[u8]) -> Result<(), StepError> {
    let mut b = [0u8; 1];
    loop {
        match rustix::io::read(go_r, &mut b) {
            Ok(1) if b[..] == *word => return Ok(()),
            Ok(_) => return Err(helper_gone()),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e).step("wait for helper"),
        }
    }
}

/// Where programs work and where their output files are collected from.
const WORKSPACE: &str = "/workspace";
/// The sandbox's /tmp, where a session interpreter reports a cell's results (see `Browse`).
const TMP: &str = "/tmp";
/// Entries visited at most when taking the baseline of /workspace.
const BASELINE_MAX_ENTRIES: u64 = 200_000;

/// Pid 1's service loop: run each requested program, collect files, report. Ends on EOF.
fn serve(ctrl: &UnixStream, seccomp: &SeccompPolicy, sigchld: &OwnedFd) -> ! {
    let mut baseline = Baseline::default();
    let mut interp: Option<Interpreter> = None;
    loop {
        // A warm interpreter says nothing while it waits: a hang-up or anything on its channel
        // means it died or misbehaves, and so does the sandbox (it is never handed out).
        // A session's interpreter is frozen between cells: pid 1, its parent, is told of every
        // change of its state (SIGCHLD), and one that runs again without pid 1's SIGCONT (a
        // POSIX timer or a child's exit signal set to SIGCONT) escaped the freeze and ends.
        if let Some(it) = &interp {
            let mut fds = vec![
                PollFd::new(ctrl, PollFlags::IN),
                PollFd::new(&it.chan, PollFlags::IN),
            ];
            if it.frozen {
                fds.push(PollFd::new(sigchld, PollFlags::IN));
            }
            match poll(&mut fds, None) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(_) => sys::exit_now(125),
            }
            let request = !fds[0].revents().is_empty();
            let on_channel = !fds[1].revents().is_empty();
            let child_changed = fds.get(2).is_some_and(|f| !f.revents().is_empty());
            drop(fds);
            // Checked before any request is served: the signalfd is drained here, and an
            // escape noticed now must not wait for a later wake-up.
            let escaped = child_changed && {
                drain_signalfd(sigchld);
                job_state(it.pid) != JobState::Stopped
            };
            if escaped || (!request && on_channel) {
                let _ = sys::kill_rest_of_namespace();
                if !it.persistent {
                    // A warm sandbox that lost its interpreter is never handed out.
                    sys::exit_now(125);
                }
                // A session's interpreter died between cells (killed from outside, or by the
                // OOM killer of the shared parent group), wrote on its channel, or escaped its
                // freeze: the sandbox and its files stay, the next cell finds no interpreter
                // and the supervisor starts a new one.
                interp = None;
                let mut peak = 0;
                if end_of_run(sigchld, &mut peak).is_err() {
                    sys::exit_now(125);
                }
                continue;
            }
        }
        let frame = match protocol::recv::<Request>(ctrl) {
            Ok(Some(f)) => f,
            _ => sys::exit_now(0),
        };
        if interp.is_none()
            && matches!(
                frame.message,
                Request::Exec(_) | Request::Start(_) | Request::Cell(_) | Request::Graft(_)
            )
            && has_children()
        {
            // What a one-shot cell left dying is gone before anything else starts.
            let mut peak = 0;
            if end_of_run(sigchld, &mut peak).is_err() {
                sys::exit_now(125);
            }
        }
        let report = match frame.message {
            // A session's interpreter: the program runs beside it, frozen (a shell command in
            // a Python session).
            Request::Exec(step) if interp.is_some() => run_beside(
                ctrl,
                sigchld,
                &step,
                frame.blobs,
                seccomp,
                &mut baseline,
                &mut interp,
            )
            .unwrap_or_else(|e| Report::from(&e)),
            Request::Exec(step) => {
                run_step(ctrl, sigchld, &step, frame.blobs, seccomp, &mut baseline)
                    .unwrap_or_else(|e| Report::from(&e))
            }
            Request::Collect(_) | Request::Browse(_) => {
                let c = match &frame.message {
                    Request::Collect(limits) => collect::collect(WORKSPACE, &baseline, limits),
                    Request::Browse(Browse {
                        limits,
                        path: Some(rel),
                        area,
                    }) => {
                        let root = match area {
                            BrowseArea::Workspace => WORKSPACE,
                            BrowseArea::Tmp => TMP,
                        };
                        collect::collect_one(root, rel, limits)
                    }
                    Request::Browse(Browse {
                        limits,
                        path: None,
                        area: BrowseArea::Workspace,
                    }) => collect::collect(WORKSPACE, &Baseline::default(), limits),
                    // /tmp is never listed: only a named file is read there.
                    Request::Browse(Browse {
                        path: None,
                        area: BrowseArea::Tmp,
                        ..
                    }) => collect::Collection::default(),
                    _ => unreachable!("matched above"),
                };
                let blobs: Vec<&[u8]> = c.blobs.iter().map(Vec::as_slice).collect();
                let report = Report::Files {
                    files: c.files,
                    omitted: c.omitted,
                    notes: c.notes,
                };
                if protocol::send(ctrl, &report, &blobs).is_err() {
                    sys::exit_now(125);
                }
                continue;
            }
            Request::Start(step) => start_interpreter(
                ctrl,
                sigchld,
                &step,
                frame.blobs,
                seccomp,
                &mut baseline,
                &mut interp,
            )
            .unwrap_or_else(|e| Report::from(&e)),
            Request::Cell(cell) => run_cell(
                ctrl,
                sigchld,
                &cell,
                frame.blobs,
                &mut baseline,
                &mut interp,
            )
            .unwrap_or_else(|e| Report::from(&e)),
            Request::Graft(step) => graft_interpreter(
                ctrl,
                sigchld,
                &step,
                frame.blobs,
                &mut baseline,
                &mut interp,
            )
            .unwrap_or_else(|e| Report::from(&e)),
            Request::Put { files } => files
                .iter()
                .try_for_each(|f| write_sandbox_file(&f.path, f.mode, blob(&frame.blobs, f.blob)?))
                .map(|()| Report::Written)
                .unwrap_or_else(|e| Report::from(&e)),
            // A Stop or Interrupt that crossed the program's exit on the wire: nothing runs.
            Request::Stop | Request::Interrupt => continue,
            Request::Setup(_) => sys::exit_now(125),
        };
        if protocol::send(ctrl, &report, &[]).is_err() {
            sys::exit_now(125);
        }
    }
}

impl From<&StepError> for Report {
    fn from(e: &StepError) -> Report {
        Report::Failed {
            step: e.step.to_string(),
            path: e.path.clone(),
            error: ChildError {
                errno: errno_of(&e.source),
                message: e.source.to_string(),
            },
        }
    }
}

/// Reap every exited child without blocking, noting the largest resident set among them in
/// `peak_rss`; returns `pid`'s record if it was among them.
fn reap_exited(pid: i32, peak_rss: &mut u64) -> Option<sys::Reaped> {
    let mut mine = None;
    loop {
        match sys::reap_one() {
            Ok(Some(r)) => {
                *peak_rss = (*peak_rss).max(r.max_rss_bytes);
                if r.pid == pid {
                    mine = Some(r);
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            // Ok(None): children remain but none has exited; ECHILD: no children left.
            _ => return mine,
        }
    }
}

/// Whether any child (live or zombie) is left.
fn has_children() -> bool {
    !matches!(
        rustix::process::waitid(
            rustix::process::WaitId::All,
            rustix::process::WaitIdOptions::EXITED
                | rustix::process::WaitIdOptions::NOHANG
                | rustix::process::WaitIdOptions::NOWAIT,
        ),
        Err(rustix::io::Errno::CHILD)
    )
}

/// A warm interpreter started by `Request::Start`: its pid and pid 1's end of the cell
/// channel (the interpreter's fd 4).
struct Interpreter {
    pid: i32,
    chan: UnixStream,
    landlock: LandlockStatus,
    /// It ran a session's cell (`keep`): it outlives cells, and its death between cells ends
    /// only itself, not the sandbox.
    persistent: bool,
    /// Stopped between a session's cells (see [`spare_interpreter`]) until the next cell.
    frozen: bool,
}

/// The longest line an interpreter may send on its channel (`R`, `D <code>`).
const CHANNEL_LINE_MAX: usize = 64;

/// Run one program and report how it ended. Every process it leaves behind is killed before
/// the report, so the next step starts clean.
fn run_step(
    ctrl: &UnixStream,
    sigchld: &OwnedFd,
    step: &ExecStep,
    blobs: Vec<Vec<u8>>,
    seccomp: &SeccompPolicy,
    baseline: &mut Baseline,
) -> Result<Report, StepError> {
    let stdin = place_inputs(&step.files, step.stdin_blob, &blobs, baseline)?;
    // The inputs are in place: free their copies now, before the program starts, so that pid
    // 1 holds no memory of the run's cgroup while the program runs.
    drop(blobs);
    let before = sys::children_rusage();
    let started = Instant::now();
    let spawned = spawn(ctrl, step, stdin, None, seccomp)?;
    let mut peak_rss = 0u64;
    // Without a channel, only the program's end comes back.
    let Waited::Exited(status) = wait_for(ctrl, sigchld, spawned.pid, None, &mut peak_rss)? else {
        return Err(invalid("wait", "a line without a channel"));
    };
    if let Some(failure) = spawned.exec_error {
        return Err(exec_failed(sigchld, failure, step, &mut peak_rss));
    }
    finish(sigchld, exit_status(&status), started, before, peak_rss)
}

/// Run a program beside a session's interpreter (`Request::Exec` between cells). The
/// interpreter is frozen (if no cell froze it yet) and stays stopped; the program runs as any other, and when it ends (or is stopped)
/// everything it started is killed but the interpreter, which is frozen again exactly as
/// after a cell ([`spare_interpreter`]: a program that continued it, or signalled it, cannot
/// leave it running). An interpreter that does not survive is gone: the session's next cell
/// finds none and starts another.
fn run_beside(
    ctrl: &UnixStream,
    sigchld: &OwnedFd,
    step: &ExecStep,
    blobs: Vec<Vec<u8>>,
    seccomp: &SeccompPolicy,
    baseline: &mut Baseline,
    interp: &mut Option<Interpreter>,
) -> Result<Report, StepError> {
    let mut peak_rss = 0u64;
    let Some(it) = interp.as_mut() else {
        return Err(invalid("exec", "no interpreter to run beside"));
    };
    if !it.frozen {
        // Not frozen yet (no cell has run): frozen now, as after a cell, so that nothing of
        // it runs while the program does. It outlives the program.
        if !spare_interpreter(sigchld, it.pid, &mut peak_rss) {
            *interp = None;
            end_of_run(sigchld, &mut peak_rss)?;
            return run_step(ctrl, sigchld, step, blobs, seccomp, baseline);
        }
        it.frozen = true;
        it.persistent = true;
    }
    let spare = it.pid;
    let stdin = place_inputs(&step.files, step.stdin_blob, &blobs, baseline)?;
    drop(blobs);
    let before = sys::children_rusage();
    let started = Instant::now();
    let spawned = spawn(ctrl, step, stdin, None, seccomp)?;
    let waited = wait_beside(ctrl, sigchld, spawned.pid, spare, &mut peak_rss);
    let wall = started.elapsed();
    if !spare_interpreter(sigchld, spare, &mut peak_rss) {
        // Gone, or not frozen again: the run's end takes everything, the interpreter too.
        *interp = None;
        end_of_run(sigchld, &mut peak_rss)?;
    }
    let status = match waited? {
        Waited::Exited(st) => st,
        Waited::Line(_) => return Err(invalid("wait", "a line without a channel")),
    };
    if let Some(failure) = spawned.exec_error {
        return Err(exec_failed(sigchld, failure, step, &mut peak_rss));
    }
    report_exit(exit_status(&status), wall, before, peak_rss, false)
}

/// [`wait_for`] of a program run beside the frozen interpreter `spare`: a Stop (timeout,
/// output flood) kills every process but the interpreter, which [`run_beside`] freezes again.
fn wait_beside(
    ctrl: &UnixStream,
    sigchld: &OwnedFd,
    pid: i32,
    spare: i32,
    peak_rss: &mut u64,
) -> Result<Waited, StepError> {
    loop {
        if let Some(st) = reap_exited(pid, peak_rss) {
            return Ok(Waited::Exited(st));
        }
        let mut fds = vec![
            PollFd::new(sigchld, PollFlags::IN),
            PollFd::new(ctrl, PollFlags::IN),
        ];
        match poll(&mut fds, None) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e).step("poll"),
        }
        let revents: Vec<PollFlags> = fds.iter().map(|f| f.revents()).collect();
        drop(fds);
        if !revents[0].is_empty() {
            drain_signalfd(sigchld);
        }
        if !revents[1].is_empty() {
            match protocol::recv::<Request>(ctrl) {
                // Everything stopped first (a stopped process forks nothing), then killed but
                // the interpreter; the program's end follows, and run_beside's freeze sweeps
                // again, within its deadline.
                Ok(Some(protocol::Frame {
                    message: Request::Stop,
                    ..
                })) => {
                    sys::stop_rest_of_namespace().step("stop")?;
                    sys::kill_all_but(Path::new("/proc"), spare).step("stop")?;
                }
                Ok(Some(protocol::Frame {
                    message: Request::Interrupt,
                    ..
                })) => sys::signal_group(pid, libc::SIGINT).step("interrupt")?,
                Ok(Some(_)) => return Err(invalid("control", "unexpected request while running")),
                _ => {
                    let _ = sys::kill_rest_of_namespace();
                    sys::exit_now(0);
                }
            }
        }
    }
}

/// Start a warm interpreter (`Request::Start`): like a program, with the cell channel on its
/// fd 4; ready once it writes `R`.
fn start_interpreter(
    ctrl: &UnixStream,
    sigchld: &OwnedFd,
    step: &ExecStep,
    blobs: Vec<Vec<u8>>,
    seccomp: &SeccompPolicy,
    baseline: &mut Baseline,
    interp: &mut Option<Interpreter>,
) -> Result<Report, StepError> {
    if interp.is_some() {
        return Err(invalid("start", "an interpreter is already running"));
    }
    let stdin = place_inputs(&step.files, step.stdin_blob, &blobs, baseline)?;
    drop(blobs);
    let (ours, theirs) = UnixStream::pair().step("socketpair")?;
    let before = sys::children_rusage();
    let started = Instant::now();
    let spawned = spawn(ctrl, step, stdin, Some(theirs.into()), seccomp)?;
    let mut peak_rss = 0u64;
    if let Some(failure) = spawned.exec_error {
        return Err(exec_failed(sigchld, failure, step, &mut peak_rss));
    }
    match wait_for(ctrl, sigchld, spawned.pid, Some(&ours), &mut peak_rss)? {
        Waited::Line(line) if line == b"R" => {
            *interp = Some(Interpreter {
                pid: spawned.pid,
                chan: ours,
                landlock: spawned.landlock,
                persistent: false,
                frozen: false,
            });
            Ok(Report::InterpreterReady)
        }
        // It ended (an import of the preload failed) or said something else: it is gone.
        Waited::Line(_) => finish(sigchld, ExitStatus::Code(125), started, before, peak_rss),
        Waited::Exited(st) => finish(sigchld, exit_status(&st), started, before, peak_rss),
    }
}

/// The hello's length: `H L` and the Landlock level's letter, and a newline.
const HELLO_LEN: usize = 5;

/// How long pid 1 waits for a forked interpreter's hello after handing out its channel.
const GRAFT_WITHIN: std::time::Duration = std::time::Duration::from_secs(20);

/// Adopt an interpreter forked from a template (`Request::Graft`, docs/isolation.md F1-F8):
/// hand the supervisor the channel's other end and the program's descriptors, wait for the
/// hello of a process that is our own child, then wait for it to be ready, as `Start` does.
fn graft_interpreter(
    ctrl: &UnixStream,
    sigchld: &OwnedFd,
    step: &ExecStep,
    blobs: Vec<Vec<u8>>,
    baseline: &mut Baseline,
    interp: &mut Option<Interpreter>,
) -> Result<Report, StepError> {
    if interp.is_some() {
        return Err(invalid("graft", "an interpreter is already running"));
    }
    let stdin = place_inputs(&step.files, step.stdin_blob, &blobs, baseline)?;
    drop(blobs);
    let (ours, theirs) = UnixStream::pair().step("socketpair")?;
    // The hello's sender pid comes from the kernel, translated into our pid namespace.
    rustix::net::sockopt::set_socket_passcred(&ours, true).step("SO_PASSCRED")?;
    let out = rustix::io::fcntl_dupfd_cloexec(std::io::stdout(), 0).step("dup stdout")?;
    let err = rustix::io::fcntl_dupfd_cloexec(std::io::stderr(), 0).step("dup stderr")?;
    let bytes = protocol::encode(&Report::GraftChannel, &[]).step("encode")?;
    sys::send_with_fds(
        ctrl,
        &bytes,
        &[theirs.as_fd(), stdin.as_fd(), out.as_fd(), err.as_fd()],
    )
    .step("send graft channel")?;
    drop((theirs, stdin, out, err));

    let before = sys::children_rusage();
    let started = Instant::now();
    let deadline = started + GRAFT_WITHIN;
    // The hello: "H L<f|p|n>\n" (its Landlock status) from a child of ours.
    let (pid, landlock) = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(invalid(
                "graft",
                "no hello from the forked interpreter in time",
            ));
        }
        let mut fds = [
            PollFd::new(&ours, PollFlags::IN),
            PollFd::new(ctrl, PollFlags::IN),
        ];
        match poll(&mut fds, Some(&timespec_of(left))) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e).step("poll"),
        }
        let (on_chan, on_ctrl) = (!fds[0].revents().is_empty(), !fds[1].revents().is_empty());
        if on_ctrl {
            // The supervisor gave up on the fork (a Stop) or went away.
            match protocol::recv::<Request>(ctrl) {
                Ok(Some(_)) => return Err(invalid("graft", "given up by the supervisor")),
                _ => sys::exit_now(0),
            }
        }
        if on_chan {
            // Exactly the hello's five bytes: the runner's "R" may follow at once on the
            // stream, and is read by `wait_for` below.
            let mut buf = [0u8; HELLO_LEN];
            let (n, sender) = sys::recv_with_pid(&ours, &mut buf).step("read hello")?;
            let hello = &buf[..n];
            let landlock = match hello {
                b"H Lf\n" => LandlockStatus::Full,
                b"H Lp\n" => LandlockStatus::Partial,
                b"H Ln\n" => LandlockStatus::None,
                _ => {
                    // What became of it, for the log: a fork that died before its hello was
                    // re-parented here and is reaped now.
                    let mut died = Vec::new();
                    while let Ok(Some(r)) = sys::reap_one() {
                        died.push(format!("{:?}/{:?}", r.code(), r.signal()));
                    }
                    let msg = format!(
                        "no hello from the forked interpreter ({} bytes; exited: {died:?})",
                        hello.len()
                    );
                    return Err(invalid("graft", &msg));
                }
            };
            // Only our own child may be adopted: the process the template forked, re-parented
            // to us when its parent in this namespace exited (F6).
            match sender {
                Some(pid) if pid > 1 && sys::is_child(pid) => break (pid, landlock),
                _ => return Err(invalid("graft", "the hello came from a process not ours")),
            }
        }
    };
    rustix::net::sockopt::set_socket_passcred(&ours, false).step("SO_PASSCRED")?;
    protocol::send(ctrl, &Report::Started { pid, landlock }, &[]).step("report started")?;
    let mut peak_rss = 0u64;
    match wait_for(ctrl, sigchld, pid, Some(&ours), &mut peak_rss)? {
        Waited::Line(line) if line == b"R" => {
            *interp = Some(Interpreter {
                pid,
                chan: ours,
                landlock,
                persistent: false,
                frozen: false,
            });
            Ok(Report::InterpreterReady)
        }
        Waited::Line(_) => finish(sigchld, ExitStatus::Code(125), started, before, peak_rss),
        Waited::Exited(st) => finish(sigchld, exit_status(&st), started, before, peak_rss),
    }
}

fn timespec_of(d: std::time::Duration) -> Timespec {
    Timespec {
        tv_sec: d.as_secs() as _,
        tv_nsec: d.subsec_nanos() as _,
    }
}

/// Run one cell in the warm interpreter (`Request::Cell`): place the files, hand the
/// interpreter the cell's stdin with a `C` line (a session's cell: `K <source>`), and wait for
/// its `D <code>` (or its end). Then, as after any program, every process of the run is killed
/// and reaped: a one-shot cell is the run of a one-shot request; after a session's cell the
/// interpreter alone is spared and waits for the next cell.
fn run_cell(
    ctrl: &UnixStream,
    sigchld: &OwnedFd,
    cell: &CellStep,
    blobs: Vec<Vec<u8>>,
    baseline: &mut Baseline,
    interp: &mut Option<Interpreter>,
) -> Result<Report, StepError> {
    if interp.is_none() {
        return Err(invalid("cell", "no interpreter is running"));
    }
    let line = match (&cell.keep, &cell.source) {
        (false, _) => b"C\n".to_vec(),
        (true, Some(src)) => {
            let src = src.to_str().filter(|s| !s.contains('\n'));
            let src = src.ok_or_else(|| invalid("cell source", "not a one-line path"))?;
            format!("K {src}\n").into_bytes()
        }
        (true, None) => return Err(invalid("cell source", "a session's cell without one")),
    };
    // The inputs first: a cell whose files do not fit (a full disk) fails without taking the
    // interpreter, and a session's state, with it.
    let stdin = place_inputs(&cell.files, cell.stdin_blob, &blobs, baseline)?;
    drop(blobs);
    let Some(mut it) = interp.take() else {
        return Err(invalid("cell", "no interpreter is running"));
    };
    if cell.keep && cell.files.is_empty() {
        // A session's cell returns what it created or changed, whatever it was given.
        *baseline = Baseline::snapshot(WORKSPACE, BASELINE_MAX_ENTRIES);
    }
    it.persistent |= cell.keep;
    let before = sys::children_rusage();
    let started = Instant::now();
    let mut peak_rss = 0u64;
    if it.frozen {
        // The session's interpreter runs again, its threads with it, for this cell only. (Gone
        // meanwhile: the send below fails and the run ends as after any death.)
        let _ = sys::signal_process(it.pid, Signal::CONT);
        it.frozen = false;
    }
    // A one-line message with the stdin descriptor attached (the socket is empty: the
    // interpreter read everything before; a send cannot block on a few bytes).
    let sent = sys::send_with_fd(&it.chan, &line, stdin.as_fd());
    drop(stdin);
    let mut done = false;
    let status = match sent {
        Ok(()) => {
            protocol::send(
                ctrl,
                &Report::Started {
                    pid: it.pid,
                    landlock: it.landlock,
                },
                &[],
            )
            .step("report started")?;
            match wait_for(ctrl, sigchld, it.pid, Some(&it.chan), &mut peak_rss)? {
                Waited::Exited(st) => exit_status(&st),
                // Anything but `D <code>`: the cell's code wrote on the channel.
                Waited::Line(line) => match parse_done(&line) {
                    Some(code) => {
                        done = true;
                        ExitStatus::Code(code)
                    }
                    None => ExitStatus::Code(125),
                },
            }
        }
        // The interpreter is gone (it closed its end): the run is over.
        Err(_) => ExitStatus::Signal(libc::SIGKILL),
    };
    if done && cell.keep {
        let wall = started.elapsed();
        if spare_interpreter(sigchld, it.pid, &mut peak_rss) {
            it.frozen = true;
            *interp = Some(it);
            return report_exit(status, wall, before, peak_rss, true);
        }
    }
    if done {
        // A one-shot cell that ended normally: its sandbox serves no other run (a warm
        // sandbox is used once), so pid 1 reports as soon as every process of the run is
        // SIGKILLed, without waiting for them to exit: freeing a preloaded interpreter's
        // memory takes milliseconds that belong to the teardown, after the verdict. They are
        // reaped before anything else runs here (see `serve`).
        let wall = started.elapsed();
        sys::kill_rest_of_namespace().step("kill leftovers")?;
        drop(it);
        return report_exit(status, wall, before, peak_rss, false);
    }
    drop(it);
    finish(sigchld, status, started, before, peak_rss)
}

/// How long the end of a session's cell may take (every other process killed and reaped, the
/// interpreter stopped) before pid 1 ends the whole run instead.
const FREEZE_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// After a session's cell: freeze the sandbox until the next cell. Every process of the run
/// but pid 1 is stopped, every one but the interpreter `pid` is killed and reaped, and the
/// interpreter stays stopped, all its threads with it, until the next cell's SIGCONT (in
/// [`run_cell`]). Between calls a session then holds its memory and files but runs nothing:
/// no thread of the interpreter burns CPU outside a call's slot or starts a process after the
/// sweep. False when that state is not reached within [`FREEZE_WITHIN`] (a process stuck in
/// the kernel, an interpreter that keeps being continued, or one that died): then the whole
/// run ends, the interpreter with it.
///
/// Why job-control signals and not the cgroup freezer (v1 `freezer.state`, v2
/// `cgroup.freeze`): the freezer needs a cgroup, which a rootless runcell without a delegated
/// subtree does not have, and a v1 host may not mount the freezer controller; it freezes a
/// whole group, and pid 1, which must serve `Put`, `Browse` and `Collect` between cells and
/// watch the interpreter, is in the run's group (the supervisor would have to thaw around
/// every request, or the programs move to a child group of their own, in every v1 hierarchy,
/// with the statistics read across both). SIGSTOP works wherever pid 1 runs, cannot be
/// caught, blocked or ignored, and `kill(-1)` from pid 1 reaches every other process of the
/// namespace at once. Its one weakness, a SIGCONT generated from inside (a POSIX timer or a
/// child's exit signal set to SIGCONT; no process runs to send one), is closed because pid 1
/// is the interpreter's parent: the kernel reports every stop and every continue to it
/// (`waitid`), here and in the serve loop between cells, which ends an interpreter that runs
/// again unbidden.
fn spare_interpreter(sigchld: &OwnedFd, pid: i32, peak_rss: &mut u64) -> bool {
    // Stop first, kill second: a running thread of the interpreter may fork at any moment, so
    // a sweep that raced it could go on forever; stopped, it forks nothing (a fork in
    // progress fails and restarts later, or its child is stopped too), and the processes it
    // started are killed where they stand (SIGKILL ends stopped processes too).
    if sys::stop_rest_of_namespace().is_err() {
        return false;
    }
    let deadline = Instant::now() + FREEZE_WITHIN;
    loop {
        let before = job_state(pid);
        let Ok(signalled) = sys::kill_all_but(Path::new("/proc"), pid) else {
            return false;
        };
        reap_exited(0, peak_rss);
        // Frozen: the interpreter was stopped before a sweep that found nothing else alive, and
        // still is after it (every killed process has exited: its exit signal, which a raw
        // clone may have set to SIGCONT, came before this sweep).
        let after = job_state(pid);
        match (before, after) {
            (JobState::Stopped, JobState::Stopped) if signalled == 0 => return true,
            (_, JobState::Gone) => return false,
            // Not stopped yet, or continued since (the exit signal of a child just killed):
            // again. A stop signal that is already pending is not queued twice.
            (_, JobState::Running) => {
                let _ = sys::signal_process(pid, Signal::STOP);
            }
            (_, JobState::Stopped) => {}
        }
        if Instant::now() >= deadline {
            return false;
        }
        // Stopped during a sweep that found nothing to kill: only the check is left to do.
        if !(after == JobState::Stopped && signalled == 0) {
            wait_sigchld(sigchld);
        }
    }
}

/// What `waitid` says of a child (the interpreter) without reaping it or consuming the report:
/// a stopped child stays reported stopped until it is continued, and one that was continued
/// stays reported so until its next stop completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JobState {
    Stopped,
    /// Running: continued since its last stop, or never stopped yet.
    Running,
    /// It exited (a zombie) or is reaped already.
    Gone,
}

fn job_state(pid: i32) -> JobState {
    use rustix::process::{WaitId, WaitIdOptions};
    let Some(pid) = Pid::from_raw(pid) else {
        return JobState::Gone;
    };
    let options = WaitIdOptions::EXITED
        | WaitIdOptions::STOPPED
        | WaitIdOptions::CONTINUED
        | WaitIdOptions::NOHANG
        | WaitIdOptions::NOWAIT;
    match rustix::process::waitid(WaitId::Pid(pid), options) {
        Ok(Some(st)) if st.stopped() => JobState::Stopped,
        Ok(Some(st)) if st.continued() => JobState::Running,
        Ok(Some(_)) => JobState::Gone,
        Ok(None) => JobState::Running,
        Err(rustix::io::Errno::INTR) => job_state(pid.as_raw_nonzero().get()),
        Err(_) => JobState::Gone,
    }
}

/// Wait up to 50 ms for a SIGCHLD (a killed process exiting), and consume it.
fn wait_sigchld(sigchld: &OwnedFd) {
    let mut fds = [PollFd::new(sigchld, PollFlags::IN)];
    let _ = poll(
        &mut fds,
        Some(&Timespec {
            tv_sec: 0,
            tv_nsec: 50_000_000,
        }),
    );
    drain_signalfd(sigchld);
}

/// A program that could not be started: end the run (the forked child is gone or going) and
/// say which step failed, with its errno.
fn exec_failed(
    sigchld: &OwnedFd,
    failure: ExecFailure,
    step: &ExecStep,
    peak_rss: &mut u64,
) -> StepError {
    if let Err(e) = end_of_run(sigchld, peak_rss) {
        return e;
    }
    StepError {
        step: failure.step,
        path: Some(PathBuf::from(&step.argv[0])),
        source: failure.error,
    }
}

/// `D <code>` with code 0..=255.
fn parse_done(line: &[u8]) -> Option<i32> {
    let rest = line.strip_prefix(b"D ")?;
    let text = std::str::from_utf8(rest).ok()?;
    text.parse::<u8>().ok().map(i32::from)
}

/// Write a step's files (taking a new baseline of /workspace when there are any) and make its
/// stdin: a memfd with the blob, or /dev/null.
fn place_inputs(
    files: &[crate::config::FileSpec],
    stdin_blob: Option<usize>,
    blobs: &[Vec<u8>],
    baseline: &mut Baseline,
) -> Result<OwnedFd, StepError> {
    for f in files {
        write_sandbox_file(&f.path, f.mode, blob(blobs, f.blob)?)?;
    }
    if !files.is_empty() {
        // What the program finds in /workspace is input; what it leaves there that is new or
        // changed is output.
        *baseline = Baseline::snapshot(WORKSPACE, BASELINE_MAX_ENTRIES);
    }
    Ok(match stdin_blob {
        Some(i) => {
            let fd = rustix::fs::memfd_create("stdin", rustix::fs::MemfdFlags::CLOEXEC)
                .step("memfd_create")?;
            let mut f = File::from(fd);
            f.write_all(blob(blobs, i)?).step("write stdin")?;
            rustix::fs::seek(&f, rustix::fs::SeekFrom::Start(0)).step("seek stdin")?;
            f.into()
        }
        None => rustix::fs::open("/dev/null", OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
            .step("open /dev/null")?,
    })
}

/// The descriptors a forked program gets: stdin (fd 0), a warm interpreter's cell channel (fd
/// 4) and the status pipe to pid 1 (fd 3, closed on exec).
pub(crate) struct ChildFds {
    pub(crate) stdin: OwnedFd,
    pub(crate) chan: Option<OwnedFd>,
    /// Where a failure is reported (pid 1 reads it); `None` in a forked interpreter, which
    /// reports to pid 1 on its channel instead.
    pub(crate) status_w: Option<OwnedFd>,
}

/// A forked program: its pid, its Landlock status, and why it could not exec, if it could not.
struct Spawned {
    pid: i32,
    landlock: LandlockStatus,
    exec_error: Option<ExecFailure>,
}

/// Fork and exec a step's program (with the cell channel on fd 4 for an interpreter), and
/// report `Started` once it exec'd.
fn spawn(
    ctrl: &UnixStream,
    step: &ExecStep,
    stdin: OwnedFd,
    chan: Option<OwnedFd>,
    seccomp: &SeccompPolicy,
) -> Result<Spawned, StepError> {
    let argv: Vec<CString> = step
        .argv
        .iter()
        .map(|a| cstring(a))
        .collect::<Result<_, _>>()?;
    let envp: Vec<CString> = step
        .env
        .iter()
        .map(|(k, v)| cstring(&format!("{k}={v}")))
        .collect::<Result<_, _>>()?;
    let cwd = step.cwd.clone();
    if argv.is_empty() {
        return Err(invalid("argv", "empty argv"));
    }
    let (status_r, status_w) = pipe_with(PipeFlags::CLOEXEC).step("pipe")?;
    // SAFETY: pid 1 is single-threaded (a clone of the single-threaded helper).
    let Some(pid) = unsafe { sys::fork() }.step("fork")? else {
        drop(status_r);
        let fds = ChildFds {
            stdin,
            chan,
            status_w: Some(status_w),
        };
        exec_program(&argv, &envp, &cwd, &step.rlimits, fds, seccomp)
    };
    drop(status_w);
    drop(stdin);
    drop(chan);

    // The program reports its Landlock status, then either execs (the close-on-exec pipe hits
    // EOF) or reports why it could not.
    let mut buf = Vec::new();
    let _ = File::from(status_r).read_to_end(&mut buf);
    let landlock = match buf.first().zip(buf.get(1)) {
        Some((b'L', b'f')) => LandlockStatus::Full,
        Some((b'L', b'p')) => LandlockStatus::Partial,
        _ => LandlockStatus::None,
    };
    let exec_error = buf
        .iter()
        .position(|&c| c == b'E')
        .map(|i| ExecFailure::decode(&buf[i + 1..]));
    if exec_error.is_none() {
        protocol::send(ctrl, &Report::Started { pid, landlock }, &[]).step("report started")?;
    }
    Ok(Spawned {
        pid,
        landlock,
        exec_error,
    })
}

/// What [`wait_for`] saw first.
enum Waited {
    /// The program ended.
    Exited(sys::Reaped),
    /// The interpreter wrote a line on its channel (without the newline).
    Line(Vec<u8>),
}

/// Wait for the program `pid` to end, or (with `chan`) for a line from it, reaping orphans
/// re-parented to us on the way (their peak resident set goes into `peak_rss`), and obey a
/// Stop (which kills every process of the run: the program ends).
fn wait_for(
    ctrl: &UnixStream,
    sigchld: &OwnedFd,
    pid: i32,
    chan: Option<&UnixStream>,
    peak_rss: &mut u64,
) -> Result<Waited, StepError> {
    let mut line = Vec::new();
    let mut chan = chan;
    loop {
        if let Some(st) = reap_exited(pid, peak_rss) {
            return Ok(Waited::Exited(st));
        }
        let mut fds = vec![
            PollFd::new(sigchld, PollFlags::IN),
            PollFd::new(ctrl, PollFlags::IN),
        ];
        if let Some(c) = chan {
            fds.push(PollFd::new(c, PollFlags::IN));
        }
        match poll(&mut fds, None) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e).step("poll"),
        }
        let revents: Vec<PollFlags> = fds.iter().map(|f| f.revents()).collect();
        drop(fds);
        if !revents[0].is_empty() {
            drain_signalfd(sigchld);
        }
        if !revents[1].is_empty() {
            match protocol::recv::<Request>(ctrl) {
                // Timeout or output flood: end the program and everything it started.
                Ok(Some(protocol::Frame {
                    message: Request::Stop,
                    ..
                })) => sys::kill_rest_of_namespace().step("stop")?,
                // Ctrl-C for the program's process group (it leads its own session).
                Ok(Some(protocol::Frame {
                    message: Request::Interrupt,
                    ..
                })) => sys::signal_group(pid, libc::SIGINT).step("interrupt")?,
                Ok(Some(_)) => return Err(invalid("control", "unexpected request while running")),
                // The supervisor is gone: so is the run.
                _ => {
                    let _ = sys::kill_rest_of_namespace();
                    sys::exit_now(0);
                }
            }
        }
        if let (Some(c), Some(ev)) = (chan, revents.get(2)) {
            if !ev.is_empty() {
                let mut buf = [0u8; CHANNEL_LINE_MAX];
                let room = CHANNEL_LINE_MAX - line.len();
                match rustix::io::read(c, &mut buf[..room.max(1)]) {
                    Ok(0) | Err(_) => {
                        // The interpreter closed its end: only its exit is left to wait for.
                        chan = None;
                    }
                    Ok(n) => {
                        line.extend_from_slice(&buf[..n]);
                        if let Some(i) = line.iter().position(|&b| b == b'\n') {
                            line.truncate(i);
                            return Ok(Waited::Line(line));
                        }
                        if line.len() >= CHANNEL_LINE_MAX {
                            return Ok(Waited::Line(line));
                        }
                    }
                }
            }
        }
    }
}

fn exit_status(st: &sys::Reaped) -> ExitStatus {
    match (st.signal(), st.code()) {
        (Some(sig), _) => ExitStatus::Signal(sig),
        (None, code) => ExitStatus::Code(code.unwrap_or(0)),
    }
}

/// The run ends with its main program: kill what it left behind (daemons, setsid children,
/// SIGTERM-ignoring loops) and reap them, so the next step starts clean. A process forked
/// while the first kill swept the namespace is caught by the next sweep.
fn end_of_run(sigchld: &OwnedFd, peak_rss: &mut u64) -> Result<(), StepError> {
    while has_children() {
        sys::kill_rest_of_namespace().step("kill leftovers")?;
        reap_exited(0, peak_rss);
        if !has_children() {
            // (Waiting for a SIGCHLD that will never come would cost the whole pause.)
            break;
        }
        wait_sigchld(sigchld);
    }
    Ok(())
}

/// End the run (see [`end_of_run`]) and report how it went.
fn finish(
    sigchld: &OwnedFd,
    status: ExitStatus,
    started: Instant,
    before: sys::ChildrenUsage,
    mut peak_rss: u64,
) -> Result<Report, StepError> {
    let wall = started.elapsed();
    end_of_run(sigchld, &mut peak_rss)?;
    report_exit(status, wall, before, peak_rss, false)
}

/// The `Exited` report of a run whose other processes are all gone.
fn report_exit(
    status: ExitStatus,
    wall: std::time::Duration,
    before: sys::ChildrenUsage,
    peak_rss: u64,
    interpreter: bool,
) -> Result<Report, StepError> {
    let after = sys::children_rusage();
    let disk_full = match rustix::fs::statvfs(WORKSPACE) {
        Ok(s) => s.f_bavail == 0 || s.f_favail == 0,
        Err(_) => false,
    };
    Ok(Report::Exited {
        status,
        wall_ns: wall.as_nanos() as u64,
        cpu_ns: after.cpu_ns.saturating_sub(before.cpu_ns),
        max_rss_bytes: peak_rss,
        disk_full,
        interpreter,
    })
}

/// The steps of [`exec_program`] that can fail. The forked child reports which one failed to
/// pid 1 through the status pipe, with the errno, so that the supervisor gets both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ExecStage {
    Setsid,
    Sigprocmask,
    Stdin,
    CloseRange,
    Chdir,
    Setrlimit,
    NoNewPrivs,
    Landlock,
    Securebits,
    BoundingSet,
    Ambient,
    Capset,
    Seccomp,
    Execve,
}

impl ExecStage {
    /// Every stage, indexed by its wire code.
    const ALL: [ExecStage; 14] = [
        ExecStage::Setsid,
        ExecStage::Sigprocmask,
        ExecStage::Stdin,
        ExecStage::CloseRange,
        ExecStage::Chdir,
        ExecStage::Setrlimit,
        ExecStage::NoNewPrivs,
        ExecStage::Landlock,
        ExecStage::Securebits,
        ExecStage::BoundingSet,
        ExecStage::Ambient,
        ExecStage::Capset,
        ExecStage::Seccomp,
        ExecStage::Execve,
    ];

    /// The step name reported to the supervisor.
    fn step(self) -> &'static str {
        match self {
            ExecStage::Setsid => "start program: setsid",
            ExecStage::Sigprocmask => "start program: sigprocmask",
            ExecStage::Stdin => "start program: stdin",
            ExecStage::CloseRange => "start program: close_range",
            ExecStage::Chdir => "start program: chdir",
            ExecStage::Setrlimit => "start program: setrlimit",
            ExecStage::NoNewPrivs => "start program: no_new_privs",
            ExecStage::Landlock => "start program: landlock",
            ExecStage::Securebits => "start program: securebits",
            ExecStage::BoundingSet => "start program: capability bounding set",
            ExecStage::Ambient => "start program: ambient capabilities",
            ExecStage::Capset => "start program: capset",
            ExecStage::Seccomp => "start program: seccomp",
            ExecStage::Execve => "start program: execve",
        }
    }
}

/// A failure of the program's process before execve, as it crosses the status pipe:
///
/// ```text
/// 'E' | stage (u8, index into ExecStage::ALL) | errno (i32 LE, 0 = none) | message (UTF-8)
/// ```
struct ExecFailure {
    step: &'static str,
    /// A [`ChildError`] (errno and message), so that `Report::from` finds the errno.
    error: io::Error,
}

impl ExecFailure {
    /// The bytes the child writes (the leading 'E' included).
    fn encode(stage: ExecStage, e: &(dyn std::error::Error + 'static)) -> Vec<u8> {
        let code = ExecStage::ALL.iter().position(|&s| s == stage).unwrap_or(0) as u8;
        let mut buf = vec![b'E', code];
        buf.extend_from_slice(&errno_of(e).unwrap_or(0).to_le_bytes());
        // The whole chain: the errors' own messages name the step, their sources the cause.
        buf.extend_from_slice(crate::errno::error_chain(e).as_bytes());
        buf
    }

    /// Decode what follows the 'E'.
    fn decode(bytes: &[u8]) -> ExecFailure {
        let Some((&code, rest)) = bytes.split_first().filter(|(_, r)| r.len() >= 4) else {
            return ExecFailure {
                step: "start program",
                error: io::Error::other("truncated failure report from the program's process"),
            };
        };
        let errno = i32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
        ExecFailure {
            step: ExecStage::ALL
                .get(code as usize)
                .map_or("start program", |s| s.step()),
            error: io::Error::other(ChildError {
                errno: (errno != 0).then_some(errno),
                message: String::from_utf8_lossy(&rest[4..]).into_owned(),
            }),
        }
    }
}

/// The errno anywhere in an error's chain (an `io::Error`, a rustix `Errno`, or a
/// [`ChildError`] wrapped in an `io::Error`).
fn errno_of(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut cur = Some(e);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            if let Some(n) = io.raw_os_error() {
                return Some(n);
            }
            if let Some(child) = io.get_ref().and_then(|i| i.downcast_ref::<ChildError>()) {
                return child.errno;
            }
        }
        if let Some(errno) = e.downcast_ref::<rustix::io::Errno>() {
            return Some(errno.raw_os_error());
        }
        cur = e.source();
    }
    None
}

fn drain_signalfd(fd: &OwnedFd) {
    let mut buf = [0u8; 128 * 8];
    while matches!(rustix::io::read(fd, &mut buf), Ok(n) if n > 0) {}
}

/// The program's last steps before execve, in the forked child of pid 1. Never returns.
/// Any failure is written to `status_w` and the process exits with 127.
fn exec_program(
    argv: &[CString],
    envp: &[CString],
    cwd: &Path,
    rlimits: &Rlimits,
    fds: ChildFds,
    seccomp: &SeccompPolicy,
) -> ! {
    match confine(cwd, rlimits, fds, seccomp, Then::Exec { argv, envp }) {
        Ok(_) => unreachable!("Then::Exec only returns by failing"),
        Err(never) => match never {},
    }
}

/// What [`confine`] does once the process is confined.
pub(crate) enum Then<'a> {
    /// X8: execve the program (a process pid 1 forked).
    Exec {
        argv: &'a [CString],
        envp: &'a [CString],
    },
    /// Return, confined, to run code already in memory (an interpreter forked from a template
    /// and adopted by pid 1: `template::zygote`, F7).
    Continue,
}

/// An uninhabited type: [`confine`] with `Then::Exec` never returns.
pub(crate) enum Never {}

/// The steps X1-X7 that confine a process of the sandbox before it runs anything of the user's,
/// then [`Then`]. The same steps for a program pid 1 execs and for an interpreter forked from a
/// template. Any failure is written to `status_w` (when there is one) and the process exits
/// with 127; with `Then::Continue` it returns the Landlock status reached.
pub(crate) fn confine(
    cwd: &Path,
    rlimits: &Rlimits,
    fds: ChildFds,
    seccomp: &SeccompPolicy,
    then: Then<'_>,
) -> Result<LandlockStatus, Never> {
    let ChildFds {
        stdin,
        chan,
        status_w,
    } = fds;
    let fail = |status_w: &Option<OwnedFd>,
                stage: ExecStage,
                e: &(dyn std::error::Error + 'static)|
     -> ! {
        if let Some(w) = status_w {
            let _ = rustix::io::write(w, &ExecFailure::encode(stage, e));
        }
        sys::exit_now(127)
    };

    // X1. A new session and process group: no controlling terminal to inject input into
    //     (TIOCSTI, bubblewrap CVE-2017-5226), and the run's processes form one group.
    if let Err(e) = rustix::process::setsid() {
        fail(&status_w, ExecStage::Setsid, &e);
    }
    // pid 1 blocks SIGCHLD (for its signalfd), and ignored signals and the mask both survive
    // execve: start the program with default dispositions, an empty mask, the usual umask.
    sys::reset_signal_dispositions();
    if let Err(e) = sys::unblock_all_signals() {
        fail(&status_w, ExecStage::Sigprocmask, &e);
    }
    rustix::process::umask(Mode::from_raw_mode(0o022));
    // X2. stdin on fd 0, the status pipe on fd 3 (close-on-exec); close everything else.
    // SAFETY: fd 0 is owned by no object of this process (inherited from the helper; in a
    // forked interpreter, placed there by the zygote, which never uses it again).
    match unsafe { sys::move_fd(stdin, 0, false) } {
        // fd 0 must stay open across execve: give up ownership instead of dropping it.
        Ok(fd) => drop(std::os::fd::IntoRawFd::into_raw_fd(fd)),
        Err(e) => fail(&status_w, ExecStage::Stdin, &e),
    }
    let status_w = match status_w {
        // SAFETY: fd 3 is the control socket, owned by the `UnixStream` of `helper_main` (or
        // of the template's zygote); that object is never used or dropped in this process
        // again (it execs, or exits with _exit, or runs the interpreter and never returns).
        Some(w) => match unsafe { sys::move_fd(w, 3, true) } {
            Ok(fd) => Some(fd),
            // The pipe is gone with the failed move; the exit code alone tells pid 1.
            Err(_) => sys::exit_now(127),
        },
        None => None,
    };
    // A warm interpreter's cell channel on fd 4 (kept across execve).
    let first_closed = match chan {
        Some(chan) => {
            // SAFETY: fd 4, if open, belongs to a pid 1 object that this process never uses
            // or drops again (it execs or exits with _exit).
            match unsafe { sys::move_fd(chan, 4, false) } {
                Ok(fd) => drop(std::os::fd::IntoRawFd::into_raw_fd(fd)),
                Err(e) => fail(&status_w, ExecStage::CloseRange, &e),
            }
            5
        }
        None => 4,
    };
    // SAFETY: the objects that own descriptors above 3 here (pid 1's copies) are never used or
    // dropped again in this process, which execs or exits with _exit. Without a status pipe,
    // fd 3 goes too (the template's control socket, in a forked interpreter).
    if let Err(e) = unsafe { sys::close_fds_from(first_closed) } {
        fail(&status_w, ExecStage::CloseRange, &e);
    }
    if status_w.is_none() {
        // SAFETY: as above: whatever owns fd 3 is never used or dropped again.
        unsafe { libc::close(3) };
    }
    if let Err(e) = rustix::process::chdir(cwd) {
        fail(&status_w, ExecStage::Chdir, &e);
    }
    // X3. rlimits: the second layer behind the cgroup (processes, file size = disk, open files,
    //     CPU seconds as a backstop for the wall clock, no core dumps).
    if let Err(e) = set_rlimits(rlimits) {
        fail(&status_w, ExecStage::Setrlimit, &e);
    }
    // X4. no_new_privs: execve can never grant privileges (setuid bits, file capabilities);
    //     required for unprivileged Landlock and seccomp.
    if let Err(e) = set_no_new_privs(true) {
        fail(&status_w, ExecStage::NoNewPrivs, &e);
    }
    // X5. Landlock (needs no privilege, so its order against X6 is free; it goes first so that
    //     a failure to drop capabilities still leaves it in place).
    let landlock = match crate::landlock::restrict_self() {
        Ok(s) => s,
        Err(e) => fail(&status_w, ExecStage::Landlock, &e),
    };
    // X6. Drop every capability in all five sets. The bounding set needs CAP_SETPCAP, so it
    //     goes before the capset that clears permitted/effective/inheritable.
    if let Err(e) = sys::lock_securebits() {
        fail(&status_w, ExecStage::Securebits, &e);
    }
    if let Err(e) = sys::drop_bounding_set() {
        fail(&status_w, ExecStage::BoundingSet, &e);
    }
    if let Err(e) = clear_ambient_capability_set() {
        fail(&status_w, ExecStage::Ambient, &e);
    }
    if let Err(e) = set_capabilities(
        None,
        CapabilitySets {
            effective: CapabilitySet::empty(),
            permitted: CapabilitySet::empty(),
            inheritable: CapabilitySet::empty(),
        },
    ) {
        fail(&status_w, ExecStage::Capset, &e);
    }
    let tag: &[u8] = match landlock {
        LandlockStatus::Full => b"Lf",
        LandlockStatus::Partial => b"Lp",
        LandlockStatus::None => b"Ln",
    };
    if let Some(w) = &status_w {
        let _ = rustix::io::write(w, tag);
    }
    // X7. seccomp, last: everything above uses syscalls the filter denies (prctl, capset,
    //     landlock_*); after it only execve and the program's own syscalls remain.
    if let Err(e) = seccomp.apply() {
        fail(&status_w, ExecStage::Seccomp, &e);
    }
    match then {
        // X8. execve with the fixed environment only.
        Then::Exec { argv, envp } => {
            let err = sys::execve(&argv[0], argv, envp);
            fail(&status_w, ExecStage::Execve, &err)
        }
        Then::Continue => Ok(landlock),
    }
}

fn set_rlimits(r: &Rlimits) -> rustix::io::Result<()> {
    let lim = |v: u64| Rlimit {
        current: Some(v),
        maximum: Some(v),
    };
    rustix::process::setrlimit(Resource::Core, lim(0))?;
    // The soft limit sends SIGXCPU (reported as a timeout); the hard limit one second later
    // is the SIGKILL for a program that catches it. Equal limits would skip SIGXCPU.
    rustix::process::setrlimit(
        Resource::Cpu,
        Rlimit {
            current: Some(r.cpu_seconds),
            maximum: Some(r.cpu_seconds + 1),
        },
    )?;
    // Fixed values, whatever runcell itself was started with: the usual 8 MiB stack (a program
    // may raise it up to 64 MiB) and 8 MiB of locked memory.
    rustix::process::setrlimit(
        Resource::Stack,
        Rlimit {
            current: Some(8 << 20),
            maximum: Some(64 << 20),
        },
    )?;
    rustix::process::setrlimit(Resource::Memlock, lim(8 << 20))?;
    rustix::process::setrlimit(Resource::Nofile, lim(r.open_files))?;
    rustix::process::setrlimit(Resource::Nproc, lim(r.processes))?;
    rustix::process::setrlimit(Resource::Fsize, lim(r.file_size_bytes))?;
    if let Some(a) = r.address_space_bytes {
        rustix::process::setrlimit(Resource::As, lim(a))?;
    }
    Ok(())
}

/// Write a requested file into the sandbox, refusing anything outside /workspace and /tmp.
/// Every component is resolved beneath its base directory without following any symlink
/// (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`): a program that ran earlier in the
/// same sandbox may have planted symlinks, and pid 1 must never write through them. A symlink
/// where a directory of the path should be is refused ("a symbolic link is in the way", with
/// the link's path), as a directory where the file should be is: the caller's conflict to
/// resolve, not a failure of the sandbox. A symlink at the file's own name is replaced (the
/// new file takes the name; the link's target is untouched), as any other file there is.
fn write_sandbox_file(path: &Path, mode: u32, data: &[u8]) -> Result<(), StepError> {
    use rustix::fs::{mkdirat, openat2, ResolveFlags};
    let base = ["/workspace", "/tmp"]
        .into_iter()
        .find(|b| path.starts_with(b))
        .filter(|_| rootfs::is_plain_absolute(path));
    let Some(base) = base else {
        return Err(invalid("write file", "path outside /workspace and /tmp"));
    };
    let rel = path.strip_prefix(base).unwrap_or(path);
    let Some(name) = rel.file_name() else {
        return Err(invalid("write file", "path names a directory"));
    };
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    let dir_flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let mut dir = rustix::fs::open(base, dir_flags | OFlags::NOFOLLOW, Mode::empty())
        .step_at("open", Path::new(base))?;
    let mut walked = PathBuf::from(base);
    for comp in rel.parent().into_iter().flat_map(Path::components) {
        // (mkdir never follows a symlink at its last component: it says EEXIST.)
        match mkdirat(&dir, comp.as_os_str(), Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e).step_at("mkdir", path),
        }
        walked.push(comp);
        dir = match openat2(&dir, comp.as_os_str(), dir_flags, Mode::empty(), resolve) {
            Ok(next) => next,
            // RESOLVE_NO_SYMLINKS refuses a symlink with ELOOP, which the error keeps.
            Err(e @ rustix::io::Errno::LOOP) => {
                return Err(StepError {
                    step: "write file",
                    path: Some(walked),
                    source: io::Error::other(ChildError {
                        errno: Some(e.raw_os_error()),
                        message: format!("{SYMLINK_IN_THE_WAY}: {}", io::Error::from(e)),
                    }),
                })
            }
            Err(e) => return Err(e).step_at("open directory", path),
        };
    }
    // The content goes to a fresh name first and is renamed into place: whatever an earlier
    // program left at the name (a file, a symlink, a fifo that would block an open, a socket)
    // is replaced whole and never followed, and a write that fails (a full disk) leaves what
    // was there. A directory in the way is refused.
    // The fresh name is random: a fixed one could be taken by the session's own code (a
    // directory named so cannot be unlinked), and every upload there would fail.
    let (part, fd) = create_part(&dir, mode, resolve).step_at("create file", path)?;
    let part = part.as_path();
    let written = rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode & 0o777))
        .step_at("chmod", path)
        .and_then(|()| File::from(fd).write_all(data).step_at("write file", path))
        .and_then(|()| {
            rustix::fs::renameat(&dir, part, &dir, name).map_err(|e| match e {
                rustix::io::Errno::ISDIR
                | rustix::io::Errno::NOTEMPTY
                | rustix::io::Errno::EXIST => StepError {
                    step: "write file",
                    path: Some(path.to_path_buf()),
                    source: io::Error::new(
                        io::ErrorKind::IsADirectory,
                        "a directory is in the way",
                    ),
                },
                e => StepError {
                    step: "write file",
                    path: Some(path.to_path_buf()),
                    source: e.into(),
                },
            })
        });
    if written.is_err() {
        let _ = rustix::fs::unlinkat(&dir, part, rustix::fs::AtFlags::empty());
    }
    written
}

/// What [`write_sandbox_file`] says of a symlink where a directory of the path should be.
const SYMLINK_IN_THE_WAY: &str = "a symbolic link is in the way";

/// Create a new, empty file under a random name in `dir` (`O_EXCL`, never following anything
/// at the name), for [`write_sandbox_file`] to fill and rename into place.
fn create_part(
    dir: &OwnedFd,
    mode: u32,
    resolve: rustix::fs::ResolveFlags,
) -> rustix::io::Result<(PathBuf, OwnedFd)> {
    let mut tries = 0;
    loop {
        let mut noise = [0u8; 8];
        rustix::rand::getrandom(&mut noise, rustix::rand::GetRandomFlags::empty())?;
        let part = PathBuf::from(format!(".runcell-part-{}", crate::hex::to_hex(&noise)));
        match rustix::fs::openat2(
            dir,
            &part,
            OFlags::WRONLY
                | OFlags::CREATE
                | OFlags::EXCL
                | OFlags::NOFOLLOW
                | OFlags::NONBLOCK
                | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode & 0o777),
            resolve,
        ) {
            Err(rustix::io::Errno::EXIST) if tries < 3 => tries += 1,
            r => return r.map(|fd| (part, fd)),
        }
    }
}

fn blob(blobs: &[Vec<u8>], i: usize) -> Result<&[u8], StepError> {
    blobs
        .get(i)
        .map(Vec::as_slice)
        .ok_or_else(|| invalid("read blob", "missing blob"))
}

fn cstring(s: &str) -> Result<CString, StepError> {
    CString::new(s).map_err(|_| invalid("argument", "NUL byte in argument or environment"))
}

fn invalid(step: &'static str, msg: &str) -> StepError {
    StepError {
        step,
        path: None,
        source: io::Error::new(io::ErrorKind::InvalidInput, msg.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::collections::BTreeSet;

    /// `docs/isolation.md`: the step sequence as documented.
    const ISOLATION_MD: &str = include_str!("../../../docs/isolation.md");
    /// The code that carries the labelled step comments.
    const INIT_RS: &str = include_str!("init.rs");
    const SANDBOX_RS: &str = include_str!("supervisor/sandbox.rs");
    const ZYGOTE_RS: &str = include_str!("template/zygote.rs");

    /// `H4a`, `P17`, `X8`, `S2`: a step letter, a number, an optional lowercase suffix.
    fn is_label(s: &str, letters: &str) -> bool {
        let mut chars = s.chars();
        let Some(first) = chars.next() else {
            return false;
        };
        let rest = chars.as_str();
        let digits = rest.trim_end_matches(|c: char| c.is_ascii_lowercase());
        letters.contains(first)
            && !digits.is_empty()
            && digits.chars().all(|c| c.is_ascii_digit())
            && rest.len() - digits.len() <= 1
    }

    /// Labels of the docs' step tables: `| H4a | ...`.
    fn documented(letters: &str) -> BTreeSet<String> {
        ISOLATION_MD
            .lines()
            .filter_map(|l| l.strip_prefix('|')?.split('|').next())
            .map(str::trim)
            .filter(|cell| is_label(cell, letters))
            .map(String::from)
            .collect()
    }

    /// Labels of step comments in the code: `// H4a. ...` or `/// P16. ...`.
    fn in_code(source: &str, letters: &str) -> BTreeSet<String> {
        source
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("//"))
            .map(|c| c.trim_start_matches('/').trim_start())
            .filter_map(|c| c.split_once('.').map(|(label, _)| label))
            .filter(|label| is_label(label, letters))
            .map(String::from)
            .collect()
    }

    #[test]
    fn every_documented_step_is_a_labelled_step_in_the_code_and_back() {
        let docs = documented("HPX");
        let code = in_code(INIT_RS, "HPX");
        assert!(
            docs.len() > 30,
            "the docs' step tables were not found: {docs:?}"
        );
        assert_eq!(
            docs, code,
            "docs/isolation.md and init.rs disagree on the H/P/X steps"
        );
        let docs = documented("S");
        let code = in_code(SANDBOX_RS, "S");
        assert!(!docs.is_empty());
        assert_eq!(
            docs, code,
            "docs/isolation.md and supervisor/sandbox.rs disagree on the S steps"
        );
        let docs = documented("TF");
        let code = in_code(ZYGOTE_RS, "TF");
        assert!(docs.len() >= 15, "the template's steps: {docs:?}");
        assert_eq!(
            docs, code,
            "docs/isolation.md and template/zygote.rs disagree on the T and F steps"
        );
    }

    #[test]
    fn step_labels_are_recognised() {
        for l in ["H0", "H4a", "P17", "X8", "S2"] {
            assert!(is_label(l, "HPXS"), "{l}");
        }
        for l in ["", "H", "Ha", "P1ab", "Q1", "h1", "X1 "] {
            assert!(!is_label(l, "HPXS"), "{l:?}");
        }
    }

    #[test]
    fn exec_failures_keep_their_step_and_errno_across_the_status_pipe() {
        let e = io::Error::from_raw_os_error(libc::ENOENT);
        let bytes = ExecFailure::encode(ExecStage::Execve, &e);
        assert_eq!(bytes[0], b'E');
        let f = ExecFailure::decode(&bytes[1..]);
        assert_eq!(f.step, "start program: execve");
        assert_eq!(errno_of(&f.error), Some(libc::ENOENT));
        assert_eq!(f.error.to_string(), e.to_string());
        // Through the report the supervisor gets.
        let report = Report::from(&StepError {
            step: f.step,
            path: Some(PathBuf::from("/usr/bin/nope")),
            source: f.error,
        });
        match report {
            Report::Failed { step, error, .. } => {
                assert_eq!(step, "start program: execve");
                assert_eq!(error.errno, Some(libc::ENOENT));
            }
            other => panic!("{other:?}"),
        }

        // A rustix errno, and an error without one.
        let bytes = ExecFailure::encode(ExecStage::Chdir, &rustix::io::Errno::ACCESS);
        assert_eq!(
            errno_of(&ExecFailure::decode(&bytes[1..]).error),
            Some(libc::EACCES)
        );
        let bytes = ExecFailure::encode(ExecStage::Landlock, &io::Error::other("no ruleset"));
        let f = ExecFailure::decode(&bytes[1..]);
        assert_eq!(
            (f.step, errno_of(&f.error)),
            ("start program: landlock", None)
        );
        assert_eq!(f.error.to_string(), "no ruleset");
        // Garbage from a dying child does not panic.
        assert_eq!(ExecFailure::decode(b"\x01").step, "start program");
        assert_eq!(
            ExecFailure::decode(&[200, 0, 0, 0, 0]).step,
            "start program"
        );
    }
}
