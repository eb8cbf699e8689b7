//! runcell-core: the shared vocabulary (request, limits policy, verdict) and the engine that
//! the CLI, the HTTP API and the MCP server all call.
//!
//! This is the boundary the doors use: they parse the one [`ExecRequest`] with the
//! [`intake`] for their [`Source`] and [`Target`], and hand it to the one [`RunService`],
//! which admits it (a place in line, the caller's share), checks it against its target and
//! the operator's [`Policy`] (a typed [`RunError`] otherwise), waits for approval where
//! needed, runs it in the [`Engine`] or a session with an [`OutputSink`] for live output and a
//! [`KillSwitch`] to stop it, and reports it to the door's [`Observer`]. Nothing above this
//! crate reaches into the jail.
#![forbid(unsafe_code)]

pub mod cluster;
pub mod engine;
pub mod error;
pub mod files;
pub mod intake;
pub mod limits;
pub mod network;
pub mod packages;
pub mod policy;
pub mod pool;
pub mod request;
pub mod schema;
pub mod service;
pub mod session;
pub mod stream;
pub mod templates;
pub mod units;
pub mod verdict;

pub use engine::{Engine, EngineConfig, RuntimeStatus, ValidRequest, ValidationError};
pub use error::{ErrorKind, RunError};
pub use intake::{Offers, SessionSettings, Source, Target, TargetKind};
pub use limits::{Limit, LimitOverrides, LimitPolicy, Limits};
pub use network::{NetworkError, NetworkPolicy};
pub use packages::PackagePolicy;
pub use policy::Policy;
pub use pool::{PoolSizes, PoolStats, Preload};
pub use request::NetworkRequest;
pub use request::{ExecRequest, InputFile};
pub use service::{
    AdmissionPolicy, Admitted, Call, Caller, Credential, Hold, Observer, RemoteSessions,
    RunService, RunSummary, ServiceConfig, Ticket,
};
pub use session::{
    ForkSource, OwnedSession, Resumed, Session, SessionInfo, SessionPolicy, SessionState,
    SessionStats, Sessions, WorkspaceListing,
};
pub use verdict::{
    ErrorCategory, NetworkConnection, NetworkReport, PackagesReport, Verdict, VerdictError,
};

/// What the engine needs from a front end while a program runs, and what it offers to stop
/// one: re-exported from the jail so that front ends depend on this crate only.
pub use runcell_jail::{KillOnDrop, KillSwitch, NoSink, OutputSink, Stream};
pub use runcell_runtimes::{python_stack, Language, WORKSPACE};

/// Raise runcell's own soft open-files limit to the hard one (servers hold a descriptor per
/// connection).
pub use runcell_jail::{open_files_hard_limit, raise_open_files_limit};

/// Keep malloc from holding on to freed large buffers (output, files) in long-running
/// processes: see `runcell_jail::pin_mmap_threshold`.
pub use runcell_jail::pin_mmap_threshold;

/// The one hex encoder: sha256 digests in verdicts, audit lines and tests.
pub use runcell_jail::to_hex;

/// The /proc entries every sandbox masks or makes read-only, for tests and documentation.
pub use runcell_jail::{PROC_MASKED_DIRS, PROC_MASKED_FILES, PROC_READONLY_DIRS};

/// The isolation layers this host provides (for `runcell doctor` and strict mode).
pub use runcell_jail::{layers as isolation_layers, Layer as IsolationLayer};

/// The sandbox helper role of the runcell binary: the supervisor exec's the binary with
/// [`HELPER_ARG`] as its first argument, and `main` must hand over to [`helper_main`] before
/// anything else (no threads, no shared state).
pub use runcell_jail::{helper_main, HELPER_ARG};
/// The template role (`runcell __template`, docs/isolation.md "Templates"), like the helper's.
pub use runcell_jail::{template_main, TEMPLATE_ARG};
