//! runcell-jail: the kernel-facing core of runcell.
//!
//! This is the only crate in the workspace that contains `unsafe` code. It knows how to
//! build a sandbox out of Linux primitives (user/pid/mount/net/ipc/uts/cgroup namespaces,
//! a tmpfs root entered with `pivot_root`, cgroups v1 and v2, rlimits, capabilities,
//! Landlock and seccomp) and how to supervise the processes inside it. It knows nothing
//! about languages or verdicts: those live in `runcell-runtimes` and `runcell-core`.
//!
//! The setup sequence is in `init.rs` (and `docs/isolation.md`); the supervisor's API is
//! [`Sandbox`]. Every module is private: what other crates may use is re-exported here, and
//! nothing else.
//!
//! Errors follow one rule: `Display` names the step that failed, never the underlying error,
//! which is reachable through [`std::error::Error::source`]; the caller that shows an error
//! formats the chain. [`SandboxError::os_error`] gives the errno behind a failure.

mod advice;
mod blockdev;
mod cgroup;
mod collect;
mod config;
mod errno;
mod fdlimit;
mod hex;
mod hostspeed;
mod identity;
mod init;
mod landlock;
mod malloc;
mod meminfo;
mod oom;
mod probe;
mod protocol;
mod rootfs;
mod seccomp;
mod supervisor;
mod sys;
mod template;

pub use advice::{classify, current_place, fix, Failure, Place, PlaceFacts};
pub use blockdev::{block_device_of, BlockDevice};
pub use cgroup::{
    memory_ceiling, CgroupError, CgroupLimits, CgroupVersion, Enforced, IoLimits, MemoryCeiling,
    MemorySource,
};
pub use collect::MAX_PATH_BYTES;
pub use config::{Overlay, Rlimits, RootEntry, SANDBOX_GID, SANDBOX_UID};
pub use errno::{error_chain, OsError};
pub use fdlimit::{open_files_hard_limit, raise_open_files_limit};
pub use hex::to_hex;
pub use hostspeed::{startup_hints, StartupHint, RCU_EXPEDITED};
pub use identity::{Identity, Shape};
pub use init::{helper_main, HELPER_ARG};
pub use malloc::pin_mmap_threshold;
pub use meminfo::MemInfo;
pub use oom::{
    lower_oom_score_adj, read_oom_score_adj, OomAdjust, SANDBOX_OOM_SCORE_ADJ, SERVER_OOM_SCORE_ADJ,
};
pub use probe::{layers, Layer};
pub use protocol::{ChildError, CollectLimits, CollectedFile, ExitStatus, LandlockStatus};
pub use rootfs::{PROC_MASKED_DIRS, PROC_MASKED_FILES, PROC_READONLY_DIRS};
pub use supervisor::{
    cgroup_version, CollectedFiles, End, Enforcement, InputFile, KillOnDrop, KillSwitch, NoSink,
    Outcome, OutputSink, Program, Sandbox, SandboxError, SandboxSpec, Stream,
};
pub use template::{
    find_libpython, template_main, Template, TemplateError, TemplateSpec, TEMPLATE_ARG,
};
