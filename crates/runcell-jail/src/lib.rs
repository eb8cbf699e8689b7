//! runcell-jail: the kernel-facing core of runcell.
//!
//! This is the only crate in the workspace that contains `unsafe` code. It knows how to
//! build a sandbox out of Linux primitives (user/pid/mount/net/ipc/uts/cgroup namespaces,
//! a tmpfs root entered with `pivot_root`, cgroups v1 and v2, rlimits, capabilities,
//! Landlock and seccomp) and how to supervise the processes inside it. It knows nothing
//! about languages or verdicts: those live in `runcell-runtimes` and `runcell-core`.
//!
//! The setup sequence is in [`init`]; the supervisor's API is [`supervisor::Sandbox`].

pub mod cgroup;
pub mod collect;
pub mod config;
pub mod init;
pub mod landlock;
pub mod probe;
pub mod protocol;
pub mod rootfs;
pub mod seccomp;
pub mod supervisor;
mod sys;

pub use config::{Rlimits, RootEntry, SANDBOX_GID, SANDBOX_UID};
pub use protocol::{ExitStatus, LandlockStatus};
pub use supervisor::{
    CgroupRequest, End, Enforcement, InputFile, KillOnDrop, KillSwitch, NoSink, Outcome,
    OutputSink, Program, Sandbox, SandboxError, SandboxSpec, Stream,
};
