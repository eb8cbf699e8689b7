//! runcell-jail: the kernel-facing core of runcell.
//!
//! This is the only crate in the workspace that contains `unsafe` code. It knows how to
//! build a sandbox out of Linux primitives (user/pid/mount/net/ipc/uts/cgroup namespaces,
//! a tmpfs root entered with `pivot_root`, cgroups v1 and v2, rlimits, capabilities,
//! Landlock and seccomp) and how to supervise the processes inside it. It knows nothing
//! about languages or verdicts: those live in `runcell-runtimes` and `runcell-core`.

pub mod cgroup;
pub mod seccomp;
