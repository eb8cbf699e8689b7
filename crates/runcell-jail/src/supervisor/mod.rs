//! The supervisor's side of a sandbox: create it, hand it programs, tear it down.
//!
//! A [`Sandbox`] is created (namespaces, filesystem and cgroup set up, pid 1 waiting), then
//! given [`Program`]s one after the other (a compile step, then a run step; later a session's
//! cells), then dropped. Creating ahead of time is what a warm pool will do; running several
//! programs in one sandbox is what a session will do.
//!
//! The supervisor never forks: it spawns the runcell binary itself (`runcell __jail`) with
//! `std::process::Command`, which is safe in a multi-threaded process, and all namespace work
//! happens in that single-threaded helper (see `init.rs`).
//!
//! The parts:
//!
//! * `sandbox`: the lifecycle (create, enforcement, collect, destroy) and what it reports.
//! * `run`: the run loop, which waits for one program on the control socket, the output pipes
//!   and the kill switch at once.
//! * `capture`: output capture up to a cap, and the live output sink.
//! * `ownership`: the cgroup of each sandbox, named after its owner so that groups left by a
//!   dead supervisor can be swept, and the removals still pending.
//! * `kill`: the kill switch another thread uses to end a run.
//! * `error`: what can go wrong, with the OS error behind it.

mod capture;
mod error;
mod kill;
mod ownership;
mod run;
mod sandbox;

/// What the template module needs of the supervisor's cgroup ownership.
pub(crate) mod template_support {
    pub(crate) use super::ownership::{
        cgroup_manager as cgroup_manager_for_template, template_group_name,
    };
}

pub use capture::{NoSink, OutputSink, Stream};
pub use error::SandboxError;
pub use kill::{KillOnDrop, KillSwitch};
pub use ownership::cgroup_version;
pub use run::{End, InputFile, Outcome, Program};
pub use sandbox::{CollectedFiles, Enforcement, Sandbox, SandboxSpec};

use std::time::Duration;

use rustix::event::Timespec;

pub(crate) fn timespec(d: Duration) -> Timespec {
    Timespec {
        tv_sec: d.as_secs() as _,
        tv_nsec: d.subsec_nanos() as _,
    }
}
